package dockertest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/moby/moby/client"
)

// Proxy stands between a test's client and the engine, as a Unix socket
// of its own that forwards to the engine's, so that a test can give the
// client engine trouble: Down (the socket is gone, connections fail; what
// was open is cut, as when the engine restarts), Fail (requests answered
// with an error status, as an engine under load answers 5xx), Stall
// (requests and open streams held unanswered, as a SIGSTOPped dockerd
// holds them), and Up (all well again). It starts Up. Each request is
// forwarded on a connection of its own, so a mode applies to every
// request made after it is set.
type Proxy struct {
	path     string // the proxy's socket
	upstream [2]string

	mu       sync.Mutex
	ln       net.Listener               // nil while Down
	conns    map[net.Conn]chan struct{} // open connections, both sides; closed when cut
	failCode int
	failIf   func(*http.Request) bool
	failed   int
	running  chan struct{} // closed unless stalled
}

// NewProxy starts a proxy to the engine Client(tb) talks to; it stops with
// the test.
func NewProxy(tb testing.TB) *Proxy {
	tb.Helper()
	host := Client(tb).DaemonHost()
	p := &Proxy{conns: map[net.Conn]chan struct{}{}, running: make(chan struct{})}
	close(p.running)
	switch {
	case strings.HasPrefix(host, "unix://"):
		p.upstream = [2]string{"unix", strings.TrimPrefix(host, "unix://")}
	case strings.HasPrefix(host, "tcp://"):
		p.upstream = [2]string{"tcp", strings.TrimPrefix(host, "tcp://")}
	default:
		tb.Fatalf("dockertest.Proxy: cannot proxy the engine at %s", host)
	}
	dir, err := os.MkdirTemp("", "dockertest-proxy-")
	if err != nil {
		tb.Fatal(err)
	}
	p.path = filepath.Join(dir, "docker.sock")
	if err := p.listen(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		p.Down()
		os.RemoveAll(dir)
	})
	return p
}

// Host is the proxy's address, as DOCKER_HOST gives one.
func (p *Proxy) Host() string { return "unix://" + p.path }

// Client returns a client of the engine through the proxy, its API version
// negotiated; it is closed with the test.
func (p *Proxy) Client(tb testing.TB) *client.Client {
	tb.Helper()
	c, err := client.New(client.WithHost(p.Host()))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := c.Ping(tb.Context(), client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		tb.Fatalf("dockertest.Proxy: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// Down takes the engine away: the socket is removed, so new connections
// fail, and every open one (a container's attach stream among them) is
// cut.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c, cut := range p.conns {
		close(cut)
		c.Close()
	}
	clear(p.conns)
}

// Up brings the engine back as it was: it listens again (after Down),
// forwards every request (after Fail) and lets held ones through (after
// Stall).
func (p *Proxy) Up() {
	p.mu.Lock()
	p.failIf = nil
	select {
	case <-p.running:
	default:
		close(p.running)
	}
	down := p.ln == nil
	p.mu.Unlock()
	if down {
		if err := p.listen(); err != nil {
			panic(fmt.Sprintf("dockertest.Proxy: listening again: %v", err))
		}
	}
}

// Fail answers every later request for which match holds (every one, for
// a nil match) with status and an error message, until Up.
func (p *Proxy) Fail(status int, match func(*http.Request) bool) {
	if match == nil {
		match = func(*http.Request) bool { return true }
	}
	p.mu.Lock()
	p.failCode, p.failIf = status, match
	p.mu.Unlock()
}

// Failed counts the requests Fail has answered.
func (p *Proxy) Failed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// Stall holds, until Up, every request and every byte of every open
// stream, unanswered.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.running:
		p.running = make(chan struct{})
	default:
	}
}

func (p *Proxy) listen() error {
	ln, err := net.Listen("unix", p.path)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return nil
}

// track counts c among the open connections, or closes it and reports
// false while Down.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		c.Close()
		return false
	}
	p.conns[c] = make(chan struct{})
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	if cut, ok := p.conns[c]; ok {
		close(cut)
		delete(p.conns, c)
	}
	p.mu.Unlock()
	c.Close()
}

// gate waits while the proxy stalls; false when c was cut meanwhile (or
// before).
func (p *Proxy) gate(c net.Conn) bool {
	p.mu.Lock()
	cut, open := p.conns[c]
	running := p.running
	p.mu.Unlock()
	if !open {
		return false
	}
	select {
	case <-running:
		return true
	case <-cut:
		return false
	}
}

// serve forwards one request of c, or answers it as the mode says, and
// then carries the connection's bytes both ways (an upgraded attach stream,
// or a response that ends with the connection).
func (p *Proxy) serve(c net.Conn) {
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || !p.gate(c) {
		return
	}
	p.mu.Lock()
	fail := p.failIf != nil && p.failIf(req)
	code := p.failCode
	if fail {
		p.failed++
	}
	p.mu.Unlock()
	if fail {
		io.Copy(io.Discard, req.Body)
		body := fmt.Sprintf(`{"message":"dockertest.Proxy: failing %s %s"}`, req.Method, req.URL.Path)
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", code, http.StatusText(code), len(body), body)
		return
	}
	up, err := net.Dial(p.upstream[0], p.upstream[1])
	if err != nil || !p.track(up) {
		return
	}
	defer p.untrack(up)
	if req.Header.Get("Upgrade") == "" {
		req.Close = true // one request a connection: each sees the mode of its time
	}
	if err := req.Write(&gatedWriter{p: p, c: up}); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.copy(up, br, c); done <- struct{}{} }()
	go func() { p.copy(c, up, up); done <- struct{}{} }()
	<-done
}

// copy carries src to dst until either ends, holding each piece while the
// proxy stalls; own is the connection whose cut ends the hold.
func (p *Proxy) copy(dst io.Writer, src io.Reader, own net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(own) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			return
		}
	}
}

// gatedWriter writes to c while the proxy does not stall.
type gatedWriter struct {
	p *Proxy
	c net.Conn
}

func (w *gatedWriter) Write(b []byte) (int, error) {
	if !w.p.gate(w.c) {
		return 0, net.ErrClosed
	}
	return w.c.Write(b)
}
