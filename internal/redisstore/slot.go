package redisstore

// Slot returns the Redis Cluster hash slot of a hash tag: CRC16 (XMODEM) modulo 16384. Every key
// of one bucket has the bucket key's hex as its tag, so all of them share a slot.
func Slot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
