package sessionca_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sessionca"
)

// TestHandshake: a client that trusts the CA's certificate alone completes
// a TLS handshake with a server presenting the CA's certificate for the
// name it dialled, and fails for another name.
func TestHandshake(t *testing.T) {
	ca, err := sessionca.New("s-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("the CA's PEM does not parse")
	}
	for _, c := range []struct {
		host, serverName string
		ok               bool
	}{
		{"api.example.test", "api.example.test", true},
		{"API.Example.TEST.", "api.example.test", true},
		{"127.0.0.1", "127.0.0.1", true},
		{"::1", "::1", true},
		{"api.example.test", "other.example.test", false},
	} {
		cert, err := ca.Certificate(c.host)
		if err != nil {
			t.Fatal(err)
		}
		err = handshake(t, cert, &tls.Config{RootCAs: pool, ServerName: c.serverName})
		if (err == nil) != c.ok {
			t.Errorf("%s as %s: handshake error %v, want ok=%v", c.host, c.serverName, err, c.ok)
		}
	}
}

func handshake(t *testing.T, cert *tls.Certificate, cfg *tls.Config) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{*cert}})
	go func() {
		if srv.Handshake() == nil {
			io.Copy(io.Discard, srv)
		}
		srv.Close()
	}()
	return tls.Client(b, cfg).Handshake()
}

// TestProperties: the CA signs end-entity server certificates only, valid
// within its own life, and reuses a host's certificate.
func TestProperties(t *testing.T) {
	ca, err := sessionca.New("s-test", 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	root := ca.Cert()
	if !root.IsCA || root.MaxPathLen != 0 || !root.MaxPathLenZero {
		t.Errorf("CA: IsCA %v MaxPathLen %d zero %v, want a CA of path length 0", root.IsCA, root.MaxPathLen, root.MaxPathLenZero)
	}
	if d := root.NotAfter.Sub(root.NotBefore); d < 2*time.Hour || d > 2*time.Hour+2*time.Minute {
		t.Errorf("CA valid for %v, want 2h", d)
	}
	a, _ := ca.Certificate("a.test")
	b, _ := ca.Certificate("a.test")
	if a != b {
		t.Error("a host's certificate was made twice")
	}
	leaf := a.Leaf
	if leaf.IsCA || leaf.NotAfter.After(root.NotAfter) || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("leaf: IsCA %v NotAfter %v (CA %v) EKU %v", leaf.IsCA, leaf.NotAfter, root.NotAfter, leaf.ExtKeyUsage)
	}
	if len(a.Certificate) != 2 {
		t.Errorf("chain of %d certificates, want the leaf and the CA", len(a.Certificate))
	}
	// A certificate it signed cannot sign another: path length 0.
	pool := x509.NewCertPool()
	pool.AddCert(root)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "a.test"}); err != nil {
		t.Errorf("the leaf does not verify: %v", err)
	}
}

// TestClose: after Close no certificate is issued, and a second Close is
// harmless.
func TestClose(t *testing.T) {
	ca, err := sessionca.New("s-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Certificate("a.test"); err != nil {
		t.Fatal(err)
	}
	ca.Close()
	ca.Close()
	if !ca.Closed() {
		t.Error("Closed is false after Close")
	}
	if _, err := ca.Certificate("a.test"); !errors.Is(err, sessionca.ErrClosed) {
		t.Errorf("Certificate after Close: %v, want ErrClosed (even for a host issued before)", err)
	}
}

func BenchmarkNew(b *testing.B) {
	for b.Loop() {
		ca, err := sessionca.New("s", time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		ca.Close()
	}
}
