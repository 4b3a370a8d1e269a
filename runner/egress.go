package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/policy"
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

// serveEgress starts the session's egress proxy, when its policy allows
// any destination and its workspace has no network of its own; it ends
// with the session, and its connections with it. It returns once the
// workspace listens on the proxy's address (Instance.Listen), so that the
// session's first command finds the proxy there.
func (m *Manager) serveEgress(ctx context.Context, s *Session, p egress.Policy) {
	if !p.On() || s.inst.Accept == nil {
		return
	}
	opts := append([]egress.Option{egress.WithSession(s.id, s.tenant), egress.WithAudit(m.auditEgress)}, m.o.egressOpts...)
	px, err := egress.New(p, opts...)
	if err != nil { // validated when the manager was made
		m.o.logger.Error("egress proxy not started", "session", s.id, "err", err)
		return
	}
	if s.inst.Listen != nil {
		if err := s.inst.Listen(ctx, egress.ListenAddr); err != nil {
			m.o.logger.Warn("egress: the workspace does not listen on the proxy's address yet; the first Accept will", "session", s.id, "err", err)
		}
	}
	go func() {
		err := px.Serve(s.ctx, func(ctx context.Context) (net.Conn, error) { return s.inst.Accept(ctx, egress.ListenAddr) })
		if s.ctx.Err() == nil {
			m.o.logger.Warn("egress proxy stopped", "tenant", s.tenant, "session", s.id, "err", err)
		}
	}()
}

// egressVars adds the proxy's variables to a session's, when it serves
// egress.
func egressVars(vars map[string]string, p egress.Policy, inst *backend.Instance) map[string]string {
	if !p.On() || inst.Accept == nil {
		return vars
	}
	out := egress.Env(egress.ListenAddr)
	maps.Copy(out, vars)
	return out
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
