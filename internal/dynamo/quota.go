package dynamo

import (
	"strconv"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Calendar quotas (bucket.Quota) are counters like fixed windows: one item per key and period,
// its partition key the bucket key, "#q" and the period's start in Unix ns (so a new period is
// a new item, whatever its length), written with ADD count c while count <= Count-c and a TTL
// of the period's end plus ttlMargin. The period comes from the replica's clock and the
// quota's calendar (bucket.QuotaPeriod): replicas whose clocks disagree at a period boundary
// count a request in the period their clock says, and each period's item stays exact.

// quotaItem returns the partition key of the item that counts key's quota l for the period
// holding instant n.
func quotaItem(key string, l bucket.Limit, n int64) string {
	start, _ := bucket.QuotaPeriod(n, l)
	return key + "#q" + strconv.FormatInt(start, 10)
}
