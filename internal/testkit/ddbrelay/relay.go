// Package ddbrelay is a fault-injecting relay in front of DynamoDB Local.
//
// It is test and benchmark tooling: an HTTP reverse proxy in front of a
// DynamoDB-API server (DynamoDB Local) that enforces the physical limit DynamoDB Local lacks, a
// write budget per item per second, and answers an over-budget write exactly as DynamoDB does
// (HTTP 400, application/x-amz-json-1.0, ProvisionedThroughputExceededException). With it the
// per-item write limit of real DynamoDB (about 1,000 writes/s per item) is exercised in tests and
// benchmarks, scaled down to what one machine can drive, instead of being assumed.
//
// It is not used by the gateway itself.
//
// # What counts
//
// A write is one item written: UpdateItem, PutItem and DeleteItem write one item each; each
// element of a TransactWriteItems (Put, Update, Delete and ConditionCheck) and of a
// BatchWriteItem (PutRequest, DeleteRequest) writes one item. An item is its table and its key
// (the Key of the request, or the KeyAttributes of a PutItem's Item). A write that reaches
// DynamoDB counts against its item's budget whether or not its condition holds: a failed
// conditional write consumes write capacity in real DynamoDB too. Every other operation (reads,
// table management) is forwarded and counted apart, never throttled.
//
// # The budget: aligned one-second windows
//
// Each item may take Options.WritesPerItemPerSecond writes in each one-second window aligned to
// the clock's whole seconds (Unix time truncated to the second). A write that would exceed its
// item's budget in the current window is not forwarded, and it does not consume budget (real
// DynamoDB charges no capacity for a throttled request). A request that writes several items
// (a transaction or a batch) is forwarded only if every one of its items is within budget, and
// otherwise throttled whole, consuming nothing; DynamoDB's own answer there is the same exception.
// Windows rather than a token bucket were chosen so that the budget and the statistics measure the
// same thing: the forwarded writes of an item in any window never exceed the budget, and the
// per-window counts in Stats compare directly with it.
//
// # A slow store
//
// Options.Delay and Options.Jitter make the store slow: every call, read or write, forwarded or
// throttled, waits Delay plus a uniform random part in [0, Jitter] before the relay decides and
// forwards it, as if the network or the store took that long. The random part comes from an RNG
// seeded with Options.Seed, so a run can be repeated. Stats reports the answer times the relay
// saw (Latency, per operation and overall): the store's latency as its clients see it.
//
// # Faults
//
// Options.Faults injects faults, per operation and per item kind, at configurable rates drawn
// from the same seeded RNG: a response dropped after the call was applied (so the SDK retries a
// write that landed), a call delivered twice, a connection reset before forwarding, an extra
// delay, and a throttle the server never saw; and faults of order (order.go): a write applied
// after its client gave up, a copy applied after other writes landed, two writes of one client
// reordered. Stats.Faults counts each kind injected. A call gets at most one fault.
//
// The body is forwarded byte for byte, so a SigV4 signature stays valid (DynamoDB Local ignores
// it anyway).
package ddbrelay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configures New.
type Options struct {
	// WritesPerItemPerSecond is each item's write budget per one-second window. (Required; 0
	// means no budget: writes are counted, never throttled.)
	WritesPerItemPerSecond int
	// KeyAttributes names the key attributes of the tables behind the relay; it is needed to find
	// the item of a PutItem (and of a transaction's or batch's Put), whose body carries the whole
	// item rather than a Key. (Optional; default ["pk"], the ratelimit-proxy table's schema.)
	KeyAttributes []string
	// Now is the clock. (Optional; default time.Now.)
	Now func() time.Time
	// Transport forwards requests to the server. (Optional; default a keep-alive transport sized
	// for hundreds of concurrent writers.)
	Transport http.RoundTripper
	// WindowHistory is how many one-second windows Stats keeps, newest last. (Optional; default
	// 3600.) Totals and the hottest item cover the relay's whole life regardless.
	WindowHistory int
	// Delay is how long every call waits before it is decided and forwarded. (Optional; default
	// 0.)
	Delay time.Duration
	// Jitter is the width of a uniform random wait added to Delay: each call waits Delay + U[0,
	// Jitter]. (Optional; default 0.)
	Jitter time.Duration
	// Seed seeds the relay's random choices (the jitter), so a run can be repeated. (Optional;
	// default 0, itself a seed.)
	Seed uint64
	// Faults are the faults to inject, tried in order for each call (see Fault). (Optional.)
	Faults []Fault
	// Sleep waits d or until ctx is done, whichever comes first. (Optional; default a timer.)
	// Tests hand in one that advances their clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// Watch, when set, is told of every write the relay forwards to the server: originals,
	// duplicates, late writes and delayed copies alike, each with the instants it was forwarded
	// and answered, between which the server applied it (the relay's clock). A checker learns
	// from it when a write of interest really landed, whatever its client saw. It is called
	// from the relay's handlers, concurrently. (Optional.)
	Watch func(Write)
}

// Write is one write forwarded to the server, as Options.Watch sees it.
type Write struct {
	Op    string
	Items []Item
	Body  []byte
	// Sent and Answered bound the instant the server applied the write.
	Sent, Answered time.Time
}

// maxBody bounds the request body the relay reads: DynamoDB's own limit for a request is 16 MB.
const maxBody = 16 << 20

// throughputExceeded is the error DynamoDB answers a throttled write with; the SDKs decode the
// __type after the '#'.
const (
	throughputExceededType = "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
	throughputExceededMsg  = "The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API."
	amzJSON                = "application/x-amz-json-1.0"
)

// Item identifies one item: its table and its key. Key is the key's single string or number
// value when the key has one attribute (the pk of the ratelimit-proxy table), and otherwise the
// key's attribute map as compact JSON with sorted attribute names.
type Item struct {
	Table string
	Key   string
}

func (i Item) String() string { return i.Table + "/" + i.Key }

// Count is how many writes of one item (or of an operation) were forwarded and throttled.
type Count struct {
	Forwarded int64
	Throttled int64
}

// Attempted is Forwarded + Throttled: the demand on the item, which the budget cut to Forwarded.
func (c Count) Attempted() int64 { return c.Forwarded + c.Throttled }

// OpStats counts one operation (its X-Amz-Target without the service prefix).
type OpStats struct {
	// Requests is how many requests of the operation arrived (forwarded or throttled).
	Requests int64
	// Writes counts item writes (zero for reads).
	Writes Count
}

// Window is one one-second window's writes per item.
type Window struct {
	Start time.Time
	Items map[Item]Count
}

// Peak is one item in one window.
type Peak struct {
	Item  Item
	Start time.Time
	Count
}

// Stats is a snapshot of what the relay saw. Write counts are item writes (a transaction of
// three items is three writes).
type Stats struct {
	// Writes totals every item write: Forwarded reached the server, Throttled was answered
	// ProvisionedThroughputExceededException.
	Writes Count
	// Unattributed counts forwarded write requests whose items the relay could not find (a
	// body it could not parse, or a PartiQL statement); they are forwarded unbudgeted and the
	// server answers them.
	Unattributed int64
	// Reads counts requests of every other operation (reads and table management).
	Reads int64
	// Ops is per operation, e.g. "UpdateItem".
	Ops map[string]OpStats
	// Windows holds the last Options.WindowHistory one-second windows that saw writes, oldest
	// first.
	Windows []Window
	// Hottest is the item and window with the most writes attempted (forwarded + throttled) over
	// the relay's life, the first one to reach that number: the demand on the hottest item.
	Hottest Peak
	// HottestForwarded is the item and window with the most writes forwarded.
	HottestForwarded Peak
	// Latency is how long the relay took to answer every call, the injected delay included.
	Latency Latency
	// OpLatency is Latency per operation, e.g. "UpdateItem".
	OpLatency map[string]Latency
	// Faults counts the faults injected, by kind (see Options.Faults). A call that drew
	// FaultThrottle or FaultReset was not forwarded and counts in Ops[op].Requests only.
	Faults map[FaultKind]int64
	// Held is how many writes and copies the order faults hold now (see FaultReorder and
	// FaultDelayedDuplicate).
	Held int
}

// Relay is an http.Handler that forwards to a DynamoDB-API server and throttles writes over
// each item's budget. It is safe for concurrent use. Create it with New.
type Relay struct {
	proxy   *httputil.ReverseProxy
	budget  int64
	keyAttr []string
	now     func() time.Time
	history int
	delay   time.Duration
	jitter  time.Duration
	sleep   func(context.Context, time.Duration) error

	faults       []Fault
	watch        func(Write)
	faultsByItem bool // some rule matches items: calls must be parsed for them

	rngMu sync.Mutex
	rng   *rand.Rand

	mu           sync.Mutex
	faultCounts  map[FaultKind]int64
	latency      histogram
	opLatency    map[string]*histogram
	total        Count
	unattributed int64
	reads        int64
	ops          map[string]*OpStats
	windows      []*window // ascending by second; the last is the current one
	hottest      Peak
	hottestFwd   Peak

	ord order // the order faults' held writes and copies (order.go)
}

type window struct {
	sec   int64
	items map[Item]*Count
}

// New returns a relay to the server at target, e.g. DynamoDB Local's http://127.0.0.1:8000.
func New(target string, o Options) (*Relay, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("ddbrelay: target %q is not an http(s) URL", target)
	}
	if o.WritesPerItemPerSecond < 0 {
		return nil, fmt.Errorf("ddbrelay: WritesPerItemPerSecond %d is negative", o.WritesPerItemPerSecond)
	}
	if o.Delay < 0 || o.Jitter < 0 {
		return nil, fmt.Errorf("ddbrelay: Delay %v and Jitter %v must not be negative", o.Delay, o.Jitter)
	}
	r := &Relay{
		budget:    int64(o.WritesPerItemPerSecond),
		keyAttr:   o.KeyAttributes,
		now:       o.Now,
		history:   o.WindowHistory,
		delay:     o.Delay,
		jitter:    o.Jitter,
		sleep:     o.Sleep,
		rng:       rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		ops:       make(map[string]*OpStats),
		opLatency: make(map[string]*histogram),
		faults:    append([]Fault(nil), o.Faults...),
		watch:     o.Watch,

		faultCounts: make(map[FaultKind]int64),
	}
	for i, f := range r.faults {
		if err := f.validate(i); err != nil {
			return nil, err
		}
		if f.Item != nil {
			r.faultsByItem = true
		}
	}
	if r.sleep == nil {
		r.sleep = sleepCtx
	}
	if len(r.keyAttr) == 0 {
		r.keyAttr = []string{"pk"}
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.history <= 0 {
		r.history = 3600
	}
	tr := o.Transport
	if tr == nil {
		tr = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
		}
	}
	r.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			// The client's Host goes with it: it is part of what SigV4 signed.
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			// The SDKs retry a 5xx like DynamoDB's own internal errors.
			http.Error(w, "ddbrelay: "+err.Error(), http.StatusBadGateway)
		},
	}
	return r, nil
}

// ServeHTTP waits the configured delay, then forwards the request, or answers it
// ProvisionedThroughputExceededException when it writes an item over its budget. It records how
// long the answer took.
func (r *Relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := r.now()
	op := operation(req.Header.Get("X-Amz-Target"))
	defer func() { r.observe(op, r.now().Sub(start)) }()
	// The body is read first: the server notices a client that leaves (and cancels the
	// request's context) only once the body has been consumed.
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody+1))
	if err != nil {
		http.Error(w, "ddbrelay: read request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxBody {
		writeError(w, "com.amazon.coral.validate#ValidationException", "Request size exceeds "+strconv.Itoa(maxBody)+" bytes")
		return
	}
	req = r.arrive(req)
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	d := r.wait()
	f := r.pickFault(op, body)
	if f != nil && f.Kind == FaultDelay {
		d += f.Delay
	}
	if d > 0 {
		if err := r.sleep(req.Context(), d); err != nil {
			return // the client went away; nothing to answer
		}
	}
	if f != nil {
		r.inject(w, req, op, body, f)
		return
	}
	r.serve(w, req, op, body)
}

// wait draws one call's delay: Delay + U[0, Jitter].
func (r *Relay) wait() time.Duration {
	if r.jitter <= 0 {
		return r.delay
	}
	r.rngMu.Lock()
	j := time.Duration(r.rng.Int64N(int64(r.jitter) + 1))
	r.rngMu.Unlock()
	return r.delay + j
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Relay) observe(op string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latency.record(d)
	h := r.opLatency[op]
	if h == nil {
		h = &histogram{}
		r.opLatency[op] = h
	}
	h.record(d)
}

func (r *Relay) serve(w http.ResponseWriter, req *http.Request, op string, body []byte) {
	if !isWrite(op) {
		r.mu.Lock()
		r.reads++
		r.opLocked(op).Requests++
		r.mu.Unlock()
		r.proxy.ServeHTTP(w, req)
		return
	}
	items, perr := writtenItems(op, body, r.keyAttr)
	if !r.admit(op, items, perr != nil) {
		writeError(w, throughputExceededType, throughputExceededMsg)
		return
	}
	sent := r.now()
	r.proxy.ServeHTTP(w, req)
	if r.watch != nil {
		r.watch(Write{Op: op, Items: items, Body: body, Sent: sent, Answered: r.now()})
	}
	r.landed(req, items)
}

// admit decides a write request and counts it. unattributed requests are forwarded unbudgeted.
func (r *Relay) admit(op string, items []Item, unattributed bool) bool {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.opLocked(op)
	st.Requests++
	if unattributed {
		r.unattributed++
		return true
	}
	win := r.windowLocked(now.Unix())
	ok := true
	if r.budget > 0 {
		// An item may appear more than once in a request; each appearance is a write.
		want := make(map[Item]int64, len(items))
		for _, it := range items {
			want[it]++
		}
		for it, n := range want {
			var used int64
			if c := win.items[it]; c != nil {
				used = c.Forwarded
			}
			if used+n > r.budget {
				ok = false
				break
			}
		}
	}
	for _, it := range items {
		c := win.items[it]
		if c == nil {
			c = &Count{}
			win.items[it] = c
		}
		if ok {
			c.Forwarded++
			r.total.Forwarded++
			st.Writes.Forwarded++
		} else {
			c.Throttled++
			r.total.Throttled++
			st.Writes.Throttled++
		}
		start := time.Unix(win.sec, 0).UTC()
		if c.Attempted() > r.hottest.Attempted() {
			r.hottest = Peak{Item: it, Start: start, Count: *c}
		} else if r.hottest.Item == it && r.hottest.Start.Equal(start) {
			r.hottest.Count = *c
		}
		if c.Forwarded > r.hottestFwd.Forwarded {
			r.hottestFwd = Peak{Item: it, Start: start, Count: *c}
		} else if r.hottestFwd.Item == it && r.hottestFwd.Start.Equal(start) {
			r.hottestFwd.Count = *c
		}
	}
	return ok
}

func (r *Relay) opLocked(op string) *OpStats {
	st := r.ops[op]
	if st == nil {
		st = &OpStats{}
		r.ops[op] = st
	}
	return st
}

// windowLocked returns the window of second sec. A clock that steps back lands in the newest
// window rather than reopening an old one, so no item's budget is granted twice for a second.
func (r *Relay) windowLocked(sec int64) *window {
	if n := len(r.windows); n > 0 && r.windows[n-1].sec >= sec {
		return r.windows[n-1]
	}
	w := &window{sec: sec, items: make(map[Item]*Count)}
	r.windows = append(r.windows, w)
	if len(r.windows) > r.history {
		copy(r.windows, r.windows[len(r.windows)-r.history:])
		clear(r.windows[r.history:])
		r.windows = r.windows[:r.history]
	}
	return w
}

// Stats returns a snapshot of the counts so far.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{
		Writes:           r.total,
		Unattributed:     r.unattributed,
		Reads:            r.reads,
		Ops:              make(map[string]OpStats, len(r.ops)),
		Windows:          make([]Window, 0, len(r.windows)),
		Hottest:          r.hottest,
		HottestForwarded: r.hottestFwd,
		Latency:          r.latency.summary(),
		OpLatency:        make(map[string]Latency, len(r.opLatency)),
	}
	for op, h := range r.opLatency {
		s.OpLatency[op] = h.summary()
	}
	s.Faults = make(map[FaultKind]int64, len(r.faultCounts))
	for k, n := range r.faultCounts {
		s.Faults[k] = n
	}
	for op, st := range r.ops {
		s.Ops[op] = *st
	}
	r.ord.mu.Lock()
	s.Held = len(r.ord.held) + len(r.ord.copies)
	r.ord.mu.Unlock()
	for _, w := range r.windows {
		if len(w.items) == 0 {
			continue
		}
		cw := Window{Start: time.Unix(w.sec, 0).UTC(), Items: make(map[Item]Count, len(w.items))}
		for it, c := range w.items {
			cw.Items[it] = *c
		}
		s.Windows = append(s.Windows, cw)
	}
	return s
}

// ResetStats starts the counts over, for a measurement that follows a warm-up. The budget
// windows go with them: a write in the second of the reset may find a whole budget again, as
// if the relay had just started.
func (r *Relay) ResetStats() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total, r.unattributed, r.reads = Count{}, 0, 0
	clear(r.ops)
	clear(r.windows)
	r.windows = r.windows[:0]
	r.hottest, r.hottestFwd = Peak{}, Peak{}
	r.latency = histogram{}
	clear(r.opLatency)
	clear(r.faultCounts)
}

// writeError answers as DynamoDB answers a client error.
func writeError(w http.ResponseWriter, typ, msg string) {
	body, _ := json.Marshal(struct {
		Type    string `json:"__type"`
		Message string `json:"message"`
	}{typ, msg})
	h := w.Header()
	h.Set("Content-Type", amzJSON)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	// DynamoDB sends the CRC32 of every response body; the SDKs check it when it is present.
	h.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(body)
}

// operation returns the operation of an X-Amz-Target such as DynamoDB_20120810.UpdateItem.
func operation(target string) string {
	if i := strings.LastIndexByte(target, '.'); i >= 0 {
		return target[i+1:]
	}
	return target
}

func isWrite(op string) bool {
	switch op {
	case "UpdateItem", "PutItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem",
		// PartiQL writes: forwarded unattributed (see Stats.Unattributed).
		"ExecuteStatement", "BatchExecuteStatement", "ExecuteTransaction":
		return true
	}
	return false
}

type attrs = map[string]json.RawMessage

// keyed is the part of a single-item write (and of a transaction's element) that names its item.
type keyed struct {
	TableName string
	Key       attrs
	Item      attrs
}

var errNoItem = errors.New("no item")

// writtenItems returns the items a write request writes, one entry per write.
func writtenItems(op string, body []byte, keyAttr []string) ([]Item, error) {
	switch op {
	case "UpdateItem", "DeleteItem", "PutItem":
		var in keyed
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, err
		}
		it, err := in.item(keyAttr)
		if err != nil {
			return nil, err
		}
		return []Item{it}, nil
	case "TransactWriteItems":
		var in struct {
			TransactItems []struct{ Put, Update, Delete, ConditionCheck *keyed }
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, err
		}
		items := make([]Item, 0, len(in.TransactItems))
		for _, ti := range in.TransactItems {
			var k *keyed
			for _, c := range []*keyed{ti.Put, ti.Update, ti.Delete, ti.ConditionCheck} {
				if c != nil {
					k = c
				}
			}
			if k == nil {
				return nil, errNoItem
			}
			it, err := k.item(keyAttr)
			if err != nil {
				return nil, err
			}
			items = append(items, it)
		}
		return items, nil
	case "BatchWriteItem":
		var in struct {
			RequestItems map[string][]struct {
				PutRequest    *struct{ Item attrs }
				DeleteRequest *struct{ Key attrs }
			}
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, err
		}
		tables := make([]string, 0, len(in.RequestItems))
		for t := range in.RequestItems {
			tables = append(tables, t)
		}
		sort.Strings(tables)
		var items []Item
		for _, t := range tables {
			for _, wr := range in.RequestItems[t] {
				k := keyed{TableName: t}
				switch {
				case wr.PutRequest != nil:
					k.Item = wr.PutRequest.Item
				case wr.DeleteRequest != nil:
					k.Key = wr.DeleteRequest.Key
				default:
					return nil, errNoItem
				}
				it, err := k.item(keyAttr)
				if err != nil {
					return nil, err
				}
				items = append(items, it)
			}
		}
		return items, nil
	}
	return nil, errNoItem
}

func (k *keyed) item(keyAttr []string) (Item, error) {
	key := k.Key
	if key == nil && k.Item != nil {
		key = make(attrs, len(keyAttr))
		for _, a := range keyAttr {
			if v, ok := k.Item[a]; ok {
				key[a] = v
			}
		}
	}
	if k.TableName == "" || len(key) == 0 {
		return Item{}, errNoItem
	}
	if len(key) == 1 {
		for _, v := range key {
			var scalar struct{ S, N *string }
			if err := json.Unmarshal(v, &scalar); err == nil {
				if scalar.S != nil {
					return Item{Table: k.TableName, Key: *scalar.S}, nil
				}
				if scalar.N != nil {
					return Item{Table: k.TableName, Key: *scalar.N}, nil
				}
			}
		}
	}
	// Several attributes (or a binary key): compact JSON, attribute names sorted by Marshal.
	compact := make(map[string]json.RawMessage, len(key))
	for a, v := range key {
		var b bytes.Buffer
		if err := json.Compact(&b, v); err != nil {
			return Item{}, err
		}
		compact[a] = b.Bytes()
	}
	s, err := json.Marshal(compact)
	if err != nil {
		return Item{}, err
	}
	return Item{Table: k.TableName, Key: string(s)}, nil
}
