package egress

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Resolver looks host names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Outcomes of a destination connection, as a Record reports them.
const (
	OutcomeOK      = "ok"      // dialled and carried until one side ended
	OutcomeRefused = "refused" // the policy refused it (HTTP 403)
	OutcomeFailed  = "failed"  // allowed, but not reached (HTTP 502)
	OutcomeCapped  = "capped"  // cut at the session's byte cap
)

// Record describes one destination connection, or one refusal, for the
// audit log and metrics. It never carries URLs' paths, headers or bodies.
type Record struct {
	Session, Tenant string
	Host            string // as the program named it
	Port            uint16
	Addr            string // the address dialled; "" when none was
	Method          string // CONNECT, or the first request's method
	Outcome         string
	Reason          string // why it was refused or failed
	BytesUp         int64  // sent to the destination
	BytesDown       int64  // received from it
	Duration        time.Duration
}

// LogAttrs are the record's fields as slog attributes.
func (r Record) LogAttrs() []slog.Attr {
	return []slog.Attr{
		slog.String("session", r.Session), slog.String("tenant", r.Tenant),
		slog.String("host", r.Host), slog.Int("port", int(r.Port)), slog.String("addr", r.Addr),
		slog.String("method", r.Method), slog.String("outcome", r.Outcome), slog.String("reason", r.Reason),
		slog.Int64("bytes_up", r.BytesUp), slog.Int64("bytes_down", r.BytesDown),
		slog.Float64("duration_ms", float64(r.Duration.Microseconds())/1000),
	}
}

// Option configures New.
type Option func(*options)

type options struct {
	session, tenant string
	resolver        Resolver
	audit           func(Record)
	dialTimeout     time.Duration
}

// WithSession names the session and tenant in the records.
func WithSession(session, tenant string) Option {
	return func(o *options) { o.session, o.tenant = session, tenant }
}

// WithResolver sets how names are looked up (default net.DefaultResolver).
// Whatever it answers is judged as an answer from the DNS would be.
func WithResolver(r Resolver) Option { return func(o *options) { o.resolver = r } }

// WithAudit calls f once per destination connection when it ends, and once
// per refusal. f must be safe for concurrent use.
func WithAudit(f func(Record)) Option { return func(o *options) { o.audit = f } }

// WithDialTimeout bounds resolving and connecting to a destination
// (default 30s).
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// Proxy is one session's egress: an HTTP forward proxy that dials what the
// session's Policy allows. It is safe for concurrent use.
type Proxy struct {
	policy  Policy
	rules   []Rule
	private []netip.Prefix
	o       options
	slots   chan struct{} // connections served at once
	moved   atomic.Int64  // bytes both ways, all connections
}

// New returns the proxy of a policy; it fails when the policy does not
// validate.
func New(p Policy, opts ...Option) (*Proxy, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	o := options{resolver: net.DefaultResolver, audit: func(Record) {}, dialTimeout: 30 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	rules, _ := ParseRules(p.Allow)
	private, _ := parsePrefixes(p.AllowPrivate)
	p.MaxConnections = cmp.Or(p.MaxConnections, DefaultMaxConnections)
	p.MaxBytes = cmp.Or(p.MaxBytes, DefaultMaxBytes)
	return &Proxy{policy: p, rules: rules, private: private, o: o, slots: make(chan struct{}, p.MaxConnections)}, nil
}

// Serve serves the connections accept returns, at most the policy's
// MaxConnections at once (accept is not called while that many are
// served), until ctx ends or accept fails. It returns once every
// connection it served has ended — all end when ctx does — with ctx's
// error or accept's.
func (p *Proxy) Serve(ctx context.Context, accept func(context.Context) (net.Conn, error)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		conn, err := accept(ctx)
		if err != nil {
			<-p.slots
			return cmp.Or(ctx.Err(), err)
		}
		wg.Go(func() {
			defer func() { <-p.slots }()
			p.ServeConn(ctx, conn)
		})
	}
}

// maxHead bounds a request's line and headers.
const maxHead = 64 << 10

// ServeConn serves the requests of one program's connection to the proxy
// until it ends, a request is refused, or ctx ends; then it closes conn.
func (p *Proxy) ServeConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	head := &headLimit{r: conn}
	br := bufio.NewReaderSize(head, 32<<10)
	var up *upstream // the destination of the last plain request, kept for the next
	defer func() { up.finish(OutcomeOK, "") }()
	for {
		head.left = maxHead
		req, err := http.ReadRequest(br)
		head.left = -1
		if err != nil {
			if err != io.EOF && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				reply(conn, http.StatusBadRequest, "sandboxd egress: a request this proxy cannot read: "+err.Error())
			}
			return
		}
		if req.Method == http.MethodConnect {
			up.finish(OutcomeOK, "")
			up = nil
			p.connect(ctx, conn, br, req)
			return
		}
		var keep bool
		up, keep = p.forward(ctx, conn, req, up)
		if !keep {
			return
		}
	}
}

// headLimit reads at most left bytes while left is not negative.
type headLimit struct {
	r    io.Reader
	left int
}

func (h *headLimit) Read(p []byte) (int, error) {
	if h.left == 0 {
		return 0, errors.New("the request's head is over 64 KiB")
	}
	if h.left > 0 && len(p) > h.left {
		p = p[:h.left]
	}
	n, err := h.r.Read(p)
	if h.left > 0 {
		h.left -= n
	}
	return n, err
}

// target is the host and port a request names.
func target(req *http.Request) (host string, port uint16, err error) {
	hostport := req.Host
	if req.Method != http.MethodConnect {
		if !req.URL.IsAbs() || req.URL.Scheme != "http" {
			return "", 0, errors.New("this proxy takes http:// URLs, and CONNECT for https")
		}
		hostport = req.URL.Host
		if req.URL.Port() == "" {
			hostport = net.JoinHostPort(req.URL.Hostname(), "80")
		}
	}
	h, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, fmt.Errorf("the destination %q is not HOST:PORT", hostport)
	}
	n, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || n == 0 || h == "" {
		return "", 0, fmt.Errorf("the destination %q is not HOST:PORT", hostport)
	}
	return canonicalHost(h), uint16(n), nil
}

// connect serves a CONNECT request: the tunnel, or its refusal.
func (p *Proxy) connect(ctx context.Context, conn net.Conn, br *bufio.Reader, req *http.Request) {
	host, port, err := target(req)
	if err != nil {
		reply(conn, http.StatusBadRequest, "sandboxd egress: "+err.Error())
		return
	}
	up, status, err := p.dial(ctx, host, port, req.Method)
	if err != nil {
		reply(conn, status, err.Error())
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		up.finish(OutcomeOK, "")
		return
	}
	done := make(chan struct{})
	go func() { // the program's bytes, the ones read with the request first
		defer close(done)
		err := drain(up.conn, br)
		if err == nil {
			err = pipe(up.conn.Conn, conn, up.conn.countUp)
		}
		if err == nil {
			closeWrite(up.conn)
		} else {
			up.conn.Close()
		}
	}()
	if err := pipe(conn, up.conn.Conn, up.conn.countDown); err == nil {
		closeWrite(conn)
	} else {
		conn.Close()
	}
	<-done
	up.finish(OutcomeOK, "")
}

// drain writes what br holds already to w.
func drain(w io.Writer, br *bufio.Reader) error {
	n := br.Buffered()
	if n == 0 {
		return nil
	}
	b, _ := br.Peek(n)
	if _, err := w.Write(b); err != nil {
		return err
	}
	_, err := br.Discard(n)
	return err
}

// spliceChunk is how much a copy between two sockets moves between two
// counts: a connection passes the session's byte cap by at most this.
const spliceChunk = 1 << 20

// pipe copies src to dst until src ends (nil) or either fails, and calls
// count with each amount moved; count's error stops it. Between two TCP
// sockets — a program's connection handed to the daemon, and a
// destination — the bytes move inside the kernel (splice), a chunk at a
// time; otherwise through a buffer.
func pipe(dst io.Writer, src io.Reader, count func(int64) error) error {
	return pipeN(dst, src, -1, count)
}

// pipeN is pipe of n bytes (all, when n < 0); it fails with
// io.ErrUnexpectedEOF when src ends before n.
func pipeN(dst io.Writer, src io.Reader, n int64, count func(int64) error) error {
	left := n
	step := func(k int64) error {
		if left > 0 {
			left -= k
		}
		return count(k)
	}
	tdst, ok := dst.(*net.TCPConn)
	tsrc, ok2 := src.(*net.TCPConn)
	if ok && ok2 {
		for left != 0 {
			chunk := int64(spliceChunk)
			if left > 0 {
				chunk = min(chunk, left)
			}
			k, err := tdst.ReadFrom(&io.LimitedReader{R: tsrc, N: chunk})
			if k > 0 {
				if cerr := step(k); cerr != nil {
					return cerr
				}
			}
			if err != nil {
				return err
			}
			if k == 0 {
				break
			}
		}
	} else {
		r := src
		if n >= 0 {
			r = &io.LimitedReader{R: src, N: n}
		}
		bp := copyBuffers.Get().(*[]byte)
		defer copyBuffers.Put(bp)
		buf := *bp
		for {
			k, err := r.Read(buf)
			if k > 0 {
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return werr
				}
				if cerr := step(int64(k)); cerr != nil {
					return cerr
				}
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	if left > 0 {
		return io.ErrUnexpectedEOF
	}
	return nil
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		c.Close()
	}
}

// hopHeaders are the headers of one hop, never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Upgrade"}

func dropHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for name := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// forward serves a plain request: it sends it to its destination (up, when
// up is that destination's connection already) and writes the response
// back. It returns the destination's connection, for the next request, and
// whether the program's connection may serve another.
func (p *Proxy) forward(ctx context.Context, conn net.Conn, req *http.Request, up *upstream) (*upstream, bool) {
	host, port, err := target(req)
	if err != nil {
		reply(conn, http.StatusBadRequest, "sandboxd egress: "+err.Error())
		return up, false
	}
	if up != nil && (up.rec.Host != host || up.rec.Port != port) {
		up.finish(OutcomeOK, "")
		up = nil
	}
	redial := func() bool {
		var status int
		var err error
		if up, status, err = p.dial(ctx, host, port, req.Method); err != nil {
			reply(conn, status, err.Error())
		}
		return err == nil
	}
	reused := up != nil
	if !reused && !redial() {
		return nil, false
	}
	dropHop(req.Header)
	req.RequestURI = ""
	resp, err := exchange(up, conn, req)
	if err != nil && reused && !up.capped() && (req.Body == nil || req.Body == http.NoBody) {
		// A kept connection the destination closed while it was idle:
		// a request without a body is sent once more, on a new one.
		up.finish(OutcomeOK, "")
		if !redial() {
			return nil, false
		}
		resp, err = exchange(up, conn, req)
	}
	if err != nil {
		if !up.capped() {
			reply(conn, http.StatusBadGateway, fmt.Sprintf("sandboxd egress: %s:%d: %v", host, port, err))
		}
		up.finish(OutcomeFailed, err.Error())
		return nil, false
	}
	dropHop(resp.Header)
	bw := responseWriters.Get().(*bufio.Writer)
	bw.Reset(conn)
	defer func() { bw.Reset(nil); responseWriters.Put(bw) }()
	// A spliced body is read past resp.Body, which must then not be
	// closed: closing drains it, and there is nothing left to drain.
	if spliced, serr := p.spliceBody(conn, bw, up, req, resp); spliced {
		err = serr
	} else {
		if err = resp.Write(bw); err == nil {
			err = bw.Flush()
		}
		resp.Body.Close()
	}
	if err != nil || resp.Close || resp.StatusCode == http.StatusSwitchingProtocols {
		up.finish(OutcomeOK, "")
		return nil, false
	}
	return up, !req.Close
}

// responseWriters hold the writers of responses to programs: 256 KiB, as
// the agent's frames are up to 256 KiB (fewer, larger ones), and pooled,
// as a new one per response costs more than a small request's forwarding.
var responseWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 256<<10) }}

// copyBuffers are pipe's buffers, pooled for the same reason.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// spliceMin is the smallest response body spliceBody moves in the kernel.
const spliceMin = 256 << 10

// spliceBody writes a large response of a known length from a destination
// to a program's handed-off socket with its body moved in the kernel: the
// head, then what the destination's reader holds already, then the rest
// spliced, counted as pipe counts. ok is false, and nothing is written,
// for any other response or connection: then resp.Write serves. resp.Body
// is not read.
func (p *Proxy) spliceBody(conn net.Conn, bw *bufio.Writer, up *upstream, req *http.Request, resp *http.Response) (ok bool, err error) {
	dst, isTCP := conn.(*net.TCPConn)
	src, srcTCP := up.conn.Conn.(*net.TCPConn)
	n := resp.ContentLength
	if !isTCP || !srcTCP || n < spliceMin || len(resp.TransferEncoding) > 0 || req.Method == http.MethodHead || len(resp.Trailer) > 0 {
		return false, nil
	}
	h := resp.Header.Clone()
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	fmt.Fprintf(bw, "HTTP/%d.%d %03d %s\r\n", resp.ProtoMajor, resp.ProtoMinor, resp.StatusCode, http.StatusText(resp.StatusCode))
	if err := h.Write(bw); err != nil {
		return true, err
	}
	bw.WriteString("\r\n")
	held := min(int64(up.br.Buffered()), n)
	if _, err := io.CopyN(bw, up.br, held); err != nil { // counted by the meter as it was read
		return true, err
	}
	if err := bw.Flush(); err != nil {
		return true, err
	}
	if err := pipeN(dst, src, n-held, up.conn.countDown); err != nil {
		return true, err
	}
	return true, nil
}

// exchange sends req to the destination and reads its final response;
// the interim ones (100 Continue, 103 Early Hints) go to the program as
// they come.
func exchange(up *upstream, conn net.Conn, req *http.Request) (*http.Response, error) {
	err := req.Write(up.bw)
	if err == nil {
		err = up.bw.Flush()
	}
	for err == nil {
		resp, rerr := http.ReadResponse(up.br, req)
		if rerr != nil {
			return nil, rerr
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
		err = resp.Write(conn)
	}
	return nil, err
}

// dial connects to host:port when the policy allows it. It fails with an
// error whose text is the body of the answer to send, and its status:
// 403 when the policy refuses, 502 when the destination is not reached.
// Either is audited here.
func (p *Proxy) dial(ctx context.Context, host string, port uint16, method string) (*upstream, int, error) {
	rec := Record{Session: p.o.session, Tenant: p.o.tenant, Host: host, Port: port, Method: method}
	start := time.Now()
	fail := func(status int, outcome, reason, body string) (*upstream, int, error) {
		rec.Outcome, rec.Reason, rec.Duration = outcome, reason, time.Since(start)
		p.o.audit(rec)
		return nil, status, errors.New(body)
	}
	if !slices.ContainsFunc(p.rules, func(r Rule) bool { return r.Match(host, port) }) {
		hp := net.JoinHostPort(host, strconv.Itoa(int(port)))
		return fail(http.StatusForbidden, OutcomeRefused, "no rule allows it", fmt.Sprintf(
			"sandboxd egress: %s refused: no rule of this session's egress policy allows it.\n"+
				"The operator allows it by adding %q (or a preset: %s) to egress.allow in the daemon's configuration,\n"+
				"or with --egress %s for sandboxd mcp; a session's egress setting only narrows the operator's.\n",
			hp, hp, strings.Join(PresetNames(), ", "), hp))
	}
	if p.moved.Load() >= p.policy.MaxBytes {
		return fail(http.StatusForbidden, OutcomeCapped, "the session's byte cap is spent", fmt.Sprintf(
			"sandboxd egress: %s:%d refused: this session has moved its %d bytes (egress.maxBytes in the daemon's configuration).\n", host, port, p.policy.MaxBytes))
	}
	dctx, cancel := context.WithTimeout(ctx, p.o.dialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		found, err := p.o.resolver.LookupNetIP(dctx, "ip", host)
		if err != nil {
			return fail(http.StatusBadGateway, OutcomeFailed, "lookup: "+err.Error(), fmt.Sprintf("sandboxd egress: %s:%d: %v\n", host, port, err))
		}
		addrs = found
	}
	var refused []string
	var dialErr error
	for _, a := range addrs {
		a = a.Unmap()
		if Refused(a) && !slices.ContainsFunc(p.private, func(pr netip.Prefix) bool { return pr.Contains(a) }) {
			refused = append(refused, a.String())
			continue
		}
		// The address checked is the address dialled: no second lookup.
		addr := netip.AddrPortFrom(a, port).String()
		var d net.Dialer
		c, err := d.DialContext(dctx, "tcp", addr)
		if err != nil {
			dialErr = err
			continue
		}
		rec.Addr = addr
		return newUpstream(p, c, rec, start), 0, nil
	}
	if dialErr != nil {
		return fail(http.StatusBadGateway, OutcomeFailed, dialErr.Error(), fmt.Sprintf("sandboxd egress: %s:%d: %v\n", host, port, dialErr))
	}
	if len(refused) > 0 {
		return fail(http.StatusForbidden, OutcomeRefused, "private address "+strings.Join(refused, ", "), fmt.Sprintf(
			"sandboxd egress: %s:%d refused: it resolves to %s, a private, loopback or link-local address,\n"+
				"which is reached only when the operator lists it in egress.allowPrivate in the daemon's configuration.\n",
			host, port, strings.Join(refused, ", ")))
	}
	return fail(http.StatusBadGateway, OutcomeFailed, "no address", fmt.Sprintf("sandboxd egress: %s:%d: the name has no address\n", host, port))
}

// reply writes a complete answer of the proxy's own, and the end of the
// connection.
func reply(w io.Writer, status int, body string) {
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Sandboxd-Egress: %s\r\n\r\n%s",
		status, http.StatusText(status), len(body), strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "-")), body)
}

// upstream is a connection to a destination, metered against the
// session's byte cap, audited once when it is finished.
type upstream struct {
	p        *Proxy
	conn     *metered
	bw       *bufio.Writer
	br       *bufio.Reader
	rec      Record
	start    time.Time
	finished sync.Once
}

func newUpstream(p *Proxy, c net.Conn, rec Record, start time.Time) *upstream {
	m := &metered{Conn: c, p: p}
	return &upstream{p: p, conn: m, bw: bufio.NewWriterSize(m, 32<<10), br: bufio.NewReaderSize(m, 32<<10), rec: rec, start: start}
}

func (u *upstream) capped() bool { return u != nil && u.conn.over.Load() }

// finish closes the connection and audits it; only the first call counts.
func (u *upstream) finish(outcome, reason string) {
	if u == nil {
		return
	}
	u.finished.Do(func() {
		u.conn.Close()
		if u.conn.over.Load() {
			outcome, reason = OutcomeCapped, fmt.Sprintf("over egress.maxBytes (%d)", u.p.policy.MaxBytes)
		}
		r := u.rec
		r.Outcome, r.Reason, r.Duration = outcome, reason, time.Since(u.start)
		r.BytesUp, r.BytesDown = u.conn.up.Load(), u.conn.down.Load()
		u.p.o.audit(r)
	})
}

// metered counts a destination connection's bytes, and cuts it when the
// session's total passes its cap.
type metered struct {
	net.Conn
	p        *Proxy
	up, down atomic.Int64
	over     atomic.Bool
}

var errCapped = errors.New("the session's egress byte cap is spent")

func (m *metered) count(n int64, dir *atomic.Int64) error {
	dir.Add(n)
	if m.p.moved.Add(n) > m.p.policy.MaxBytes {
		m.over.Store(true)
		m.Conn.Close()
		return errCapped
	}
	return nil
}

// countUp and countDown count bytes moved past the meter (pipe).
func (m *metered) countUp(n int64) error   { return m.count(n, &m.up) }
func (m *metered) countDown(n int64) error { return m.count(n, &m.down) }

func (m *metered) Read(b []byte) (int, error) {
	n, err := m.Conn.Read(b)
	if cerr := m.count(int64(n), &m.down); cerr != nil {
		return n, cerr
	}
	return n, err
}

func (m *metered) Write(b []byte) (int, error) {
	if m.p.moved.Load() >= m.p.policy.MaxBytes {
		m.over.Store(true)
		m.Conn.Close()
		return 0, errCapped
	}
	n, err := m.Conn.Write(b)
	if cerr := m.count(int64(n), &m.up); cerr != nil {
		return n, cerr
	}
	return n, err
}

// CloseWrite half-closes the destination connection.
func (m *metered) CloseWrite() error {
	if cw, ok := m.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return m.Conn.Close()
}
