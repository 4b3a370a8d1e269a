package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// testCA is a certificate authority for the proxy's side of inspection,
// made here: the egress package imports nothing of the project, its tests
// neither (the daemon's is package sessionca).
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	mu   sync.Mutex
	made map[string]*tls.Certificate
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, made: map[string]*tls.Certificate{}}
}

func (ca *testCA) Certificate(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.made[host]; c != nil {
		return c, nil
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{host},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	ca.made[host] = c
	return c, nil
}

const (
	testValue       = "s3cr3t-VALUE-of-the-token-7f2a"
	testPlaceholder = "sbx_ph_PLACEHOLDER0123456789"
)

// broker is a proxy with one secret, for the destinations of its
// servers, all on loopback under names the fake DNS gives.
type broker struct {
	u     *url.URL
	px    *Proxy
	ca    *testCA
	audit *audit
	srv   *httptest.Server // api.example.com, the secret's destination, HTTPS
	other *httptest.Server // other.example.com, allowed, no secret, HTTPS
	plain *httptest.Server // plain.example.com, allowed, no secret, HTTP
	seen  chan *http.Request
}

func newBroker(t *testing.T, secret func(s *Secret), opts ...Option) *broker {
	t.Helper()
	b := &broker{ca: newTestCA(t), audit: newAudit(), seen: make(chan *http.Request, 100)}
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.seen <- r.Clone(r.Context())
		switch r.URL.Path {
		case "/echo":
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
			fmt.Fprintf(w, "you sent %s and %s", r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"))
		default:
			fmt.Fprint(w, "hello from "+r.Host)
		}
	})
	b.srv = httptest.NewTLSServer(record)
	b.other = httptest.NewTLSServer(record)
	b.plain = httptest.NewServer(record)
	t.Cleanup(b.srv.Close)
	t.Cleanup(b.other.Close)
	t.Cleanup(b.plain.Close)
	roots := x509.NewCertPool()
	roots.AddCert(b.srv.Certificate())
	roots.AddCert(b.other.Certificate())
	dns := &fakeDNS{names: map[string][]string{"api.example.com": {"127.0.0.1"}, "other.example.com": {"127.0.0.1"}, "plain.example.com": {"127.0.0.1"}, "example.com": {"127.0.0.1"}}}
	s := Secret{Name: "API_TOKEN", Placeholder: testPlaceholder, Allow: []string{"api.example.com:" + port(t, b.srv)},
		Value: func() (string, error) { return testValue, nil }}
	if secret != nil {
		secret(&s)
	}
	pol := Policy{Allow: []string{"api.example.com:" + port(t, b.srv), "other.example.com:" + port(t, b.other), "plain.example.com:" + port(t, b.plain)}, AllowPrivate: []string{"127.0.0.1"}}
	all := append([]Option{WithResolver(dns), WithAudit(b.audit.add), WithSession("s-1", "acme"),
		WithTLS(TLS{Certificate: b.ca.Certificate, RootCAs: roots, Trusted: true}), WithSecrets(s)}, opts...)
	b.u, b.px = serve(t, pol, all...)
	return b
}

// client trusts the proxy's CA (the session's) and the servers' own
// certificates, and names call as its user.
func (b *broker) client(call string) *http.Client {
	u := *b.u
	if call != "" {
		u.User = url.UserPassword(call, callUser)
	}
	pool := b.ca.pool.Clone()
	pool.AddCert(b.srv.Certificate())
	pool.AddCert(b.other.Certificate())
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&u), TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func (b *broker) url(srv *httptest.Server, name, path string) string {
	u, _ := url.Parse(srv.URL)
	return u.Scheme + "://" + name + ":" + u.Port() + path
}

func do(t *testing.T, c *http.Client, method, u string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// noValue fails when the secret's value is in any record so far.
func (b *broker) noValue(t *testing.T) {
	t.Helper()
	b.audit.mu.Lock()
	defer b.audit.mu.Unlock()
	for _, r := range b.audit.recs {
		if strings.Contains(fmt.Sprintf("%+v", r), testValue) {
			t.Errorf("a record holds the secret's value: %+v", r)
		}
	}
}

// TestSecretInjected: the placeholder in a header, in Basic authorization
// (a URL's user:password@), in X-Api-Key, becomes the value in the
// request the secret's destination receives over the proxy's inspected
// HTTPS; the program sees the destination through a certificate of the
// proxy's CA; the record names the secret, never the value.
func TestSecretInjected(t *testing.T) {
	b := newBroker(t, nil)
	c := b.client("call-1")
	base := b.url(b.srv, "api.example.com", "/x")
	for _, tc := range []struct {
		name   string
		url    string
		header map[string]string
		check  func(r *http.Request) bool
	}{
		{"bearer", base, map[string]string{"Authorization": "Bearer " + testPlaceholder},
			func(r *http.Request) bool {
				return r.Header.Get("Authorization") == "Bearer "+testValue
			}},
		{"header", base, map[string]string{"X-Api-Key": testPlaceholder},
			func(r *http.Request) bool { return r.Header.Get("X-Api-Key") == testValue }},
		{"basic userinfo", strings.Replace(base, "https://", "https://x-access-token:"+testPlaceholder+"@", 1), nil,
			func(r *http.Request) bool {
				u, p, ok := r.BasicAuth()
				return ok && u == "x-access-token" && p == testValue
			}},
	} {
		resp, body := do(t, c, "GET", tc.url, tc.header)
		if resp.StatusCode != 200 || !strings.HasPrefix(body, "hello from api.example.com") {
			t.Errorf("%s: %d %q", tc.name, resp.StatusCode, body)
		}
		if got := <-b.seen; !tc.check(got) {
			t.Errorf("%s: the destination saw %v", tc.name, got.Header)
		}
		if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != "egress test CA" {
			t.Errorf("%s: the program saw %v, want the proxy's certificate", tc.name, resp.TLS.PeerCertificates[0].Issuer)
		}
	}
	c.CloseIdleConnections()
	rec := b.audit.wait(t, 1)
	if !rec.Inspected || len(rec.Secrets) != 1 || rec.Secrets[0] != "API_TOKEN" || rec.Call != "call-1" || rec.Outcome != OutcomeOK {
		t.Errorf("record: %+v; want inspected, secret API_TOKEN, call call-1", rec)
	}
	b.noValue(t)
}

// TestSecretRefusedElsewhere: a request that carries the placeholder to an
// allowed host the secret may not go to (plain HTTP, which the proxy sees),
// in a URL, or on the secret's host with a method or path it may not go
// with, is refused with a 403 that names the secret and where it may go;
// nothing reaches a destination, and the value is in no answer.
func TestSecretRefusedElsewhere(t *testing.T) {
	b := newBroker(t, func(s *Secret) { s.Methods = []string{"GET"}; s.Paths = []string{"/repos/acme/"} })
	c := b.client("")
	auth := map[string]string{"Authorization": "Bearer " + testPlaceholder}
	for _, tc := range []struct {
		name, method, url string
		header            map[string]string
		why               string
	}{
		{"another host", "GET", b.url(b.plain, "plain.example.com", "/repos/acme/x"), auth, "may not go to plain.example.com"},
		{"in the URL", "GET", b.url(b.srv, "api.example.com", "/repos/acme/x?token="+testPlaceholder), nil, "in the request's URL"},
		{"method", "POST", b.url(b.srv, "api.example.com", "/repos/acme/x"), auth, "may not go with POST"},
		{"path", "GET", b.url(b.srv, "api.example.com", "/repos/other/x"), auth, "may not go to the path /repos/other/x"},
		{"dot segments", "GET", b.url(b.srv, "api.example.com", "/repos/acme/%2e%2e/other"), auth, "plain form"},
		{"basic elsewhere", "GET", b.url(b.plain, "plain.example.com", "/"), map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+testPlaceholder))}, "may not go to plain.example.com"},
	} {
		resp, body := do(t, c, tc.method, tc.url, tc.header)
		if resp.StatusCode != 403 || !strings.Contains(body, "API_TOKEN") || !strings.Contains(body, tc.why) || !strings.Contains(resp.Status, "egress policy") {
			t.Errorf("%s: %s %q; want a 403 naming the secret and %q", tc.name, resp.Status, body, tc.why)
		}
		if strings.Contains(body, testValue) {
			t.Errorf("%s: the answer holds the value", tc.name)
		}
	}
	select {
	case r := <-b.seen:
		t.Errorf("a destination received %s %s", r.Method, r.URL)
	default:
	}
	// Allowed: GET under the path.
	if resp, body := do(t, c, "GET", b.url(b.srv, "api.example.com", "/repos/acme/x"), auth); resp.StatusCode != 200 {
		t.Errorf("allowed request: %s %q", resp.Status, body)
	}
	if got := <-b.seen; got.Header.Get("Authorization") != "Bearer "+testValue {
		t.Errorf("the destination saw %q", got.Header.Get("Authorization"))
	}
	b.noValue(t)
}

// TestTunnelEndToEnd: a destination no secret may go to stays a tunnel:
// the program sees the destination's own certificate, and the proxy does
// not inspect it — even with the placeholder inside, which it cannot see.
func TestTunnelEndToEnd(t *testing.T) {
	b := newBroker(t, nil)
	c := b.client("")
	resp, body := do(t, c, "GET", b.url(b.other, "other.example.com", "/"), map[string]string{"Authorization": "Bearer " + testPlaceholder})
	if resp.StatusCode != 200 || !resp.TLS.PeerCertificates[0].Equal(b.other.Certificate()) {
		t.Errorf("tunnel: %s %q, certificate %v; want the destination's own", resp.Status, body, resp.TLS.PeerCertificates[0].Subject)
	}
	if got := <-b.seen; got.Header.Get("Authorization") != "Bearer "+testPlaceholder {
		t.Errorf("the tunnel changed the request: %q", got.Header.Get("Authorization"))
	}
	c.CloseIdleConnections()
	if rec := b.audit.wait(t, 1); rec.Inspected || len(rec.Secrets) > 0 {
		t.Errorf("tunnel record: %+v", rec)
	}
}

// TestMaskedEcho: a destination that echoes the value sends it back
// masked, in headers and body, lengths unchanged.
func TestMaskedEcho(t *testing.T) {
	b := newBroker(t, nil)
	resp, body := do(t, b.client(""), "GET", b.url(b.srv, "api.example.com", "/echo"), map[string]string{"Authorization": "Bearer " + testPlaceholder, "X-Api-Key": testPlaceholder})
	mask := strings.Repeat("*", len(testValue))
	if strings.Contains(body, testValue) || body != "you sent Bearer "+mask+" and "+mask || resp.Header.Get("X-Echo") != "Bearer "+mask {
		t.Errorf("echo: %q, header %q", body, resp.Header.Get("X-Echo"))
	}
}

// TestMaskerSplit: a value split across reads is masked whole.
func TestMaskerSplit(t *testing.T) {
	text := strings.Repeat("a", 100) + testValue + "b" + testValue
	for split := 1; split < len(text); split += 7 {
		r := io.MultiReader(strings.NewReader(text[:split]), strings.NewReader(text[split:]))
		m := &masker{r: io.NopCloser(r), values: [][]byte{[]byte(testValue)}, keep: len(testValue) - 1}
		out, err := io.ReadAll(m)
		if err != nil || strings.Contains(string(out), testValue) || len(out) != len(text) {
			t.Fatalf("split %d: %q %v", split, out, err)
		}
	}
}

// TestMisdirected: an inspected connection carries requests for its own
// host only.
func TestMisdirected(t *testing.T) {
	b := newBroker(t, nil)
	conn := b.tlsThrough(t, "api.example.com:"+port(t, b.srv))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer %s\r\n\r\n", testPlaceholder)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("Host evil.example on api.example.com's connection: %s", resp.Status)
	}
}

// tlsThrough opens a CONNECT to hostport and TLS over it, trusting the
// proxy's CA.
func (b *broker) tlsThrough(t *testing.T, hostport string) *tls.Conn {
	t.Helper()
	raw := b.rawConnect(t, hostport)
	host, _, _ := net.SplitHostPort(hostport)
	tc := tls.Client(raw, &tls.Config{RootCAs: b.ca.pool, ServerName: host})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// TestRefusalSpeaks: a refused HTTPS destination's refusal comes as its
// answer over TLS the session trusts, so the program reads the body; its
// status line says the sandbox's policy blocked it (what Go, pip and npm
// print), and the body which setting allows it and that no other way
// works.
func TestRefusalSpeaks(t *testing.T) {
	b := newBroker(t, nil)
	c := b.client("call-9")
	resp, body := do(t, c, "GET", "https://blocked.example:443/", nil)
	for _, want := range []string{"blocked.example:443", "egress.allow", "Retrying another way will not work"} {
		if !strings.Contains(body, want) {
			t.Errorf("refusal body %q lacks %q", body, want)
		}
	}
	if resp.StatusCode != 403 || !strings.Contains(resp.Status, "egress policy") {
		t.Errorf("refusal status %q", resp.Status)
	}
	if rec := b.audit.wait(t, 1); rec.Outcome != OutcomeRefused || rec.Call != "call-9" || rec.Host != "blocked.example" {
		t.Errorf("refusal record %+v", rec)
	}
	// Without the proxy's TLS, the CONNECT is answered: Go prints the
	// status line's text.
	u, _ := serve(t, Policy{Allow: []string{"a.test:443"}})
	_, err := client(u, nil).Get("https://blocked.example/")
	if err == nil || !strings.Contains(err.Error(), "Forbidden by the sandbox's egress policy: blocked.example:443 is not allowed") {
		t.Errorf("Go's error for a refused CONNECT: %v", err)
	}
}

// TestSetAllowCuts: narrowing the rules cuts an open connection to a host
// they no longer allow, and refuses the next; others stay.
func TestSetAllowCuts(t *testing.T) {
	b := newBroker(t, nil)
	tunnel := b.rawConnect(t, "other.example.com:"+port(t, b.other))
	inspected := b.tlsThrough(t, "api.example.com:"+port(t, b.srv))
	// Both are open: their destinations' connections are made.
	waitLive(t, b.px, 2)
	if err := b.px.SetAllow([]string{"api.example.com:" + port(t, b.srv)}); err != nil {
		t.Fatal(err)
	}
	tunnel.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := tunnel.Read(make([]byte, 1)); err == nil {
		t.Error("the tunnel to other.example.com is still open")
	}
	rec := b.audit.wait(t, 1)
	if rec.Outcome != OutcomeCut || rec.Host != "other.example.com" {
		t.Errorf("cut record: %+v", rec)
	}
	// The inspected connection to api.example.com lives on.
	fmt.Fprintf(inspected, "GET / HTTP/1.1\r\nHost: api.example.com:%s\r\n\r\n", port(t, b.srv))
	if resp, err := http.ReadResponse(bufio.NewReader(inspected), nil); err != nil || resp.StatusCode != 200 {
		t.Errorf("api.example.com after narrowing: %v %v", resp, err)
	}
	if resp, _ := do(t, b.client(""), "GET", b.url(b.other, "other.example.com", "/"), nil); resp.StatusCode != 403 {
		t.Errorf("other.example.com after narrowing: %s", resp.Status)
	}
}

// rawConnect opens a CONNECT to hostport through the proxy.
func (b *broker) rawConnect(t *testing.T, hostport string) net.Conn {
	t.Helper()
	raw, err := net.Dial("tcp", b.u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	if resp, err := http.ReadResponse(bufio.NewReader(raw), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v", hostport, resp, err)
	}
	return raw
}

// waitLive waits until the proxy holds n destination connections.
func waitLive(t *testing.T, px *Proxy, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		px.mu.Lock()
		live := len(px.live)
		px.mu.Unlock()
		if live >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live connections, want %d", live, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOpenedAndCall: the opened hook hears of a connection with the ID
// its end's record has, and the call its program named.
func TestOpenedAndCall(t *testing.T) {
	opened := make(chan Record, 10)
	b := newBroker(t, nil, WithOpened(func(r Record) { opened <- r }))
	c := b.client("call-7")
	do(t, c, "GET", b.url(b.plain, "plain.example.com", "/"), nil)
	c.CloseIdleConnections()
	o := <-opened
	end := b.audit.wait(t, 1)
	if o.ID == 0 || o.ID != end.ID || o.Call != "call-7" || end.Call != "call-7" || o.Outcome != "" {
		t.Errorf("opened %+v, ended %+v", o, end)
	}
}

// TestUpstreamUnverified: the proxy's own TLS to a destination whose
// certificate its roots do not hold fails, and the program is told why,
// inside the TLS it trusts (the handshakes overlap: the tunnel is
// accepted before the destination's is known to fail).
func TestUpstreamUnverified(t *testing.T) {
	b := newBroker(t, nil)
	b.px.o.tls.RootCAs = x509.NewCertPool()
	hp := "api.example.com:" + port(t, b.srv)
	tc := b.tlsThrough(t, hp)
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", hp)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || !strings.Contains(string(body), "caCerts") || !strings.Contains(string(body), "unknown authority") {
		t.Errorf("unverified destination: %s %q", resp.Status, body)
	}
	if rec := b.audit.wait(t, 1); rec.Outcome != OutcomeFailed || !strings.Contains(rec.Reason, "unknown authority") {
		t.Errorf("record: %+v", rec)
	}
}

func TestCallEnv(t *testing.T) {
	env := CallEnv(ListenAddr, "call-abc")
	u, err := url.Parse(env["HTTPS_PROXY"])
	if err != nil || u.User.Username() != "call-abc" || u.Host != ListenAddr || env["GIT_HTTP_PROXY_AUTHMETHOD"] != "basic" {
		t.Errorf("CallEnv: %v", env)
	}
	req, _ := http.NewRequest("CONNECT", "http://x", nil)
	p, _ := u.User.Password()
	req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+p)))
	if callOf(req) != "call-abc" {
		t.Errorf("callOf: %q", callOf(req))
	}
	if env := CallEnv(ListenAddr, "bad call!"); strings.Contains(env["HTTP_PROXY"], "@") {
		t.Errorf("an invalid call is named: %v", env)
	}
}

// BenchmarkInspection measures what inspection costs, one run: requests
// of a Go client to a loopback HTTPS server directly, through the proxy's
// CONNECT tunnel, and through its inspection (the secret's destination:
// the proxy terminates the client's TLS and opens its own), interleaved,
// each a new connection (TLS handshakes included) or on a kept one,
// reported as medians and as what the tunnel and the inspection add to
// direct; and a 100 MB download each way. The target: inspection adds at
// most 2 ms median.
//
//	go test ./egress -run '^$' -bench Inspection -benchtime 1x
func BenchmarkInspection(b *testing.B) {
	const size = 100 << 20
	ca := newTestCA(b)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(size))
		io.CopyN(w, zeroReader{}, size)
	})
	// The server's certificates are ECDSA, as the proxy's are: the
	// comparison is of the paths, not of RSA against ECDSA.
	upstream := newTestCA(b)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return upstream.Certificate(hi.ServerName) }}
	srv.StartTLS()
	defer srv.Close()
	p := port(b, srv)
	roots := upstream.pool
	dns := &fakeDNS{names: map[string][]string{"api.example.com": {"127.0.0.1"}, "tunnel.example.com": {"127.0.0.1"}}}
	u, _ := serve(b, Policy{Allow: []string{"api.example.com:" + p, "tunnel.example.com:" + p}, AllowPrivate: []string{"127.0.0.1"}},
		WithResolver(dns), WithTLS(TLS{Certificate: ca.Certificate, RootCAs: roots, Trusted: true}),
		WithSecrets(Secret{Name: "T", Placeholder: testPlaceholder, Allow: []string{"api.example.com:" + p}, Value: func() (string, error) { return testValue, nil }}))
	pool := ca.pool.Clone()
	pool.AddCert(upstream.cert)
	client := func(proxied, keep bool) *http.Client {
		tr := &http.Transport{DisableKeepAlives: !keep, TLSClientConfig: &tls.Config{RootCAs: pool}}
		if proxied {
			tr.Proxy = http.ProxyURL(u)
		} else {
			tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, "127.0.0.1:"+p)
			}
		}
		return &http.Client{Transport: tr}
	}
	modes := []struct {
		name, host string
		proxied    bool
	}{{"direct", "tunnel.example.com", false}, {"tunnel", "tunnel.example.com", true}, {"inspected", "api.example.com", true}}
	get := func(c *http.Client, host, path string) time.Duration {
		req, _ := http.NewRequest("GET", "https://"+host+":"+p+path, nil)
		req.Header.Set("Authorization", "Bearer "+testPlaceholder)
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start)
	}
	for range b.N {
		for _, keep := range []bool{false, true} {
			times := make([][]time.Duration, len(modes))
			clients := make([]*http.Client, len(modes))
			for i, m := range modes {
				clients[i] = client(m.proxied, keep)
			}
			for range 300 {
				for i, m := range modes {
					times[i] = append(times[i], get(clients[i], m.host, "/small"))
				}
			}
			med := make([]float64, len(modes))
			suffix := "-new"
			if keep {
				suffix = "-kept"
			}
			for i, m := range modes {
				slices.Sort(times[i])
				med[i] = float64(times[i][len(times[i])/2].Microseconds()) / 1000
				b.ReportMetric(med[i], m.name+suffix+"-median-ms")
			}
			b.ReportMetric(med[1]-med[0], "tunnel"+suffix+"-added-ms")
			b.ReportMetric(med[2]-med[0], "inspected"+suffix+"-added-ms")
			b.ReportMetric(med[2]-med[1], "inspection"+suffix+"-over-tunnel-ms")
		}
		for _, m := range modes {
			d := get(client(m.proxied, false), m.host, "/100m")
			b.ReportMetric(size/d.Seconds()/1e6, m.name+"-100MB-MB/s")
		}
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }
