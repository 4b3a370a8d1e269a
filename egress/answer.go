package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// answer is a response of the proxy's own: a refusal (403), a request it
// cannot read (400), a destination not reached (502).
//
// A refusal is written for a model as much as for a person: its status
// line's text says the sandbox's policy blocked the request (Go's HTTP
// client, pip and npm print that text and nothing else), and its body says
// which host, which setting would allow it, and that no other way out
// exists (curl and git print the body; see refuseConnect for HTTPS).
type answer struct {
	status int
	// phrase is the status line's text; "" is the status's usual one.
	phrase string
	// reason is the short why of the audit record.
	reason string
	body   string
}

func (a *answer) Error() string { return a.body }

// Texts of the refusals, one place for each.
const (
	// blockedPhrase is how every policy refusal's status line begins.
	blockedPhrase = "Forbidden by the sandbox's egress policy"
	// noOtherWay ends every policy refusal's body.
	noOtherWay = "Retrying another way will not work: this sandbox has no network of its own (no DNS, no direct connections),\n" +
		"so --noproxy, another proxy, raw sockets or another program fail too; every connection passes this policy.\n"
)

func hostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// notAllowed refuses a destination no rule allows.
func notAllowed(host string, port uint16) *answer {
	hp := hostPort(host, port)
	return &answer{status: http.StatusForbidden, reason: "no rule allows it",
		phrase: blockedPhrase + ": " + hp + " is not allowed (egress.allow); no other way out exists",
		body: fmt.Sprintf("sandboxd egress: %s refused: this sandbox's egress policy blocks it (no rule allows it).\n"+
			"Only the sandbox's operator can allow it: add %q (or a preset: %s) to egress.allow in the daemon's configuration\n"+
			"(sandboxd mcp: --egress %s). A session's egress setting chooses only among what the operator allows.\n%s",
			hp, hp, strings.Join(PresetNames(), ", "), hp, noOtherWay)}
}

// privateAddress refuses a name that resolves to private addresses only.
func privateAddress(host string, port uint16, addrs []string) *answer {
	return &answer{status: http.StatusForbidden, reason: "private address " + strings.Join(addrs, ", "),
		phrase: blockedPhrase + ": " + hostPort(host, port) + " resolves to a private address (egress.allowPrivate)",
		body: fmt.Sprintf("sandboxd egress: %s refused: it resolves to %s: not a public address\n"+
			"(private, loopback, link-local, reserved, or an IPv6 form of such an IPv4 address),\n"+
			"which is reached only when the operator lists it in egress.allowPrivate in the daemon's configuration.\n%s",
			hostPort(host, port), strings.Join(addrs, ", "), noOtherWay)}
}

// byteCapSpent refuses a connection of a session past its byte cap.
func byteCapSpent(host string, port uint16, max int64) *answer {
	return &answer{status: http.StatusForbidden, reason: "the session's byte cap is spent",
		phrase: blockedPhrase + ": this session's egress byte cap is spent (egress.maxBytes)",
		body: fmt.Sprintf("sandboxd egress: %s refused: this session has moved its %d bytes (egress.maxBytes in the daemon's configuration).\n",
			hostPort(host, port), max)}
}

// badGateway is an allowed destination not reached.
func badGateway(host string, port uint16, why string) *answer {
	return &answer{status: http.StatusBadGateway, reason: why, body: fmt.Sprintf("sandboxd egress: %s: %s\n", hostPort(host, port), why)}
}

// badRequest is a request the proxy cannot serve as written.
func badRequest(why string) *answer {
	return &answer{status: http.StatusBadRequest, reason: why, body: "sandboxd egress: " + why}
}

// reply writes a complete answer of the proxy's own, and the end of the
// connection.
func reply(w io.Writer, a *answer) {
	body := a.body
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	phrase := a.phrase
	if phrase == "" {
		phrase = http.StatusText(a.status)
	}
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Sandboxd-Egress: %s\r\n\r\n%s",
		a.status, phrase, len(body), strings.ToLower(strings.ReplaceAll(http.StatusText(a.status), " ", "-")), body)
}

// refusalWait bounds how long refuseConnect waits for a program's first
// bytes, and then for its request.
const refusalWait = 10 * time.Second

// refuseConnect answers a CONNECT the proxy refuses. When the session
// trusts the proxy's certificates (WithTLS, TLS.Trusted), a refusal (403) is given as
// the destination's own answer: the tunnel is accepted, the program's TLS
// is terminated with a certificate for host, and its first request is
// answered with the refusal — so that curl prints the body and git shows
// it ("remote: …"), where a refused CONNECT makes them print only
// "CONNECT tunnel failed, response 403". A program that does not open TLS
// gets the refusal as plain text. Nothing is dialled either way. Without
// the proxy's TLS, or for any other answer, the CONNECT itself is answered.
func (p *Proxy) refuseConnect(ctx context.Context, conn net.Conn, br *bufio.Reader, host string, a *answer) {
	if a.status != http.StatusForbidden || p.o.tls == nil || p.o.tls.Certificate == nil || !p.o.tls.Trusted {
		reply(conn, a)
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	conn.SetDeadline(time.Now().Add(refusalWait))
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	if first[0] != 0x16 { // not a TLS handshake record
		reply(conn, a)
		return
	}
	tc := p.terminate(&bufferedConn{Conn: conn, r: br}, host)
	if err := tc.HandshakeContext(ctx); err != nil {
		return
	}
	head := &headLimit{r: tc, left: maxHead}
	if _, err := http.ReadRequest(bufio.NewReader(head)); err != nil {
		return
	}
	reply(tc, a)
	tc.Close()
}

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
