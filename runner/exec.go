package runner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// Exec runs cmd in the session's workspace as one call named op (Do: it
// holds a slot of the session's calls in flight while it runs, and is
// audited and cancelled as every call is): the command a translation of
// another sandbox API (package e2b) runs where the bash tool would. Its
// environment is the session's, as the bash tool's commands get it — the
// egress proxy's variables, the session's variables and secrets'
// placeholders — with cmd.Env over it. It needs the shell.exec grant
// (ErrForbidden without it) and a workspace that runs commands.
func (s *Session) Exec(ctx context.Context, op string, cmd workspace.Command) (workspace.Result, error) {
	return s.exec(ctx, op, cmd, func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		return s.inst.Bash.Run(ctx, cmd) // a method value of a nil Bash would panic here
	})
}

// exec is Exec, cmd run by run.
func (s *Session) exec(ctx context.Context, op string, cmd workspace.Command, run func(context.Context, workspace.Command) (workspace.Result, error)) (workspace.Result, error) {
	if s.inst.Bash == nil {
		return workspace.Result{}, &workspace.Error{Kind: workspace.ErrForbidden, Msg: "this session's workspace runs no commands"}
	}
	if !slices.Contains(s.set.Config().Grants, tools.GrantShellExec) {
		return workspace.Result{}, &workspace.Error{Kind: workspace.ErrForbidden, Msg: "running commands needs the shell.exec grant"}
	}
	env := map[string]string{}
	var secrets []sessionSecret
	if s.eg != nil {
		tr := s.eg.TraceEgress(randomID("call-"))
		defer tr.Close()
		maps.Copy(env, tr.Env())
		secrets = s.eg.secrets
	}
	maps.Copy(env, s.set.Config().BashEnv)
	maps.Copy(env, sessionVars(s.settingsNow().Vars, secrets))
	maps.Copy(env, cmd.Env)
	cmd.Env = env
	var res workspace.Result
	err := s.Do(ctx, op, func(ctx context.Context) (bool, error) {
		var err error
		res, err = run(ctx, cmd)
		return false, err
	})
	return res, err
}

// ExpiresAt is when the session's lifetime ends (zero: it has none).
func (s *Session) ExpiresAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lifetime <= 0 {
		return time.Time{}
	}
	return s.created.Add(s.lifetime)
}

// LatestExpiry is the latest end SetExpiry accepts: the session's
// creation plus the operator's maximum lifetime; zero when there is no
// maximum.
func (s *Session) LatestExpiry() time.Time {
	if max := s.m.o.maxLifetime; max > 0 {
		return s.created.Add(time.Duration(max))
	}
	return time.Time{}
}

// CanPause reports whether the session's backend can pause it
// (Manager.Pause); where it cannot, Pause fails with ErrNoPause.
func (s *Session) CanPause() bool { return s.inst.Pause != nil }

// SetExpiry ends the session at t instead: its lifetime becomes t less its
// creation time, within the operator's maximum lifetime (a SettingError
// over it). A t already past ends it at the next sweep.
func (s *Session) SetExpiry(t time.Time) error {
	d := max(t.Sub(s.created), time.Nanosecond)
	if max := s.m.o.maxLifetime; max > 0 && Duration(d) > max {
		return &SettingError{"lifetime", fmt.Sprintf("%v from its creation is over the operator's maximum of %v", d.Round(time.Second), time.Duration(max))}
	}
	s.mu.Lock()
	s.lifetime = d
	s.mu.Unlock()
	return nil
}
