package policy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"sync"
)

// PseudonymLen is the length of a pseudonym in hex digits (128 bits of the HMAC).
const PseudonymLen = 32

// Pseudonyms turns client key values into the pseudonyms that log lines carry instead of them:
// HMAC-SHA256 under a secret of `kind 0x00 value`, cut to 16 bytes, in hex. kind is a policy's
// KeyKind (ip, api_key, user, header:name), so one client has one pseudonym per kind in every
// policy and every log line, and a pseudonym of an api key never equals that of a user id.
//
// An unkeyed hash would not do: small key spaces (every IPv4 address, numeric user ids) can be
// hashed in full and the log lines searched. With a secret nobody can, while lines about the same
// client still share a pseudonym. A Pseudonyms is safe for concurrent use; the zero value is not
// usable (see NewPseudonyms).
type Pseudonyms struct {
	secret []byte
	macs   sync.Pool // hash.Hash keyed with secret
}

// NewPseudonyms returns pseudonyms keyed by secret; an empty secret draws a random one, so that
// pseudonyms are stable only within the process.
func NewPseudonyms(secret []byte) *Pseudonyms {
	if len(secret) == 0 {
		secret = make([]byte, 32)
		rand.Read(secret) // never fails (crypto/rand, Go 1.24+)
	}
	ps := &Pseudonyms{secret: append([]byte(nil), secret...)}
	ps.macs.New = func() any { return hmac.New(sha256.New, ps.secret) }
	return ps
}

// Append appends the pseudonym of value (of the given key kind) to dst.
func (ps *Pseudonyms) Append(dst []byte, kind, value string) []byte {
	m := ps.macs.Get().(hash.Hash)
	m.Reset()
	// One write from a stack buffer (for the common lengths): writing a converted string
	// through the hash.Hash interface would allocate it on the heap.
	var buf [256]byte
	b := append(buf[:0], kind...)
	b = append(b, 0)
	b = append(b, value...)
	m.Write(b)
	var sum [sha256.Size]byte
	out := m.Sum(sum[:0])
	ps.macs.Put(m)
	return hex.AppendEncode(dst, out[:PseudonymLen/2])
}

// Of returns the pseudonym of value (of the given key kind).
func (ps *Pseudonyms) Of(kind, value string) string {
	var buf [PseudonymLen]byte
	return string(ps.Append(buf[:0], kind, value))
}

// minPseudonymSecret is the shortest secret accepted: HMAC-SHA256's block-size key strength.
const minPseudonymSecret = 32

// errPseudonymSecret is why a log.pseudonym_secret_env variable is refused.
var errPseudonymSecret = errors.New("environment variable is not set or empty")

// PseudonymSecret reads the secret that log.pseudonym_secret_env names through getenv (nil means
// os.Getenv). The error never quotes the variable's value.
func PseudonymSecret(name string, getenv func(string) string) ([]byte, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	v := getenv(name)
	switch {
	case v == "":
		return nil, errPseudonymSecret
	case len(v) < minPseudonymSecret:
		return nil, fmt.Errorf("secret must be at least %d bytes", minPseudonymSecret)
	}
	return []byte(v), nil
}

// LogPseudonyms builds the pseudonyms that cfg's log lines use: keyed by the secret that
// log.pseudonym_secret_env names, or by a random one when it is unset.
func LogPseudonyms(cfg *Config, getenv func(string) string) (*Pseudonyms, error) {
	if cfg.Log.PseudonymSecretEnv == "" {
		return NewPseudonyms(nil), nil
	}
	secret, err := PseudonymSecret(cfg.Log.PseudonymSecretEnv, getenv)
	if err != nil {
		return nil, fmt.Errorf("log.pseudonym_secret_env: %w", err)
	}
	return NewPseudonyms(secret), nil
}
