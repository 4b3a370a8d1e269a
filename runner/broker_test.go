package runner_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/sessionca"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// brokerValue is the secret the daemon holds (in its environment) and the
// session never sees.
const brokerValue = "ghs_BrokerTestValue0123456789abcdefXYZ"

// tlsServer starts an HTTPS server on loopback whose certificates, for
// whatever name a client asks, the test's upstream authority issues.
func tlsServer(t *testing.T, ca *sessionca.CA, h http.Handler) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.Certificate(hi.ServerName)
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return srv, u.Port()
}

// gitServer is git's smart HTTP (git http-backend) over a bare repository
// of a temporary directory, behind Basic authorization with the secret.
func gitServer(t *testing.T) (http.Handler, string) {
	t.Helper()
	backend, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git, for git http-backend: %v", err)
	}
	root := t.TempDir()
	repo := filepath.Join(root, "repo.git")
	for _, args := range [][]string{{"init", "-q", "--bare", "-b", "main", repo}, {"-C", repo, "config", "http.receivepack", "true"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	h := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(backend)), "git-http-backend"),
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, pass, ok := r.BasicAuth(); !ok || user != "x-access-token" || pass != brokerValue {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}), repo
}

// TestDockerBroker: a session of the dev image holds a placeholder for a
// secret of the daemon's, and its programs use the secret over HTTPS the
// broker inspects with the session's own certificate authority — curl
// with a bearer header and with user:password@, git clone and push to a
// loopback git http-backend whose credential helper sandboxd sets up, and
// go mod download through a loopback module proxy that requires the token
// — while the placeholder sent to another allowed host is refused (403
// naming the secret), a destination without secrets stays a tunnel with
// its own certificate, narrowing the policy at runtime cuts an open
// connection, each result lists its call's egress, and the value is in no
// result, no daemon log line and no file of the workspace, nor the CA's
// key.
func TestDockerBroker(t *testing.T) {
	dev := dockertest.NamedImage(t, "dev")
	t.Setenv("SANDBOXD_TEST_BROKER_TOKEN", brokerValue)
	upstream, err := sessionca.New("test-upstream", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Close()

	api := http.NewServeMux()
	api.HandleFunc("/secure", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+brokerValue {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "authorized\n")
	})
	api.HandleFunc("/tenant", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+tenantValue {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "tenant authorized\n")
	})
	api.HandleFunc("/basic", func(w http.ResponseWriter, r *http.Request) {
		if _, pass, _ := r.BasicAuth(); pass != brokerValue {
			http.Error(w, "bad password", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "basic authorized\n")
	})
	_, apiPort := tlsServer(t, upstream, api)
	gitH, repo := gitServer(t)
	_, gitPort := tlsServer(t, upstream, gitH)
	modules := http.FileServerFS(goproxyTree(t))
	_, goPort := tlsServer(t, upstream, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pass, _ := r.BasicAuth(); pass != brokerValue {
			http.Error(w, "a token is required", http.StatusUnauthorized)
			return
		}
		modules.ServeHTTP(w, r)
	}))
	// tunnel.test streams until the client goes: an open connection to cut.
	var streaming sync.WaitGroup
	streamed := make(chan struct{}, 1)
	_, tunnelPort := tlsServer(t, upstream, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			io.WriteString(w, "tunnel end\n")
			return
		}
		streaming.Add(1)
		defer streaming.Done()
		select {
		case streamed <- struct{}{}:
		default:
		}
		for r.Context().Err() == nil {
			io.WriteString(w, "tick\n")
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	}))
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain\n") }))
	defer plain.Close()
	pu, _ := url.Parse(plain.URL)
	plainPort := pu.Port()

	logs := &lockedBuffer{}
	allow := []string{"api.test:" + apiPort, "git.test:" + gitPort, "goproxy.test:" + goPort, "tunnel.test:" + tunnelPort, "other.test:" + plainPort}
	m, _ := dockerManagerOn(t, &docker.Backend{},
		runner.WithPolicy(dockertest.Policy(policy.Policy{DefaultImage: dev})),
		runner.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		runner.WithEgress(egress.Policy{Allow: allow, AllowPrivate: []string{"127.0.0.1"}},
			egress.WithResolver(names{"api.test": "127.0.0.1", "git.test": "127.0.0.1", "goproxy.test": "127.0.0.1", "tunnel.test": "127.0.0.1", "other.test": "127.0.0.1"})),
		runner.WithSecrets(runner.Secret{Name: "API_TOKEN", Secret: sources.Secret{Env: "SANDBOXD_TEST_BROKER_TOKEN"},
			Allow: []string{"api.test:" + apiPort, "git.test:" + gitPort, "goproxy.test:" + goPort}, GitUsername: "x-access-token"}),
		runner.WithCACerts(upstream.CertPEM()))
	defer m.Shutdown(context.Background())
	ctx := context.Background()
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", MaxSecrets: 1, Settings: runner.Settings{Grants: []string{tools.GrantShellExec, tools.GrantFSWrite}, Always: []string{"shell"},
		SecretValues: []runner.TenantSecret{{Name: "TENANT_TOKEN", Value: tenantValue, Allow: []string{"api.test:" + apiPort}, Paths: []string{"/tenant"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ca := runner.SessionCA(s)
	if ca == nil {
		t.Fatal("the session has no certificate authority")
	}

	var results []string // every result's text and structure, to search for the value
	calls := 0
	call := func(t *testing.T, tool string, args map[string]any) tools.Result {
		t.Helper()
		calls++
		data, _ := json.Marshal(args)
		id := fmt.Sprintf("call-broker-%d", calls)
		res, err := s.Call(ctx, tool, data, tools.CallOptions{CallID: id, RunID: id})
		if err != nil {
			t.Fatal(err)
		}
		structured, _ := json.Marshal(res.Structured)
		results = append(results, res.Text, string(structured))
		return res
	}
	run := func(t *testing.T, script string) *tools.BashResult {
		t.Helper()
		res := call(t, "bash", map[string]any{"command": script, "timeout": 120})
		br, _ := res.Structured.(*tools.BashResult)
		if br == nil {
			t.Fatalf("%s: %s", script, res.Text)
		}
		return br
	}
	decided := func(br *tools.BashResult, host, outcome string) *tools.EgressDecision {
		for i, d := range br.Egress {
			if d.Host == host && d.Outcome == outcome {
				return &br.Egress[i]
			}
		}
		return nil
	}

	t.Run("Placeholder", func(t *testing.T) {
		br := run(t, `case "$API_TOKEN" in sbxph_*) echo placeholder;; *) echo "not a placeholder: $API_TOKEN";; esac`)
		if br.Output != "placeholder\n" {
			t.Errorf("the session's API_TOKEN: %q", br.Output)
		}
	})
	t.Run("Header", func(t *testing.T) {
		br := run(t, `curl -sS -H "Authorization: Bearer $API_TOKEN" https://api.test:`+apiPort+`/secure`)
		if br.Output != "authorized\n" {
			t.Errorf("curl with the placeholder in a header: %q", br.Output)
		}
		if d := decided(br, "api.test", "ok"); d == nil || !d.Inspected || len(d.Secrets) != 1 || d.Secrets[0] != "API_TOKEN" {
			t.Errorf("the call's egress: %+v", br.Egress)
		}
	})
	t.Run("BasicUserinfo", func(t *testing.T) {
		br := run(t, `curl -sS "https://x:$API_TOKEN@api.test:`+apiPort+`/basic"`)
		if br.Output != "basic authorized\n" {
			t.Errorf("curl with the placeholder as user:password@: %q", br.Output)
		}
	})
	t.Run("RefusedForAnotherHost", func(t *testing.T) {
		br := run(t, `curl -sS -H "Authorization: Bearer $API_TOKEN" http://other.test:`+plainPort+`/`)
		if !strings.Contains(br.Output, "API_TOKEN") || !strings.Contains(br.Output, "refused") || strings.Contains(br.Output, "plain") {
			t.Errorf("the placeholder to another allowed host: %q", br.Output)
		}
		if d := decided(br, "other.test", "refused"); d == nil || !strings.Contains(d.Reason, "API_TOKEN") {
			t.Errorf("the call's egress: %+v", br.Egress)
		}
	})
	t.Run("TenantSecret", func(t *testing.T) { // the tenant's own, within its destinations and paths
		br := run(t, `curl -sS -H "Authorization: Bearer $TENANT_TOKEN" https://api.test:`+apiPort+`/tenant`)
		if br.Output != "tenant authorized\n" {
			t.Errorf("curl with the tenant's placeholder: %q", br.Output)
		}
		if d := decided(br, "api.test", "ok"); d == nil || len(d.Secrets) != 1 || d.Secrets[0] != "TENANT_TOKEN" {
			t.Errorf("the call's egress: %+v", br.Egress)
		}
		for _, script := range []string{
			`curl -sS -H "Authorization: Bearer $TENANT_TOKEN" https://api.test:` + apiPort + `/secure`, // a path it may not go to
			`curl -sS -H "Authorization: Bearer $TENANT_TOKEN" http://other.test:` + plainPort + `/`,    // a host
		} {
			if br := run(t, script); !strings.Contains(br.Output, "TENANT_TOKEN") || !strings.Contains(br.Output, "refused") {
				t.Errorf("%s: %q; want a refusal naming TENANT_TOKEN", script, br.Output)
			}
		}
	})
	t.Run("GitPush", func(t *testing.T) {
		br := run(t, `set -e
git config --global user.email agent@sandboxd.test; git config --global user.name agent
git clone -q https://git.test:`+gitPort+`/repo.git work 2>&1
cd work; git checkout -q -b main; echo pushed through the broker > README; git add README; git commit -qm first
git push -q origin main 2>&1 && echo pushed`)
		if !strings.HasSuffix(br.Output, "pushed\n") {
			t.Fatalf("git clone and push: %q", br.Output)
		}
		out, err := exec.Command("git", "--git-dir", repo, "show", "main:README").Output()
		if err != nil || string(out) != "pushed through the broker\n" {
			t.Errorf("the pushed commit on the server: %q %v", out, err)
		}
	})
	t.Run("GoModuleProxyWithToken", func(t *testing.T) {
		br := run(t, `set -e; export GOPROXY="https://x:$API_TOKEN@goproxy.test:`+goPort+`" GOSUMDB=off GOMODCACHE=$PWD/.modcache GOCACHE=$PWD/.gocache GOFLAGS=-modcacherw
mkdir -p app && cd app
printf 'module app\n\ngo 1.19\n\nrequire sandboxd.test/greet v1.0.0\n' > go.mod
printf 'package main\n\nimport (\n\t"fmt"\n\n\t"sandboxd.test/greet"\n)\n\nfunc main() { fmt.Println(greet.Hello()) }\n' > main.go
go mod download sandboxd.test/greet 2>&1 && go run . 2>&1`)
		if !strings.Contains(br.Output, "hello from a module fetched through sandboxd") {
			t.Errorf("go mod download through a module proxy that needs the token: %q", br.Output)
		}
	})
	t.Run("TunnelEndToEnd", func(t *testing.T) {
		br := run(t, `curl -sS -v https://tunnel.test:`+tunnelPort+`/ 2>&1 | grep -E 'issuer:|tunnel end'`)
		if !strings.Contains(br.Output, "CN=sandboxd session test-upstream") || !strings.Contains(br.Output, "tunnel end") {
			t.Errorf("a destination without secrets: %q; want the destination's own certificate", br.Output)
		}
		if d := decided(br, "tunnel.test", "ok"); d == nil || d.Inspected {
			t.Errorf("the call's egress: %+v", br.Egress)
		}
	})
	t.Run("NoKeyInTheWorkspace", func(t *testing.T) {
		br := run(t, `cat /tmp/.sandboxd/extra-ca.crt; grep -rl "PRIVATE KEY" /tmp /workspace 2>/dev/null; env | grep -ci "private key"; true`)
		if !strings.HasPrefix(br.Output, string(ca.CertPEM())) || strings.Contains(br.Output, "PRIVATE") || !strings.HasSuffix(br.Output, "0\n") {
			t.Errorf("what the workspace holds of the authority: %q", br.Output)
		}
	})
	t.Run("NarrowingCutsOpenConnection", func(t *testing.T) {
		res := call(t, "bash", map[string]any{"command": `curl -sSN https://tunnel.test:` + tunnelPort + `/stream; echo "curl ended: $?"`, "background": true})
		bg, _ := res.Structured.(*tools.BackgroundResult)
		if bg == nil {
			t.Fatalf("background curl: %s", res.Text)
		}
		select { // the connection is open, end to end
		case <-streamed:
		case <-time.After(2 * time.Minute):
			r := call(t, "bash_output", map[string]any{"id": bg.ID})
			t.Fatalf("the stream did not start: %s", r.Text)
		}
		if _, err := s.SetEgress(ctx, []string{"api.test:" + apiPort}); err != nil {
			t.Fatal(err)
		}
		r := call(t, "bash_output", map[string]any{"id": bg.ID, "wait": 60})
		o, _ := r.Structured.(*tools.BackgroundResult)
		if o == nil || o.Running || !strings.Contains(o.Output, "curl ended") {
			t.Fatalf("the open connection after narrowing: %s", r.Text)
		}
		cut := false
		for _, d := range o.Egress {
			cut = cut || d.Host == "tunnel.test" && d.Outcome == egress.OutcomeCut
		}
		if !cut {
			t.Errorf("bash_output's egress after narrowing: %+v", o.Egress)
		}
		streaming.Wait() // the destination's side ended too
		br := run(t, `curl -sS https://tunnel.test:`+tunnelPort+`/ 2>&1`)
		if d := decided(br, "tunnel.test", "refused"); d == nil || !strings.Contains(br.Output, "egress policy") {
			t.Errorf("tunnel.test after narrowing: %q %+v", br.Output, br.Egress)
		}
		if _, err := s.SetEgress(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs.String(), "egress policy changed") {
			t.Error("the change is not in the audit log")
		}
	})
	t.Run("NameResolutionFailsClearly", func(t *testing.T) {
		start := time.Now()
		res := call(t, "bash", map[string]any{"command": `getent hosts example.com; curl -sS --noproxy '*' https://example.com/ 2>&1; echo done`, "timeout": 120})
		if time.Since(start) > time.Minute || !strings.Contains(res.Text, "Could not resolve host") || !strings.Contains(res.Text, "no DNS") {
			t.Errorf("a program resolving names itself: %s", res.Text)
		}
	})
	// RefusalsSpeak holds the README's table of what each program of the
	// dev image prints for a host no rule allows (Refusals, DNS, …).
	t.Run("RefusalsSpeak", func(t *testing.T) {
		const why = "Forbidden by the sandbox's egress policy: blocked.test:443 is not allowed"
		for _, c := range []struct {
			program, script string
			want            []string
		}{
			{"curl", `curl -sS https://blocked.test/; echo "exit $?"`, []string{"egress.allow", "exit 0"}},
			{"curl -f", `curl -sSf https://blocked.test/ 2>&1`, []string{"The requested URL returned error: 403"}},
			{"git clone", `git clone -q https://blocked.test/repo.git blocked 2>&1`, []string{"remote: ", "The requested URL returned error: 403"}},
			{"go get", `mkdir -p refused && cd refused && printf 'module refused\n\ngo 1.19\n' > go.mod && GOPROXY=https://blocked.test GOSUMDB=off GOMODCACHE=$PWD/.modcache GOCACHE=$PWD/.gocache GOFLAGS=-modcacherw go get blocked.test/mod@v1.0.0 2>&1`,
				[]string{"403 " + why, "no other way out exists", "server response:"}},
			{"npm", `npm view --registry https://blocked.test/ left-pad version 2>&1`, []string{"403 403 " + why}},
			{"pip", `pip download --no-deps --index-url https://blocked.test/simple --dest /tmp/refused left-pad 2>&1`, []string{"No matching distribution found"}},
		} {
			br := run(t, c.script)
			for _, want := range c.want {
				if !strings.Contains(br.Output, want) {
					t.Errorf("%s prints %q; the README says it shows %q", c.program, br.Output, want)
				}
			}
			if d := decided(br, "blocked.test", "refused"); d == nil {
				t.Errorf("%s: the call's egress names no refusal of blocked.test: %+v", c.program, br.Egress)
			}
		}
	})
	t.Run("ValueNowhere", func(t *testing.T) {
		log := logs.String()
		for _, value := range []string{brokerValue, tenantValue} {
			for _, r := range results {
				if strings.Contains(r, value) {
					t.Errorf("a result holds the secret's value: %s", r)
				}
			}
			if strings.Contains(log, value) {
				t.Error("the daemon's log holds the secret's value")
			}
			if br := run(t, `grep -rl "`+value+`" /workspace /tmp 2>/dev/null; env | grep -c "`+value+`"; true`); br.Output != "0\n" {
				t.Errorf("the workspace holds the secret's value: %q", br.Output)
			}
		}
		// Each egress line names the session, its tenant and the call.
		var named int
		for line := range strings.SplitSeq(log, "\n") {
			if strings.Contains(line, "msg=egress ") && strings.Contains(line, "session="+s.ID()) && strings.Contains(line, "tenant=acme") && strings.Contains(line, "call=call-broker-") {
				named++
			}
		}
		if named == 0 {
			t.Errorf("no egress line names its call:\n%s", log)
		}
	})
	if err := m.Delete(ctx, "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if !ca.Closed() {
		t.Error("the session's certificate authority outlived it")
	}
}
