package protect

import (
	"testing"
	"time"
)

// TestLatencyMeasuresTheUpstreamAlone: the sample runs from the end of the request's body to the
// answer's headers; requests that say nothing about the upstream are left out. On 85d8db7 the
// proxy timed from the start of the forward (the client's upload included) and counted an
// abandoned request as the time until its client left.
func TestLatencyMeasuresTheUpstreamAlone(t *testing.T) {
	sent := t0.Add(5 * time.Second) // a body that took 5 s to arrive ended here
	for _, tc := range []struct {
		name     string
		o        Outcome
		sent, at time.Time
		want     time.Duration
		ok       bool
	}{
		{"answered", Answered, sent, sent.Add(40 * time.Millisecond), 40 * time.Millisecond, true},
		{"failed upstream: at least this long", Failed, sent, sent.Add(time.Second), time.Second, true},
		{"abandoned after 3 ms", Abandoned, sent, sent.Add(3 * time.Millisecond), 0, false},
		{"never sent", NotSent, sent, sent.Add(time.Millisecond), 0, false},
		{"body never ended", Answered, time.Time{}, sent, 0, false},
		{"answered before the body ended", Answered, sent, sent.Add(-time.Millisecond), 0, false},
	} {
		d, ok := Latency(tc.o, tc.sent, tc.at)
		if d != tc.want || ok != tc.ok {
			t.Errorf("%s: got %v, %v, want %v, %v", tc.name, d, ok, tc.want, tc.ok)
		}
	}
}
