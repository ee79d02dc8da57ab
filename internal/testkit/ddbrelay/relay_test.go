package ddbrelay_test

import (
	"context"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
)

// clock is a settable clock for the relay's Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// t0 is the start of a whole second, so that t0 and t0+999ms share a window.
var t0 = time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)

// recorded is one request as the fake server saw it.
type recorded struct {
	target, host, auth string
	body               []byte
}

// fakeServer answers every request 200 {} and records it.
type fakeServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	f := &fakeServer{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{r.Header.Get("X-Amz-Target"), r.Host, r.Header.Get("Authorization"), b})
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) received() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

func newRelay(t *testing.T, target string, budget int, c *clock) (*ddbrelay.Relay, *httptest.Server) {
	t.Helper()
	r, err := ddbrelay.New(target, ddbrelay.Options{WritesPerItemPerSecond: budget, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, srv
}

// post sends one DynamoDB JSON request and returns the status and body.
func post(t *testing.T, url, op, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "dynamodb.us-east-1.amazonaws.com"
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDLOCAL/20261203/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=abc")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, b
}

const (
	update = `{"TableName":"t","Key":{"pk":{"S":"a"}},"UpdateExpression":"ADD #c :one"}`
	put    = `{"TableName":"t","Item":{"pk":{"S":"b"},"v":{"N":"1"}}}`
	del    = `{"TableName":"t","Key":{"pk":{"S":"c"}}}`
	txn    = `{"TransactItems":[{"Update":{"TableName":"t","Key":{"pk":{"S":"a"}},"UpdateExpression":"ADD #c :one"}},` +
		`{"Put":{"TableName":"u","Item":{"pk":{"S":"b"}}}},{"Delete":{"TableName":"t","Key":{"pk":{"S":"c"}}}},` +
		`{"ConditionCheck":{"TableName":"t","Key":{"pk":{"S":"d"}},"ConditionExpression":"attribute_exists(pk)"}}]}`
	batch = `{"RequestItems":{"t":[{"PutRequest":{"Item":{"pk":{"S":"a"},"x":{"S":"y"}}}},{"DeleteRequest":{"Key":{"pk":{"S":"e"}}}}],` +
		`"u":[{"DeleteRequest":{"Key":{"pk":{"S":"a"}}}}]}}`
)

func TestWritesAreAttributedToTheirItems(t *testing.T) {
	for _, tc := range []struct {
		op, body string
		want     map[ddbrelay.Item]int64
	}{
		{"UpdateItem", update, map[ddbrelay.Item]int64{{Table: "t", Key: "a"}: 1}},
		{"PutItem", put, map[ddbrelay.Item]int64{{Table: "t", Key: "b"}: 1}},
		{"DeleteItem", del, map[ddbrelay.Item]int64{{Table: "t", Key: "c"}: 1}},
		{"TransactWriteItems", txn, map[ddbrelay.Item]int64{{Table: "t", Key: "a"}: 1, {Table: "u", Key: "b"}: 1, {Table: "t", Key: "c"}: 1, {Table: "t", Key: "d"}: 1}},
		{"BatchWriteItem", batch, map[ddbrelay.Item]int64{{Table: "t", Key: "a"}: 1, {Table: "t", Key: "e"}: 1, {Table: "u", Key: "a"}: 1}},
		{"UpdateItem", `{"TableName":"t","Key":{"id":{"N":"7"},"sk":{"S":"x"}}}`, map[ddbrelay.Item]int64{{Table: "t", Key: `{"id":{"N":"7"},"sk":{"S":"x"}}`}: 1}},
		{"UpdateItem", `{"TableName":"t","Key":{"n":{"N":"42"}}}`, map[ddbrelay.Item]int64{{Table: "t", Key: "42"}: 1}},
	} {
		t.Run(tc.op, func(t *testing.T) {
			f := newFakeServer(t)
			r, srv := newRelay(t, f.URL, 100, &clock{t: t0})
			if code, _, _ := post(t, srv.URL, tc.op, tc.body); code != http.StatusOK {
				t.Fatalf("status got %d, want 200", code)
			}
			st := r.Stats()
			var n int64
			for _, c := range tc.want {
				n += c
			}
			if st.Writes != (ddbrelay.Count{Forwarded: n}) || st.Ops[tc.op] != (ddbrelay.OpStats{Requests: 1, Writes: ddbrelay.Count{Forwarded: n}}) {
				t.Errorf("writes got %+v, op %+v; want %d forwarded in 1 request", st.Writes, st.Ops[tc.op], n)
			}
			if len(st.Windows) != 1 || !st.Windows[0].Start.Equal(t0) {
				t.Fatalf("windows got %+v, want one at %v", st.Windows, t0)
			}
			got := st.Windows[0].Items
			if len(got) != len(tc.want) {
				t.Errorf("items got %v, want %v", got, tc.want)
			}
			for it, c := range tc.want {
				if got[it] != (ddbrelay.Count{Forwarded: c}) {
					t.Errorf("item %v got %+v, want %d forwarded", it, got[it], c)
				}
			}
		})
	}
}

func TestForwardsBodyAndSignedHeadersUnchanged(t *testing.T) {
	f := newFakeServer(t)
	_, srv := newRelay(t, f.URL, 10, &clock{t: t0})
	for _, op := range []string{"UpdateItem", "GetItem"} {
		if code, _, _ := post(t, srv.URL, op, update); code != http.StatusOK {
			t.Fatalf("%s status got %d, want 200", op, code)
		}
	}
	got := f.received()
	if len(got) != 2 {
		t.Fatalf("server got %d requests, want 2", len(got))
	}
	for _, r := range got {
		if string(r.body) != update || r.host != "dynamodb.us-east-1.amazonaws.com" || !strings.Contains(r.auth, "Signature=abc") {
			t.Errorf("%s arrived as body %q host %q auth %q; want them unchanged", r.target, r.body, r.host, r.auth)
		}
	}
}

func TestThrottlesOverBudgetLikeDynamoDB(t *testing.T) {
	f := newFakeServer(t)
	c := &clock{t: t0}
	r, srv := newRelay(t, f.URL, 3, c)
	for i := range 3 {
		c.Set(t0.Add(time.Duration(i) * 300 * time.Millisecond))
		if code, _, _ := post(t, srv.URL, "UpdateItem", update); code != http.StatusOK {
			t.Fatalf("write %d: status got %d, want 200", i+1, code)
		}
	}
	c.Set(t0.Add(999 * time.Millisecond))
	code, h, body := post(t, srv.URL, "UpdateItem", update)
	if code != http.StatusBadRequest {
		t.Fatalf("4th write in one second: status got %d, want 400", code)
	}
	if ct := h.Get("Content-Type"); ct != "application/x-amz-json-1.0" {
		t.Errorf("Content-Type got %q, want application/x-amz-json-1.0", ct)
	}
	if crc := h.Get("X-Amz-Crc32"); crc != strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10) {
		t.Errorf("X-Amz-Crc32 got %q, want the body's CRC32", crc)
	}
	var e map[string]string
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if len(e) != 2 || e["__type"] != "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException" || e["message"] == "" {
		t.Errorf("body got %q, want exactly __type ProvisionedThroughputExceededException and a message", body)
	}
	// Other items and reads are not affected.
	if code, _, _ := post(t, srv.URL, "PutItem", put); code != http.StatusOK {
		t.Errorf("write of another item: status got %d, want 200", code)
	}
	for range 10 {
		if code, _, _ := post(t, srv.URL, "GetItem", update); code != http.StatusOK {
			t.Errorf("read of the throttled item: status got %d, want 200", code)
		}
	}
	// A transaction touching the exhausted item is throttled whole and consumes nothing.
	if code, _, _ := post(t, srv.URL, "TransactWriteItems", txn); code != http.StatusBadRequest {
		t.Errorf("transaction with an exhausted item: status got %d, want 400", code)
	}
	// The next second refills the budget.
	c.Set(t0.Add(time.Second))
	if code, _, _ := post(t, srv.URL, "TransactWriteItems", txn); code != http.StatusOK {
		t.Errorf("transaction in the next second: status got %d, want 200", code)
	}

	if n := len(f.received()); n != 3+1+10+1 {
		t.Errorf("server got %d requests, want 15 (nothing throttled may reach it)", n)
	}
	st := r.Stats()
	a, b := ddbrelay.Item{Table: "t", Key: "a"}, ddbrelay.Item{Table: "u", Key: "b"}
	if st.Writes != (ddbrelay.Count{Forwarded: 3 + 1 + 4, Throttled: 1 + 4}) {
		t.Errorf("writes got %+v, want 8 forwarded, 5 throttled", st.Writes)
	}
	if st.Reads != 10 || st.Ops["GetItem"].Requests != 10 {
		t.Errorf("reads got %d (GetItem %+v), want 10", st.Reads, st.Ops["GetItem"])
	}
	if got := st.Ops["TransactWriteItems"]; got != (ddbrelay.OpStats{Requests: 2, Writes: ddbrelay.Count{Forwarded: 4, Throttled: 4}}) {
		t.Errorf("TransactWriteItems got %+v, want 2 requests, 4 forwarded, 4 throttled", got)
	}
	if got := st.Ops["UpdateItem"]; got != (ddbrelay.OpStats{Requests: 4, Writes: ddbrelay.Count{Forwarded: 3, Throttled: 1}}) {
		t.Errorf("UpdateItem got %+v, want 4 requests, 3 forwarded, 1 throttled", got)
	}
	if len(st.Windows) != 2 {
		t.Fatalf("windows got %d, want 2", len(st.Windows))
	}
	if got := st.Windows[0].Items[a]; got != (ddbrelay.Count{Forwarded: 3, Throttled: 2}) {
		t.Errorf("first second, item a: got %+v, want 3 forwarded, 2 throttled", got)
	}
	if got := st.Windows[0].Items[b]; got != (ddbrelay.Count{Throttled: 1}) {
		t.Errorf("first second, item u/b: got %+v, want 1 throttled (its transaction was)", got)
	}
	if got := st.Windows[1].Items[a]; got != (ddbrelay.Count{Forwarded: 1}) {
		t.Errorf("second second, item a: got %+v, want 1 forwarded", got)
	}
	want := ddbrelay.Peak{Item: a, Start: t0, Count: ddbrelay.Count{Forwarded: 3, Throttled: 2}}
	if st.Hottest != want || st.HottestForwarded != want {
		t.Errorf("hottest got %+v / %+v, want %+v", st.Hottest, st.HottestForwarded, want)
	}
}

func TestRequestWritingOneItemTwiceNeedsBudgetForBoth(t *testing.T) {
	f := newFakeServer(t)
	r, srv := newRelay(t, f.URL, 2, &clock{t: t0})
	if code, _, _ := post(t, srv.URL, "UpdateItem", update); code != http.StatusOK {
		t.Fatalf("first write: status %d, want 200", code)
	}
	twice := `{"RequestItems":{"t":[{"DeleteRequest":{"Key":{"pk":{"S":"a"}}}},{"DeleteRequest":{"Key":{"pk":{"S":"a"}}}}]}}`
	if code, _, _ := post(t, srv.URL, "BatchWriteItem", twice); code != http.StatusBadRequest {
		t.Errorf("two writes of an item with one left: status %d, want 400", code)
	}
	if got := r.Stats().Writes; got != (ddbrelay.Count{Forwarded: 1, Throttled: 2}) {
		t.Errorf("writes got %+v, want 1 forwarded, 2 throttled", got)
	}
}

func TestClockSteppingBackGrantsNoSecondBudget(t *testing.T) {
	f := newFakeServer(t)
	c := &clock{t: t0.Add(time.Second)}
	r, srv := newRelay(t, f.URL, 1, c)
	if code, _, _ := post(t, srv.URL, "UpdateItem", update); code != http.StatusOK {
		t.Fatalf("first write: status %d, want 200", code)
	}
	c.Set(t0)
	if code, _, _ := post(t, srv.URL, "UpdateItem", update); code != http.StatusBadRequest {
		t.Errorf("a write after the clock stepped back: status %d, want 400 (same window)", code)
	}
	if w := r.Stats().Windows; len(w) != 1 || !w[0].Start.Equal(t0.Add(time.Second)) {
		t.Errorf("windows got %+v, want only the newest", w)
	}
}

func TestUnparseableWriteIsForwardedUnattributed(t *testing.T) {
	f := newFakeServer(t)
	r, srv := newRelay(t, f.URL, 1, &clock{t: t0})
	for _, body := range []string{`not json`, `{"TableName":"t"}`, `{"TransactItems":[{}]}`} {
		if code, _, _ := post(t, srv.URL, "UpdateItem", body); code != http.StatusOK {
			t.Errorf("body %q: status %d, want 200 (the server judges it)", body, code)
		}
	}
	st := r.Stats()
	if st.Unattributed != 3 || st.Writes != (ddbrelay.Count{}) {
		t.Errorf("got unattributed %d, writes %+v; want 3 and none", st.Unattributed, st.Writes)
	}
}

func TestWindowHistoryIsBounded(t *testing.T) {
	f := newFakeServer(t)
	c := &clock{t: t0}
	r, err := ddbrelay.New(f.URL, ddbrelay.Options{WritesPerItemPerSecond: 1, Now: c.Now, WindowHistory: 2})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	for i := range 5 {
		c.Set(t0.Add(time.Duration(i) * time.Second))
		post(t, srv.URL, "UpdateItem", update)
	}
	st := r.Stats()
	if len(st.Windows) != 2 || !st.Windows[0].Start.Equal(t0.Add(3*time.Second)) || !st.Windows[1].Start.Equal(t0.Add(4*time.Second)) {
		t.Errorf("windows got %+v, want the last two", st.Windows)
	}
	if st.Writes.Forwarded != 5 || st.Hottest.Start != t0 {
		t.Errorf("totals got %+v hottest %+v, want 5 forwarded and the first window hottest", st.Writes, st.Hottest)
	}
}

func TestResetStatsStartsTheCountsOver(t *testing.T) {
	f := newFakeServer(t)
	c := &clock{t: t0}
	r, err := ddbrelay.New(f.URL, ddbrelay.Options{WritesPerItemPerSecond: 1, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	post(t, srv.URL, "UpdateItem", update)
	post(t, srv.URL, "UpdateItem", update) // over the budget: throttled
	r.ResetStats()
	if st := r.Stats(); st.Writes != (ddbrelay.Count{}) || len(st.Ops) != 0 || len(st.Windows) != 0 || st.Hottest != (ddbrelay.Peak{}) {
		t.Fatalf("after ResetStats got %+v, want nothing counted", st)
	}
	c.Set(t0.Add(time.Second))
	post(t, srv.URL, "UpdateItem", update)
	if st := r.Stats(); st.Writes.Forwarded != 1 || st.Ops["UpdateItem"].Requests != 1 || st.Hottest.Forwarded != 1 {
		t.Errorf("after a write got %+v, want exactly that write", st)
	}
}

func TestServerDownIs502(t *testing.T) {
	f := newFakeServer(t)
	url := f.URL
	f.Close()
	_, srv := newRelay(t, url, 1, &clock{t: t0})
	if code, _, _ := post(t, srv.URL, "UpdateItem", update); code != http.StatusBadGateway {
		t.Errorf("status got %d, want 502", code)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		target string
		budget int
		want   string
	}{
		{"127.0.0.1:8000", 1, `target "127.0.0.1:8000"`},
		{"http://127.0.0.1:8000", -1, "WritesPerItemPerSecond -1"},
		{"http://127.0.0.1:8000", -2, "Jitter -1ns"},
	} {
		o := ddbrelay.Options{WritesPerItemPerSecond: tc.budget}
		if tc.budget == -2 {
			o = ddbrelay.Options{Jitter: -1}
		}
		if _, err := ddbrelay.New(tc.target, o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q, %d) error %v, want one naming %s", tc.target, tc.budget, err, tc.want)
		}
	}
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeSleep records each wait and advances the clock by it instead of waiting.
type fakeSleep struct {
	c     *clock
	mu    sync.Mutex
	waits []time.Duration
}

func (f *fakeSleep) Sleep(_ context.Context, d time.Duration) error {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	f.c.Add(d)
	return nil
}

func TestDelayPlusJitterOnEveryCallSeededAndMeasured(t *testing.T) {
	const delay, jitter, calls = 10 * time.Millisecond, 20 * time.Millisecond, 400
	run := func(seed uint64) (*ddbrelay.Relay, []time.Duration) {
		f := newFakeServer(t)
		c := &clock{t: t0}
		fs := &fakeSleep{c: c}
		r, err := ddbrelay.New(f.URL, ddbrelay.Options{Now: c.Now, Delay: delay, Jitter: jitter, Seed: seed, Sleep: fs.Sleep})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(r)
		defer srv.Close()
		for i := range calls {
			op := "UpdateItem"
			if i%4 == 0 {
				op = "GetItem"
			}
			if code, _, _ := post(t, srv.URL, op, update); code != http.StatusOK {
				t.Fatalf("call %d: status %d, want 200", i, code)
			}
		}
		if n := len(f.received()); n != calls {
			t.Fatalf("server got %d calls, want %d", n, calls)
		}
		return r, fs.waits
	}
	r, waits := run(7)
	if len(waits) != calls {
		t.Fatalf("got %d waits, want one per call (%d)", len(waits), calls)
	}
	lo, hi := waits[0], waits[0]
	for _, d := range waits {
		if d < delay || d > delay+jitter {
			t.Fatalf("a wait of %v, want within [%v, %v]", d, delay, delay+jitter)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	// Uniform over 20 ms: 400 draws all within the lowest or highest 2 ms has probability ~0.
	if lo > delay+2*time.Millisecond || hi < delay+jitter-2*time.Millisecond {
		t.Errorf("waits spread over [%v, %v], want the whole [%v, %v]", lo, hi, delay, delay+jitter)
	}
	if _, again := run(7); !slices.Equal(again, waits) {
		t.Errorf("seed 7 twice gave different waits")
	}
	if _, other := run(8); slices.Equal(other, waits) {
		t.Errorf("seeds 7 and 8 gave the same waits")
	}

	// The fake server answers in no (fake) time, so each answer took exactly its wait.
	sorted := slices.Clone(waits)
	slices.Sort(sorted)
	st := r.Stats()
	near := func(what string, got, want time.Duration) {
		t.Helper()
		if diff := (got - want).Abs(); float64(diff) > float64(want)/64 {
			t.Errorf("%s got %v, want %v within 1/64", what, got, want)
		}
	}
	if st.Latency.Count != calls || st.Latency.Max != sorted[calls-1] {
		t.Errorf("latency got %+v, want %d calls, max %v", st.Latency, calls, sorted[calls-1])
	}
	near("p50", st.Latency.P50, sorted[calls/2-1])
	near("p99", st.Latency.P99, sorted[calls*99/100-1])
	var perOp []time.Duration
	for i, d := range waits {
		if i%4 == 0 {
			perOp = append(perOp, d)
		}
	}
	slices.Sort(perOp)
	get := st.OpLatency["GetItem"]
	if get.Count != calls/4 || get.Max != perOp[len(perOp)-1] {
		t.Errorf("GetItem latency got %+v, want %d calls, max %v", get, calls/4, perOp[len(perOp)-1])
	}
	near("GetItem p50", get.P50, perOp[len(perOp)/2-1])
	if st.OpLatency["UpdateItem"].Count != calls*3/4 {
		t.Errorf("UpdateItem latency got %+v, want %d calls", st.OpLatency["UpdateItem"], calls*3/4)
	}
	r.ResetStats()
	if st := r.Stats(); st.Latency != (ddbrelay.Latency{}) || len(st.OpLatency) != 0 {
		t.Errorf("after ResetStats latency got %+v %v, want none", st.Latency, st.OpLatency)
	}
}

func TestThrottledCallsAreDelayedToo(t *testing.T) {
	f := newFakeServer(t)
	c := &clock{t: t0}
	fs := &fakeSleep{c: c}
	r, err := ddbrelay.New(f.URL, ddbrelay.Options{WritesPerItemPerSecond: 1, Now: c.Now, Delay: 300 * time.Millisecond, Sleep: fs.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	post(t, srv.URL, "UpdateItem", update)
	if code, _, _ := post(t, srv.URL, "UpdateItem", update); code != http.StatusBadRequest {
		t.Fatalf("second write in the window: status %d, want 400", code)
	}
	if st := r.Stats(); st.Latency.Count != 2 || st.Latency.P50 != 300*time.Millisecond || st.Latency.Max != 300*time.Millisecond {
		t.Errorf("latency got %+v, want 2 calls of exactly 300ms", st.Latency)
	}
}

func TestDelayIsRealAndACallerThatLeavesIsNotForwarded(t *testing.T) {
	f := newFakeServer(t)
	r, err := ddbrelay.New(f.URL, ddbrelay.Options{Delay: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	start := time.Now()
	post(t, srv.URL, "GetItem", update)
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Errorf("a call took %v, want at least the 40ms delay", el)
	}
	if st := r.Stats(); st.Latency.Max < 40*time.Millisecond {
		t.Errorf("relay's latency got %+v, want at least 40ms", st.Latency)
	}

	slow, err := ddbrelay.New(f.URL, ddbrelay.Options{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ssrv := httptest.NewServer(slow)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ssrv.URL, strings.NewReader(update))
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.UpdateItem")
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("a call delayed an hour answered %d within 50ms", res.StatusCode)
	}
	ssrv.Close() // waits for the handler
	if n := len(f.received()); n != 1 {
		t.Errorf("server got %d calls, want 1 (the abandoned one must not be forwarded)", n)
	}
	if st := slow.Stats(); st.Latency.Count != 1 || st.Writes.Attempted() != 0 {
		t.Errorf("abandoned call: latency %+v, writes %+v; want it timed and not counted as a write", st.Latency, st.Writes)
	}
}

// TestWatchSeesEveryForwardedWrite: Watch is told of each write the server applied, a
// duplicate's copy included, with the instants that bound it; reads and writes the relay never
// forwarded (a throttle) are not writes it applied.
func TestWatchSeesEveryForwardedWrite(t *testing.T) {
	f := newFakeServer(t)
	var mu sync.Mutex
	var seen []ddbrelay.Write
	c := &clock{t: t0}
	r, err := ddbrelay.New(f.URL, ddbrelay.Options{Now: c.Now, WritesPerItemPerSecond: 2,
		Faults: []ddbrelay.Fault{{Kind: ddbrelay.FaultDuplicate, Op: "DeleteItem", Rate: 1}},
		Watch: func(w ddbrelay.Write) {
			mu.Lock()
			seen = append(seen, w)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	post(t, srv.URL, "UpdateItem", update)
	post(t, srv.URL, "GetItem", `{"TableName":"t","Key":{"pk":{"S":"a"}}}`)
	post(t, srv.URL, "DeleteItem", del) // applied twice
	post(t, srv.URL, "UpdateItem", update)
	if code, _, _ := post(t, srv.URL, "UpdateItem", update); code == http.StatusOK {
		t.Fatal("third write of item a in one second: got 200, want a throttle")
	}
	mu.Lock()
	defer mu.Unlock()
	var ops []string
	for _, w := range seen {
		ops = append(ops, w.Op)
		if w.Sent.IsZero() || w.Answered.Before(w.Sent) || len(w.Items) != 1 || len(w.Body) == 0 {
			t.Errorf("watched write %+v: want its item, its body and Sent <= Answered", w)
		}
	}
	if want := []string{"UpdateItem", "DeleteItem", "DeleteItem", "UpdateItem"}; !slices.Equal(ops, want) {
		t.Errorf("watched got %v, want %v", ops, want)
	}
	if len(seen) == 4 && seen[1].Items[0] != (ddbrelay.Item{Table: "t", Key: "c"}) {
		t.Errorf("the delete's item got %v, want t/c", seen[1].Items[0])
	}
}
