package e2e

// End-to-end tests of TLS termination: h2 by ALPN, TLS 1.2 minimum, mutual TLS, gRPC over TLS,
// and a certificate rotated on disk while requests run (a broken one keeps the old).

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// testCA signs certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	pool *x509.CertPool
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pool: x509.NewCertPool()}
	ca.pool.AddCert(cert)
	return ca
}

// issue returns a PEM certificate and key for 127.0.0.1 (server) or a client, with serial.
func (ca *testCA) issue(t *testing.T, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: fmt.Sprintf("leaf-%d", serial)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// writeAtomic replaces path's content in one rename, as Kubernetes and cert-manager do.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tlsGateway starts a gateway that terminates TLS with a certificate of serial 1 from ca, and
// returns it with the paths of its files. extraTLS adds lines to the tls block; rest follows it.
func tlsGateway(t *testing.T, ca *testCA, upstreamURL, extraTLS, rest string, env ...string) (g *gateway, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	c, k := ca.issue(t, 1, false)
	writeAtomic(t, certFile, c)
	writeAtomic(t, keyFile, k)
	g = startGateway(t, upstreamURL, fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n%s%s", certFile, keyFile, extraTLS, rest), env...)
	return g, certFile, keyFile
}

func httpsURL(g *gateway) string { return "https://" + strings.TrimPrefix(g.proxy, "http://") }

func tlsClient(roots *x509.CertPool, h2 bool, certs ...tls.Certificate) *http.Client {
	p := new(http.Protocols)
	p.SetHTTP1(!h2)
	p.SetHTTP2(h2)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Protocols:       p,
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs},
	}}
}

func TestTLSTermination(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "proto %s", r.Header.Get("X-Forwarded-Proto"))
	})
	ca := newTestCA(t, "test CA")
	g, _, _ := tlsGateway(t, ca, up.URL, "", lenientPolicy)
	for _, h2 := range []bool{true, false} {
		resp, body := doGet(t, tlsClient(ca.pool, h2), httpsURL(g)+"/x")
		wantProto := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[h2]
		if resp.StatusCode != http.StatusOK || resp.Proto != wantProto || body != "proto https" {
			t.Errorf("h2=%v: got %d over %s, body %q; want 200 over %s, proto https", h2, resp.StatusCode, resp.Proto, body, wantProto)
		}
		if resp.Header.Get("X-RateLimit-Limit") != "1000" {
			t.Errorf("h2=%v: X-RateLimit-Limit got %q, want 1000", h2, resp.Header.Get("X-RateLimit-Limit"))
		}
	}
	// curl, where present, negotiates h2 by ALPN.
	if curl, err := exec.LookPath("curl"); err == nil {
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		writeAtomic(t, caFile, ca.pem)
		out, err := exec.Command(curl, "-sS", "--http2", "--cacert", caFile, "-o", os.DevNull,
			"-w", "%{http_version} %{http_code}", httpsURL(g)+"/x").CombinedOutput()
		if err != nil {
			t.Fatalf("curl --http2: %v: %s", err, out)
		}
		if got, want := string(out), "2 200"; got != want {
			t.Errorf("curl --http2 over TLS: got %q, want %q", got, want)
		}
	} else {
		t.Log("curl not found: the curl h2 check did not run")
	}
	// TLS 1.1 is refused; plaintext HTTP on the TLS port gets no answer from the proxy.
	old := &tls.Config{RootCAs: ca.pool, MaxVersion: tls.VersionTLS11}
	if conn, err := tls.Dial("tcp", strings.TrimPrefix(g.proxy, "http://"), old); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 handshake succeeded, want it refused (TLS 1.2 minimum)")
	}
	if resp, err := http.Get(g.proxy + "/x"); err == nil {
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP on the TLS port was forwarded")
		}
		resp.Body.Close()
	}

	// gRPC over TLS: h2 by ALPN.
	gup := newGRPCUpstream(t)
	gg, _, _ := tlsGateway(t, ca, "http://"+gup.addr, "", "upstream_protocol: h2c\n"+lenientPolicy)
	cc, err := grpc.NewClient(strings.TrimPrefix(gg.proxy, "http://"),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := healthpb.NewHealthClient(cc).Check(callCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC over TLS: got %v, %v; want SERVING", resp, err)
	}
}

func TestTLSMutual(t *testing.T) {
	up := newUpstream(t, nil)
	ca := newTestCA(t, "server CA")
	clientCA := newTestCA(t, "client CA")
	caFile := filepath.Join(t.TempDir(), "clients.pem")
	writeAtomic(t, caFile, clientCA.pem)
	g, _, _ := tlsGateway(t, ca, up.URL, "  client_ca_file: "+caFile+"\n", lenientPolicy)

	if resp, err := tlsClient(ca.pool, true).Get(httpsURL(g) + "/x"); err == nil {
		resp.Body.Close()
		t.Errorf("no client certificate: got %d, want the handshake refused", resp.StatusCode)
	}
	stranger := newTestCA(t, "another CA")
	sc, sk := stranger.issue(t, 7, true)
	strangerCert, err := tls.X509KeyPair(sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := tlsClient(ca.pool, true, strangerCert).Get(httpsURL(g) + "/x"); err == nil {
		resp.Body.Close()
		t.Errorf("client certificate of another CA: got %d, want the handshake refused", resp.StatusCode)
	}
	cc, ck := clientCA.issue(t, 8, true)
	clientCert, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := doGet(t, tlsClient(ca.pool, true, clientCert), httpsURL(g)+"/x"); resp.StatusCode != http.StatusOK {
		t.Errorf("good client certificate: got %d %s, want 200", resp.StatusCode, body)
	}
}

// servedSerial handshakes with the gateway and returns the serial of the certificate it served.
func servedSerial(t *testing.T, g *gateway, roots *x509.CertPool) int64 {
	t.Helper()
	conn, err := tls.Dial("tcp", strings.TrimPrefix(g.proxy, "http://"), &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestTLSCertificateRotation: a certificate replaced on disk is served to new connections
// without a restart while requests keep succeeding; a broken replacement keeps the running
// certificate and is reported like a bad config.
func TestTLSCertificateRotation(t *testing.T) {
	up := newUpstream(t, nil)
	ca := newTestCA(t, "test CA")
	g, certFile, keyFile := tlsGateway(t, ca, up.URL, "", lenientPolicy)
	if got := servedSerial(t, g, ca.pool); got != 1 {
		t.Fatalf("serial before rotation got %d, want 1", got)
	}

	// Requests run throughout, each on a new connection so that each handshake sees the
	// certificate in force.
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := tlsClient(ca.pool, true)
			if resp, err := c.Get(httpsURL(g) + "/x"); err != nil || resp.StatusCode != http.StatusOK {
				failed.Add(1)
			} else {
				ok.Add(1)
				resp.Body.Close()
			}
			c.CloseIdleConnections()
		}
	}()

	c2, k2 := ca.issue(t, 2, false)
	// The key goes first: until the certificate follows, the pair does not match and that
	// reload fails, which must not disturb anything.
	writeAtomic(t, keyFile, k2)
	writeAtomic(t, certFile, c2)
	eventually(t, "the rotated certificate served", func() bool { return servedSerial(t, g, ca.pool) == 2 })

	errorsBefore := metric(t, g.admin, `ratelimit_config_reloads_total{result="error"}`)
	writeAtomic(t, certFile, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	eventually(t, "the broken certificate reported", func() bool {
		return metric(t, g.admin, `ratelimit_config_reloads_total{result="error"}`) > errorsBefore
	})
	if got := servedSerial(t, g, ca.pool); got != 2 {
		t.Errorf("serial after a broken rotation got %d, want 2 (the running certificate)", got)
	}
	if !strings.Contains(g.logs.String(), "tls.cert_file") {
		t.Error("the log does not name tls.cert_file for the broken certificate")
	}
	close(stop)
	<-done
	t.Logf("requests during the rotations: %d ok, %d failed", ok.Load(), failed.Load())
	if ok.Load() == 0 || failed.Load() != 0 {
		t.Errorf("requests during the rotations: %d ok, %d failed; want all ok", ok.Load(), failed.Load())
	}
}
