package policy

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"http://h:8080/p", "http://h:8080/p"},
		{"http://u:p@h", "http://u:xxxxx@h"},
		{"https://token@h/x", "https://xxxxx@h/x"},
		{"http://u:p@h/%zz", "http://xxxxx@h/%zz"},
		{"u:p@h", "xxxxx@h"},
		{"not a url", "not a url"},
		{"http://h/%zz", "http://h/%zz"},
	}
	for _, tt := range tests {
		if got := redactURL(tt.in); got != tt.want {
			t.Errorf("redactURL(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}

// readServerRequest parses raw as net/http's server does, so that header handling (Host moved
// out of the map, canonical names) is the real one.
func readServerRequest(t *testing.T, raw string) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatalf("ReadRequest: %v", err)
	}
	r.RemoteAddr = "192.0.2.1:1234"
	return r
}

// TestUnseenHeadersLeaveRequestHeader pins the reason validation refuses header:Host and
// header:Transfer-Encoding: net/http's server takes them out of Request.Header. If a Go release
// kept them, this fails and the refusal can be reconsidered.
func TestUnseenHeadersLeaveRequestHeader(t *testing.T) {
	r := readServerRequest(t, "POST / HTTP/1.1\r\nHost: tenant-a.example\r\nTransfer-Encoding: chunked\r\nX-Tenant: acme\r\n\r\n0\r\n\r\n")
	for _, name := range []string{"Host", "Transfer-Encoding"} {
		if v, ok := r.Header[name]; ok {
			t.Errorf("got %s: %q in Request.Header, want it moved out by net/http", name, v)
		}
		if unseenHeader(name) == "" {
			t.Errorf("unseenHeader(%q): got \"\", want a reason", name)
		}
	}
	if got := r.Header.Get("X-Tenant"); got != "acme" {
		t.Errorf("got X-Tenant %q, want acme: other headers stay", got)
	}
	if unseenHeader("X-Tenant") != "" {
		t.Errorf("unseenHeader(X-Tenant): got a reason, want none")
	}
}
