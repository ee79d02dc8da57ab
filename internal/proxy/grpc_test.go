package proxy

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc":               true,
		"application/grpc+proto":         true,
		"application/grpc+json":          true,
		"Application/GRPC; charset=utf8": true,
		"application/grpc-web":           false,
		"application/grpc-web+proto":     false,
		"application/grpcx":              false,
		"application/json":               false,
		"":                               false,
	} {
		r, _ := http.NewRequest(http.MethodPost, "http://h/", nil)
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		if got := isGRPC(r); got != want {
			t.Errorf("isGRPC(%q) got %v, want %v", ct, got, want)
		}
	}
}

func TestParseGRPCTimeout(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1H", time.Hour, true}, {"2M", 2 * time.Minute, true}, {"3S", 3 * time.Second, true},
		{"250m", 250 * time.Millisecond, true}, {"7u", 7 * time.Microsecond, true}, {"9n", 9, true},
		{"99999999H", maxGRPCTimeout, true}, {"0m", 0, true},
		{"", 0, false}, {"S", 0, false}, {"1s", 0, false}, {"-1S", 0, false}, {"+1S", 0, false},
		{"123456789S", 0, false}, {"1.5S", 0, false},
	} {
		got, ok := parseGRPCTimeout(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseGRPCTimeout(%q) got %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestGRPCMessageEncoding(t *testing.T) {
	for in, want := range map[string]string{
		`Rate limit of policy "a" exceeded`: `Rate limit of policy "a" exceeded`,
		"50% done":                          "50%25 done",
		"line\nbreak":                       "line%0Abreak",
		"café":                              "caf%C3%A9",
	} {
		if got := grpcMessage(in); got != want {
			t.Errorf("grpcMessage(%q) got %q, want %q", in, got, want)
		}
	}
}

func grpcGet(hs *harness, kv ...string) (*http.Response, string) {
	hs.t.Helper()
	return hs.get("/pkg.Svc/Method", append([]string{"Content-Type", "application/grpc"}, kv...)...)
}

// wantGRPCStatus checks a trailers-only gRPC answer: HTTP 200, no body, the content-type of the
// call and the grpc-status code.
func wantGRPCStatus(t *testing.T, res *http.Response, body, code string) {
	t.Helper()
	if res.StatusCode != http.StatusOK || body != "" {
		t.Errorf("got HTTP %d with body %q, want 200 and no body", res.StatusCode, body)
	}
	wantHeader(t, res, "Content-Type", "application/grpc")
	wantHeader(t, res, "Grpc-Status", code)
	if res.Header.Get("Grpc-Message") == "" {
		t.Error("no grpc-message")
	}
}

func TestGRPC_RejectedIsResourceExhaustedWithRetryInfo(t *testing.T) {
	pol := (&fakePolicies{}).add("per-key", false, 1)
	lim := newFakeLimiter(false, bucket.Result{Allowed: false, Limit: 5, RetryAfter: 1500*time.Millisecond + 1, Reset: 3 * time.Second})
	hs := newHarness(t, pol, lim, nil, nil)
	for i := range 2 { // the second answer comes from the policy's cached rendering
		res, body := grpcGet(hs)
		wantGRPCStatus(t, res, body, "8")
		wantHeader(t, res, "Retry-After", "2")
		wantHeader(t, res, "X-RateLimit-Limit", "5")
		wantHeader(t, res, "X-RateLimit-Remaining", "0")
		raw, err := base64.RawStdEncoding.DecodeString(res.Header.Get("Grpc-Status-Details-Bin"))
		if err != nil {
			t.Fatalf("answer %d: grpc-status-details-bin: %v", i, err)
		}
		var st spb.Status
		if err := proto.Unmarshal(raw, &st); err != nil {
			t.Fatalf("answer %d: status: %v", i, err)
		}
		if st.GetCode() != 8 || len(st.GetDetails()) != 1 {
			t.Fatalf("answer %d: status got code %d with %d details, want 8 with 1", i, st.GetCode(), len(st.GetDetails()))
		}
		var ri errdetails.RetryInfo
		if err := st.GetDetails()[0].UnmarshalTo(&ri); err != nil {
			t.Fatalf("answer %d: detail is not RetryInfo: %v", i, err)
		}
		// Rounded up to the millisecond, never early.
		if got, want := ri.GetRetryDelay().AsDuration(), 1501*time.Millisecond; got != want {
			t.Errorf("answer %d: RetryInfo delay got %v, want %v", i, got, want)
		}
		// The message states the wait RetryInfo holds, not another rounding of it.
		const msg = `Rate limit of policy "per-key" exceeded; retry after 1.501s.`
		if got := res.Header.Get("Grpc-Message"); got != msg || st.GetMessage() != msg {
			t.Errorf("answer %d: grpc-message %q, status message %q, want %q", i, got, st.GetMessage(), msg)
		}
	}
	if got := hs.up.hits.Load(); got != 0 {
		t.Errorf("upstream hits = %d, want 0", got)
	}
	// An HTTP request to the same policy still gets problem+json.
	res, body := hs.get("/")
	if p := decodeProblem(t, res, body); res.StatusCode != http.StatusTooManyRequests || p.Type != answer.ProblemRateLimited {
		t.Errorf("HTTP request: got %d %q, want 429 rate-limited", res.StatusCode, p.Type)
	}
	wantCounter(t, hs.reg, 2, "ratelimit_protocol_decisions_total", "protocol", "grpc", "result", "limited")
	wantCounter(t, hs.reg, 1, "ratelimit_protocol_decisions_total", "protocol", "http1", "result", "limited")
	wantCounter(t, hs.reg, 3, mDecisions, "result", "limited")
}

func TestGRPC_StatusMapping(t *testing.T) {
	t.Run("unauthenticated", func(t *testing.T) {
		pol := &fakePolicies{err: policy.ErrUnauthorized}
		hs := newHarness(t, pol, newFakeLimiter(true), nil, nil)
		res, body := grpcGet(hs)
		wantGRPCStatus(t, res, body, "16")
	})
	t.Run("store down, on_error deny", func(t *testing.T) {
		pol := (&fakePolicies{}).add("p", false, 1)
		lim := newFakeLimiter(true)
		lim.err = errors.New("store: connection reset")
		lim.rule = bucket.Deny
		hs := newHarness(t, pol, lim, nil, nil)
		res, body := grpcGet(hs)
		wantGRPCStatus(t, res, body, "14")
	})
	t.Run("plan failed", func(t *testing.T) {
		pol := &fakePolicies{err: errors.New("broken")}
		hs := newHarness(t, pol, newFakeLimiter(true), nil, nil)
		res, body := grpcGet(hs)
		wantGRPCStatus(t, res, body, "13")
	})
	t.Run("upstream refused", func(t *testing.T) {
		up := newUpstream(t, nil)
		up.Close()
		pol := (&fakePolicies{}).add("p", false, 1)
		hs := newHarness(t, pol, newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 1}), up, nil)
		res, body := grpcGet(hs)
		wantGRPCStatus(t, res, body, "14")
	})
}

// TestGRPC_TimeoutBoundsTheStore: a call's grpc-timeout shorter than store.timeout ends the
// store's wait, and the call gets DEADLINE_EXCEEDED (not on_error's answer).
func TestGRPC_TimeoutBoundsTheStore(t *testing.T) {
	pol := (&fakePolicies{}).add("p", false, 1)
	lim := newFakeLimiter(true)
	lim.block = true
	hs := newHarness(t, pol, lim, nil, func(o *Options) { o.StoreTimeout = time.Minute })
	start := time.Now()
	res, body := grpcGet(hs, "Grpc-Timeout", "50m")
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("answered after %v: the store waited for store.timeout, not the call's deadline", took)
	}
	wantGRPCStatus(t, res, body, "4")
	if got := hs.up.hits.Load(); got != 0 {
		t.Errorf("upstream hits = %d, want 0: on_error allow must not forward a call past its deadline", got)
	}
}

// FuzzParseGRPCTimeout: any header value parses without panicking; what is accepted is 1 to 8
// digits and a unit, never negative, and 8 digits of any unit never overflow.
func FuzzParseGRPCTimeout(f *testing.F) {
	for _, s := range []string{"1H", "99999999H", "250m", "0n", "-1S", "1.5S", "", "S", "123456789u"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := parseGRPCTimeout(s)
		if !ok {
			return
		}
		if d < 0 {
			t.Fatalf("parseGRPCTimeout(%q) = %v, negative", s, d)
		}
		digits := s[:len(s)-1]
		if len(digits) < 1 || len(digits) > 8 || strings.Trim(digits, "0123456789") != "" ||
			!strings.ContainsRune("HMSmun", rune(s[len(s)-1])) {
			t.Fatalf("parseGRPCTimeout(%q) accepted a value outside the grammar", s)
		}
	})
}

// deadlineWriter is a ResponseWriter whose stream read deadline can be set, and that records
// every SetReadDeadline made after the handler returned (net/http forbids touching a
// ResponseWriter then: Go's HTTP/2 server clears the stream's state, a data race).
type deadlineWriter struct {
	http.ResponseWriter
	mu       sync.Mutex
	returned bool
	late     int
}

func (w *deadlineWriter) SetReadDeadline(time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.returned {
		w.late++
	}
	return nil
}

// An upstream may answer a gRPC call before it has read the call's body (Unimplemented does):
// the reverse proxy returns, and so does the handler, while the HTTP/2 transport's goroutine
// still reads the body to send it. Those reads must not move the stream's read deadline any
// more (the race TestKubernetesGRPCExampleServes met in a race-enabled binary).
func TestIdleBodyLeavesTheWriterWhenTheHandlerReturns(t *testing.T) {
	w := &deadlineWriter{ResponseWriter: httptest.NewRecorder()}
	r := httptest.NewRequest(http.MethodPost, "/svc/Method", strings.NewReader("a gRPC message or two"))
	r.ProtoMajor, r.ProtoMinor = 2, 0
	r.Header.Set("Content-Type", "application/grpc")
	r, cancel := grpcDeadline(w, r, time.Second)
	buf := make([]byte, 4)
	if _, err := r.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel() // ServeHTTP returns
	w.mu.Lock()
	w.returned = true
	w.mu.Unlock()
	for {
		if _, err := r.Body.Read(buf); err != nil {
			break
		}
	}
	if w.late != 0 {
		t.Errorf("%d SetReadDeadline calls after the handler returned, want 0", w.late)
	}
}
