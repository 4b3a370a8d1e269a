package runner

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/sessionca"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// egressPolicy is the policy of a session: the operator's, narrowed by the
// tenant's rules and then the session's (nil: not narrowed).
func egressPolicy(op egress.Policy, tenant, session []string) (egress.Policy, error) {
	p, within := op, "the operator's egress.allow"
	for _, step := range []struct {
		rules   []string
		setting string
	}{{tenant, "the tenant's egress"}, {session, "egress"}} {
		if step.rules == nil {
			continue
		}
		narrowed, err := p.Narrow(step.rules)
		var ne *egress.NarrowError
		switch {
		case errors.As(err, &ne):
			return egress.Policy{}, &policy.DeniedError{Setting: step.setting, Value: ne.Rule,
				Limit: fmt.Sprintf("%s may name only what %s allows (%s)", step.setting, within, cmp.Or(strings.Join(ne.Allowed, ", "), "nothing"))}
		case err != nil:
			return egress.Policy{}, &SettingError{step.setting, err.Error()}
		}
		p, within = narrowed, within+", as the tenant's egress narrows it,"
	}
	return p, nil
}

// sessionEgress is a session's way out, where its workspace has no
// network of its own (Instance.Accept): its policy, which may change while
// it lives (Session.SetEgress); its proxy, from the moment the policy
// allows anything; the certificate authority the proxy inspects HTTPS
// with, made for the session and trusted in its workspace; its secrets'
// placeholders; and the traces of its calls' connections. It is the
// session's tools.EgressTracer.
type sessionEgress struct {
	m           *Manager
	s           *Session
	tenantRules []string // the tenant's narrowing of the operator's rules (nil: none)
	secrets     []sessionSecret

	mu     sync.Mutex
	policy egress.Policy
	px     *egress.Proxy
	ca     *sessionca.CA
	trust  map[string]string // the variables that trust ca; nil until installed
	calls  map[string]*callTrace
	closed bool
}

// trustDir is where a session's workspace keeps the certificates it trusts:
// the image's own authorities and the session's (and the operator's
// caCerts) in ca-certificates.crt, the added ones alone in extra-ca.crt.
const trustDir = "/tmp/.sandboxd"

// trustScript writes trustDir's files from the added certificates on its
// standard input and the first system bundle the image has.
const trustScript = `set -e
umask 022
d=` + trustDir + `
mkdir -p "$d"
cat > "$d/extra.tmp"
sys=
for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/ca-bundle.pem /etc/ssl/cert.pem; do
	if [ -f "$f" ]; then sys=$f; break; fi
done
{ if [ -n "$sys" ]; then cat "$sys"; echo; fi; cat "$d/extra.tmp"; } > "$d/all.tmp"
mv -f "$d/extra.tmp" "$d/extra-ca.crt"
mv -f "$d/all.tmp" "$d/ca-certificates.crt"
`

// trustVars are the variables that make the programs of a session's
// workspace trust trustDir's certificates: OpenSSL's and Go's
// (SSL_CERT_FILE: curl, Python's ssl, Ruby), curl's, git's, Python
// requests' and pip's bundles, and Node's (and so npm's) extra
// certificates.
func trustVars() map[string]string {
	all, extra := trustDir+"/ca-certificates.crt", trustDir+"/extra-ca.crt"
	return map[string]string{
		"SSL_CERT_FILE": all, "CURL_CA_BUNDLE": all, "GIT_SSL_CAINFO": all, "REQUESTS_CA_BUNDLE": all, "PIP_CERT": all,
		"NODE_EXTRA_CA_CERTS": extra,
	}
}

// newSessionEgress is the egress of s under p, when its workspace has no
// network of its own; nil where commands use the host's network.
func (m *Manager) newSessionEgress(s *Session, p egress.Policy, tenantRules []string, secrets []sessionSecret) *sessionEgress {
	if s.inst.Accept == nil {
		return nil
	}
	return &sessionEgress{m: m, s: s, policy: p, tenantRules: tenantRules, secrets: secrets, calls: map[string]*callTrace{}}
}

// start serves the session's egress when its policy allows any
// destination. It returns once the workspace listens on the proxy's
// address (Instance.Listen), so that the session's first command finds the
// proxy there; the proxy ends with the session, and its connections with
// it.
func (e *sessionEgress) start(ctx context.Context) error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.policy.On() || e.px != nil || e.closed {
		return nil
	}
	return e.serveLocked(ctx)
}

// serveLocked makes the session's certificate authority, has the
// workspace trust it, and starts the proxy; e.mu is held. A workspace
// that cannot be made to trust it (an image without a shell's mkdir, cat
// and mv) is warned of: its tunnels work, the HTTPS of its secrets'
// destinations fails there with a certificate error, which the call's
// egress decision explains.
func (e *sessionEgress) serveLocked(ctx context.Context) error {
	m, s := e.m, e.s
	ca, err := sessionca.New(s.id, cmp.Or(s.lifetime, 30*24*time.Hour))
	if err != nil {
		return fmt.Errorf("runner: the session's certificate authority: %w", err)
	}
	trusted := true
	if err := e.installTrust(ctx, ca); err != nil {
		trusted = false
		m.o.logger.Warn("egress: the workspace does not trust the session's certificate authority: HTTPS to its secrets' destinations will fail there, "+
			"and refusals of HTTPS destinations are the CONNECT's answer", "session", s.id, "err", err)
	}
	opts := []egress.Option{egress.WithSession(s.id, s.tenant), egress.WithAudit(e.ended), egress.WithOpened(e.opened),
		egress.WithTLS(egress.TLS{Certificate: ca.Certificate, RootCAs: m.roots, Trusted: trusted}), egress.WithSecrets(egressSecrets(e.secrets)...)}
	px, err := egress.New(e.policy, append(opts, m.o.egressOpts...)...)
	if err != nil {
		ca.Close()
		return fmt.Errorf("runner: the session's egress proxy: %w", err)
	}
	if s.inst.Listen != nil {
		if err := s.inst.Listen(ctx, egress.ListenAddr); err != nil {
			m.o.logger.Warn("egress: the workspace does not listen on the proxy's address yet; the first Accept will", "session", s.id, "err", err)
		}
	}
	e.px, e.ca = px, ca
	go func() {
		err := px.Serve(s.ctx, func(ctx context.Context) (net.Conn, error) { return s.inst.Accept(ctx, egress.ListenAddr) })
		if s.ctx.Err() == nil {
			m.o.logger.Warn("egress proxy stopped", "tenant", s.tenant, "session", s.id, "err", err)
		}
	}()
	return nil
}

// installTrust writes the session's authority, and the operator's, into
// the workspace's trustDir beside the image's own, and keeps the variables
// that make its programs trust them. Only certificates go there: the
// authority's key stays in the daemon.
func (e *sessionEgress) installTrust(ctx context.Context, ca *sessionca.CA) error {
	if e.s.inst.Bash == nil {
		return errors.New("the workspace runs no commands")
	}
	pem := append(slices.Clone(ca.CertPEM()), e.m.o.caPEM...)
	var out bytes.Buffer
	var mu sync.Mutex
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := e.s.inst.Bash.Run(tctx, workspace.Command{Script: trustScript, Stdin: bytes.NewReader(pem), Combined: true, Timeout: time.Minute,
		Output: func(_ workspace.Stream, p []byte) {
			mu.Lock()
			out.Write(p[:min(len(p), 4096-min(out.Len(), 4096))])
			mu.Unlock()
		}})
	switch {
	case err != nil:
		return err
	case res.ExitCode != 0 || res.Signal != "" || res.TimedOut:
		return fmt.Errorf("writing %s failed (exit %d): %s", trustDir, res.ExitCode, strings.TrimSpace(out.String()))
	}
	e.trust = trustVars()
	return nil
}

// close forgets the session's certificate authority once its proxy has
// ended with the session; nothing issues a certificate for it afterwards.
func (e *sessionEgress) close() {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	if e.ca != nil {
		e.ca.Close()
	}
}

// EgressPolicy is a session's egress as SetEgress left it.
type EgressPolicy struct {
	// Allow are the rules in force: the operator's, as the tenant's and
	// the session's narrow them, presets expanded.
	Allow []string `json:"allow"`
	// Asked are the session's own rules (Settings.Egress); null when it
	// keeps its tenant's.
	Asked []string `json:"asked"`
	// Secrets name the session's secrets.
	Secrets []string `json:"secrets"`
}

// Egress describes the session's egress now.
func (s *Session) Egress() EgressPolicy {
	s.mu.Lock()
	asked := slices.Clone(s.settings.Egress)
	s.mu.Unlock()
	p := EgressPolicy{Asked: asked, Allow: []string{}, Secrets: []string{}}
	e := s.eg
	if e == nil {
		return p
	}
	e.mu.Lock()
	rules, _ := egress.ParseRules(e.policy.Allow)
	e.mu.Unlock()
	for _, r := range rules {
		p.Allow = append(p.Allow, r.String())
	}
	for _, sec := range e.secrets {
		p.Secrets = append(p.Secrets, sec.Name)
	}
	return p
}

// SetEgress replaces the session's egress rules while it lives: asked
// ("HOST:PORT" rules and presets) narrows the operator's as the tenant's
// narrow them, as Settings.Egress does at creation — so it may widen what
// the session had within that ceiling — and nil goes back to the tenant's.
// From the moment it returns, connections are judged by the new rules,
// and every open one they no longer allow is cut; a session whose egress
// was off gets its proxy now. The change is in the audit log. It fails
// with a *policy.DeniedError for a rule beyond the ceiling, a
// *SettingError for one that does not parse or a backend whose commands
// use the host's network, and ErrClosed once the session is ending.
func (s *Session) SetEgress(ctx context.Context, asked []string) (EgressPolicy, error) {
	e := s.eg
	if e == nil {
		return EgressPolicy{}, &SettingError{"egress", "this session's backend (" + s.m.backend.Name() + ") gives commands the host's network: egress applies to the docker and kubernetes backends"}
	}
	p, err := egressPolicy(s.m.o.egress, e.tenantRules, asked)
	if err != nil {
		return EgressPolicy{}, err
	}
	if err := s.begin(); err != nil {
		return EgressPolicy{}, err
	}
	defer s.end()
	e.mu.Lock()
	old := e.policy.Allow
	e.policy = p
	switch {
	case e.closed:
		err = fmt.Errorf("%w: %s", ErrClosed, s.id)
	case e.px != nil:
		err = e.px.SetAllow(p.Allow)
	case p.On():
		err = e.serveLocked(ctx)
	}
	e.mu.Unlock()
	if err != nil {
		return EgressPolicy{}, err
	}
	s.mu.Lock()
	s.settings.Egress = slices.Clone(asked)
	s.mu.Unlock()
	s.m.o.logger.Info("egress policy changed", "tenant", s.tenant, "session", s.id, "from", old, "to", p.Allow)
	if err := s.m.publish(ctx, s, e.tenantRules); err != nil {
		s.m.o.logger.Warn("egress: the session's record was not updated for other replicas", "session", s.id, "err", err)
	}
	return s.Egress(), nil
}

// opened and ended are the proxy's hooks: the audit log and the metrics
// hear of every record, the trace of the call it names of its own.
func (e *sessionEgress) opened(r egress.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.calls[r.Call]; t != nil {
		t.open[r.ID] = r
		if t.idle == nil {
			t.idle = make(chan struct{})
		}
	}
}

func (e *sessionEgress) ended(r egress.Record) {
	e.m.auditEgress(r)
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.calls[r.Call]
	if t == nil {
		return
	}
	delete(t.open, r.ID)
	if len(t.open) == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	if len(t.decided) < maxDecisions || slices.ContainsFunc(t.decided, func(d tools.EgressDecision) bool { return sameDecision(d, decision(r)) }) {
		t.decided = tools.MergeEgress(t.decided, decision(r))
	} else {
		t.dropped++
	}
}

// maxDecisions bounds the distinct decisions a call's trace keeps between
// two Takes; more are counted.
const maxDecisions = 64

// endGrace bounds how long a command's result waits for its connections
// to end once the command has (they end as its processes do, a moment
// later through the workspace's stream).
const endGrace = 5 * time.Second

// TraceEgress begins the trace of a call's commands (tools.EgressTracer).
func (e *sessionEgress) TraceEgress(call string) tools.EgressTrace {
	t := &callTrace{e: e, call: call, open: map[uint64]egress.Record{}}
	e.mu.Lock()
	e.calls[call] = t
	e.mu.Unlock()
	return t
}

// callTrace is the trace of one call's commands.
type callTrace struct {
	e    *sessionEgress
	call string
	// Under e.mu:
	open    map[uint64]egress.Record // opened, not ended
	idle    chan struct{}            // closed when open empties
	decided []tools.EgressDecision
	dropped int
}

func (t *callTrace) Env() map[string]string {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	if t.e.px == nil {
		return nil
	}
	env := egress.CallEnv(egress.ListenAddr, t.call)
	maps.Copy(env, t.e.trust)
	return env
}

func (t *callTrace) Take(ctx context.Context, ended bool) []tools.EgressDecision {
	t.e.mu.Lock()
	idle := t.idle
	t.e.mu.Unlock()
	if ended && idle != nil {
		timer := time.NewTimer(endGrace)
		select {
		case <-idle:
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	out := t.decided
	t.decided = nil
	for _, r := range t.open {
		d := decision(r)
		d.Outcome = "open"
		out = tools.MergeEgress(out, d)
	}
	if t.dropped > 0 {
		out = append(out, tools.EgressDecision{Host: "(others)", Outcome: "various", Connections: t.dropped,
			Reason: fmt.Sprintf("%d more decisions than the %d a result lists", t.dropped, maxDecisions)})
		t.dropped = 0
	}
	return out
}

func (t *callTrace) Off() string {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	if t.e.px == nil {
		return "This sandbox has no network: no DNS and no connections, and its egress policy allows no destination. " +
			"Only the sandbox's operator (egress.allow) or the session's owner can allow one; no program or option inside can."
	}
	return "This sandbox has no DNS and no network of its own: programs reach the hosts its egress policy allows only through the proxy " +
		"in HTTPS_PROXY and HTTP_PROXY, which resolves names itself. A program that ignores the proxy, or is told to bypass it " +
		"(--noproxy, NO_PROXY, a raw socket), cannot connect, whatever it tries."
}

func (t *callTrace) Close() {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	if t.e.calls[t.call] == t {
		delete(t.e.calls, t.call)
	}
}

// decision is a record as a tool result shows it.
func decision(r egress.Record) tools.EgressDecision {
	return tools.EgressDecision{Host: r.Host, Port: int(r.Port), Outcome: r.Outcome, Reason: r.Reason, Connections: 1,
		BytesUp: r.BytesUp, BytesDown: r.BytesDown, Inspected: r.Inspected, Secrets: r.Secrets}
}

func sameDecision(a, b tools.EgressDecision) bool {
	return a.Host == b.Host && a.Port == b.Port && a.Outcome == b.Outcome && a.Reason == b.Reason
}

// trustedRoots are the host's roots and the certificates of data (PEM),
// which holds nothing else.
func trustedRoots(data []byte) (*x509.CertPool, error) {
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return roots, nil
	}
	certs, err := sessionca.ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	for _, c := range certs {
		roots.AddCert(c)
	}
	return roots, nil
}

// auditEgress logs one egress record and counts it.
func (m *Manager) auditEgress(r egress.Record) {
	level := slog.LevelInfo
	if r.Outcome != egress.OutcomeOK {
		level = slog.LevelWarn
	}
	m.o.logger.LogAttrs(context.Background(), level, "egress", r.LogAttrs()...)
	m.egress.add(r)
}

// EgressStats counts the sessions' egress connections, for metrics.
type EgressStats struct {
	// Connections counts destination connections and refusals by outcome
	// (egress.OutcomeOK, …).
	Connections map[string]uint64
	// BytesUp and BytesDown count the bytes sent to destinations and
	// received from them.
	BytesUp, BytesDown uint64
}

type egressCounts struct {
	mu sync.Mutex
	st EgressStats
}

func (c *egressCounts) add(r egress.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st.Connections == nil {
		c.st.Connections = map[string]uint64{}
	}
	c.st.Connections[r.Outcome]++
	c.st.BytesUp += uint64(r.BytesUp)
	c.st.BytesDown += uint64(r.BytesDown)
}

func (c *egressCounts) stats() EgressStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	st.Connections = maps.Clone(c.st.Connections)
	return st
}
