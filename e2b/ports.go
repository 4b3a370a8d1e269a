package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/workspace"
)

// EnvdPort is the port E2B's SDK reaches envd on (PORT-ID.DOMAIN) when
// E2B_SANDBOX_URL is not set: Ports serves it as envd, the sandbox named
// by the host.
const EnvdPort = 49983

// TrafficTokenHeader carries a sandbox's traffic access token, which a
// sandbox created with network.allowPublicTraffic false requires on every
// request to its ports.
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// WithPorts lets the tenants for which allowed is true reach their
// sandboxes' ports through Ports (default: no tenant). It is asked on
// every request, so a tenant the operator stops allowing is refused from
// then on.
func WithPorts(allowed func(tenant string) bool) Option {
	return func(o *options) { o.ports = allowed }
}

// DefaultPortConnections is how many requests to its sandboxes' ports
// (each upgraded connection one, for as long as it is open) a tenant may
// have open at once, unless WithPortConnections says otherwise.
const DefaultPortConnections = 256

// WithPortConnections caps the requests to its sandboxes' ports that one
// tenant has open at once, an upgraded connection (WebSocket) counting as
// one until it closes (default DefaultPortConnections; 0 or less is no
// cap). A request past it is refused at once with 429 in E2B's shape,
// with Retry-After: each open request holds a connection through the
// sandbox's agent and the daemon's buffers, so one tenant's clients cannot
// take them all from the others'.
func WithPortConnections(n int) Option {
	return func(o *options) { o.portConns = n }
}

// Ports serves E2B's sandbox hosts: a request whose host is
// PORT-SANDBOXID.DOMAIN (the domain of WithDomain, its port aside), as
// E2B's SDK builds it (Sandbox.get_host), is carried to PORT on the
// sandbox's loopback, through its agent (runner.Session.Dial): the
// sandbox's container keeps no network of its own. Upgrades (WebSocket)
// pass through. Port EnvdPort is the sandbox's envd API.
//
// A port is refused (403) unless WithPorts allows the sandbox's tenant,
// and, for a sandbox created with network.allowPublicTraffic false,
// unless the request carries its traffic access token
// (TrafficTokenHeader). A sandbox that is not running, and a port nothing
// listens on, are 502 in E2B's shape. Each connection to a sandbox's port
// is logged when it ends ("e2b port": tenant, sandbox, port, client,
// bytes each way, duration), and each refusal.
func (s *Server) Ports() http.Handler { return http.HandlerFunc(s.servePort) }

// portOf parses a sandbox host: PORT-ID.DOMAIN, any port of the host
// aside.
func (s *Server) portOf(host string) (port int, id string, ok bool) {
	domain := hostOnly(s.o.domain)
	label, found := strings.CutSuffix(strings.ToLower(hostOnly(host)), "."+strings.ToLower(domain))
	if domain == "" || !found {
		return 0, "", false
	}
	p, id, found := strings.Cut(label, "-")
	port, err := strconv.Atoi(p)
	if !found || err != nil || port < 1 || port > 65535 || id == "" || strings.Contains(id, ".") {
		return 0, "", false
	}
	return port, id, true
}

// hostOnly is host without its port.
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return host
}

// portError is E2B's proxy's error body.
type portError struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId,omitempty"`
	Port      int    `json:"port,omitempty"`
}

func (s *Server) servePort(w http.ResponseWriter, r *http.Request) {
	port, id, ok := s.portOf(r.Host)
	if !ok {
		writeJSON(w, http.StatusBadRequest, portError{Code: http.StatusBadRequest,
			Message: fmt.Sprintf("host %q is no sandbox's: want PORT-SANDBOXID.%s, as Sandbox.get_host(port) gives it", r.Host, hostOnly(s.o.domain))})
		return
	}
	box, err := s.box(id)
	if err != nil {
		msg := "The sandbox was not found: it was killed, timed out or never existed"
		if errors.Is(err, runner.ErrPaused) {
			msg = err.Error()
		}
		writeJSON(w, http.StatusBadGateway, portError{Code: http.StatusBadGateway, SandboxID: id, Port: port, Message: msg})
		return
	}
	if port == EnvdPort {
		r.Header.Set(SandboxHeader, id)
		s.serveEnvd(w, r)
		return
	}
	refuse := func(why string) {
		s.o.logger.Info("e2b port refused", "tenant", box.tenant, "sandbox", id, "port", port, "client", r.RemoteAddr, "reason", why)
		writeJSON(w, http.StatusForbidden, portError{Code: http.StatusForbidden, SandboxID: id, Port: port, Message: why})
	}
	switch {
	case s.o.ports == nil || !s.o.ports(box.tenant):
		refuse(fmt.Sprintf("ports are not allowed for tenant %q: the operator allows them (e2b.ports.tenants)", box.tenant))
		return
	case box.traffic != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(TrafficTokenHeader)), []byte(box.traffic)) != 1:
		refuse("this sandbox's traffic is not public: its traffic access token (" + TrafficTokenHeader + ") is required")
		return
	}
	if !s.takePortConn(box.tenant) {
		s.o.logger.Info("e2b port refused", "tenant", box.tenant, "sandbox", id, "port", port, "client", r.RemoteAddr, "reason", "too many open")
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, portError{Code: http.StatusTooManyRequests, SandboxID: id, Port: port,
			Message: fmt.Sprintf("tenant %q has %d requests to its sandboxes' ports open, as many as it may (e2b.ports.maxConnections): retry once one has ended", box.tenant, s.o.portConns)})
		return
	}
	defer s.dropPortConn(box.tenant)
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), portKey{}, portTarget{box: box, port: port, client: r.RemoteAddr})))
}

// takePortConn counts one more open request to tenant's ports, unless it
// has as many as WithPortConnections allows.
func (s *Server) takePortConn(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.o.portConns > 0 && s.portConns[tenant] >= s.o.portConns {
		return false
	}
	s.portConns[tenant]++
	return true
}

// dropPortConn counts one request to tenant's ports fewer.
func (s *Server) dropPortConn(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.portConns[tenant]--; s.portConns[tenant] <= 0 {
		delete(s.portConns, tenant)
	}
}

type portKey struct{}

// portTarget is where a request to a port goes, and who sent it.
type portTarget struct {
	box    *sandbox
	port   int
	client string
}

// newPortProxy is the reverse proxy of Ports: its transport dials each
// connection through the sandbox's agent, pooled per sandbox and port
// (the outbound URL's host names them), so that a connection is only ever
// reused for the sandbox and port it was dialled to.
func (s *Server) newPortProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			pt, ok := ctx.Value(portKey{}).(portTarget)
			if !ok || addr != poolKey(pt)+":80" {
				return nil, fmt.Errorf("e2b: dial %s: not a sandbox's port", addr)
			}
			conn, err := pt.box.sess.Dial(ctx, pt.port)
			if err != nil {
				return nil, err
			}
			return &auditedConn{Conn: conn, pt: pt, start: time.Now(), log: s.o.logger}, nil
		},
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // a port's server answers when it does, as E2B's proxy waits
		DisableCompression:    true,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pt := pr.In.Context().Value(portKey{}).(portTarget)
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", poolKey(pt)
			pr.Out.Host = pr.In.Host // the server sees the host it was asked by, as behind E2B's proxy
			pr.Out.Header.Del(TrafficTokenHeader)
			pr.SetXForwarded()
		},
		Transport: tr,
		ErrorLog:  slog.NewLogLogger(s.o.logger.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			pt := r.Context().Value(portKey{}).(portTarget)
			body := portError{Code: http.StatusBadGateway, SandboxID: pt.box.sess.ID(), Port: pt.port}
			switch {
			case errors.Is(err, context.Canceled):
				return // the client went away
			case errors.Is(err, workspace.ErrNotFound):
				body.Message = fmt.Sprintf("The sandbox is running but port is not open: nothing listens on port %d in the sandbox (a server there must listen on 127.0.0.1 or 0.0.0.0)", pt.port)
			case errors.Is(err, runner.ErrClosed):
				body.Message = "The sandbox was not found: it ended"
			default:
				body.Message = fmt.Sprintf("port %d: %v", pt.port, err)
			}
			s.o.logger.Info("e2b port refused", "tenant", pt.box.tenant, "sandbox", body.SandboxID, "port", pt.port, "client", pt.client, "reason", body.Message)
			writeJSON(w, http.StatusBadGateway, body)
		},
	}
}

// poolKey names a sandbox's port as the transport's host, in the
// sandbox's run: a connection dialled before a pause is never reused after
// its resume.
func poolKey(pt portTarget) string {
	return strconv.Itoa(pt.port) + "-" + pt.box.id + "-r" + strconv.FormatInt(pt.box.run, 10)
}

// auditedConn is a connection to a sandbox's port, logged when it ends.
type auditedConn struct {
	net.Conn
	pt        portTarget
	start     time.Time
	log       *slog.Logger
	in, out   atomic.Int64 // bytes to the sandbox, from it
	closeOnce atomic.Bool
}

func (c *auditedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.out.Add(int64(n))
	return n, err
}

func (c *auditedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.in.Add(int64(n))
	return n, err
}

func (c *auditedConn) Close() error {
	err := c.Conn.Close()
	if c.closeOnce.CompareAndSwap(false, true) {
		c.log.Info("e2b port", "tenant", c.pt.box.tenant, "sandbox", c.pt.box.sess.ID(), "port", c.pt.port, "client", c.pt.client,
			"bytesIn", c.in.Load(), "bytesOut", c.out.Load(), "duration", time.Since(c.start).Round(time.Millisecond))
	}
	return err
}

// CloseWrite ends what the sandbox's server reads, where the connection
// can (an upgraded connection's half-close).
func (c *auditedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
