package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// TLS is the proxy's side of HTTPS inspection: the certificates it
// presents to a session's programs — issued by an authority they trust,
// one of the session's own (package sessionca) — and what verifies the
// destinations' certificates on its own TLS connections to them. The
// proxy never holds the authority's key: it asks Certificate.
//
// The proxy inspects a destination's HTTPS only when a secret may go
// there (Secret.Allow), or the policy says InspectAll; every other CONNECT
// is a tunnel of the program's bytes, end to end, its TLS the program's
// own with the destination's own certificate. An inspected connection is
// two: the program's TLS, which the proxy terminates with a certificate
// for the CONNECT's host, and the proxy's, to that host, verified against
// RootCAs for that name, over which the proxy sends the program's
// requests (HTTP/1.1; ALPN offers nothing else) once it has put in their
// secrets. A request whose Host names another host than the CONNECT's is
// refused: a secret goes only where its connection was verified to go.
type TLS struct {
	// Certificate returns the certificate to present for host (a name or
	// an IP address, without a port).
	Certificate func(host string) (*tls.Certificate, error)
	// RootCAs verify destinations' certificates; nil is the host's roots.
	RootCAs *x509.CertPool
	// Trusted says the session's programs trust Certificate's issuer:
	// only then is a refused HTTPS destination's refusal given inside TLS
	// (refuseConnect), where a program that does not trust it would see a
	// certificate error instead.
	Trusted bool
}

// WithTLS lets the proxy terminate programs' TLS: to inspect (and put
// secrets into) the HTTPS of destinations secrets may go to, or all with
// Policy.InspectAll, and to give a refused HTTPS destination's refusal as
// its answer (see refuseConnect). Without it every CONNECT is a tunnel.
func WithTLS(t TLS) Option { return func(o *options) { o.tls = &t } }

// inspects reports whether the proxy terminates the TLS of a CONNECT to
// host:port.
func (p *Proxy) inspects(host string, port uint16) bool {
	if p.o.tls == nil || p.o.tls.Certificate == nil {
		return false
	}
	if p.policy.InspectAll {
		return true
	}
	for i := range p.o.secrets {
		if p.o.secrets[i].goesTo(host, port) {
			return true
		}
	}
	return false
}

// terminate is the proxy's TLS server on a program's connection, with a
// certificate for host.
func (p *Proxy) terminate(c net.Conn, host string) *tls.Conn {
	return tls.Server(c, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.o.tls.Certificate(host) },
		NextProtos:     []string{"http/1.1"},
		MinVersion:     tls.VersionTLS12,
	})
}

// dialTLS is dial, and the proxy's own TLS to the destination, verified
// for host; a handshake that fails is a 502 that says why.
func (p *Proxy) dialTLS(ctx context.Context, host string, port uint16, call string, client net.Conn) (*upstream, *answer) {
	up, ans := p.dial(ctx, host, port, http.MethodConnect, call, client)
	if ans != nil {
		return nil, ans
	}
	tc := tls.Client(up.conn, &tls.Config{
		ServerName: strings.Trim(host, "[]"),
		RootCAs:    p.o.tls.RootCAs,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
		// Resumed sessions skip the certificate's verification and
		// signature: a program that opens a connection per request (curl,
		// git) pays one full handshake to each destination, not one each.
		ClientSessionCache: p.sessions,
	})
	hctx, cancel := context.WithTimeout(ctx, p.o.dialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		why := "the proxy's TLS to it failed: " + err.Error()
		var unknown x509.UnknownAuthorityError
		if errors.As(err, &unknown) {
			why += " (the daemon trusts the host's certificate authorities and those of caCerts in its configuration; " +
				"a network that re-signs TLS needs its authority there)"
		}
		up.finish(OutcomeFailed, why)
		return nil, badGateway(host, port, why)
	}
	up.speakTLS(tc)
	return up, nil
}

// intercept serves a CONNECT whose HTTPS the proxy inspects: it connects
// to the destination with TLS of its own while it accepts the tunnel and
// terminates the program's TLS — the two handshakes overlap — and then
// relays the program's requests one by one. A destination the rules
// refuse, or any destination of a session that does not trust the
// proxy's certificates, is answered as a tunnel's is, before the tunnel;
// a destination allowed but not reached is answered inside the
// program's TLS (502), which the program then reads.
func (p *Proxy) intercept(ctx context.Context, conn net.Conn, br *bufio.Reader, host string, port uint16, call string) {
	type dialed struct {
		up  *upstream
		ans *answer
	}
	ready := make(chan dialed, 1)
	if !p.allows(host, port) || !p.o.tls.Trusted {
		up, ans := p.dialTLS(ctx, host, port, call, conn)
		if ans != nil {
			p.refuseConnect(ctx, conn, br, host, ans)
			return
		}
		ready <- dialed{up, nil}
	} else {
		go func() {
			up, ans := p.dialTLS(ctx, host, port, call, conn)
			ready <- dialed{up, ans}
		}()
	}
	var up *upstream
	taken := false
	defer func() {
		if !taken { // the dial may still run: its connection is finished too
			up = (<-ready).up
		}
		up.finish(OutcomeOK, "")
	}()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	tc := p.terminate(&bufferedConn{Conn: conn, r: br}, host)
	hctx, cancel := context.WithTimeout(ctx, p.o.dialTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	d := <-ready
	up, taken = d.up, true
	switch {
	case err != nil && up != nil:
		up.finish(OutcomeFailed, "the program's TLS handshake with the proxy failed (does it trust the session's certificate authority?): "+err.Error())
		return
	case err != nil:
		return
	case d.ans != nil:
		reply(tc, d.ans)
		tc.Close()
		return
	}
	defer tc.Close()
	head := &headLimit{r: tc}
	cbr := bufio.NewReaderSize(head, 32<<10)
	for {
		head.left = maxHead
		req, err := http.ReadRequest(cbr)
		head.left = -1
		if err != nil {
			if err != io.EOF && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) && !up.wasCut() {
				p.invalid(tc, host, port, "", call, unreadable(err))
			}
			return
		}
		if !sameHost(req.Host, host, port) {
			a := &answer{status: http.StatusMisdirectedRequest, reason: "Host " + req.Host + " on a connection to " + hostPort(host, port),
				body: fmt.Sprintf("sandboxd egress: this request names the host %q, but its connection was opened to %s:\n"+
					"a request goes only to the host its connection was opened (and verified) for; open one to %s for it.\n", req.Host, hostPort(host, port), req.Host)}
			p.refused(host, port, req.Method, call, a)
			reply(tc, a)
			return
		}
		var keep bool
		up, keep = p.relay(tc, req, host, port, call, up, func() (*upstream, *answer) {
			return p.dialTLS(ctx, host, port, call, conn)
		})
		if !keep {
			return
		}
		// An idle inspected connection holds its destination's open, as a
		// tunnel would; the caps bound how many.
		tc.SetReadDeadline(time.Time{})
	}
}

// sameHost reports whether a request's Host names host:port (the port
// may be left out for 443).
func sameHost(reqHost, host string, port uint16) bool {
	h, p, err := net.SplitHostPort(reqHost)
	if err != nil {
		h, p = reqHost, "443"
	}
	n, err := strconv.ParseUint(p, 10, 16)
	return err == nil && uint16(n) == port && canonicalHost(strings.Trim(h, "[]")) == canonicalHost(strings.Trim(host, "[]"))
}
