package e2e

import (
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestRLSRedisServesIstioSampleRules: the rule file of Istio's rate limit sample, as
// deploy/envoy/istio-ratelimit-config.yaml keeps its ConfigMap (the one
// examples/istio-redis.yaml mounts unchanged), served on Redis in the sample's domain: one
// /productpage a minute, 100 a minute for any other path.
func TestRLSRedisServesIstioSampleRules(t *testing.T) {
	cm := find(yamlDocs(t, "istio-ratelimit-config.yaml"), "ConfigMap", "ratelimit-config")
	rules, _ := dig(cm, "data", "config.yaml").(string)
	if rules == "" {
		t.Fatal("istio-ratelimit-config.yaml: no data config.yaml in ConfigMap ratelimit-config")
	}
	url := redisURL(t)
	ask := func(g *rlsGateway, path string) *pb.RateLimitResponse_DescriptorStatus {
		return g.call(t, &pb.RateLimitRequest{Domain: "ratelimit", Descriptors: []*rlext.RateLimitDescriptor{desc("PATH", path)}}).GetStatuses()[0]
	}
	// The windows are whole minutes: two calls astride a minute's end fall in two windows, so
	// such an attempt is made again on fresh keys (a new prefix).
	for attempt := 1; ; attempt++ {
		g := startRLSGateway(t, map[string]string{"config.yaml": rules}, redisStore(url, "istio"+randomSuffix()+":", "allow"), "")
		before := time.Now().Truncate(time.Minute)
		first, second, other := ask(g, "/productpage"), ask(g, "/productpage"), ask(g, "/reviews")
		if !time.Now().Truncate(time.Minute).Equal(before) && attempt < 3 {
			t.Logf("attempt %d crossed a minute's end; again", attempt)
			continue
		}
		wantStatus(t, "first /productpage", first, pb.RateLimitResponse_OK, 0)
		wantStatus(t, "second /productpage", second, pb.RateLimitResponse_OVER_LIMIT, 0)
		wantStatus(t, "/reviews", other, pb.RateLimitResponse_OK, 99)
		return
	}
}
