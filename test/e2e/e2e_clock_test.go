package e2e

// End-to-end tests of the gateway's clock: the test gateway's shifted clock
// (RATELIMIT_TEST_CLOCK_OFFSET, internal/testkit/gateway), and the clock offset measured against
// DynamoDB's Date header. They start their own DynamoDB Local when
// DYNAMODB_ENDPOINT is unset.

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// minuteWindow is one global fixed window of 1 per minute.
const minuteWindow = `policies:
  - name: fw
    key: global
    algorithm: fixed_window
    limit: 1
    window: 1m
`

// waitOutMinuteEdge waits for the next minute when less than margin of this one is left, so that
// the requests of a test with one-minute windows fall in one window of the unshifted clock.
func waitOutMinuteEdge(t *testing.T, margin time.Duration) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < margin {
		t.Logf("%s: %v before the minute ends; waiting for the next one", now.Format(time.TimeOnly), left.Round(time.Millisecond))
		time.Sleep(left + 50*time.Millisecond) // the clock, not a process: nothing to poll
	}
}

// TestTestClockOffsetShiftsDecisions: three replicas share a window of 1 per minute on one table;
// one runs 1m ahead (RATELIMIT_TEST_CLOCK_OFFSET), one 1m behind. The unshifted replica spends the window;
// the shifted ones, in the next and the previous minute by their clocks, each still admit one.
// Without the shift reaching the decisions, all three share one window and admit one in all.
func TestTestClockOffsetShiftsDecisions(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-clock-" + randomSuffix()
	up := newUpstream(t, nil)
	// Correction off: this test is about the raw shift. With correction on, a replica
	// corrects by up to max_correction (5 s) once it has measured, so whether the "1m ahead"
	// replica is 60 s or 55 s ahead would depend on when its first probe came back, and near the
	// start of a minute 55 s does not reach the next window.
	cfg := dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + "    clock: {correct: false}\n" + minuteWindow
	now := startGateway(t, up.URL, cfg, awsEnv()...)
	ahead := startGateway(t, up.URL, cfg, append(awsEnv(), clockOffset("1m"))...)
	behind := startGateway(t, up.URL, cfg, append(awsEnv(), clockOffset("-1m"))...)

	waitOutMinuteEdge(t, 10*time.Second)
	for _, step := range []struct {
		name string
		gw   *gateway
		want int
	}{
		{"unshifted, first", now, http.StatusOK},
		{"unshifted, second", now, http.StatusTooManyRequests},
		{"1m ahead, first (next window)", ahead, http.StatusOK},
		{"1m ahead, second", ahead, http.StatusTooManyRequests},
		{"1m behind, first (previous window)", behind, http.StatusOK},
		{"1m behind, second", behind, http.StatusTooManyRequests},
		{"unshifted, third", now, http.StatusTooManyRequests},
	} {
		if got := statusOf(step.gw.proxy+"/x", ""); got != step.want {
			t.Errorf("%s: status %d, want %d", step.name, got, step.want)
		}
	}
}

// TestClockOffsetIsTheTestGatewaysAlone: the shipped binary has no way to shift its clock (no
// flag, no variable: it reads the variable and ignores it), and the test gateway refuses a value
// that is not a duration, naming the variable.
func TestClockOffsetIsTheTestGatewaysAlone(t *testing.T) {
	code, _, stderr := runCLI(t, "serve", "--config", "x.yaml", "--test-clock-offset", "1m")
	if code == 0 || !strings.Contains(stderr, "unknown flag") {
		t.Errorf("the shipped binary with --test-clock-offset: exit %d, stderr %q; want an unknown flag", code, stderr)
	}
	code, _, stderr = runBinary(t, func(c *exec.Cmd) {
		c.Path, c.Args[0] = testGateway, testGateway
		c.Env = append(os.Environ(), clockOffset("soon"))
	}, "serve", "--config", "x.yaml")
	if code == 0 || !strings.Contains(stderr, "RATELIMIT_TEST_CLOCK_OFFSET") {
		t.Errorf("the test gateway with RATELIMIT_TEST_CLOCK_OFFSET=soon: exit %d, stderr %q; want a failure naming the variable", code, stderr)
	}
}

// clockGauges reads a gateway's clock gauges: the measured offset, its uncertainty and the
// correction, in seconds (NaN until measured).
func clockGauges(t *testing.T, g *gateway) (offset, uncertainty, correction float64) {
	t.Helper()
	_, body := get(t, g.admin+"/metrics")
	fams := parseFamilies(t, body)
	val := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("%s: not on %s/metrics", name, g.admin)
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	return val("ratelimit_clock_offset_seconds"), val("ratelimit_clock_offset_uncertainty_seconds"), val("ratelimit_clock_correction_seconds")
}

// measured polls until the gateway knows its clock's offset within 50ms, and returns the gauges.
// On a machine so loaded that round trips stay long, it settles after 30s for 200ms: the tests'
// bounds are stated in the measured uncertainty, whatever it is.
func measured(t *testing.T, g *gateway) (offset, uncertainty, correction float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		offset, uncertainty, correction = clockGauges(t, g)
		if uncertainty <= 0.05 { // false for NaN
			return offset, uncertainty, correction
		}
		if time.Now().After(deadline) {
			if uncertainty <= 0.2 {
				t.Logf("after 30s: offset %v ± %v (a loaded machine)", offset, uncertainty)
				return offset, uncertainty, correction
			}
			t.Fatalf("after 30s: offset %v ± %v, want an uncertainty within 200ms", offset, uncertainty)
		}
		time.Sleep(100 * time.Millisecond) // polling a process with a deadline
	}
}

// skewPolicy is a token bucket of burst 10 at 5/s: a replica 2s ahead sees 10 more tokens.
const skewPolicy = `identity:
  user_header: X-User-Id
policies:
  - name: tb
    key: user
    algorithm: token_bucket
    rate: 5/s
    burst: 10
`

// TestClockCorrectionAcrossReplicas: replicas started 2s ahead (RATELIMIT_TEST_CLOCK_OFFSET=2s) measure
// their offset against DynamoDB Local's Date header (the host's clock, so -2s), export it, warn,
// and, with store.dynamodb.clock.correct (the default), decide on the corrected clock. A burst
// of 10 at 5/s spent on an in-sync replica and then asked of the corrected one admits at most
// burst + rate × (the real time it took + both replicas' clock errors); asked of a replica that
// does not correct, 10 more: the refill of its 2s.
func TestClockCorrectionAcrossReplicas(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-skew-" + randomSuffix()
	up := newUpstream(t, nil)
	store := func(clock string) string {
		return dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + clock + skewPolicy
	}
	inSync := startGateway(t, up.URL, store(""), awsEnv()...)
	corrected := startGateway(t, up.URL, store(""), append(awsEnv(), clockOffset("2s"))...)
	uncorrected := startGateway(t, up.URL, store("    clock: {correct: false}\n"), append(awsEnv(), clockOffset("2s"))...)

	_, uIn, cIn := measured(t, inSync)
	off, u, c := measured(t, corrected)
	offU, uU, cU := measured(t, uncorrected)
	t.Logf("in sync: ± %.4fs, correction %.4fs; 2s ahead, corrected: %.4fs ± %.4fs, correction %.4fs; 2s ahead, not corrected: %.4fs ± %.4fs",
		uIn, cIn, off, u, c, offU, uU)
	for _, g := range []struct {
		name                   string
		off, u, corr, wantCorr float64
	}{{"corrected", off, u, c, -2}, {"not corrected", offU, uU, cU, 0}} {
		if math.Abs(g.off+2) > g.u+0.001 {
			t.Errorf("%s: offset %v ± %v, want -2s within the uncertainty", g.name, g.off, g.u)
		}
		if math.Abs(g.corr-g.wantCorr) > 2*g.u+0.001 {
			t.Errorf("%s: correction %v, want %v within the interval's width %v", g.name, g.corr, g.wantCorr, 2*g.u)
		}
	}
	if math.Abs(cIn) > 2*uIn+0.001 {
		t.Errorf("in sync: correction %v, want 0 within %v", cIn, 2*uIn)
	}
	for _, g := range []*gateway{corrected, uncorrected} {
		if !strings.Contains(g.logs.String(), "clock is off") {
			t.Errorf("a replica 2s ahead logged no warning:\n%s", g.logs.String())
		}
	}
	if strings.Contains(inSync.logs.String(), "clock is off") {
		t.Errorf("the in-sync replica warned:\n%s", inSync.logs.String())
	}

	// Each replica's decision clock is off by at most its correction's distance to the interval's
	// far end: |offset - correction| + uncertainty.
	errOf := func(off, u, corr float64) float64 { return math.Abs(off-corr) + u }
	burst := func(g *gateway, user string) int {
		var wg sync.WaitGroup
		var mu sync.Mutex
		n := 0
		for range 10 {
			wg.Go(func() {
				if statusOf(g.proxy+"/x", user) == http.StatusOK {
					mu.Lock()
					n++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return n
	}
	for _, c := range []struct {
		name     string
		second   *gateway
		errSum   float64
		overFrom int // admitted at least this many shows the over-admission (0: check the bound)
	}{
		{"corrected", corrected, errOf(0, uIn, cIn) + errOf(off, u, c), 0},
		{"not corrected", uncorrected, 0, 20},
	} {
		user := fmt.Sprintf("skew-%s-%s", strings.ReplaceAll(c.name, " ", "-"), randomSuffix())
		start := time.Now()
		got := burst(inSync, user) + burst(c.second, user)
		elapsed := time.Since(start).Seconds()
		bound := 10 + int(math.Floor(5*(elapsed+c.errSum)))
		t.Logf("%s: %d admitted in %.3fs (bound with the measured errors: %d)", c.name, got, elapsed, bound)
		if c.overFrom == 0 && got > bound {
			t.Errorf("%s: %d admitted, want at most burst + rate × (%.3fs + %.3fs) = %d", c.name, got, elapsed, c.errSum, bound)
		}
		if c.overFrom > 0 && got < c.overFrom {
			t.Errorf("%s: %d admitted in %.3fs, want at least %d: the 2s of refill a clock ahead sees", c.name, got, elapsed, c.overFrom)
		}
	}
}

// TestClockMaxOffsetReadiness: with store.dynamodb.clock.max_offset, a replica 2s ahead that does
// not correct its clock answers /readyz 503 naming the clock, while one that corrects it is ready
// (its decision clock is within the bound) and an in-sync one too.
func TestClockMaxOffsetReadiness(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-skew-ready-" + randomSuffix()
	up := newUpstream(t, nil)
	store := func(clock string) string {
		return dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + clock + skewPolicy
	}
	// Started first: it creates the table, and the readiness of the others is about the clock.
	inSync := startGateway(t, up.URL, store("    clock: {max_offset: 500ms}\n"), awsEnv()...)
	corrected := startGateway(t, up.URL, store("    clock: {max_offset: 500ms}\n"), append(awsEnv(), clockOffset("2s"))...)
	unready := launchGateway(t, nil, up.URL, store("    clock: {correct: false, max_offset: 500ms}\n"), append(awsEnv(), clockOffset("2s"))...)

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(unready.admin + "/readyz")
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body[:n]), "max_offset") {
				t.Logf("/readyz of the uncorrected replica: %d %s", resp.StatusCode, body[:n])
				break
			}
			if resp.StatusCode == http.StatusOK {
				t.Fatalf("/readyz of a replica 2s off with max_offset 500ms: 200, want 503")
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 503 naming max_offset from /readyz after 30s:\n%s", unready.logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a process with a deadline
	}
	for name, g := range map[string]*gateway{"in sync": inSync, "2s ahead, corrected": corrected} {
		if resp, body := get(t, g.admin+"/readyz"); resp.StatusCode != http.StatusOK {
			t.Errorf("%s: /readyz %d %q, want 200", name, resp.StatusCode, body)
		}
	}
	// Unready for the load balancer, but it still decides (on its own clock) if asked.
	if code := statusOf(unready.proxy+"/x", "someone"); code != http.StatusOK {
		t.Errorf("the unready replica answered %d, want 200: readiness routes traffic away, it does not refuse it", code)
	}
}
