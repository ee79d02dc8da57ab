package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Bounds of admin.top_k and admin.max_exemptions, and the shortest admin token accepted.
const (
	maxTopK = 10000
	// MaxExemptions bounds admin.max_exemptions: dynamo.MaxExemptions, what the table's index
	// of exemptions holds within DynamoDB's item size (a server test keeps the two equal).
	MaxExemptions    = 5000
	minAdminTokenLen = 16
)

// checkAdmin checks the admin block: the token variables must hold a token (never quoted in
// the error), top_k and max_exemptions must be within their bounds.
func checkAdmin(es *Errors, a *AdminConfig, getenv func(string) string) {
	for _, f := range []struct{ path, name string }{
		{"admin.token_env", a.TokenEnv},
		{"admin.read_token_env", a.ReadTokenEnv},
	} {
		if f.name == "" {
			continue
		}
		if _, err := adminToken(f.name, getenv); err != nil {
			shown := f.name
			if !isIdentifier(f.name) {
				shown = "" // probably the token itself, pasted into the wrong field
			}
			es.add(f.path, shown, err.Error())
		}
	}
	if n := a.TopK; n < 1 || n > maxTopK {
		es.add("admin.top_k", strconv.Itoa(n), fmt.Sprintf("must be from 1 to %d", maxTopK))
	}
	if n := a.MaxExemptions; n < 1 || n > MaxExemptions {
		es.add("admin.max_exemptions", strconv.Itoa(n), fmt.Sprintf("must be from 1 to %d", MaxExemptions))
	}
	if len(a.Hosts) > maxAdminHosts {
		es.add("admin.hosts", strconv.Itoa(len(a.Hosts))+" names", fmt.Sprintf("at most %d", maxAdminHosts))
	}
	for i, h := range a.Hosts {
		if err := checkAdminHost(h); err != nil {
			es.add(fmt.Sprintf("admin.hosts[%d]", i), h, err.Error())
		}
	}
}

// maxAdminHosts bounds admin.hosts: each is a name an operator reaches the listener by.
const maxAdminHosts = 100

// checkAdminHost checks one entry of admin.hosts: a host name or an IP literal, without
// scheme, port, path or wildcard (a wildcard would answer names an attacker can register).
func checkAdminHost(h string) error {
	if h == "" {
		return errors.New("empty")
	}
	inner := strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if a, err := netip.ParseAddr(inner); err == nil {
		if a.IsUnspecified() {
			return errors.New("an unspecified address names no host: give the address clients connect to")
		}
		return nil
	}
	switch {
	case strings.Contains(h, "://") || strings.Contains(h, "/"):
		return errors.New("want a host name, without scheme or path (e.g. console.example.com)")
	case strings.Contains(h, "*"):
		return errors.New("wildcards are not accepted: list each name")
	case strings.Contains(h, ":"):
		return errors.New("want a host name without a port (the port is not compared)")
	}
	name := strings.TrimSuffix(h, ".")
	if len(name) > 253 {
		return errors.New("longer than a DNS name (253 bytes)")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("want a DNS name: dot-separated labels of 1 to 63 characters")
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("character %q: want letters, digits, '-' or '_' in a DNS name (an international name in its xn-- form)", r)
			}
		}
	}
	return nil
}

// adminToken reads the token that the variable name holds. The error never quotes its value.
func adminToken(name string, getenv func(string) string) (string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	v := getenv(name)
	switch {
	case v == "":
		return "", errors.New("environment variable is not set or empty")
	case len(v) < minAdminTokenLen:
		return "", fmt.Errorf("token must be at least %d bytes", minAdminTokenLen)
	}
	return v, nil
}

// AdminTokens reads the admin tokens that cfg names through getenv (nil means os.Getenv): the
// write token and the read token, "" for a variable the admin block does not name.
func AdminTokens(cfg *Config, getenv func(string) string) (write, read string, err error) {
	if cfg.Admin.TokenEnv != "" {
		if write, err = adminToken(cfg.Admin.TokenEnv, getenv); err != nil {
			return "", "", fmt.Errorf("admin.token_env: %w", err)
		}
	}
	if cfg.Admin.ReadTokenEnv != "" {
		if read, err = adminToken(cfg.Admin.ReadTokenEnv, getenv); err != nil {
			return "", "", fmt.Errorf("admin.read_token_env: %w", err)
		}
	}
	return write, read, nil
}
