package policy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned writes a self-signed certificate and its key into dir and returns their paths.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	for path, b := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

func TestValidateTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir, "server")
	otherCert, otherKey := selfSigned(t, dir, "other")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	tlsBlock := func(fields string) string { return minimal + "tls: {" + fields + "}\n" }
	for _, tt := range []struct {
		name string
		yaml string
		want []string // substrings, one per reported problem, in order
	}{
		{"ok", tlsBlock("cert_file: " + cert + ", key_file: " + key), nil},
		{"ok with client CAs", tlsBlock("cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + otherCert), nil},
		{"no certificate", tlsBlock("client_ca_file: " + otherCert), []string{"tls.cert_file: required when tls is set", "tls.key_file: required when tls is set"}},
		{"missing files", tlsBlock("cert_file: " + missing + ", key_file: " + missing), []string{
			`tls.cert_file: "` + missing + `": cannot read`, `tls.key_file: "` + missing + `": cannot read`}},
		{"key of another certificate", tlsBlock("cert_file: " + cert + ", key_file: " + otherKey), []string{
			`tls.cert_file: "` + cert + `": with tls.key_file "` + otherKey + `": not a usable PEM certificate and key: tls: private key does not match public key`}},
		{"not PEM", tlsBlock("cert_file: " + garbage + ", key_file: " + key), []string{
			`tls.cert_file: "` + garbage + `": with tls.key_file`}},
		{"client CAs not PEM", tlsBlock("cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + garbage), []string{
			`tls.client_ca_file: "` + garbage + `": must hold PEM CA certificates`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml), LoadOptions{Getenv: noEnv})
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			got := errorLines(t, cfg.Validate(noEnv))
			if len(got) != len(tt.want) {
				t.Fatalf("got %d problems %q, want %d %q", len(got), got, len(tt.want), tt.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("problem %d: got %q, want it to start with %q", i, got[i], tt.want[i])
				}
				if strings.Contains(got[i], "PRIVATE KEY") {
					t.Errorf("problem %d quotes the key: %q", i, got[i])
				}
			}
			if tt.want != nil {
				return
			}
			set, err := Compile(cfg, CompileOptions{Getenv: noEnv})
			if err != nil {
				t.Fatal(err)
			}
			m := set.TLS()
			if m == nil || m.Certificate.Leaf == nil || m.Certificate.Leaf.Subject.CommonName != "server" {
				t.Fatalf("TLS material got %+v, want the server certificate", m)
			}
			if wantCAs := strings.Contains(tt.yaml, "client_ca_file"); (m.ClientCAs != nil) != wantCAs {
				t.Errorf("client CAs loaded: got %v, want %v", m.ClientCAs != nil, wantCAs)
			}
		})
	}
}
