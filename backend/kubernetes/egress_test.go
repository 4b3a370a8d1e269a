package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// names resolves from a table: no real DNS is asked.
type names map[string]string

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestEgress: a session in a pod reaches what its egress policy allows —
// a loopback server of the test's, listed by the policy — through the
// daemon's proxy, the agent carrying the connection on its stream, and
// gets the proxy's 403 for a host no rule allows. The pod itself has no
// way out (its NetworkPolicy denies all egress).
func TestEgress(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the daemon's side")
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	m := manager(t, runner.WithEgress(egress.Policy{Allow: []string{"allowed.test:" + u.Port()}, AllowPrivate: []string{"127.0.0.1"}},
		egress.WithResolver(names{"allowed.test": "127.0.0.1", "other.test": "127.0.0.1"})))
	ctx := context.Background()
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "test-tenant", Settings: runner.Settings{Grants: []string{tools.GrantShellExec}, Always: []string{"shell"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Delete(ctx, "test-tenant", s.ID())
	get := func(host string) string {
		t.Helper()
		// bash's /dev/tcp: the minimal image has no curl.
		script := fmt.Sprintf(`echo "proxy=$HTTP_PROXY"
exec 3<>/dev/tcp/127.0.0.1/3128 || exit 1
printf 'GET http://%[1]s:%[2]s/ HTTP/1.0\r\nHost: %[1]s:%[2]s\r\n\r\n' >&3
cat <&3`, host, u.Port())
		args, _ := json.Marshal(map[string]any{"command": script, "timeout": 120})
		res, err := s.Call(ctx, "bash", args, tools.CallOptions{})
		br, _ := res.Structured.(*tools.BashResult)
		if err != nil || br == nil {
			t.Fatalf("bash: %v %+v", err, res)
		}
		return br.Output
	}
	if out := get("allowed.test"); !strings.Contains(out, ":egress@127.0.0.1:3128") || !strings.Contains(out, "200 OK") || !strings.Contains(out, "hello from the daemon's side") {
		t.Errorf("an allowed host through the proxy: %q", out)
	}
	if out := get("other.test"); !strings.Contains(out, "403") || !strings.Contains(out, "egress.allow") {
		t.Errorf("a host no rule allows: %q; want the 403 naming egress.allow", out)
	}
	if st := m.Stats().Egress; st.Connections[egress.OutcomeOK] == 0 || st.Connections[egress.OutcomeRefused] == 0 {
		t.Errorf("egress stats: %+v", st)
	}
	// A program that resolves a name itself fails at once: the pod has no
	// DNS (the NetworkPolicy would drop cluster DNS's packets, and a
	// lookup would wait out the resolver's timeouts), and the result says
	// why.
	args, _ := json.Marshal(map[string]any{"command": `(exec 3<>/dev/tcp/example.com/80) 2>&1; echo "exit $?"`, "timeout": 60})
	res, err := s.Call(ctx, "bash", args, tools.CallOptions{})
	br, _ := res.Structured.(*tools.BashResult)
	if err != nil || br == nil || br.TimedOut || !strings.Contains(br.Output, "exit 1") || !strings.Contains(res.Text, "no DNS") {
		t.Errorf("a name resolved in the pod: %v %s", err, res.Text)
	}
}
