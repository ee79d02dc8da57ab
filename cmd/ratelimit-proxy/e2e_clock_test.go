package main

// End-to-end tests of the gateway's clock: the test-only --test-clock-offset flag, and the clock
// offset measured against DynamoDB's Date header. They start their own DynamoDB Local when
// DYNAMODB_ENDPOINT is unset.

import (
	"net/http"
	"strings"
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
// one runs with --test-clock-offset=1m, one with -1m. The unshifted replica spends the window;
// the shifted ones, in the next and the previous minute by their clocks, each still admit one.
// Without the flag reaching the decisions, all three share one window and admit one in all.
func TestTestClockOffsetShiftsDecisions(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-clock-" + randomSuffix()
	up := newUpstream(t, nil)
	cfg := dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + minuteWindow
	now := startGateway(t, up.URL, cfg, awsEnv()...)
	ahead := startGatewayArgs(t, []string{"--test-clock-offset=1m"}, up.URL, cfg, awsEnv()...)
	behind := startGatewayArgs(t, []string{"--test-clock-offset", "-1m"}, up.URL, cfg, awsEnv()...)

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

// TestTestClockOffsetIsHidden: the flag is for tests: serve --help does not offer it, and a value
// that is not a duration is refused.
func TestTestClockOffsetIsHidden(t *testing.T) {
	code, stdout, stderr := runCLI(t, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d, stderr %q", code, stderr)
	}
	if strings.Contains(stdout, "clock") {
		t.Errorf("serve --help shows the test-only flag:\n%s", stdout)
	}
	code, _, stderr = runCLI(t, "serve", "--config", "x.yaml", "--test-clock-offset", "soon")
	if code == 0 || !strings.Contains(stderr, "test-clock-offset") {
		t.Errorf("--test-clock-offset soon: exit %d, stderr %q; want a failure naming the flag", code, stderr)
	}
}
