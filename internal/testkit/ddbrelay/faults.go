package ddbrelay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"time"
)

// FaultKind names one kind of fault the relay injects.
type FaultKind string

// The kinds of fault. Each one is what a real network or DynamoDB does to a call now and then;
// together they exercise every path by which a client may apply a write twice, lose it, or
// learn nothing of it.
const (
	// FaultDropResponse forwards the call, lets the server apply it, then resets the client's
	// connection instead of answering: the client cannot tell an applied write from a lost one,
	// and the SDK retries it.
	FaultDropResponse FaultKind = "drop_response"
	// FaultDuplicate forwards the call twice, one after the other, and answers with the first
	// answer: a request the network delivered twice.
	FaultDuplicate FaultKind = "duplicate"
	// FaultReset resets the client's connection without forwarding the call.
	FaultReset FaultKind = "reset"
	// FaultDelay makes the call wait Fault.Delay more before it is forwarded.
	FaultDelay FaultKind = "delay"
	// FaultThrottle answers ProvisionedThroughputExceededException without forwarding the call,
	// as DynamoDB does when a partition is hot.
	FaultThrottle FaultKind = "throttle"
	// FaultLateWrite holds a write until its client gives up (its timeout closes the
	// connection) or Fault.Hold passes, then applies it: a write that lands after its client
	// stopped waiting, and after whatever the client did next. Writes only.
	FaultLateWrite FaultKind = "late_write"
	// FaultDelayedDuplicate applies and answers a write, and applies a copy of it once another
	// write to one of its items has landed (or Fault.Hold passed): a duplicate the network
	// delivered late, after other clients' writes. Writes only; counted when the copy is sent.
	FaultDelayedDuplicate FaultKind = "delayed_duplicate"
	// FaultReorder holds a write until a later write of the same source (see Relay.Source) has
	// landed, then applies and answers it: two writes of one client applied in the opposite
	// order. Writes only; counted when the order changed (a write held past Fault.Hold without
	// a later one is applied as it is).
	FaultReorder FaultKind = "reorder"
)

// FaultKinds lists every kind, in a fixed order.
var FaultKinds = []FaultKind{FaultDropResponse, FaultDuplicate, FaultReset, FaultDelay, FaultThrottle,
	FaultLateWrite, FaultDelayedDuplicate, FaultReorder}

// Fault is one rule: calls that match it get the fault at the given rate.
type Fault struct {
	// Kind is the fault injected. (Required.)
	Kind FaultKind
	// Op limits the rule to one operation, e.g. "UpdateItem", "TransactWriteItems",
	// "BatchGetItem". (Optional; default every operation.)
	Op string
	// Item limits the rule to calls that name at least one item whose key (Item.Key) matches,
	// e.g. `#l[0-9]+$` for the shards of a leased pool, `#c$` for concurrency slots, `#w[0-9]+$`
	// for fixed windows (see internal/dynamo's table layout). A write names the items it writes,
	// GetItem its Key and BatchGetItem every key it reads; other calls name none and never
	// match. (Optional; default every call.)
	Item *regexp.Regexp
	// Body limits the rule to calls whose request body matches, e.g. `":gid"` for the
	// give-backs of internal/dynamo (every form carries its own id under that name). (Optional;
	// default every call.)
	Body *regexp.Regexp
	// Rate is the probability that a matching call gets the fault, in [0, 1]. (Required.)
	Rate float64
	// Delay is FaultDelay's extra wait. (Required for FaultDelay, unused otherwise.)
	Delay time.Duration
	// Hold is the longest an order fault holds its write: FaultLateWrite waits this long at
	// most for its client to give up, FaultDelayedDuplicate for another write to its items,
	// FaultReorder for a later write of its source. (Optional; default 10 s, 1 s and 500 ms.)
	Hold time.Duration
}

func (f Fault) validate(i int) error {
	switch f.Kind {
	case FaultDropResponse, FaultDuplicate, FaultReset, FaultThrottle, FaultLateWrite, FaultDelayedDuplicate, FaultReorder:
	case FaultDelay:
		if f.Delay <= 0 {
			return fmt.Errorf("ddbrelay: Faults[%d].Delay %v must be positive for a delay fault", i, f.Delay)
		}
	default:
		return fmt.Errorf("ddbrelay: Faults[%d].Kind %q is not one of %v", i, f.Kind, FaultKinds)
	}
	if f.Hold < 0 {
		return fmt.Errorf("ddbrelay: Faults[%d].Hold %v must not be negative", i, f.Hold)
	}
	if !(f.Rate >= 0 && f.Rate <= 1) {
		return fmt.Errorf("ddbrelay: Faults[%d].Rate %v is not within [0, 1]", i, f.Rate)
	}
	return nil
}

func (f *Fault) matches(op string, body []byte, items []Item) bool {
	if f.Op != "" && f.Op != op {
		return false
	}
	if f.Body != nil && !f.Body.Match(body) {
		return false
	}
	if f.Item == nil {
		return true
	}
	for _, it := range items {
		if f.Item.MatchString(it.Key) {
			return true
		}
	}
	return false
}

// pickFault draws the fault of one call: the rules are tried in order, each matching rule draws
// once, and the first draw under its rate wins. At most one fault per call.
func (r *Relay) pickFault(op string, body []byte) *Fault {
	if len(r.faults) == 0 {
		return nil
	}
	var items []Item
	if r.faultsByItem {
		items = namedItems(op, body, r.keyAttr)
	}
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	for i := range r.faults {
		f := &r.faults[i]
		if f.matches(op, body, items) && r.rng.Float64() < f.Rate {
			return f
		}
	}
	return nil
}

// namedItems returns the items a call writes or reads, for matching Fault.Item.
func namedItems(op string, body []byte, keyAttr []string) []Item {
	if isWrite(op) {
		items, _ := writtenItems(op, body, keyAttr)
		return items
	}
	switch op {
	case "GetItem":
		var in keyed
		if json.Unmarshal(body, &in) != nil {
			return nil
		}
		if it, err := in.item(keyAttr); err == nil {
			return []Item{it}
		}
	case "BatchGetItem":
		var in struct {
			RequestItems map[string]struct{ Keys []attrs }
		}
		if json.Unmarshal(body, &in) != nil {
			return nil
		}
		tables := make([]string, 0, len(in.RequestItems))
		for t := range in.RequestItems {
			tables = append(tables, t)
		}
		sort.Strings(tables)
		var items []Item
		for _, t := range tables {
			for _, k := range in.RequestItems[t].Keys {
				if it, err := (&keyed{TableName: t, Key: k}).item(keyAttr); err == nil {
					items = append(items, it)
				}
			}
		}
		return items
	}
	return nil
}

// inject serves a call that drew fault f.
func (r *Relay) inject(w http.ResponseWriter, req *http.Request, op string, body []byte, f *Fault) {
	switch f.Kind {
	case FaultLateWrite, FaultDelayedDuplicate, FaultReorder:
		if !isWrite(op) {
			r.serve(w, req, op, body) // faults of writes: a read goes through
			return
		}
	}
	switch f.Kind {
	case FaultLateWrite:
		r.lateWrite(w, req, op, body, f)
		return
	case FaultDelayedDuplicate:
		r.delayedDuplicate(w, req, op, body, f)
		return
	case FaultReorder:
		r.reorder(w, req, op, body, f)
		return
	}
	r.countFault(f.Kind)
	switch f.Kind {
	case FaultThrottle:
		r.mu.Lock()
		r.opLocked(op).Requests++
		r.mu.Unlock()
		writeError(w, throughputExceededType, throughputExceededMsg)
	case FaultReset:
		r.mu.Lock()
		r.opLocked(op).Requests++
		r.mu.Unlock()
		abort(w)
	case FaultDropResponse:
		r.serve(httptest.NewRecorder(), req, op, body)
		abort(w)
	case FaultDuplicate:
		first := httptest.NewRecorder()
		r.serve(first, req, op, body)
		again := req.Clone(req.Context())
		again.Body = io.NopCloser(bytes.NewReader(body))
		r.serve(httptest.NewRecorder(), again, op, body)
		copyResponse(w, first)
	default: // FaultDelay waited before the call got here
		r.serve(w, req, op, body)
	}
}

func (r *Relay) countFault(k FaultKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faultCounts[k]++
}

// abort resets the client's connection: TCP RST where the connection allows it (the SDK then
// sees "connection reset by peer"), otherwise the server's own abort.
func abort(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func copyResponse(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	h := w.Header()
	for k, v := range rec.Header() {
		h[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}
