package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDNS answers names from a table and counts its lookups; no real DNS
// is ever asked.
type fakeDNS struct {
	names   map[string][]string
	lookups atomic.Int64
}

func (f *fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.lookups.Add(1)
	var out []netip.Addr
	for _, a := range f.names[host] {
		out = append(out, netip.MustParseAddr(a))
	}
	if len(out) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return out, nil
}

// audit collects records.
type audit struct {
	mu   sync.Mutex
	recs []Record
	got  chan struct{}
}

func newAudit() *audit { return &audit{got: make(chan struct{}, 100)} }

func (a *audit) add(r Record) {
	a.mu.Lock()
	a.recs = append(a.recs, r)
	a.mu.Unlock()
	a.got <- struct{}{}
}

// wait returns the nth record (1-based), waiting for it.
func (a *audit) wait(t *testing.T, n int) Record {
	t.Helper()
	for {
		a.mu.Lock()
		if len(a.recs) >= n {
			r := a.recs[n-1]
			a.mu.Unlock()
			return r
		}
		a.mu.Unlock()
		select {
		case <-a.got:
		case <-time.After(time.Minute):
			t.Fatalf("no audit record %d", n)
		}
	}
}

// serve runs a proxy of p on a loopback listener and returns its URL.
func serve(t testing.TB, p Policy, opts ...Option) (*url.URL, *Proxy) {
	t.Helper()
	px, err := New(p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- px.Serve(ctx, func(context.Context) (net.Conn, error) { return ln.Accept() })
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-done
	})
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}, px
}

// client goes through the proxy at u and trusts srv's certificate.
func client(u *url.URL, srv *httptest.Server) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: false}
	if srv != nil && srv.TLS != nil {
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	return &http.Client{Transport: tr}
}

func port(t testing.TB, srv *httptest.Server) string {
	u, _ := url.Parse(srv.URL)
	return u.Port()
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestParseRule(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"proxy.golang.org:443", "proxy.golang.org:443", true},
		{"Proxy.Golang.ORG.:443", "proxy.golang.org:443", true},
		{"*.pythonhosted.org:443", "*.pythonhosted.org:443", true},
		{"127.0.0.1:8080", "127.0.0.1:8080", true},
		{"[::1]:443", "[::1]:443", true},
		{"proxy.golang.org", "", false},
		{"proxy.golang.org:0", "", false},
		{"proxy.golang.org:65536", "", false},
		{"*.org:443", "", false},
		{"*:443", "", false},
		{"a..b:443", "", false},
		{"http://x:443", "", false},
		{"[1.2.3.4]:443", "", false},
	} {
		r, err := ParseRule(c.in)
		if (err == nil) != c.ok || c.ok && r.String() != c.want {
			t.Errorf("ParseRule(%q) = %v, %v; want %q ok=%v", c.in, r, err, c.want, c.ok)
		}
	}
}

func TestRuleMatchAndWithin(t *testing.T) {
	wild, _ := ParseRule("*.pythonhosted.org:443")
	exact, _ := ParseRule("pypi.org:443")
	for _, c := range []struct {
		r    Rule
		host string
		port uint16
		want bool
	}{
		{wild, "files.pythonhosted.org", 443, true},
		{wild, "FILES.pythonhosted.org.", 443, true},
		{wild, "pythonhosted.org", 443, false},
		{wild, "evilpythonhosted.org", 443, false},
		{wild, "files.pythonhosted.org", 80, false},
		{exact, "pypi.org", 443, true},
		{exact, "x.pypi.org", 443, false},
	} {
		if got := c.r.Match(c.host, c.port); got != c.want {
			t.Errorf("%v.Match(%s, %d) = %v", c.r, c.host, c.port, got)
		}
	}
	op := Policy{Allow: []string{"*.pythonhosted.org:443", "go"}}
	for _, asked := range [][]string{{"files.pythonhosted.org:443"}, {"*.a.pythonhosted.org:443"}, {"proxy.golang.org:443"}, {"go"}, {}} {
		if _, err := op.Narrow(asked); err != nil {
			t.Errorf("Narrow(%q): %v", asked, err)
		}
	}
	for _, asked := range [][]string{{"pythonhosted.org:443"}, {"*.evil.org:443"}, {"files.pythonhosted.org:80"}, {"pypi"}, {"evil.com:443"}} {
		var ne *NarrowError
		if _, err := op.Narrow(asked); !errors.As(err, &ne) {
			t.Errorf("Narrow(%q) = %v; want a NarrowError", asked, err)
		}
	}
}

func TestRefused(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "127.1.2.3", "::1", "169.254.169.254", "10.1.2.3", "172.16.0.1", "172.31.255.255",
		"192.168.1.1", "fc00::1", "fd12::1", "fe80::1", "0.0.0.0", "::", "100.64.0.1", "224.0.0.1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
		// The second attack's: IPv4 reached through IPv6 (NAT64, local NAT64,
		// 6to4, Teredo, IPv4-compatible, SIIT), site-local, discard, and IPv4
		// special ranges.
		"64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "64:ff9b:1::a9fe:a9fe", "2002:a9fe:a9fe::1", "2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
		"::a9fe:a9fe", "::7f00:1", "::ffff:0:a9fe:a9fe", "fec0::1", "100::1", "192.0.0.1", "198.18.0.1", "198.19.255.255", "240.0.0.1", "255.255.255.255"} {
		if !Refused(netip.MustParseAddr(a)) {
			t.Errorf("%s is not refused", a)
		}
	}
	// Documentation ranges are routed by some networks (these build
	// machines' egress gateway is at 203.0.113.80): not refused.
	for _, a := range []string{"8.8.8.8", "172.32.0.1", "2001:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808", "198.20.0.1", "2003::1",
		"203.0.113.80", "192.0.2.1", "198.51.100.1", "2001:db8::1"} {
		if Refused(netip.MustParseAddr(a)) {
			t.Errorf("%s is refused", a)
		}
	}
}

// TestHTTPSAllowedAndRefused: a TLS server on loopback, whose name the
// fake DNS gives, is reached through CONNECT only because the policy
// lists it and its private address; the same server under a name no rule
// allows, or the same name on another port, is a 403 naming the setting.
func TestHTTPSAllowedAndRefused(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello over tls") }))
	defer srv.Close()
	p := port(t, srv)
	dns := &fakeDNS{names: map[string][]string{"example.com": {"127.0.0.1"}, "other.example": {"127.0.0.1"}}}
	a := newAudit()
	u, _ := serve(t, Policy{Allow: []string{"example.com:" + p}, AllowPrivate: []string{"127.0.0.1"}},
		WithResolver(dns), WithAudit(a.add), WithSession("s-1", "acme"))
	c := client(u, srv)

	if code, body := get(t, c, "https://example.com:"+p+"/"); code != 200 || body != "hello over tls" {
		t.Errorf("allowed: %d %q", code, body)
	}
	c.CloseIdleConnections()
	rec := a.wait(t, 1)
	if rec.Outcome != OutcomeOK || rec.Host != "example.com" || rec.Addr != "127.0.0.1:"+p || rec.Method != "CONNECT" ||
		rec.Session != "s-1" || rec.Tenant != "acme" || rec.BytesUp == 0 || rec.BytesDown == 0 {
		t.Errorf("audit of the allowed connection: %+v", rec)
	}

	for i, target := range []string{"https://other.example:" + p + "/", "https://example.com:1/"} {
		_, err := c.Get(target)
		if err == nil || !strings.Contains(err.Error(), "Forbidden") {
			t.Errorf("%s: %v; want the proxy's 403", target, err)
		}
		rec := a.wait(t, 2+i)
		if rec.Outcome != OutcomeRefused || rec.Addr != "" {
			t.Errorf("audit of %s: %+v", target, rec)
		}
	}
	// The 403's body, as a program sees it.
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "CONNECT other.example:%s HTTP/1.1\r\nHost: other.example:%s\r\n\r\n", p, p)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.Contains(string(body), "other.example:"+p) || !strings.Contains(string(body), "egress.allow") {
		t.Errorf("refusal: %d %q; want 403 naming the host and egress.allow", resp.StatusCode, body)
	}
}

// TestPrivateAddressRefused: an allowed name that resolves to a private
// address — the cloud metadata address, the daemon's loopback — is refused
// unless that address is listed, and nothing is dialled; a name with a
// listed address and an unlisted one is dialled only at the listed one.
func TestPrivateAddressRefused(t *testing.T) {
	var dialled atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { dialled.Add(1) }))
	defer srv.Close()
	p := port(t, srv)
	dns := &fakeDNS{names: map[string][]string{
		"metadata.example": {"169.254.169.254"},
		"rebind.example":   {"127.0.0.1"},
		"mixed.example":    {"10.0.0.1", "127.0.0.1"},
		"nat64.example":    {"64:ff9b::a9fe:a9fe"},
		"6to4.example":     {"2002:7f00:1::1"},
	}}
	a := newAudit()
	u, _ := serve(t, Policy{Allow: []string{"metadata.example:" + p, "rebind.example:" + p, "127.0.0.1:" + p, "nat64.example:" + p, "6to4.example:" + p, "[::7f00:1]:" + p}},
		WithResolver(dns), WithAudit(a.add))
	c := client(u, nil)
	n := 0
	for _, target := range []string{"http://metadata.example:" + p + "/", "http://rebind.example:" + p + "/", "http://127.0.0.1:" + p + "/",
		"http://nat64.example:" + p + "/", "http://6to4.example:" + p + "/", "http://[::7f00:1]:" + p + "/"} {
		code, body := get(t, c, target)
		if code != 403 || !strings.Contains(body, "egress.allowPrivate") {
			t.Errorf("%s: %d %q; want a 403 naming egress.allowPrivate", target, code, body)
		}
		n++
		if rec := a.wait(t, n); rec.Outcome != OutcomeRefused || !strings.Contains(rec.Reason, "private") {
			t.Errorf("audit of %s: %+v", target, rec)
		}
	}
	if dialled.Load() != 0 {
		t.Errorf("the loopback server was reached %d times", dialled.Load())
	}

	u2, _ := serve(t, Policy{Allow: []string{"mixed.example:" + p}, AllowPrivate: []string{"127.0.0.0/8"}}, WithResolver(dns), WithAudit(a.add))
	before := dns.lookups.Load()
	c2 := client(u2, nil)
	if code, _ := get(t, c2, "http://mixed.example:"+p+"/"); code != 200 {
		t.Errorf("mixed.example: %d", code)
	}
	c2.CloseIdleConnections()
	n++
	if rec := a.wait(t, n); rec.Addr != "127.0.0.1:"+p {
		t.Errorf("dialled %q; want the listed address only", rec.Addr)
	}
	if got := dns.lookups.Load() - before; got != 1 {
		t.Errorf("%d lookups for one connection; the address checked must be the one dialled", got)
	}
}

// TestPlainHTTPKeepAlive: plain requests are forwarded in origin form,
// hop-by-hop headers dropped, and two requests share one destination
// connection (one audit record with both requests' bytes); when the
// destination closes it while it is idle, the next request is sent on a
// new one.
func TestPlainHTTPKeepAlive(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != "" || r.RequestURI != "/path?q=1" {
			http.Error(w, "forwarded badly: "+r.RequestURI, 500)
			return
		}
		fmt.Fprint(w, strings.Repeat("x", 1000))
	}))
	defer srv.Close()
	p := port(t, srv)
	a := newAudit()
	u, _ := serve(t, Policy{Allow: []string{"files.example:" + p}, AllowPrivate: []string{"127.0.0.1"}},
		WithResolver(&fakeDNS{names: map[string][]string{"files.example": {"127.0.0.1"}}}), WithAudit(a.add))
	u.User = url.UserPassword("a", "b")
	c := client(u, nil)
	for range 2 {
		if code, body := get(t, c, "http://files.example:"+p+"/path?q=1"); code != 200 || len(body) != 1000 {
			t.Errorf("GET: %d %q", code, body)
		}
	}
	srv.CloseClientConnections() // the destination ends the kept connection while it is idle
	if code, body := get(t, c, "http://files.example:"+p+"/path?q=1"); code != 200 || len(body) != 1000 {
		t.Errorf("GET after the destination closed the kept connection: %d %q", code, body)
	}
	c.CloseIdleConnections()
	if rec := a.wait(t, 1); rec.Outcome != OutcomeOK || rec.Method != "GET" || rec.BytesDown < 2000 {
		t.Errorf("audit: %+v; want one connection for both requests", rec)
	}
	if rec := a.wait(t, 2); rec.Outcome != OutcomeOK || rec.BytesDown < 1000 {
		t.Errorf("audit of the second connection: %+v", rec)
	}
}

func TestByteCap(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 1<<20))
	}))
	defer srv.Close()
	p := port(t, srv)
	a := newAudit()
	u, _ := serve(t, Policy{Allow: []string{"127.0.0.1:" + p}, AllowPrivate: []string{"127.0.0.1"}, MaxBytes: 64 << 10}, WithAudit(a.add))
	c := client(u, nil)
	resp, err := c.Get(srv.URL)
	if err == nil {
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n >= 1<<20 {
			t.Errorf("read all %d bytes past a cap of 64 KiB", n)
		}
	}
	if rec := a.wait(t, 1); rec.Outcome != OutcomeCapped || rec.BytesDown > 1<<20 {
		t.Errorf("audit: %+v; want capped", rec)
	}
	code, body := get(t, c, srv.URL)
	if code != 403 || !strings.Contains(body, "egress.maxBytes") {
		t.Errorf("after the cap: %d %q", code, body)
	}
}

// TestLargeDownloads: large plain responses (moved in the kernel between
// the program's socket and the destination's) arrive whole, one after the
// other on one kept connection, and so do small ones in between.
func TestLargeDownloads(t *testing.T) {
	big := make([]byte, 3<<20+17)
	rand.Read(big)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			io.WriteString(w, "small")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		w.Write(big)
	}))
	defer srv.Close()
	a := newAudit()
	u, _ := serve(t, Policy{Allow: []string{"127.0.0.1:" + port(t, srv)}, AllowPrivate: []string{"127.0.0.1"}}, WithAudit(a.add))
	c := client(u, nil)
	for i, path := range []string{"/big", "/small", "/big", "/big"} {
		resp, err := c.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := map[bool][]byte{true: []byte("small"), false: big}[path == "/small"]; err != nil || !bytes.Equal(got, want) {
			t.Fatalf("request %d (%s): %d bytes, %v; want %d", i, path, len(got), err, len(want))
		}
	}
	c.CloseIdleConnections()
	rec := a.wait(t, 1)
	if want := int64(3 * len(big)); rec.Outcome != OutcomeOK || rec.BytesDown < want {
		t.Errorf("audit: %+v; want one kept connection of at least %d bytes down", rec, want)
	}
}

// TestByteCapTunnel: a CONNECT tunnel is cut once the session's bytes pass
// the cap, exactly.
func TestByteCapTunnel(t *testing.T) {
	const size = 16 << 20
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, size))
	}))
	defer srv.Close()
	a := newAudit()
	const maxBytes = 64 << 10
	u, _ := serve(t, Policy{Allow: []string{"127.0.0.1:" + port(t, srv)}, AllowPrivate: []string{"127.0.0.1"}, MaxBytes: maxBytes}, WithAudit(a.add))
	resp, err := client(u, srv).Get(srv.URL)
	if err == nil {
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n >= size {
			t.Errorf("read all %d bytes past a cap of 64 KiB", n)
		}
	}
	if rec := a.wait(t, 1); rec.Outcome != OutcomeCapped || rec.BytesUp+rec.BytesDown != maxBytes {
		t.Errorf("audit: %+v; want capped at the cap exactly", rec)
	}
}

// TestBadRequestsAudited: every request the proxy answers 400 — one it
// cannot read, a head over 64 KiB, a URL that is not absolute http://, a
// CONNECT to no HOST:PORT — leaves an audit record, which carries no path.
func TestBadRequestsAudited(t *testing.T) {
	a := newAudit()
	u, _ := serve(t, Policy{Allow: []string{"example.com:80"}}, WithAudit(a.add), WithSession("s-1", "acme"))
	for i, req := range []string{
		"NOT HTTP AT ALL /secret-path\r\n\r\n",
		"GET http://example.com/secret-path HTTP/1.1\r\nHost: example.com\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n",
		"GET /secret-path HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"GET ftp://example.com/secret-path HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, req)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%.40q: %v %v; want 400", req, resp, err)
			continue
		}
		rec := a.wait(t, i+1)
		if rec.Outcome != OutcomeInvalid || rec.Reason == "" || rec.Session != "s-1" || rec.Tenant != "acme" || strings.Contains(fmt.Sprint(rec), "secret-path") {
			t.Errorf("%.40q: audit %+v", req, rec)
		}
		if i == 1 && rec.Reason != "the request's head is over 64 KiB" {
			t.Errorf("a head over 64 KiB, audited as %q", rec.Reason)
		}
	}
}

// tcpServer serves each connection on loopback with serve, then closes
// it, until the test ends.
func tcpServer(t *testing.T, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { serve(c); c.Close() }()
		}
	}()
	return ln
}

// TestByteCapExact: sixteen connections at once, tunnels (moved in the
// kernel) and plain requests with large bodies, each able to move 8 MiB,
// under a cap of 3 MiB and an odd number of bytes, while a seventeenth
// tunnel stays idle: the session moves exactly its cap, no byte more and
// none less (the idle tunnel holds none of it for good), by the audit and
// by what the programs received.
func TestByteCapExact(t *testing.T) {
	const each = 8 << 20
	const maxBytes = 3<<20 + 12345
	src := tcpServer(t, func(c net.Conn) { c.Write(make([]byte, each)) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(each))
		w.Write(make([]byte, each))
	}))
	defer srv.Close()
	quiet := tcpServer(t, func(c net.Conn) { io.Copy(io.Discard, c) }) // sends nothing; ends when its client does
	a := newAudit()
	u, _ := serve(t, Policy{Allow: []string{src.Addr().String(), quiet.Addr().String(), "127.0.0.1:" + port(t, srv)}, AllowPrivate: []string{"127.0.0.1"}, MaxBytes: maxBytes}, WithAudit(a.add))
	connect := func(target net.Addr) (net.Conn, *bufio.Reader, bool) {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Error(err)
			return nil, nil, false
		}
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			conn.Close()
			return nil, nil, false // refused: the cap was spent before it was dialled
		}
		return conn, br, true
	}
	idle, _, ok := connect(quiet.Addr())
	if !ok {
		t.Fatal("the idle tunnel was refused")
	}
	var received atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if i%4 == 0 { // a plain request
				resp, err := client(u, nil).Get(srv.URL)
				if err == nil {
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					received.Add(n)
				}
				return
			}
			conn, br, ok := connect(src.Addr())
			if !ok {
				return
			}
			defer conn.Close()
			n, _ := io.Copy(io.Discard, br)
			received.Add(n)
		})
	}
	wg.Wait()
	idle.Close()
	var moved int64
	for i := 1; i <= 17; i++ {
		rec := a.wait(t, i)
		moved += rec.BytesUp + rec.BytesDown
	}
	if moved != maxBytes {
		t.Errorf("the session moved %d bytes (audit), its cap is %d: %+d", moved, maxBytes, moved-maxBytes)
	}
	if got := received.Load(); got > maxBytes {
		t.Errorf("the programs received %d bytes of bodies and tunnels, over the cap of %d", got, maxBytes)
	}
}

// TestConnectionCapAndEnd: with a cap of one connection, a second waits
// until the first ends; ending the proxy's context ends a tunnel.
func TestConnectionCapAndEnd(t *testing.T) {
	echo := tcpServer(t, func(c net.Conn) { io.Copy(c, c) })
	px, err := New(Policy{Allow: []string{echo.Addr().String()}, AllowPrivate: []string{"127.0.0.1"}, MaxConnections: 1})
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 2)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- px.Serve(ctx, func(ctx context.Context) (net.Conn, error) {
			select {
			case c := <-conns:
				return c, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
	}()
	tunnel := func() (net.Conn, *bufio.Reader) {
		prog, proxySide := net.Pipe()
		conns <- proxySide
		return prog, bufio.NewReader(prog)
	}
	first, r1 := tunnel()
	fmt.Fprintf(first, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", echo.Addr(), echo.Addr())
	if resp, err := http.ReadResponse(r1, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first tunnel: %v %v", resp, err)
	}
	second, r2 := tunnel()
	answered := make(chan struct{})
	go func() {
		fmt.Fprintf(second, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", echo.Addr(), echo.Addr())
		http.ReadResponse(r2, nil)
		close(answered)
	}()
	select {
	case <-answered:
		t.Error("a second connection was served beside the first, over the cap of one")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	select {
	case <-answered:
	case <-time.After(time.Minute):
		t.Fatal("the second connection was not served after the first ended")
	}
	cancel()
	second.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := r2.ReadByte(); err == nil {
		t.Error("the tunnel outlived the proxy's context")
	}
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Errorf("Serve: %v", err)
	}
}

// BenchmarkSmallRequest is the proxy's own cost per request: a new
// connection each time (as a new curl makes), through the proxy on
// loopback against straight to the server, in the same run.
func BenchmarkSmallRequest(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	u, _ := serve(b, Policy{Allow: []string{"127.0.0.1:" + port(b, srv)}, AllowPrivate: []string{"127.0.0.1"}})
	for _, bc := range []struct {
		name  string
		proxy *url.URL
	}{{"Direct", nil}, {"Proxied", u}} {
		b.Run(bc.name, func(b *testing.B) {
			tr := &http.Transport{DisableKeepAlives: true}
			if bc.proxy != nil {
				tr.Proxy = http.ProxyURL(bc.proxy)
			}
			c := &http.Client{Transport: tr}
			for b.Loop() {
				resp, err := c.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
