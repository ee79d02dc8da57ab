// Package memstore is the in-process bucket.Store: keyed algorithm state in sharded tables,
// bounded by eviction, pools and a count-min sketch for the keys it cannot hold.
//
// store.go holds the shards and their entries; take.go a group's decision (Take and its steps),
// takeone.go a single charge's; evict.go what a full shard forgets; pool.go each pool's share of
// a shard; sketch.go where the new keys no share can hold are judged; giveback.go Release;
// console.go what the operators' console needs (Peek, Reset); table.go and compact.go the
// open-addressing table and the compact sliding-window state.
package memstore
