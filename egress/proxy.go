package egress

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
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
	OutcomeCut     = "cut"     // cut when the policy changed (SetAllow) and no longer allowed it
	OutcomeInvalid = "invalid" // a request the proxy cannot serve as written (HTTP 400)
)

// Record describes one destination connection, or one refusal, for the
// audit log and metrics. It never carries URLs' paths, headers or bodies.
type Record struct {
	// ID tells the connections of one Proxy apart (0 for a refusal).
	ID              uint64
	Session, Tenant string
	// Call is the call the connection is attributed to: the user its
	// program gave the proxy (CallEnv), "" when none.
	Call      string
	Host      string // as the program named it
	Port      uint16
	Addr      string // the address dialled; "" when none was
	Method    string // CONNECT, or the first request's method
	Outcome   string
	Reason    string // why it was refused or failed
	BytesUp   int64  // sent to the destination
	BytesDown int64  // received from it
	Duration  time.Duration
	// Inspected says the proxy terminated the program's TLS and sent
	// its requests itself (a destination with secrets, or inspectAll).
	Inspected bool
	// Secrets names the secrets put into its requests, never their
	// values.
	Secrets []string
}

// LogAttrs are the record's fields as slog attributes.
func (r Record) LogAttrs() []slog.Attr {
	return []slog.Attr{
		slog.String("session", r.Session), slog.String("tenant", r.Tenant), slog.String("call", r.Call),
		slog.String("host", r.Host), slog.Int("port", int(r.Port)), slog.String("addr", r.Addr),
		slog.String("method", r.Method), slog.String("outcome", r.Outcome), slog.String("reason", r.Reason),
		slog.Int64("bytes_up", r.BytesUp), slog.Int64("bytes_down", r.BytesDown),
		slog.Float64("duration_ms", float64(r.Duration.Microseconds())/1000),
		slog.Bool("inspected", r.Inspected), slog.Any("secrets", r.Secrets),
	}
}

// Option configures New.
type Option func(*options)

type options struct {
	session, tenant string
	resolver        Resolver
	audit           func(Record)
	opened          func(Record)
	dialTimeout     time.Duration
	tls             *TLS
	secrets         []Secret
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

// WithOpened calls f once per destination connection when it is made
// (its Record's Outcome is ""), before the program's bytes flow; WithAudit's
// function hears of it again when it ends, with the same ID. f must be
// quick and safe for concurrent use.
func WithOpened(f func(Record)) Option { return func(o *options) { o.opened = f } }

// WithDialTimeout bounds resolving and connecting to a destination
// (default 30s).
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// Proxy is one session's egress: an HTTP forward proxy that dials what the
// session's Policy allows. It is safe for concurrent use.
type Proxy struct {
	policy  Policy // its Allow as New had it; allow holds the live rules
	allow   atomic.Pointer[[]Rule]
	private []netip.Prefix
	o       options
	slots   chan struct{} // connections served at once
	bytes   *byteCap      // Policy.MaxBytes, both ways, all connections
	ids     atomic.Uint64 // the last Record.ID given

	mu   sync.Mutex
	live map[*upstream]struct{} // destination connections not finished

	sessions tls.ClientSessionCache // of the proxy's own TLS to destinations
}

// New returns the proxy of a policy; it fails when the policy does not
// validate.
func New(p Policy, opts ...Option) (*Proxy, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	o := options{resolver: net.DefaultResolver, audit: func(Record) {}, opened: func(Record) {}, dialTimeout: 30 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	secrets, err := compileSecrets(o.secrets)
	if err != nil {
		return nil, err
	}
	o.secrets = secrets
	if p.InspectAll && (o.tls == nil || o.tls.Certificate == nil) {
		return nil, errors.New("egress: inspectAll needs the proxy's TLS (WithTLS): a certificate authority the session trusts")
	}
	if len(secrets) > 0 && (o.tls == nil || o.tls.Certificate == nil) {
		return nil, errors.New("egress: secrets need the proxy's TLS (WithTLS) to reach HTTPS destinations")
	}
	rules, _ := ParseRules(p.Allow)
	private, _ := parsePrefixes(p.AllowPrivate)
	p.MaxConnections = cmp.Or(p.MaxConnections, DefaultMaxConnections)
	p.MaxBytes = cmp.Or(p.MaxBytes, DefaultMaxBytes)
	px := &Proxy{policy: p, private: private, o: o, slots: make(chan struct{}, p.MaxConnections), bytes: newByteCap(p.MaxBytes), live: map[*upstream]struct{}{},
		sessions: tls.NewLRUClientSessionCache(64)}
	px.allow.Store(&rules)
	return px, nil
}

// rules are the proxy's rules now.
func (p *Proxy) rules() []Rule { return *p.allow.Load() }

// allows reports whether the rules allow host and port now.
func (p *Proxy) allows(host string, port uint16) bool {
	return slices.ContainsFunc(p.rules(), func(r Rule) bool { return r.Match(host, port) })
}

// SetAllow replaces the proxy's rules (Policy.Allow: rules and presets)
// while it serves: connections made from then on are judged by them, and
// every open destination connection they no longer allow is cut at once
// (Outcome OutcomeCut), the program's connection with it. The caller
// decides whether the new rules lie within the operator's (Policy.Narrow);
// SetAllow only checks that they parse.
func (p *Proxy) SetAllow(entries []string) error {
	rules, err := ParseRules(entries)
	if err != nil {
		return err
	}
	p.allow.Store(&rules)
	p.mu.Lock()
	var cut []*upstream
	for u := range p.live {
		if !p.allows(u.rec.Host, u.rec.Port) {
			cut = append(cut, u)
		}
	}
	p.mu.Unlock()
	for _, u := range cut {
		u.cut()
	}
	return nil
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
				p.invalid(conn, "", 0, "", "", unreadable(err))
			}
			return
		}
		call := callOf(req)
		if req.Method == http.MethodConnect {
			up.finish(OutcomeOK, "")
			up = nil
			p.connect(ctx, conn, br, req, call)
			return
		}
		var keep bool
		up, keep = p.forward(ctx, conn, req, up, call)
		if !keep {
			return
		}
	}
}

// errHeadTooLarge is a request line and headers over maxHead.
var errHeadTooLarge = errors.New("the request's head is over 64 KiB")

// headLimit reads at most left bytes while left is not negative.
type headLimit struct {
	r    io.Reader
	left int
}

func (h *headLimit) Read(p []byte) (int, error) {
	if h.left == 0 {
		return 0, errHeadTooLarge
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

// connect serves a CONNECT request: the tunnel, its inspection when the
// destination has secrets (or the policy inspects all), or its refusal.
func (p *Proxy) connect(ctx context.Context, conn net.Conn, br *bufio.Reader, req *http.Request, call string) {
	host, port, err := target(req)
	if err != nil {
		p.invalid(conn, "", 0, req.Method, call, badRequest(err.Error()))
		return
	}
	if p.inspects(host, port) {
		p.intercept(ctx, conn, br, host, port, call)
		return
	}
	up, ans := p.dial(ctx, host, port, req.Method, call, conn)
	if ans != nil {
		p.refuseConnect(ctx, conn, br, host, ans)
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
			err = pipe(up.conn.Conn, conn, up.conn, &up.conn.up)
		}
		if err == nil {
			closeWrite(up.conn)
		} else {
			up.conn.Close()
		}
	}()
	if err := pipe(conn, up.conn.Conn, up.conn, &up.conn.down); err == nil {
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
func (p *Proxy) forward(ctx context.Context, conn net.Conn, req *http.Request, up *upstream, call string) (*upstream, bool) {
	host, port, err := target(req)
	if err != nil {
		p.invalid(conn, "", 0, req.Method, call, badRequest(err.Error()))
		return up, false
	}
	if up != nil && (up.rec.Host != host || up.rec.Port != port) {
		up.finish(OutcomeOK, "")
		up = nil
	}
	return p.relay(conn, req, host, port, call, up, func() (*upstream, *answer) {
		return p.dial(ctx, host, port, req.Method, call, conn)
	})
}

// relay sends req to host:port — through up, when it is that
// destination's connection already, or one redial makes — with the
// secrets it may carry put in place of their placeholders, and writes the
// response to conn, a program's connection (or the TLS the proxy
// terminated on it). It returns the destination's connection, for the
// next request, and whether conn may serve another. A request the secrets
// refuse is answered 403 and audited.
func (p *Proxy) relay(conn net.Conn, req *http.Request, host string, port uint16, call string, up *upstream, redial func() (*upstream, *answer)) (*upstream, bool) {
	dropHop(req.Header)
	inj, ans := p.inject(req, host, port)
	if ans != nil {
		p.refused(host, port, req.Method, call, ans)
		reply(conn, ans)
		return up, false
	}
	dial := func() bool {
		var ans *answer
		if up, ans = redial(); ans != nil {
			reply(conn, ans)
		}
		return ans == nil
	}
	reused := up != nil
	if !reused && !dial() {
		return nil, false
	}
	req.RequestURI = ""
	resp, err := exchange(up, conn, req)
	if err != nil && reused && !up.capped() && !up.wasCut() && (req.Body == nil || req.Body == http.NoBody) {
		// A kept connection the destination closed while it was idle:
		// a request without a body is sent once more, on a new one.
		up.finish(OutcomeOK, "")
		if !dial() {
			return nil, false
		}
		resp, err = exchange(up, conn, req)
	}
	if err != nil {
		why := inj.redact(err.Error())
		if !up.capped() && !up.wasCut() {
			reply(conn, &answer{status: http.StatusBadGateway, reason: why, body: fmt.Sprintf("sandboxd egress: %s: %s", hostPort(host, port), why)})
		}
		up.finish(OutcomeFailed, why)
		return nil, false
	}
	up.injected(inj.names)
	dropHop(resp.Header)
	bw := responseWriters.Get().(*bufio.Writer)
	bw.Reset(conn)
	defer func() { bw.Reset(nil); responseWriters.Put(bw) }()
	// A spliced body is read past resp.Body, which must then not be
	// closed: closing drains it, and there is nothing left to drain.
	if spliced, serr := p.spliceBody(conn, bw, up, req, resp, inj); spliced {
		err = serr
	} else {
		inj.mask(resp)
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
func (p *Proxy) spliceBody(conn net.Conn, bw *bufio.Writer, up *upstream, req *http.Request, resp *http.Response, inj injection) (ok bool, err error) {
	dst, isTCP := conn.(*net.TCPConn)
	src, srcTCP := up.conn.Conn.(*net.TCPConn)
	n := resp.ContentLength
	if !isTCP || !srcTCP || len(inj.values) > 0 || up.tls != nil || n < spliceMin || len(resp.TransferEncoding) > 0 || req.Method == http.MethodHead || len(resp.Trailer) > 0 {
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
	if err := pipeN(dst, src, n-held, up.conn, &up.conn.down); err != nil {
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

// dial connects to host:port when the policy allows it, for a connection
// of call's, whose program's side is client. It fails with the answer to
// send: 403 when the policy refuses, 502 when the destination is not
// reached. Either is audited here; a connection made is reported to the
// opened hook.
func (p *Proxy) dial(ctx context.Context, host string, port uint16, method, call string, client net.Conn) (*upstream, *answer) {
	rec := Record{ID: p.ids.Add(1), Session: p.o.session, Tenant: p.o.tenant, Call: call, Host: host, Port: port, Method: method}
	start := time.Now()
	fail := func(outcome string, ans *answer) (*upstream, *answer) {
		rec.Outcome, rec.Reason, rec.Duration = outcome, ans.reason, time.Since(start)
		p.o.audit(rec)
		return nil, ans
	}
	if !p.allows(host, port) {
		return fail(OutcomeRefused, notAllowed(host, port))
	}
	if p.bytes.spent() {
		return fail(OutcomeCapped, byteCapSpent(host, port, p.policy.MaxBytes))
	}
	dctx, cancel := context.WithTimeout(ctx, p.o.dialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		found, err := p.o.resolver.LookupNetIP(dctx, "ip", host)
		if err != nil {
			return fail(OutcomeFailed, badGateway(host, port, "lookup: "+err.Error()))
		}
		addrs = found
	}
	var refused []string
	var dialErr error
	for _, a := range addrs {
		a = a.Unmap()
		if what, bad := refusedAs(a); bad && !slices.ContainsFunc(p.private, func(pr netip.Prefix) bool { return pr.Contains(a) || pr.Contains(subject(a)) }) {
			if s := subject(a); s != a {
				what = "NAT64 of " + s.String() + ", " + what
			}
			refused = append(refused, a.String()+" ("+cmp.Or(what, "not an address to dial")+")")
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
		return p.newUpstream(c, client, rec, start), nil
	}
	if dialErr != nil {
		return fail(OutcomeFailed, badGateway(host, port, dialErr.Error()))
	}
	if len(refused) > 0 {
		return fail(OutcomeRefused, privateAddress(host, port, refused))
	}
	return fail(OutcomeFailed, badGateway(host, port, "the name has no address"))
}

// refused audits a request the proxy answered itself with ans, without a
// destination connection.
func (p *Proxy) refused(host string, port uint16, method, call string, ans *answer) {
	outcome := OutcomeRefused
	switch ans.status {
	case http.StatusForbidden, http.StatusMisdirectedRequest:
	case http.StatusBadRequest:
		outcome = OutcomeInvalid
	default:
		outcome = OutcomeFailed
	}
	p.o.audit(Record{ID: p.ids.Add(1), Session: p.o.session, Tenant: p.o.tenant, Call: call, Host: host, Port: port,
		Method: method, Outcome: outcome, Reason: ans.reason})
}

// invalid audits and answers a request the proxy cannot serve as written
// (400): host and method as far as they are known.
func (p *Proxy) invalid(w io.Writer, host string, port uint16, method, call string, ans *answer) {
	p.refused(host, port, method, call, ans)
	reply(w, ans)
}

// unreadable is the answer to a request the proxy cannot read. Its reason,
// for the audit, leaves out what net/http quotes of the request, which may
// hold a URL's path.
func unreadable(err error) *answer {
	a := badRequest("a request this proxy cannot read: " + err.Error())
	a.reason = "a request this proxy cannot read"
	if errors.Is(err, errHeadTooLarge) {
		a.reason = errHeadTooLarge.Error()
	}
	return a
}

// upstream is a connection to a destination, metered against the
// session's byte cap, audited once when it is finished.
type upstream struct {
	p      *Proxy
	conn   *metered
	tls    *tls.Conn // the proxy's own TLS over conn, when it inspects
	client net.Conn  // the program's connection it serves
	bw     *bufio.Writer
	br     *bufio.Reader
	rec    Record
	start  time.Time
	// secrets names the secrets put into its requests; only the goroutine
	// serving the connection touches it.
	secrets  []string
	cutDown  atomic.Bool
	finished sync.Once
}

func (p *Proxy) newUpstream(c, client net.Conn, rec Record, start time.Time) *upstream {
	m := &metered{Conn: c, p: p}
	u := &upstream{p: p, conn: m, client: client, bw: bufio.NewWriterSize(m, 32<<10), br: bufio.NewReaderSize(m, 32<<10), rec: rec, start: start}
	p.mu.Lock()
	p.live[u] = struct{}{}
	p.mu.Unlock()
	p.o.opened(rec)
	return u
}

// speakTLS makes the proxy's reads and writes on u go through tc, a TLS
// client over u's connection.
func (u *upstream) speakTLS(tc *tls.Conn) {
	u.tls = tc
	u.bw.Reset(tc)
	u.br.Reset(tc)
	u.rec.Inspected = true
}

func (u *upstream) capped() bool { return u != nil && u.conn.over.Load() }
func (u *upstream) wasCut() bool { return u != nil && u.cutDown.Load() }

// injected notes the secrets put into one of its requests.
func (u *upstream) injected(names []string) {
	for _, n := range names {
		if !slices.Contains(u.secrets, n) {
			u.secrets = append(u.secrets, n)
		}
	}
}

// cut ends the connection, and the program's, now: the policy no longer
// allows its destination (SetAllow). The goroutine serving it finishes it.
func (u *upstream) cut() {
	u.cutDown.Store(true)
	u.conn.Conn.Close()
	if u.client != nil {
		u.client.Close()
	}
}

// finish closes the connection and audits it; only the first call counts.
func (u *upstream) finish(outcome, reason string) {
	if u == nil {
		return
	}
	u.finished.Do(func() {
		u.conn.Close()
		u.p.mu.Lock()
		delete(u.p.live, u)
		u.p.mu.Unlock()
		switch {
		case u.conn.over.Load():
			outcome, reason = OutcomeCapped, fmt.Sprintf("over egress.maxBytes (%d)", u.p.policy.MaxBytes)
		case u.cutDown.Load():
			outcome, reason = OutcomeCut, "the session's egress policy changed and no longer allows it"
		}
		r := u.rec
		r.Outcome, r.Reason, r.Duration = outcome, reason, time.Since(u.start)
		r.BytesUp, r.BytesDown = u.conn.up.Load(), u.conn.down.Load()
		r.Secrets = slices.Clone(u.secrets)
		u.p.o.audit(r)
	})
}
