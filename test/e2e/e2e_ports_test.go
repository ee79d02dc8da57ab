package e2e

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestStartGatewayPortTaken: freePorts closes its listeners before the gateway binds, so another
// process may take a port in between, and may even answer /readyz there. startGateway must not
// take that answer for its gateway's, and must start it again on new ports (TestGRPCSilentStream
// once dialled a gateway that never started: its admin port answered for another).
func TestStartGatewayPortTaken(t *testing.T) {
	foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})) // /readyz: 200
	t.Cleanup(foreign.Close)
	taken := strings.TrimPrefix(foreign.URL, "http://")
	calls := 0
	gatewayPorts = func(t *testing.T, n int) []string {
		calls++
		ports := freePorts(t, n)
		if calls == 1 {
			ports[1] = taken // the admin port
		}
		return ports
	}
	t.Cleanup(func() { gatewayPorts = freePorts })
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, ipPolicy)
	if calls != 2 {
		t.Errorf("ports chosen %d times, want 2 (the first set had a taken port)", calls)
	}
	if g.admin == foreign.URL {
		t.Fatalf("startGateway returned the gateway on the taken admin port")
	}
	res, err := http.Get(g.proxy + "/x")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("the gateway started again: got %d, want 200", res.StatusCode)
	}
}
