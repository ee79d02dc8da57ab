package bucket

import (
	"errors"
	"fmt"
)

// OnError is store.on_error: what becomes of a decision the store cannot make (an error, a
// timeout, an open circuit). It is parsed once (ParseOnError), applied once by the store that
// guards the shared one (internal/fallback), and only rendered by the front ends, which read it
// from the *UndecidedError that store returns.
type OnError uint8

// The rules. The zero OnError is Allow, the config's default.
const (
	// Allow lets the request through without limits (fail open): the proxy forwards it without
	// rate-limit headers, the rate limit service answers OK.
	Allow OnError = iota
	// Deny refuses it (fail closed): the proxy answers 503 with Retry-After: 1, the rate limit
	// service the gRPC status UNAVAILABLE.
	Deny
	// Local decides from this replica's own memory store with every limit divided by the
	// replicas; such a decision is no error, so no front end ever renders Local.
	Local
)

var onErrorNames = [...]string{Allow: "allow", Deny: "deny", Local: "local"}

// ParseOnError reads a value of store.on_error: allow (also ""), deny or local.
func ParseOnError(s string) (OnError, error) {
	switch s {
	case "", "allow":
		return Allow, nil
	case "deny":
		return Deny, nil
	case "local":
		return Local, nil
	}
	return Allow, fmt.Errorf("store.on_error %q: must be allow, deny or local", s)
}

// String returns the config spelling of o.
func (o OnError) String() string {
	if int(o) < len(onErrorNames) {
		return onErrorNames[o]
	}
	return fmt.Sprintf("OnError(%d)", uint8(o))
}

// FailsClosed reports whether an undecided request is refused.
func (o OnError) FailsClosed() bool { return o == Deny }

// UndecidedError is the error of a Take that could not decide, carrying the on_error rule that
// applies to it: the front ends answer by its Rule, never by a rule of their own. Err is the
// store's own error (errors.Is(err, context.DeadlineExceeded) sees through it).
type UndecidedError struct {
	Rule OnError
	Err  error
}

func (e *UndecidedError) Error() string {
	return fmt.Sprintf("store could not decide (on_error %s): %v", e.Rule, e.Err)
}

func (e *UndecidedError) Unwrap() error { return e.Err }

// RuleOf is the on_error rule for err, a failed Take: the Rule of the *UndecidedError in its
// chain, else Allow (a store that no rule guards, as in tests: the config's default).
func RuleOf(err error) OnError {
	if ue, ok := errors.AsType[*UndecidedError](err); ok {
		return ue.Rule
	}
	return Allow
}
