package proxy

import (
	"net/http"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// decNone is a request that no decision was counted for: the client left while the limiter
// decided.
const decNone = -1

// AccessMessage is the message of access log lines (logger "access"); replay recognises the
// gateway's own lines by it.
const AccessMessage = "request"

// logAccess writes the access log line of one request (Options.AccessLog):
//
//	{"level":"info","ts":...,"logger":"access","msg":"request","time":"2026-12-03T07:47:06.123456789Z",
//	 "method":"GET","path":"/api/x","status":429,"duration_seconds":0.000231,"decision":"limited",
//	 "protocol":"http1","policy":"per-key","keys":{"ip":"<pseudonym>","api_key":"<pseudonym>"}}
//
// time is the instant the limiter decided at, or the arrival when it was not asked (UTC, RFC 3339
// with nanoseconds); replay uses it as its clock.
// path is the URL path without the query, which can carry credentials (?api_key=). status is 0
// when nothing was written (the client left). decision is the label of
// ratelimit_decisions_total ("canceled" when the client left before one was made);
// policy, only on a 429, names the policy the response names. keys holds the pseudonym of each
// key kind the policies use (whether or not they matched): never a raw value.
func (h *Handler) logAccess(r *http.Request, st *reqState, start, end time.Time) {
	ce := h.access.Check(zap.InfoLevel, AccessMessage)
	if ce == nil {
		return
	}
	decision := "canceled"
	if st.decision != decNone {
		decision = decisionNames[st.decision]
	}
	path := ""
	if r.URL != nil {
		path = r.URL.Path
	}
	fields := make([]zap.Field, 0, 8)
	at := start
	if !st.now.IsZero() {
		at = st.now // the instant the limiter decided at: replay decides there too
	}
	fields = append(fields,
		zap.String("time", at.UTC().Format(time.RFC3339Nano)),
		zap.String("method", r.Method),
		zap.String("path", path),
		zap.Int("status", st.fw.status),
		zap.Float64("duration_seconds", end.Sub(start).Seconds()),
		zap.String("decision", decision),
		zap.String("protocol", protocolNames[st.proto]),
	)
	if st.rejector != "" {
		fields = append(fields, zap.String("policy", st.rejector))
	}
	fields = append(fields, zap.Object("keys", accessKeys{h: h, p: &st.plan}))
	ce.Write(fields...)
}

// accessKeys renders the "keys" object of an access log line: the plan's Identity when the
// planner filled it, else the key kinds of its charges.
type accessKeys struct {
	h *Handler
	p *policy.Plan
}

func (a accessKeys) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	var buf [policy.PseudonymLen]byte
	if len(a.p.Identity) > 0 {
		for i, kv := range a.p.Identity {
			enc.AddByteString(kv.Kind, a.h.pseudonyms.Append(buf[:0], kv.Kind, a.p.IdentityValue(i)))
		}
		return nil
	}
	seen := make(map[string]bool, len(a.p.Policies))
	for i, pol := range a.p.Policies {
		if pol.KeyKind == "global" || pol.KeyKind == "" || seen[pol.KeyKind] {
			continue
		}
		seen[pol.KeyKind] = true
		enc.AddByteString(pol.KeyKind, a.h.pseudonyms.Append(buf[:0], pol.KeyKind, a.p.KeyValue(i)))
	}
	return nil
}
