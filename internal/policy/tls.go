package policy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"
)

// TLSConfig terminates TLS on the proxy listener. The block's presence switches TLS on (a
// restart is needed to switch it on or off); the files are re-read on every reload, so a
// certificate rotated on disk is served without a restart.
type TLSConfig struct {
	// CertFile is the PEM certificate chain, leaf first. (Required)
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM private key of the leaf. (Required)
	KeyFile string `yaml:"key_file"`
	// ClientCAFile, when set, holds the PEM CA certificates that client certificates must chain
	// to: every client must present one (mutual TLS). (Optional) default: no client
	// certificates asked.
	ClientCAFile string `yaml:"client_ca_file"`
}

// TLSMaterial is a loaded tls block, immutable once built.
type TLSMaterial struct {
	// Certificate is the server's certificate chain and key.
	Certificate tls.Certificate
	// ClientCAs verifies client certificates; nil when tls.client_ca_file is unset.
	ClientCAs *x509.CertPool
	// NotAfter is when the leaf certificate expires.
	NotAfter time.Time
}

// checkTLS validates the tls block and loads its files; a file that cannot be read or parsed is
// reported with its field and path, never with its content.
func checkTLS(es *Errors, t *TLSConfig) *TLSMaterial {
	if t.CertFile == "" {
		es.add("tls.cert_file", "", "required when tls is set")
	}
	if t.KeyFile == "" {
		es.add("tls.key_file", "", "required when tls is set")
	}
	m := new(TLSMaterial)
	ok := true
	if t.CertFile != "" && t.KeyFile != "" {
		certPEM, err := os.ReadFile(t.CertFile)
		if err != nil {
			es.add("tls.cert_file", t.CertFile, fmt.Sprintf("cannot read: %v", err))
			ok = false
		}
		keyPEM, err := os.ReadFile(t.KeyFile)
		if err != nil {
			es.add("tls.key_file", t.KeyFile, fmt.Sprintf("cannot read: %v", err))
			ok = false
		}
		if ok {
			// tls's errors name what is wrong (no PEM data, a key that does not match the
			// certificate) without quoting the key.
			cert, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				es.add("tls.cert_file", t.CertFile, fmt.Sprintf("with tls.key_file %q: not a usable PEM certificate and key: %v", t.KeyFile, err))
				ok = false
			} else {
				m.Certificate = cert
				m.NotAfter = cert.Leaf.NotAfter
			}
		}
	} else {
		ok = false
	}
	if f := t.ClientCAFile; f != "" {
		data, err := os.ReadFile(f)
		switch {
		case err != nil:
			es.add("tls.client_ca_file", f, fmt.Sprintf("cannot read: %v", err))
			ok = false
		default:
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(data) {
				es.add("tls.client_ca_file", f, "must hold PEM CA certificates")
				ok = false
			}
			m.ClientCAs = pool
		}
	}
	if !ok {
		return nil
	}
	return m
}
