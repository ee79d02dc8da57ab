-- wait waits until ARGV[1] replicas have this connection's writes, at most ARGV[2] ms, and
-- returns how many did. KEYS[1] only routes it to the key's node in a cluster.
return redis.call('WAIT', ARGV[1], ARGV[2])
