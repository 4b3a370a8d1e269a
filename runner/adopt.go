package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// record is what a session's workspace keeps of it for another replica of
// the daemon to adopt it (backend.Adopter): the settings it was created
// with and what the manager decided from them. The tool configuration and
// egress policy are derived again from the settings by the adopting
// replica, which must run the same configuration.
type record struct {
	Settings Settings `json:"settings"`
	// TenantEgress is the tenant's egress rules (CreateRequest.Egress);
	// null keeps the operator's.
	TenantEgress []string  `json:"tenantEgress"`
	Lifetime     Duration  `json:"lifetime,omitzero"`
	Idle         Duration  `json:"idle,omitzero"`
	Created      time.Time `json:"created"`
	Pooled       bool      `json:"pooled,omitempty"`
	// Placeholders are the session's secrets' placeholders, by name, which
	// its commands hold: the adopting replica's proxy takes the same.
	Placeholders map[string]string `json:"placeholders,omitempty"`
	// Detached are the IDs of the session's detached calls, newest last
	// (Detach records each before it answers): those a later run does not
	// have were interrupted (ErrInterrupted).
	Detached []string `json:"detached,omitempty"`
	// Skills are the catalogue's skills active in the session
	// (tools.Set.ActiveSkills): load_skill's are recorded before it
	// answers, and a later run activates them again.
	Skills []string `json:"skills,omitempty"`
}

// adoptTimeout bounds one adoption (Get of a session another replica
// opened).
const adoptTimeout = time.Minute

// publish keeps the session's record with its workspace when the backend
// shares workspaces between replicas (Instance.Publish).
func (m *Manager) publish(ctx context.Context, s *Session, tenantEgress []string) error {
	if s.inst.Publish == nil {
		return nil
	}
	s.publishing.Lock() // one record at a time, the newest last
	defer s.publishing.Unlock()
	rec, err := s.record(tenantEgress)
	if err != nil {
		return err
	}
	if err := s.inst.Publish(ctx, rec); err != nil {
		return fmt.Errorf("runner: keeping the session's record with its workspace: %w", err)
	}
	return nil
}

// record is what another run of the daemon needs to take s back
// (revive), the tenant's egress rules it was made with among it.
func (s *Session) record(tenantEgress []string) (backend.Record, error) {
	r := record{TenantEgress: tenantEgress, Lifetime: Duration(s.lifetime), Idle: Duration(s.idle), Created: s.created, Pooled: s.pooled}
	s.mu.Lock()
	r.Settings = s.settings
	r.Detached = s.detachedIDs()
	s.mu.Unlock()
	if s.set != nil {
		r.Skills = s.set.ActiveSkills()
	}
	if s.eg != nil && len(s.eg.secrets) > 0 {
		r.Placeholders = map[string]string{}
		for _, sec := range s.eg.secrets {
			r.Placeholders[sec.Name] = sec.placeholder
		}
	}
	data, err := json.Marshal(r)
	if err != nil {
		return backend.Record{}, err
	}
	return backend.Record{Session: s.id, Tenant: s.tenant, Data: data, Created: s.created, Lifetime: s.lifetime, Idle: s.idle}, nil
}

// adopt takes over the tenant's session id from another replica of the
// daemon (backend.Adopter), or fails with notFound when the backend has no
// such session of this tenant. Adoptions run one at a time, so that two
// requests for one session take it over once.
func (m *Manager) adopt(ad backend.Adopter, tenant, id string, notFound error) (*Session, error) {
	m.adopting.Lock()
	defer m.adopting.Unlock()
	m.mu.Lock()
	if s := m.sessions[id]; s != nil && s.tenant == tenant { // adopted while this one waited
		m.mu.Unlock()
		return s, nil
	}
	closing := m.closing
	m.mu.Unlock()
	if closing {
		return nil, notFound
	}
	ctx, cancel := context.WithTimeout(context.Background(), adoptTimeout)
	defer cancel()
	want := m.selector()
	want[policy.LabelTenant] = tenant
	inst, rec, err := ad.Adopt(ctx, id, want)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return nil, notFound
	case err != nil:
		return nil, fmt.Errorf("runner: taking the session over from another replica: %w", err)
	}
	if rec.Tenant != tenant || rec.Session != id {
		inst.Close(ctx)
		return nil, fmt.Errorf("runner: the record of session %s names another (%s of %s): %w", id, rec.Session, rec.Tenant, workspace.ErrUnavailable)
	}
	s, err := m.revive(ctx, inst, rec, revival{from: "the replica that held it before"})
	if err != nil {
		return nil, err
	}
	m.o.logger.Info("session taken over from another replica", "tenant", tenant, "session", id, "workspace", inst.ID)
	return s, nil
}

// revive makes the session of a workspace another run of the daemon
// opened, from the record it published (adopted from a replica, resumed
// after a restart): its settings, tenant, creation time and expiry, judged
// again under this run's configuration, which must allow them; and what
// it kept beside its record (kept.go) — its journal, its first tree, its
// skills — or, where that is missing or damaged, Info.Lost says so
// (rv.from names the run that held it before). On failure inst is
// closed.
func (m *Manager) revive(ctx context.Context, inst *backend.Instance, rec backend.Record, rv revival) (*Session, error) {
	tenant, id := rec.Tenant, rec.Session
	var r record
	if err := json.Unmarshal(rec.Data, &r); err != nil {
		inst.Close(ctx)
		return nil, fmt.Errorf("runner: the record of session %s is unreadable (%v): %w", id, err, workspace.ErrUnavailable)
	}
	cfg, err := toolsConfig(m.o.tools, r.Settings, m.o.grants)
	if err == nil {
		err = toolsError(cfg.Check(tools.Caps{Bash: inst.Bash != nil, Scope: r.Settings.Scope}))
	}
	if err != nil {
		return nil, errors.Join(err, inst.Close(ctx))
	}
	out, err := egressPolicy(m.o.egress, r.TenantEgress, r.Settings.Egress)
	if err != nil {
		return nil, errors.Join(err, inst.Close(ctx))
	}
	secrets, err := m.sessionSecrets(tenant, r.Settings.Secrets, r.Placeholders)
	if err != nil {
		return nil, errors.Join(err, inst.Close(ctx))
	}
	secrets = keptTenantSecrets(secrets, r.Settings.SecretValues, r.Placeholders)
	if err := m.reserve(tenant, 0); err != nil {
		return nil, errors.Join(err, inst.Close(ctx))
	}
	var past *tools.PastBackground
	if len(rv.background) > 0 {
		past = &tools.PastBackground{Commands: rv.background, Cause: pausedCause(rv.pausedAt), At: rv.pausedAt}
	}
	s, err := m.newSession(id, tenant, r.Settings, cfg, inst, time.Duration(r.Lifetime), time.Duration(r.Idle), sessionOut{out, r.TenantEgress, secrets}, past)
	if err != nil {
		m.release(tenant)
		return nil, errors.Join(err, inst.Close(ctx))
	}
	s.created, s.pooled, s.tenantEgress = r.Created, r.Pooled, r.TenantEgress
	s.interrupted = r.Detached
	if !rv.pausedAt.IsZero() {
		s.interruptedBy = "the session was paused, at " + rv.pausedAt.UTC().Format(time.RFC3339)
	}
	var lost []string
	if why := m.keptJournal(ctx, s, rv.from); why != "" {
		lost = append(lost, why)
	}
	var why string
	if s.base, why = m.keptBaseline(s, rv.from); why != "" {
		lost = append(lost, "the diff since its start: "+why)
	}
	lost = append(lost, keptSkills(s, r.Skills)...)
	s.lost = lost
	if len(lost) > 0 {
		m.o.logger.Warn("the session did not get back all it had", "tenant", tenant, "session", id, "lost", lost)
	}
	if err := m.track(ctx, s); err != nil {
		return nil, err
	}
	return s, nil
}

// selector is the labels of what this daemon's runs make, whichever run
// made it: the manager's labels without the owner's.
func (m *Manager) selector() map[string]string {
	sel := maps.Clone(m.labels)
	for k := range backend.Self().Labels() {
		delete(sel, k)
	}
	return sel
}

// moved forgets s, which another replica took over (backend.ErrMoved): it
// ends here — its calls in flight fail, its local state (journal, diff
// baseline) is dropped — while its workspace lives on with that replica; a
// later request here takes it back.
func (m *Manager) moved(s *Session, cause error) {
	m.mu.Lock()
	if m.sessions[s.id] != s {
		m.mu.Unlock()
		return
	}
	delete(m.sessions, s.id)
	m.deleting.Add(1)
	m.mu.Unlock()
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.leave.Store(true) // what the workspace keeps (background commands) is the new holder's
	s.cancel(cause)
	m.o.logger.Info("session taken over by another replica", "tenant", s.tenant, "session", s.id, "workspace", s.inst.ID)
	go func() {
		defer m.deleting.Done()
		ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
		defer cancel()
		s.close(ctx, cause, false)
	}()
}
