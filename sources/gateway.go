package sources

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// Gateway sends the requests of a session's http sources for the agent. It
// runs in the daemon, outside the sandbox, which has no network: the shell
// tool's curl reaches a source only through it.
//
// Do guarantees, for every request:
//   - it is sent only when its method, scheme, host, port, path, query
//     parameter names, headers and body match a declared RequestShape of
//     the source whose URL it is under; anything else is refused with a
//     *RefusedError before a connection is made;
//   - the credential is added by the Gateway, read from the daemon's
//     environment or file at that moment; the agent cannot set or replace
//     its header, and the secret is replaced by "[redacted]" wherever it
//     appears in the response's headers or body (as written, not in an
//     encoded form);
//   - a redirect is followed only when asked (curl -L), at most
//     MaxRedirects times, and only to a URL that is itself a declared
//     request of the same source — a redirect anywhere else is refused
//     before it is sent, so the credential goes nowhere undeclared;
//   - the response body is bounded by the source's MaxResponseBytes (a
//     larger one is refused, not cut) and the whole exchange by its timeout;
//   - every request, sent or refused, is given to the audit function.
//
// Set-Cookie headers are dropped: sessions of the API are the daemon's
// business, not the agent's. A Gateway is safe for concurrent use.
type Gateway struct {
	sources   []*httpSource
	transport http.RoundTripper
	audit     func(AuditRecord)
	lookupEnv func(string) (string, bool)
}

type httpSource struct {
	Decl
	base   *url.URL
	shapes [][]segment // parsed Requests[i].Path
}

// AuditRecord is one request as the audit sees it. It never holds the
// credential.
type AuditRecord struct {
	Time    time.Time
	Session string
	Run     string
	// Source is the source the request was matched to, or "" when none was.
	Source string
	Method string
	URL    string
	// Outcome is "sent" (a response came back, whatever its status),
	// "refused" (by the declarations or a limit) or "failed" (the network,
	// the API or a timeout).
	Outcome  string
	Reason   string
	Status   int
	Bytes    int64
	Duration time.Duration
}

// GatewayOption configures NewGateway.
type GatewayOption func(*Gateway)

// WithAudit sends every AuditRecord to f (default: the slog default
// logger, at Info, as "source request"). f is called synchronously.
func WithAudit(f func(AuditRecord)) GatewayOption { return func(g *Gateway) { g.audit = f } }

// WithTransport sends requests through rt (default: a clone of
// http.DefaultTransport), e.g. one that trusts a private CA.
func WithTransport(rt http.RoundTripper) GatewayOption { return func(g *Gateway) { g.transport = rt } }

// WithLookupEnv reads credentials' environment variables through f
// (default os.LookupEnv).
func WithLookupEnv(f func(string) (string, bool)) GatewayOption {
	return func(g *Gateway) { g.lookupEnv = f }
}

// NewGateway returns the gateway of decls' http sources (other kinds are
// ignored; a Gateway with none refuses every request). It fails when a
// declaration is invalid or a credential cannot be read now, naming the
// source and where the secret was looked for — never the secret.
func NewGateway(decls Decls, opts ...GatewayOption) (*Gateway, error) {
	if err := decls.Validate(); err != nil {
		return nil, err
	}
	g := &Gateway{lookupEnv: os.LookupEnv}
	for _, o := range opts {
		o(g)
	}
	if g.transport == nil {
		g.transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if g.audit == nil {
		g.audit = func(r AuditRecord) {
			slog.Info("source request", "session", r.Session, "run", r.Run, "source", r.Source, "method", r.Method,
				"url", r.URL, "outcome", r.Outcome, "reason", r.Reason, "status", r.Status, "bytes", r.Bytes, "duration", r.Duration)
		}
	}
	for _, d := range decls {
		if d.Kind != KindHTTP {
			continue
		}
		s := &httpSource{Decl: d}
		s.base, _ = url.Parse(d.URL)
		for _, r := range d.Requests {
			segs, _ := parsePattern(r.Path)
			s.shapes = append(s.shapes, segs)
		}
		if _, err := g.secret(s); err != nil {
			return nil, err
		}
		g.sources = append(g.sources, s)
	}
	return g, nil
}

// Only returns a gateway that sends requests of the named sources alone
// (the others are refused as if undeclared), sharing g's transport and
// audit: a session's view of the operator's gateway.
func (g *Gateway) Only(names ...string) *Gateway {
	v := *g
	v.sources = nil
	for _, s := range g.sources {
		if slices.Contains(names, s.Name) {
			v.sources = append(v.sources, s)
		}
	}
	return &v
}

// HTTPRequest is a request the agent asks the gateway to send.
type HTTPRequest struct {
	Method string
	URL    string
	Header http.Header
	Body   []byte
	// FollowRedirects follows redirects (curl -L); without it a redirect
	// is the response.
	FollowRedirects bool
	// MaxTime, when positive, bounds the request below the source's
	// timeout (curl --max-time).
	MaxTime time.Duration
	// Session and Run name who asked, for the audit.
	Session, Run string
}

// HTTPResponse is what came back, redacted.
type HTTPResponse struct {
	Source string
	// URL is the URL of the response: the request's, or the last redirect's.
	URL    string
	Proto  string
	Status int
	// StatusText is the status line's text after the code ("OK").
	StatusText string
	Header     http.Header
	Body       []byte
}

// RefusedError is a request the declarations do not allow, or one that
// passed a limit. It matches workspace.ErrForbidden, or
// workspace.ErrFileTooLarge for a response over the limit.
type RefusedError struct {
	Source string // "" when no source's URL holds the request
	Method string
	URL    string
	Reason string
	// Declared lists the source's declared requests ("GET https://…/items/{id}").
	Declared []string
	kind     *workspace.Kind
}

func (e *RefusedError) Error() string {
	msg := fmt.Sprintf("%s %s refused: %s", e.Method, e.URL, e.Reason)
	if e.Source != "" && len(e.Declared) > 0 {
		msg += fmt.Sprintf("; source %s declares %s (see %s/%s)", e.Source, strings.Join(e.Declared, ", "), SnapshotPath(e.Source), DescriptorFile)
	}
	return msg
}

// Unwrap gives the error's kind.
func (e *RefusedError) Unwrap() error {
	if e.kind != nil {
		return e.kind
	}
	return workspace.ErrForbidden
}

var errSourceTimeout = errors.New("the source's time limit passed")

// Do sends req if a declaration allows it; see Gateway for what it
// guarantees. A refusal is a *RefusedError; a timeout matches
// workspace.ErrTimeout; a failure of the network or the API is returned
// as it is; the end of ctx is ctx's error.
func (g *Gateway) Do(ctx context.Context, req HTTPRequest) (*HTTPResponse, error) {
	start := time.Now()
	rec := AuditRecord{Time: start, Session: req.Session, Run: req.Run, Method: req.Method, URL: req.URL}
	resp, err := g.do(ctx, req, &rec)
	rec.Duration = time.Since(start)
	var re *RefusedError
	switch {
	case errors.As(err, &re):
		rec.Outcome, rec.Reason = "refused", re.Reason
	case err != nil:
		rec.Outcome, rec.Reason = "failed", err.Error()
	default:
		rec.Outcome, rec.Status, rec.Bytes = "sent", resp.Status, int64(len(resp.Body))
	}
	g.audit(rec)
	return resp, err
}

func (g *Gateway) do(ctx context.Context, req HTTPRequest, rec *AuditRecord) (*HTTPResponse, error) {
	refuse := func(s *httpSource, format string, args ...any) *RefusedError {
		e := &RefusedError{Method: req.Method, URL: req.URL, Reason: fmt.Sprintf(format, args...)}
		if s != nil {
			e.Source, e.Declared = s.Name, s.declared()
		}
		return e
	}
	u, err := url.Parse(req.URL)
	if err != nil || !u.IsAbs() || u.Host == "" {
		return nil, refuse(nil, "not an absolute http or https URL")
	}
	if len(req.URL) > 8<<10 {
		return nil, refuse(nil, "the URL is over 8 KiB")
	}
	s := g.sourceOf(u)
	if s == nil {
		return nil, refuse(nil, "no source is at %s (sources: %s)", u.Scheme+"://"+u.Host+u.EscapedPath(), g.urls())
	}
	rec.Source = s.Name
	u.Fragment, u.RawFragment = "", ""
	shape, why := s.match(req.Method, u)
	if shape == nil {
		return nil, refuse(s, "%s", why)
	}
	allowed := shape.allowedHeaders()
	var credHeader string
	if s.Credential != nil {
		credHeader = http.CanonicalHeaderKey(s.Credential.Header)
	}
	out := http.Header{}
	for name, vals := range req.Header {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case canon == credHeader:
			return nil, refuse(s, "the %s header is the source's credential, which sandboxd adds itself", canon)
		case !slices.Contains(allowed, canon):
			return nil, refuse(s, "header %s is not one %s %s may set (it may set %s)", canon, shape.Method, shape.Path, strings.Join(allowed, ", "))
		}
		for _, v := range vals {
			if !validHeaderValue(v) {
				return nil, refuse(s, "header %s has a control character", canon)
			}
			out.Add(canon, v)
		}
	}
	if len(req.Body) > 0 && !shape.Body {
		return nil, refuse(s, "%s %s takes no body", shape.Method, shape.Path)
	}
	if len(req.Body) > DefaultMaxRequestBytes {
		return nil, refuse(s, "the body is %d bytes, over the limit of %d", len(req.Body), DefaultMaxRequestBytes)
	}
	secret, err := g.secret(s)
	if err != nil {
		return nil, err
	}

	timeout := time.Duration(s.timeoutMs()) * time.Millisecond
	if req.MaxTime > 0 && req.MaxTime < timeout {
		timeout = req.MaxTime
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errSourceTimeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, req.Method, u.String(), bytes.NewReader(req.Body))
	if err != nil {
		return nil, refuse(s, "%v", err)
	}
	if len(req.Body) == 0 {
		hreq.Body, hreq.GetBody, hreq.ContentLength = http.NoBody, nil, 0
	}
	hreq.Header = out
	hreq.Header.Set("User-Agent", "sandboxd-source/1")
	s.authorize(hreq.Header, secret)

	var redirectRefusal *RefusedError
	client := &http.Client{Transport: g.transport, CheckRedirect: func(next *http.Request, via []*http.Request) error {
		if !req.FollowRedirects {
			return http.ErrUseLastResponse
		}
		if len(via) > MaxRedirects {
			redirectRefusal = refuse(s, "more than %d redirects", MaxRedirects)
			return redirectRefusal
		}
		if g.sourceOf(next.URL) != s {
			redirectRefusal = refuse(s, "the response redirects to %s, which is not under the source's URL %s", redact(next.URL.String(), secret), s.URL)
			return redirectRefusal
		}
		shape, why := s.match(next.Method, next.URL)
		if shape == nil {
			redirectRefusal = refuse(s, "the response redirects to %s %s: %s", next.Method, redact(next.URL.String(), secret), why)
			return redirectRefusal
		}
		if next.ContentLength != 0 && !shape.Body { // a 307 or 308 sends the body again
			redirectRefusal = refuse(s, "the response redirects the body to %s %s, which takes none", next.Method, redact(next.URL.String(), secret))
			return redirectRefusal
		}
		s.authorize(next.Header, secret)
		return nil
	}}
	hresp, err := client.Do(hreq)
	if err != nil {
		switch {
		case redirectRefusal != nil:
			return nil, redirectRefusal
		case errors.Is(context.Cause(ctx), errSourceTimeout):
			return nil, fmt.Errorf("%w: %s %s: no whole response within %v", workspace.ErrTimeout, req.Method, req.URL, timeout)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		}
		return nil, errors.New(redact(err.Error(), secret))
	}
	defer hresp.Body.Close()
	max := s.maxResponse()
	tooLarge := func() error {
		e := refuse(s, "the response is over the source's limit of %d bytes (maxResponseBytes)", max)
		e.kind = workspace.ErrFileTooLarge
		return e
	}
	if hresp.ContentLength > max {
		return nil, tooLarge()
	}
	body, err := io.ReadAll(io.LimitReader(hresp.Body, max+1))
	switch {
	case int64(len(body)) > max:
		return nil, tooLarge()
	case err != nil && errors.Is(context.Cause(ctx), errSourceTimeout):
		return nil, fmt.Errorf("%w: %s %s: no whole response within %v", workspace.ErrTimeout, req.Method, req.URL, timeout)
	case err != nil && ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		return nil, errors.New(redact(err.Error(), secret))
	}
	header := http.Header{}
	for name, vals := range hresp.Header {
		if name == "Set-Cookie" {
			continue
		}
		for _, v := range vals {
			header.Add(name, redact(v, secret))
		}
	}
	return &HTTPResponse{
		Source: s.Name, URL: redact(hresp.Request.URL.String(), secret), Proto: hresp.Proto,
		Status: hresp.StatusCode, StatusText: strings.TrimSpace(strings.TrimPrefix(hresp.Status, fmt.Sprint(hresp.StatusCode))),
		Header: header, Body: redactBytes(body, secret),
	}, nil
}

// secret reads a source's credential ("" when it has none).
func (g *Gateway) secret(s *httpSource) (string, error) {
	c := s.Credential
	if c == nil {
		return "", nil
	}
	v, err := c.Secret.Read(g.lookupEnv)
	if err != nil {
		return "", fmt.Errorf("the credential of source %s: %w", s.Name, err)
	}
	if !validHeaderValue(c.Prefix + v) {
		return "", fmt.Errorf("the credential of source %s: %w: its prefix and secret hold a character a header cannot", s.Name, workspace.ErrUnavailable)
	}
	return v, nil
}

func (s *httpSource) authorize(h http.Header, secret string) {
	if s.Credential != nil {
		h.Set(s.Credential.Header, s.Credential.Prefix+secret)
	}
}

// redact replaces the secret wherever it appears. Secrets under four bytes
// are not searched for: they would match too much to mean anything.
func redact(s, secret string) string {
	if len(secret) < 4 {
		return s
	}
	return strings.ReplaceAll(s, secret, "[redacted]")
}

func redactBytes(b []byte, secret string) []byte {
	if len(secret) < 4 {
		return b
	}
	return bytes.ReplaceAll(b, []byte(secret), []byte("[redacted]"))
}

// sourceOf returns the source whose URL holds u (the longest base path
// wins when several share a host), or nil.
func (g *Gateway) sourceOf(u *url.URL) *httpSource {
	var best *httpSource
	for _, s := range g.sources {
		if !sameOrigin(s.base, u) {
			continue
		}
		if _, ok := s.rest(u); ok && (best == nil || len(s.base.EscapedPath()) > len(best.base.EscapedPath())) {
			best = s
		}
	}
	return best
}

func (g *Gateway) urls() string {
	if len(g.sources) == 0 {
		return "none"
	}
	var us []string
	for _, s := range g.sources {
		us = append(us, s.URL)
	}
	return strings.Join(us, ", ")
}

func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

// rest is u's escaped path below the source's URL: "" or "/…".
func (s *httpSource) rest(u *url.URL) (string, bool) {
	base := strings.TrimSuffix(s.base.EscapedPath(), "/")
	p := u.EscapedPath()
	if p == base || p == base+"/" {
		return "", true
	}
	if r, ok := strings.CutPrefix(p, base+"/"); ok {
		return "/" + r, true
	}
	return "", false
}

func (s *httpSource) declared() []string {
	out := make([]string, len(s.Requests))
	for i, r := range s.Requests {
		out[i] = r.Method + " " + strings.TrimSuffix(s.URL, "/") + r.Path
	}
	return out
}

// match returns the shape u matches with method, or nil and why not.
func (s *httpSource) match(method string, u *url.URL) (*RequestShape, string) {
	if u.User != nil {
		return nil, "a URL with a user is refused"
	}
	rest, _ := s.rest(u)
	segs, why := splitPath(rest)
	if why != "" {
		return nil, why
	}
	var methods []string
	for i := range s.Requests {
		if matchSegments(s.shapes[i], segs) {
			if s.Requests[i].Method == method {
				shape := &s.Requests[i]
				q, err := url.ParseQuery(u.RawQuery)
				if err != nil {
					return nil, "the query cannot be read: " + err.Error()
				}
				for name := range q {
					if !slices.Contains(shape.Query, name) {
						return nil, fmt.Sprintf("query parameter %q is not one %s %s takes (%s)", name, shape.Method, shape.Path, cmp.Or(strings.Join(shape.Query, ", "), "none"))
					}
				}
				return shape, ""
			}
			methods = append(methods, s.Requests[i].Method)
		}
	}
	if len(methods) > 0 {
		return nil, fmt.Sprintf("method %s is not declared for this path (%s is)", method, strings.Join(methods, ", "))
	}
	return nil, "the path is not a declared request of the source"
}

// splitPath decodes a path's segments, refusing those a server could read
// as something else than the declaration matched: empty; dots alone ("."
// "..", and "..." or ". ." which some servers trim to them); a ';' (path
// parameters: Tomcat and Spring read "..;" as ".."); a '%' left after
// decoding (a double encoding such as %252e%252e, which a server decoding
// again reads as ".."); an encoded '/' or '\'; a control character. What
// is sent is then exactly the path that was matched.
func splitPath(rest string) ([]string, string) {
	if rest == "" || rest == "/" {
		return nil, ""
	}
	raw := strings.Split(rest[1:], "/")
	segs := make([]string, len(raw))
	for i, r := range raw {
		v, err := url.PathUnescape(r)
		switch {
		case err != nil:
			return nil, fmt.Sprintf("path segment %q is not well encoded", r)
		case strings.Trim(v, ". ") == "":
			return nil, fmt.Sprintf("path segment %q is refused (empty, . and .. segments could name another resource)", r)
		case strings.Contains(v, ";"):
			return nil, fmt.Sprintf("path segment %q is refused (a ';' starts path parameters, and some servers read \"..;\" as \"..\")", r)
		case strings.Contains(v, "%"):
			return nil, fmt.Sprintf("path segment %q is refused (it is encoded twice: a server decoding it again would read another path)", r)
		case strings.ContainsAny(v, "/\\") || !utf8Printable(v):
			return nil, fmt.Sprintf("path segment %q is refused (it encodes a separator or a control character)", r)
		}
		segs[i] = v
	}
	return segs, ""
}

func matchSegments(pat []segment, segs []string) bool {
	for i, p := range pat {
		if p.rest {
			return len(segs) > i
		}
		if i >= len(segs) || (p.wild == "" && p.lit != segs[i]) {
			return false
		}
	}
	return len(segs) == len(pat)
}
