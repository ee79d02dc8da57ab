// Package dynamo is a bucket.Store on DynamoDB, exact across replicas.
//
// Every replica of the gateway updates the same items of one table with conditional writes,
// which DynamoDB serialises per item, so no decision reads before it writes. Each write's
// condition, why re-sending it is safe, give-backs, coalescing, leases and the table are
// described for maintainers in docs/dynamodb-internals.md, and for operators in
// docs/dynamodb.md.
//
// Files: store.go routes a decision (deny cache, then the group's mode); writes.go holds each
// algorithm's conditional write; quota.go and slots.go the quota's and the sliding window's
// items; coalesce.go the per-item writers; refund.go and transaction.go the two group modes;
// giveback.go the give-backs; package lease the lease mode, with leasetable.go its table;
// concurrency.go and release.go concurrency slots; console.go the console's reads, resets and
// exemptions; items.go, liveness.go, cache.go and table.go what they share, and package schema
// what they share with package lease.
package dynamo
