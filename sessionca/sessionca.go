// Package sessionca is the certificate authority of one session: made by
// the daemon when the session starts, held in the daemon's memory only,
// and forgotten when the session ends. The egress proxy presents its
// certificates to the session's programs when it inspects their HTTPS
// (to put a secret in place of its placeholder), and the session trusts
// it through its certificate alone (CertPEM): the key never leaves this
// process.
//
//	ca, err := sessionca.New("s-1234", 24*time.Hour)
//	defer ca.Close()
//	cert, err := ca.Certificate("api.github.com") // for tls.Config.GetCertificate
//
// What it guarantees: the CA's key and its certificates' keys are made
// from crypto/rand, are never written anywhere (no file, no log, no
// method returns them), and after Close no certificate is issued and the
// keys are no longer referred to; the CA may issue only end-entity
// certificates (path length 0) for server authentication, valid until the
// CA itself expires. What it does not: Go gives no way to wipe a key from
// memory — after Close the garbage collector reclaims it, but a core dump
// of the daemon before then holds it; a program that trusts the CA trusts
// it for every name, which is why it is one session's alone.
package sessionca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// ErrClosed is what Certificate fails with after Close.
var ErrClosed = errors.New("sessionca: the session's certificate authority is closed")

// maxLeaves bounds the certificates a CA keeps for reuse; past it the
// cache starts again (a session naming thousands of hosts pays a
// signature per new one, ~50 µs).
const maxLeaves = 512

// CA is one session's certificate authority. It is safe for concurrent
// use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte

	mu      sync.Mutex
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey // one key for every certificate the CA issues
	leaves  map[string]*tls.Certificate
	closed  bool
}

// New makes a CA named for the session, valid from a minute ago for
// validity (at least an hour).
func New(session string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "sandboxd session " + session, Organization: []string{"sandboxd egress inspection"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(max(validity, time.Hour)),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{
		cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key: key, leafKey: leafKey, leaves: map[string]*tls.Certificate{},
	}, nil
}

// CertPEM is the CA's certificate, PEM-encoded: what the session trusts.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// Cert is the CA's certificate.
func (ca *CA) Cert() *x509.Certificate { return ca.cert }

// Certificate returns a certificate for host (a DNS name or an IP
// address, without a port) signed by the CA, with the CA's certificate as
// its chain, for a TLS server to present. Certificates are kept and reused
// per host.
func (ca *CA) Certificate(host string) (*tls.Certificate, error) {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" {
		return nil, errors.New("sessionca: no host name")
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.closed {
		return nil, ErrClosed
	}
	if c := ca.leaves[host]; c != nil {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    ca.cert.NotBefore,
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sessionca: a certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	ca.leaves[host] = c
	return c, nil
}

// Close forgets the CA's keys and certificates: Certificate fails with
// ErrClosed from then on, and nothing refers to the keys any more (see the
// package's note on what that does not promise). Close may be called more
// than once.
func (ca *CA) Close() {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.closed {
		return
	}
	ca.closed = true
	ca.key, ca.leafKey = nil, nil
	clear(ca.leaves)
}

// Closed reports whether Close was called.
func (ca *CA) Closed() bool {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.closed
}

// ParseCertificates reads PEM certificates, and nothing else: a block of
// another type, a certificate that does not parse, or no certificate at
// all is an error. It is how the daemon reads the authorities an operator
// adds (caCerts).
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := bytes.TrimSpace(data); len(rest) > 0; rest = bytes.TrimSpace(rest) {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil || block.Type != "CERTIFICATE" {
			return nil, errors.New("want PEM certificates (-----BEGIN CERTIFICATE-----) and nothing else")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("a certificate that does not parse: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificate")
	}
	return certs, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on the systems Go supports
	}
	return n.Add(n, big.NewInt(1))
}
