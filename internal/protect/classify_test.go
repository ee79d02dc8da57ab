package protect

import (
	"net/http/httptest"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

func TestClassify(t *testing.T) {
	c := NewClassifier([]policy.PriorityConfig{
		// viper hands header names in lower case; they match in any case.
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
		if got := c.Classify(r); got != tc.want {
			t.Errorf("%s %s (X-Priority %q): got %v, want %v", tc.method, tc.target, tc.header, got, tc.want)
		}
	}
	if got := (*Classifier)(nil).Classify(httptest.NewRequest("GET", "/", nil)); got != Default {
		t.Errorf("nil classifier: got %v, want default", got)
	}
}
