package console

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Keys is what the console needs from the store: a key's state without charging it, and a
// reset that makes it full again. memstore.Store and dynamo.Store implement it. Both must be
// safe for concurrent use and honour ctx.
type Keys interface {
	Peek(ctx context.Context, now time.Time, c bucket.Charge) (bucket.Result, error)
	Reset(ctx context.Context, now time.Time, c bucket.Charge) error
}

// Options configure New.
type Options struct {
	// Policies returns the policy set in force. (Required)
	Policies func() *policy.Set
	// Keys inspects and resets keys. (Optional) nil: the keys endpoints answer 501.
	Keys Keys
	// Pseudonyms are the access log's: keys are shown as it shows them. (Required)
	Pseudonyms *policy.Pseudonyms
	// WriteToken is the bearer token of writes; "" turns writes off (403). WriteTokenName
	// (admin.token_env) is who the audit log says wrote.
	WriteToken, WriteTokenName string
	// ReadToken, when set, is needed (or the write token) for reads. ReadTokenName names it.
	ReadToken, ReadTokenName string
	// TopK is each policy's sketch size. (Optional) default 100.
	TopK int
	// StoreTimeout bounds each store call. (Optional) default 1s.
	StoreTimeout time.Duration
	// Logger receives the audit lines. (Optional) default: none.
	Logger *zap.Logger
	// Registerer receives ratelimit_admin_writes_total. (Optional) nil: not exported.
	Registerer prometheus.Registerer
	// Now is the clock. (Optional) default time.Now.
	Now func() time.Time
	// Shared, when set, stores exemptions where every replica reads them (the DynamoDB
	// table) and is polled every second. (Optional) nil: exemptions are this replica's.
	Shared Shared
	// MaxExemptions bounds the live exemptions (admin.max_exemptions), in Shared or in this
	// replica. (Optional) default 1000.
	MaxExemptions int
}

// Shared is a store of exemptions that every replica sees.
type Shared interface {
	// PutExemption stores e (its JSON form, by id) until its expiry, unless most live
	// exemptions are stored already (stored false).
	PutExemption(ctx context.Context, id string, data []byte, expires time.Time, most int) (stored bool, err error)
	// DeleteExemption removes the exemption id; found is false when no live one has that id.
	DeleteExemption(ctx context.Context, id string) (found bool, err error)
	// Exemptions returns every stored exemption's JSON form.
	Exemptions(ctx context.Context) ([][]byte, error)
}

type metrics struct{ writes *prometheus.CounterVec }

// New builds a Console.
func New(o Options) (*Console, error) {
	if o.Policies == nil || o.Pseudonyms == nil {
		return nil, errors.New("admin: Policies and Pseudonyms are required")
	}
	if o.TopK <= 0 {
		o.TopK = 100
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxExemptions <= 0 {
		o.MaxExemptions = DefaultMaxExemptions
	}
	m := &metrics{writes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_admin_writes_total",
		Help: "Writes made through the admin API, by action (reset, exempt, unexempt).",
	}, []string{"action"})}
	for _, a := range []string{actionReset, actionExempt, actionUnexempt} {
		m.writes.WithLabelValues(a)
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(m.writes); err != nil {
			return nil, fmt.Errorf("admin: register metrics: %w", err)
		}
	}
	return &Console{o: o, m: m}, nil
}

// The actions of ratelimit_admin_writes_total and of audit lines.
const (
	actionReset    = "reset"
	actionExempt   = "exempt"
	actionUnexempt = "unexempt"
)

// Handler serves the API under /v1/ and the live page at /.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/policies", c.read(c.getPolicies))
	mux.HandleFunc("GET /v1/keys/{policy}", c.read(c.getKey))
	mux.HandleFunc("POST /v1/keys/{policy}/reset", c.write(c.postReset))
	mux.HandleFunc("GET /v1/top/{policy}", c.read(c.getTop))
	mux.HandleFunc("GET /v1/exemptions", c.read(c.getExemptions))
	mux.HandleFunc("POST /v1/exemptions", c.write(c.postExemption))
	mux.HandleFunc("DELETE /v1/exemptions/{id}", c.write(c.deleteExemption))
	mux.HandleFunc("GET /v1/series/{policy}", c.read(c.getSeries))
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "not-found", "No admin endpoint "+r.Method+" "+r.URL.Path+"; see docs/operations.md.")
	})
	mux.HandleFunc("GET /{$}", c.read(c.page))
	return mux
}

// bearer returns the request's bearer token, "" without one.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func tokenIs(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// read guards a read: open unless a read token is configured.
func (c *Console) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.o.ReadToken != "" {
			t := bearer(r)
			if !tokenIs(t, c.o.ReadToken) && !tokenIs(t, c.o.WriteToken) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimit-proxy admin"`)
				writeProblem(w, http.StatusUnauthorized, "unauthorized", "Reads need the bearer token of admin.read_token_env (or of admin.token_env).")
				return
			}
		}
		h(w, r)
	}
}

// rawLookupAllowed reports whether r may look a key up by its raw value (key, or an rls
// descriptor's entries), and answers the problem when not. The answer names the key's
// pseudonym: open, such a read is an oracle that turns any guessed value into the pseudonym the
// access log shows, which unmasks the logs of small key spaces (every IPv4 address, numeric
// user ids) one guess per request. So it needs a token: the read token where one is configured
// (read already checked it), else the write token; with no token configured only lookups by
// pseudonym answer, which name a key the caller already saw as a pseudonym.
func (c *Console) rawLookupAllowed(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case c.o.ReadToken != "":
		return true // read checked the read (or write) token
	case c.o.WriteToken == "":
		writeProblem(w, http.StatusForbidden, "raw-key-lookup-off",
			"Looking a key up by its value needs a token, and none is configured: give pseudonym (from GET /v1/top or the access log), or set admin.read_token_env or admin.token_env.")
		return false
	case !tokenIs(bearer(r), c.o.WriteToken):
		w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimit-proxy admin"`)
		writeProblem(w, http.StatusUnauthorized, "unauthorized",
			"Looking a key up by its value needs the bearer token of admin.token_env (admin.read_token_env is unset); a lookup by pseudonym needs none.")
		return false
	}
	return true
}

// write guards a write: 403 when writes are off, 401 without the right token.
func (c *Console) write(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.o.WriteToken == "" {
			writeProblem(w, http.StatusForbidden, "writes-disabled",
				"Admin writes are off: set admin.token_env to the name of an environment variable holding a token (at least 16 bytes) and send it as Authorization: Bearer <token>.")
			return
		}
		if !tokenIs(bearer(r), c.o.WriteToken) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimit-proxy admin"`)
			writeProblem(w, http.StatusUnauthorized, "unauthorized", "Writes need the bearer token of admin.token_env.")
			return
		}
		h(w, r)
	}
}

// problemBase prefixes the problem types of the admin API.
const problemBase = "https://github.com/ratelimit-proxy/ratelimit-proxy/blob/main/docs/operations.md#admin-"

func writeProblem(w http.ResponseWriter, status int, typ, detail string) {
	answer.WriteProblem(w, nil, answer.Problem{Type: problemBase + typ, Status: status, Detail: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// PolicyInfo is one policy in GET /v1/policies.
type PolicyInfo struct {
	// Name names the policy in the API's paths and bodies; an rls rule's is its label
	// (envoyrules.Rule.Label: the domain, then the rule's name or descriptor path).
	Name      string  `json:"name"`
	Scope     string  `json:"scope"`          // proxy, or rls:DOMAIN
	Rule      string  `json:"rule,omitempty"` // an rls rule's rate_limit.name, when it has one
	Algorithm string  `json:"algorithm"`
	Key       string  `json:"key"` // ip, api_key, user, global, header:name; descriptor for rls rules
	Limit     int64   `json:"limit"`
	Rate      float64 `json:"rate_per_second,omitempty"`
	Window    float64 `json:"window_seconds,omitempty"`
	Mode      string  `json:"mode"`
	Summary   string  `json:"summary"`
}

func infoOf(p *policy.Policy) PolicyInfo {
	l := p.Limit
	pi := PolicyInfo{Name: p.Name, Scope: "proxy", Algorithm: policy.AlgorithmName(l.Algorithm), Key: p.KeyKind,
		Mode: "enforce", Summary: p.Summary, Limit: l.Count, Window: l.Window.Seconds()}
	if p.Shadow {
		pi.Mode = "shadow"
	}
	if l.Algorithm == bucket.TokenBucket || l.Algorithm == bucket.LeakyBucket {
		pi.Limit, pi.Rate = l.Burst, l.Rate
	}
	if l.Algorithm == bucket.Quota {
		pi.Window = l.Period.Nominal().Seconds()
	}
	return pi
}

func (c *Console) getPolicies(w http.ResponseWriter, _ *http.Request) {
	set := c.o.Policies()
	pols := set.Policies()
	out := make([]PolicyInfo, len(pols), len(pols)+set.RLS().Len())
	for i, p := range pols {
		out[i] = infoOf(p)
	}
	for _, dn := range set.RLS().Domains() {
		for _, r := range set.RLS().Domain(dn).Rules() {
			out = append(out, rlsInfo(dn, r))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"policies": out})
}

// rlsInfo describes an rls rule as GET /v1/policies lists it: named by its label, scope
// rls:DOMAIN, its key the descriptor.
func rlsInfo(domain string, r *envoyrules.Rule) PolicyInfo {
	pi := infoOf(rlsPolicy(r))
	pi.Scope, pi.Rule, pi.Summary = "rls:"+domain, r.Name, "descriptor "+r.Label
	if r.Unlimited {
		pi.Algorithm, pi.Limit, pi.Rate, pi.Window = "unlimited", 0, 0, 0
	}
	return pi
}

// rlsPolicy is an rls rule as a policy, for what the console does alike with both: named by
// its label, with its limit (from which an exemption's limit is built).
func rlsPolicy(r *envoyrules.Rule) *policy.Policy {
	return &policy.Policy{Name: r.Label, Shadow: r.Shadow, Limit: r.Limit, KeyKind: "descriptor"}
}

// resolveRLS finds the charge of an rls descriptor (domain, and entries as "k=v"). name is
// the rule's label, its rate_limit.name, or "rls" for whichever rule matches. The key is shown
// as rlsLabel shows it: its values may be credentials.
func (c *Console) resolveRLS(name, domain string, entries []string) (target, int, string) {
	es := make([]envoyrules.Entry, 0, len(entries))
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		if k == "" {
			return target{}, http.StatusBadRequest, fmt.Sprintf("entry %q: want key=value (or key=).", e)
		}
		es = append(es, envoyrules.Entry{Key: k, Value: v})
	}
	if len(es) == 0 {
		return target{}, http.StatusBadRequest, "An rls descriptor needs at least one entry=key=value."
	}
	rt, err := c.o.Policies().RLS().Charge(domain, es)
	if err != nil {
		return target{}, http.StatusNotFound, err.Error()
	}
	if r := rt.Rule; name != "rls" && name != r.Label && (r.Name == "" || name != r.Name) {
		return target{}, http.StatusBadRequest, fmt.Sprintf("The descriptor matches rule %q, not %q (or use rls).", r.Label, name)
	}
	return target{pol: rlsPolicy(rt.Rule), charge: rt.Charge, unlimited: rt.Unlimited,
		label: rlsLabel(c.o.Pseudonyms, domain, rt.Entries)}, 0, ""
}

// resolveAny resolves what a request names: an rls descriptor when it gives a domain (and
// entries), else a key or pseudonym of policy name.
func (c *Console) resolveAny(name, key, pseudonym, domain string, entries []string) (target, int, string) {
	if domain != "" {
		return c.resolveRLS(name, domain, entries)
	}
	return c.resolve(name, key, pseudonym)
}

// target is the key a request names, resolved to its charge.
type target struct {
	pol       *policy.Policy
	charge    bucket.Charge
	label     string // as the access log shows it
	unlimited bool   // an unlimited override in the file
}

// resolve finds the charge of policy name for a key value or a pseudonym. It returns the
// problem to answer when it cannot.
func (c *Console) resolve(name, key, pseudonym string) (target, int, string) {
	set := c.o.Policies()
	pol := set.Policy(name)
	if pol == nil {
		if _, r := set.RLS().RuleByLabel(name); r != nil {
			return c.resolveRLSPseudonym(r, key, pseudonym)
		}
		return target{}, http.StatusNotFound, fmt.Sprintf("No policy named %q; GET /v1/policies lists them.", name)
	}
	switch {
	case key != "" && pseudonym != "":
		return target{}, http.StatusBadRequest, "Give key or pseudonym, not both."
	case pseudonym != "":
		e, ok := c.byPseudonym(name, pseudonym)
		if !ok {
			return target{}, http.StatusNotFound, fmt.Sprintf("Pseudonym %q is not among policy %s's heaviest keys on this replica (the console keeps no raw keys): give the key itself.", pseudonym, name)
		}
		return target{pol: pol, label: e.label, charge: bucket.Charge{Key: e.key, Limit: e.limit, Cost: 1}}, 0, ""
	case key == "" && pol.KeyKind != "global":
		return target{}, http.StatusBadRequest, "The key is missing: give key (or pseudonym)."
	}
	ch, _, unlimited, err := set.KeyCharge(name, key)
	if err != nil {
		return target{}, http.StatusBadRequest, err.Error()
	}
	t := target{pol: pol, charge: ch, unlimited: unlimited, label: c.labelOf(pol, key)}
	return t, 0, ""
}

// resolveRLSPseudonym finds a key of rls rule r by its pseudonym among the rule's heaviest
// keys; a raw key is refused, since an rls key is a descriptor (domain and entries).
func (c *Console) resolveRLSPseudonym(r *envoyrules.Rule, key, pseudonym string) (target, int, string) {
	if key != "" || pseudonym == "" {
		return target{}, http.StatusBadRequest, fmt.Sprintf("%s is an rls rule: give its descriptor (domain and entries) or a pseudonym from GET /v1/top/%s.", r.Label, r.Label)
	}
	e, ok := c.byPseudonym(r.Label, pseudonym)
	if !ok {
		return target{}, http.StatusNotFound, fmt.Sprintf("Pseudonym %q is not among rule %s's heaviest keys on this replica (the console keeps no raw keys): give the descriptor itself.", pseudonym, r.Label)
	}
	return target{pol: rlsPolicy(r), label: e.label, charge: bucket.Charge{Key: e.key, Limit: r.Limit, Shadow: r.Shadow, Lease: r.Lease, Cost: 1}}, 0, ""
}

// labelOf shows a raw key value as the access log does: as its pseudonym (an IP too).
func (c *Console) labelOf(pol *policy.Policy, key string) string {
	if pol.KeyKind == "global" {
		return globalLabel
	}
	return c.o.Pseudonyms.Of(pol.KeyKind, key)
}

// KeyState is the answer of GET /v1/keys/{policy}.
type KeyState struct {
	Policy     string     `json:"policy"`
	Key        string     `json:"key"`
	Limit      int64      `json:"limit"`
	Remaining  int64      `json:"remaining"`
	ResetAfter float64    `json:"reset_after_seconds"`
	RetryAfter *float64   `json:"retry_after_seconds,omitempty"`
	Limited    bool       `json:"limited"`
	Exempt     bool       `json:"exempt"`
	Exemption  *Exemption `json:"exemption,omitempty"`
}

func (c *Console) getKey(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if (q.Get("key") != "" || q.Get("domain") != "" || len(q["entry"]) > 0) && !c.rawLookupAllowed(w, r) {
		return
	}
	t, status, detail := c.resolveAny(r.PathValue("policy"), q.Get("key"), q.Get("pseudonym"), q.Get("domain"), q["entry"])
	if status != 0 {
		writeProblem(w, status, "bad-key", detail)
		return
	}
	now := c.o.Now()
	ks := KeyState{Policy: t.pol.Name, Key: t.label, Exempt: t.unlimited}
	if t.unlimited {
		writeJSON(w, http.StatusOK, ks)
		return
	}
	if e := c.ex.find(now, t.pol.Name, t.charge.Key); e != nil {
		ks.Exempt, ks.Exemption = true, e
		if e.Unlimited {
			writeJSON(w, http.StatusOK, ks)
			return
		}
		t.charge.Limit = e.lim
	}
	if c.o.Keys == nil {
		writeProblem(w, http.StatusNotImplemented, "no-store", "This store cannot inspect keys.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.o.StoreTimeout)
	defer cancel()
	res, err := c.o.Keys.Peek(ctx, now, t.charge)
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "store-error", "The store did not answer: "+err.Error())
		return
	}
	ks.Limit, ks.Remaining, ks.ResetAfter, ks.Limited = res.Limit, res.Remaining, res.Reset.Seconds(), !res.Allowed
	if !res.Allowed {
		ra := math.Ceil(res.RetryAfter.Seconds()) // as Retry-After rounds: up
		ks.RetryAfter = &ra
	}
	writeJSON(w, http.StatusOK, ks)
}

// writeBody is the JSON body of reset and exemption writes.
type writeBody struct {
	Policy    string     `json:"policy"`
	Key       string     `json:"key"`
	Pseudonym string     `json:"pseudonym"`
	Reason    string     `json:"reason"`
	Limit     *LimitSpec `json:"limit"`
	Unlimited bool       `json:"unlimited"`
	ExpiresIn string     `json:"expires_in"`
	ExpiresAt *time.Time `json:"expires_at"`
	// Domain and Entries name an rls descriptor (reset and exemptions): entries as "key=value".
	Domain  string   `json:"domain"`
	Entries []string `json:"entries"`
}

// maxBody bounds a write's body.
const maxBody = 64 << 10

func decodeBody(w http.ResponseWriter, r *http.Request, b *writeBody) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(b); err != nil {
		writeProblem(w, http.StatusBadRequest, "bad-body", "The body is not the expected JSON object: "+err.Error())
		return false
	}
	return true
}

// audit writes one audit line and counts the write.
func (c *Console) audit(action string, fields ...zap.Field) {
	c.m.writes.WithLabelValues(action).Inc()
	c.o.Logger.Info("admin write", append([]zap.Field{zap.Bool("audit", true), zap.String("who", c.o.WriteTokenName),
		zap.String("action", action)}, fields...)...)
}

func (c *Console) postReset(w http.ResponseWriter, r *http.Request) {
	var b writeBody
	if !decodeBody(w, r, &b) || !checkReason(w, b.Reason) {
		return
	}
	t, status, detail := c.resolveAny(r.PathValue("policy"), b.Key, b.Pseudonym, b.Domain, b.Entries)
	if status != 0 {
		writeProblem(w, status, "bad-key", detail)
		return
	}
	if c.o.Keys == nil {
		writeProblem(w, http.StatusNotImplemented, "no-store", "This store cannot reset keys.")
		return
	}
	now := c.o.Now()
	ctx, cancel := context.WithTimeout(r.Context(), c.o.StoreTimeout)
	defer cancel()
	if err := c.o.Keys.Reset(ctx, now, t.charge); err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "store-error", "The store did not answer: "+err.Error())
		return
	}
	c.audit(actionReset, zap.String("policy", t.pol.Name), zap.String("key", t.label), zap.String("reason", b.Reason))
	c.resets.add(ResetRecord{At: now.UTC(), Policy: t.pol.Name, Key: t.label, Who: c.o.WriteTokenName, Reason: b.Reason})
	writeJSON(w, http.StatusOK, map[string]any{"policy": t.pol.Name, "key": t.label, "reset": true, "at": now.UTC()})
}

func (c *Console) getTop(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("policy")
	if !c.known(name) {
		writeProblem(w, http.StatusNotFound, "bad-policy", fmt.Sprintf("No policy named %q; GET /v1/policies lists them.", name))
		return
	}
	n := 20
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > maxTopK {
			writeProblem(w, http.StatusBadRequest, "bad-n", fmt.Sprintf("n %q: must be from 1 to %d.", s, maxTopK))
			return
		}
		n = v
	}
	writeJSON(w, http.StatusOK, map[string]any{"policy": name, "top_k": c.o.TopK, "replica_view": true,
		"keys": c.top(name, n, c.o.Now())})
}

// known reports whether name is a policy's name or an rls rule's label.
func (c *Console) known(name string) bool {
	set := c.o.Policies()
	if set.Policy(name) != nil {
		return true
	}
	_, r := set.RLS().RuleByLabel(name)
	return r != nil
}

// maxTopK bounds n of GET /v1/top.
const maxTopK = 10000

func (c *Console) getSeries(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("policy")
	writeJSON(w, http.StatusOK, map[string]any{"policy": name, "points": c.series(name, c.o.Now())})
}
