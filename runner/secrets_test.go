package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// tenantValue is a tenant's own secret, which it gives with its session.
const tenantValue = "npm_TenantOwnValue0123456789"

// TestTenantSecrets: a tenant brings secrets of its own within what the
// operator allows it — as many as its MaxSecrets, each going only where
// the session may reach — and its session holds a placeholder, its proxy
// the value; the value is in no record and nothing the API shows, so a
// session adopted from its record has the placeholder and a clear refusal
// in place of the value.
func TestTenantSecrets(t *testing.T) {
	m := newManager(t, memory.Backend{}, runner.WithSnapshots(snapshotStore(t)), runner.WithEgress(egress.Policy{Allow: []string{"registry.npmjs.org:443", "api.github.com:443"}}))
	own := func(name, value string, allow ...string) runner.TenantSecret {
		return runner.TenantSecret{Name: name, Value: value, Allow: allow}
	}
	create := func(max int, st runner.Settings) (*runner.Session, error) {
		return m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: st, MaxSecrets: max})
	}

	refused := []struct {
		name    string
		max     int
		secrets []runner.TenantSecret
		egress  []string
		want    string
	}{
		{"none allowed", 0, []runner.TenantSecret{own("NPM_TOKEN", tenantValue, "registry.npmjs.org:443")}, nil, "maxSecrets"},
		{"over the allowance", 1, []runner.TenantSecret{own("A", "a", "registry.npmjs.org:443"), own("B", "b", "registry.npmjs.org:443")}, nil, "1 secrets of their own"},
		{"a destination the operator does not allow", 1, []runner.TenantSecret{own("NPM_TOKEN", tenantValue, "evil.example:443")}, nil, "evil.example"},
		{"a destination the session narrowed away", 1, []runner.TenantSecret{own("NPM_TOKEN", tenantValue, "registry.npmjs.org:443")}, []string{"api.github.com:443"}, "registry.npmjs.org"},
		{"no destination", 1, []runner.TenantSecret{own("NPM_TOKEN", tenantValue)}, nil, "allow names no destination"},
		{"a variable sandboxd sets", 1, []runner.TenantSecret{own("HTTPS_PROXY", tenantValue, "registry.npmjs.org:443")}, nil, "HTTPS_PROXY"},
		{"no value", 1, []runner.TenantSecret{own("NPM_TOKEN", "", "registry.npmjs.org:443")}, nil, "its value must be"},
		{"a value no header can hold", 1, []runner.TenantSecret{own("NPM_TOKEN", "a\r\nX-Injected: 1", "registry.npmjs.org:443")}, nil, "control character"},
		{"twice", 2, []runner.TenantSecret{own("NPM_TOKEN", "a", "registry.npmjs.org:443"), own("NPM_TOKEN", "b", "registry.npmjs.org:443")}, nil, "the session's already"},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			st := runner.Settings{SecretValues: c.secrets, Egress: c.egress}
			s, err := create(c.max, st)
			if err == nil {
				m.Delete(context.Background(), "acme", s.ID())
				t.Fatal("accepted")
			}
			var denied *policy.DeniedError
			var setting *runner.SettingError
			if !errors.As(err, &denied) && !errors.As(err, &setting) || !strings.Contains(err.Error(), "secretValues") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v; want a refusal of secretValues naming %q", err, c.want)
			}
			if strings.Contains(err.Error(), tenantValue) {
				t.Errorf("the refusal holds the value: %v", err)
			}
		})
	}

	s, err := create(1, runner.Settings{Grants: []string{tools.GrantShellExec}, Always: []string{"shell"},
		SecretValues: []runner.TenantSecret{own("NPM_TOKEN", tenantValue, "registry.npmjs.org:443")}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Call(context.Background(), "bash", json.RawMessage(`{"command":"echo \"$NPM_TOKEN\""}`), tools.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	placeholder := strings.TrimSpace(res.Structured.(*tools.BashResult).Output)
	if !strings.HasPrefix(placeholder, "sbxph_") {
		t.Fatalf("the session's NPM_TOKEN is %q; want its placeholder", placeholder)
	}
	info, _ := json.Marshal(s.Info())
	record, adopted, err := runner.Adopted(s)
	if err != nil {
		t.Fatal(err)
	}
	for what, data := range map[string][]byte{"the session's info": info, "its record": record} {
		if strings.Contains(string(data), tenantValue) {
			t.Errorf("%s holds the value: %s", what, data)
		}
	}
	if !strings.Contains(string(record), `"NPM_TOKEN"`) {
		t.Errorf("the record does not name the tenant's secret: %s", record)
	}
	if len(adopted) != 1 {
		t.Fatalf("an adopting replica's secrets: %+v", adopted)
	}
	if v, err := adopted[0].Value(); v != "" || !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "start a new session") {
		t.Errorf("an adopted session's value: %q %v; want none, and why", v, err)
	}
	if got := (runner.TenantSecret{Name: "NPM_TOKEN", Value: tenantValue}).String(); strings.Contains(got, tenantValue) {
		t.Errorf("String: %s", got)
	}

	// A fork is the session's copy: it has the tenant's secrets too, with
	// their values (which the fork's settings, merged through JSON with
	// the request's, would lose), under placeholders of its own.
	forks, err := m.Fork(context.Background(), "acme", s.ID(), runner.ForkRequest{Count: 2, MaxSecrets: 1, Settings: json.RawMessage(`{"lifetime":"10m"}`)})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	res, err = forks[0].Call(context.Background(), "bash", json.RawMessage(`{"command":"echo \"$NPM_TOKEN\""}`), tools.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(res.Structured.(*tools.BashResult).Output); !strings.HasPrefix(got, "sbxph_") || got == placeholder {
		t.Errorf("the fork's NPM_TOKEN is %q; want a placeholder of its own", got)
	}
}
