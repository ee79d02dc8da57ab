// Package redisstore is a bucket.Store on Redis (7+) or Valkey (8+), exact across replicas.
//
// Every group of charges is decided by one Lua script (take), which the server runs atomically:
// it evaluates every charge on the state it reads and commits the conforming ones only when the
// group is admitted, in one round trip. The script computes nothing but the decision and the new
// state; the verdict's numbers come from package bucket's arithmetic on the state the script read,
// and a script that decided otherwise than the algorithm is an error (ErrDisagree). Instants are
// the caller's (Take's now, the gateway's clock), as on DynamoDB. Keys carry the bucket key's hex
// (a digest), never a client value, and every key expires once its state is a fresh key's.
// docs/redis.md describes the deployments and what each can lose.
//
// Files: store.go the decision, release.go give-backs and concurrency slots' renewals, admin.go
// the console, scripts.go and lua/ the scripts, slot.go the cluster's hash slots, dial.go the
// client from the configuration.
package redisstore
