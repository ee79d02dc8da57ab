package protect

import (
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

func TestClassify(t *testing.T) {
	c := NewClassifier([]policy.PriorityConfig{
		// header names match in any case.
		{Name: "critical", Match: policy.PriorityMatchConfig{Headers: map[string]string{"x-priority": "critical"}}},
		{Name: "sheddable", Match: policy.PriorityMatchConfig{Methods: []string{"GET"}, PathPrefix: "/batch/"}},
		{Name: "critical", Match: policy.PriorityMatchConfig{PathPrefix: "/Pay", PathCaseSensitive: true}},
	})
	for _, tc := range []struct {
		method, target, header string
		want                   Class
	}{
		{"GET", "/x", "critical", Critical},
		{"GET", "/x", "Critical", Default}, // values match exactly
		{"GET", "/batch/job", "", Sheddable},
		{"HEAD", "/batch/job", "", Sheddable}, // GET brings HEAD
		{"get", "/BATCH//job", "", Sheddable}, // canonical method and path, folded
		{"GET", "/batch", "", Sheddable},      // a prefix ending in / matches the bare path
		{"POST", "/batch/job", "", Default},
		{"GET", "/batchx", "", Default},
		{"POST", "/Pay/now", "", Critical},
		{"POST", "/pay/now", "", Default},           // case-sensitive prefix
		{"GET", "/batch/job", "critical", Critical}, // first match wins
	} {
		r := httptest.NewRequest("GET", "http://x"+tc.target, nil)
		r.Method = tc.method
		if tc.header != "" {
			r.Header.Set("X-Priority", tc.header)
		}
		if got := c.Classify(r, trustAll{}); got != tc.want {
			t.Errorf("%s %s (X-Priority %q): got %v, want %v", tc.method, tc.target, tc.header, got, tc.want)
		}
	}
	if got := (*Classifier)(nil).Classify(httptest.NewRequest("GET", "/", nil), nil); got != Default {
		t.Errorf("nil classifier: got %v, want default", got)
	}
}

type trustAll struct{}

func (trustAll) Trusted(netip.Addr) bool { return true }

type trustOnly netip.Prefix

func (p trustOnly) Trusted(a netip.Addr) bool { return netip.Prefix(p).Contains(a) }

// TestClassifyHeaderBelievedOnlyFromTrustedPeers: a header rule matches only a request whose TCP
// peer is trusted, and never a header sent on several lines (one a client added beside the
// proxy's). Routes match from anyone. On 85d8db7 any client's X-Priority: critical matched,
// and so did X-Priority: low plus X-Priority: critical.
func TestClassifyHeaderBelievedOnlyFromTrustedPeers(t *testing.T) {
	c := NewClassifier([]policy.PriorityConfig{
		{Name: "critical", Match: policy.PriorityMatchConfig{Headers: map[string]string{"X-Priority": "critical"}}},
		{Name: "critical", Match: policy.PriorityMatchConfig{PathPrefix: "/pay/"}},
	})
	proxy := trustOnly(netip.MustParsePrefix("10.0.0.0/8"))
	for _, tc := range []struct {
		name   string
		remote string
		t      Trust
		path   string
		values []string
		want   Class
	}{
		{"trusted proxy", "10.1.2.3:5000", proxy, "/x", []string{"critical"}, Critical},
		{"trusted proxy, IPv4-mapped", "[::ffff:10.1.2.3]:5000", proxy, "/x", []string{"critical"}, Critical},
		{"any client", "192.0.2.7:5000", proxy, "/x", []string{"critical"}, Default},
		{"no trusted proxies", "10.1.2.3:5000", nil, "/x", []string{"critical"}, Default},
		{"no address", "@unix", proxy, "/x", []string{"critical"}, Default},
		{"two lines from a trusted proxy", "10.1.2.3:5000", proxy, "/x", []string{"low", "critical"}, Default},
		{"two equal lines", "10.1.2.3:5000", proxy, "/x", []string{"critical", "critical"}, Default},
		{"a route from any client", "192.0.2.7:5000", proxy, "/pay/now", nil, Critical},
	} {
		r := httptest.NewRequest("GET", "http://x"+tc.path, nil)
		r.RemoteAddr = tc.remote
		for _, v := range tc.values {
			r.Header.Add("X-Priority", v)
		}
		if got := c.Classify(r, tc.t); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
