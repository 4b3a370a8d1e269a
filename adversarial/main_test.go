package adversarial

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/agentbin"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// fakeSecret is set in this test process's environment; no tool output of
// any backend may ever contain it.
const fakeSecret = "sbx-FAKE-HOST-SECRET-7c1e9"

// outsideSecret is the content of the file outside each workspace that
// confinement must keep out of every answer.
const outsideSecret = "OUTSIDE-SECRET-d41d8"

// agentBuilt is set when agentbin built the agent into a directory of its
// own, which dockertest.Main removes at the end: sandboxd is built there too.
var agentBuilt bool

func TestMain(m *testing.M) {
	os.Setenv("SANDBOXD_ADVERSARIAL_SECRET", fakeSecret)
	os.Setenv("AWS_SECRET_ACCESS_KEY", fakeSecret)
	agentBuilt = os.Getenv(docker.EnvAgent) == ""
	if p, err := agentbin.Path(); err == nil {
		os.Setenv(docker.EnvAgent, p)
	}
	dockertest.Main(m, "adversarial")
}

// world is one workspace under attack: its ports, its root as commands see
// it, and a directory outside it (holding secret files) that no attack may
// read or change.
type world struct {
	backend string
	fs      workspace.FileSystem
	bash    workspace.Bash
	root    string // the workspace root as commands see it
	outside string // a directory beside the workspace, as commands see it
	loan    *dockertest.Loan
}

// backends runs f as a parallel subtest per backend: "local" (localfs and
// localexec over a temporary directory) and "docker" (a hardened session
// container lent by pool).
func backends(t *testing.T, pool func() *dockertest.Pool, f func(t *testing.T, w *world)) {
	t.Run("local", func(t *testing.T) {
		t.Parallel()
		f(t, localWorld(t))
	})
	t.Run("docker", func(t *testing.T) {
		t.Parallel()
		f(t, dockerWorld(t, pool()))
	})
}

// attack is one named attack, run against every backend.
type attack struct {
	name string
	run  func(t *testing.T, w *world)
}

// runAttacks runs each attack as a subtest named by the attack, with one
// subtest per backend below it. Docker containers come from a pool shared
// by the attacks of this call.
func runAttacks(t *testing.T, attacks []attack) {
	var once sync.Once
	var p *dockertest.Pool
	pool := func() *dockertest.Pool {
		once.Do(func() { p = dockertest.NewPool(t, 3, docker.Spec{}) })
		return p
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			backends(t, pool, a.run)
		})
	}
}

func localWorld(t *testing.T) *world {
	base := t.TempDir()
	root, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fsys, err := localfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	sh, err := localexec.New(root)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{backend: "local", fs: fsys, bash: sh, root: root, outside: outside}
	w.fillOutside(t)
	return w
}

func dockerWorld(t *testing.T, pool *dockertest.Pool) *world {
	l := pool.Get(t)
	w := &world{backend: "docker", fs: l.Agent(), bash: l.Bash(), root: policy.WorkspaceDir, outside: dockertest.OutsideDir, loan: l}
	w.fillOutside(t)
	return w
}

func (w *world) fillOutside(t *testing.T) {
	w.sh(t, `mkdir -p "$OUT/d" && printf '%s' "$SECRET" > "$OUT/secret" && printf '%s' "$SECRET" > "$OUT/d/f" && printf '%s' "$SECRET" > "$OUT/f"`)
	before := w.outsideState(t)
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		if after := w.outsideState(t); after != before {
			t.Errorf("the directory outside the workspace changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

// outsideState describes every entry outside the workspace: name, type,
// size, inode and contents' hash (directories by name: their times move
// with the attacker's own temporaries, see swapScript).
func (w *world) outsideState(t *testing.T) string {
	return w.sh(t, `cd "$OUT" && find . | grep -v '/swap\.[a-z]*\.tmp' | sort | while read -r f; do if [ -d "$f" ] && [ ! -L "$f" ]; then echo "$f/"; else stat -c '%n %F %s %i %Y' "$f"; fi; [ -f "$f" ] && [ ! -L "$f" ] && md5sum "$f"; done; true`)
}

// sh runs script in the workspace as the backend runs commands (the host's
// bash for local, the container's shell for docker), with $OUT the outside
// directory, $WS the root and $SECRET the outside secret; it fails the test
// unless the script exits 0, and returns its output.
func (w *world) sh(t *testing.T, script string) string {
	t.Helper()
	out, res, err := w.run(t, context.Background(), script, 60*time.Second)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: %q: exit %d, %v\n%s", w.backend, script, res.ExitCode, err, out)
	}
	return out
}

func (w *world) run(t *testing.T, ctx context.Context, script string, timeout time.Duration) (string, workspace.Result, error) {
	var mu sync.Mutex
	var b strings.Builder
	res, err := w.bash.Run(ctx, workspace.Command{
		Script:  script,
		Env:     map[string]string{"OUT": w.outside, "WS": w.root, "SECRET": outsideSecret},
		Timeout: timeout,
		Output: func(_ workspace.Stream, p []byte) {
			mu.Lock()
			b.Write(p)
			mu.Unlock()
		},
	})
	mu.Lock()
	defer mu.Unlock()
	return b.String(), res, err
}

// toolSet returns the seven tools over w with every skill on.
func (w *world) toolSet(t *testing.T, edit func(*tools.Config)) *tools.Set {
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
	cfg.Always = []string{"read", "edit", "shell"}
	cfg.MaxCallsPerRun = 0
	if edit != nil {
		edit(&cfg)
	}
	set, err := tools.New(tools.Env{FS: w.fs, Bash: w.bash, Session: workspace.Session{ID: "adv", Root: w.root}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// execSet returns the workspace-shell profile over w as a provider drives
// it: workspace_exec of commands, each call judged, run and committed or
// restored as production runs it (tools.Set.Call).
func (w *world) execSet(t *testing.T, commands workspaceshell.Commands, timeoutMS int64) *tools.Set {
	return w.toolSet(t, func(c *tools.Config) {
		c.Always = nil
		c.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
		c.Driver = workspaceshell.DriverProvider
		c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write, Commands: commands, Timeout: &timeoutMS}
	})
}

// call calls a tool and returns its result; a result never carries the
// fake host secret or the outside secret.
func call(t *testing.T, set *tools.Set, tool string, args any) tools.Result {
	t.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	res := set.Call(context.Background(), tool, raw, tools.CallOptions{})
	leakCheck(t, tool, res)
	return res
}

func leakCheck(t *testing.T, tool string, res tools.Result) {
	t.Helper()
	js, _ := json.Marshal(res.Structured)
	for _, s := range []string{fakeSecret, outsideSecret} {
		if strings.Contains(res.Text, s) || bytes.Contains(js, []byte(s)) {
			t.Errorf("%s leaked a secret: %s", tool, res.Text)
		}
	}
}

// errKind is the error kind of a failed tool result, "" for success.
func errKind(res tools.Result) string {
	if e, ok := res.Structured.(*tools.ErrorResult); ok && res.IsError {
		return e.Error
	}
	return ""
}

// daemon is an in-process sandboxd API (runner + httpapi, as `sandboxd
// serve` assembles them) with two tenants, acme and bolt.
type daemon struct {
	url string
	m   *runner.Manager
	srv *httptest.Server
}

const (
	acmeToken    = "acme-token-adversarial"
	boltToken    = "bolt-token-adversarial"
	metricsToken = "metrics-token-adversarial"
)

type daemonConfig struct {
	backend     string // "local", "memory" or "docker"
	maxSessions int
	maxBody     int64
	maxTransfer int64
	pool        int
	tools       *tools.Config   // the operator's tool options (default: DefaultConfig, no call cap)
	options     []runner.Option // more of the operator's settings
	// writeTimeout is httpapi.WithWriteTimeout's (default: its own).
	writeTimeout time.Duration
}

func newDaemon(t testing.TB, c daemonConfig) *daemon {
	t.Helper()
	var b backend.Backend
	pol := policy.Policy{Images: []string{"sandboxd/*"}}
	switch c.backend {
	case "memory":
		b = memory.Backend{TempDir: t.TempDir()}
	case "local":
		b = &local.Backend{Dir: t.TempDir()}
	case "docker":
		b = &docker.Backend{Client: dockertest.Client(t)}
		pol.DefaultImage = dockertest.Image(t)
	default:
		t.Fatalf("no backend %q", c.backend)
	}
	cfg := tools.DefaultConfig()
	cfg.MaxCallsPerRun = 0
	if c.tools != nil {
		cfg = *c.tools
	}
	opts := []runner.Option{
		runner.WithPolicy(pol), runner.WithTools(cfg), runner.WithMaxSessions(c.maxSessions),
		runner.WithDaemonName(fmt.Sprintf("adv-%d", time.Now().UnixNano())),
		runner.WithLabels(dockertest.Labels()),
	}
	if c.pool > 0 {
		opts = append(opts, runner.WithPool(runner.PoolConfig{Size: c.pool}))
	}
	opts = append(opts, c.options...)
	m, err := runner.New(context.Background(), b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	apiOpts := []httpapi.Option{httpapi.WithTenants([]httpapi.Tenant{
		{Name: "acme", Tokens: []string{httpapi.HashToken(acmeToken)}},
		{Name: "bolt", Tokens: []string{httpapi.HashToken(boltToken)}},
	}), httpapi.WithMetricsTokens(httpapi.HashToken(metricsToken))}
	if c.maxBody > 0 {
		apiOpts = append(apiOpts, httpapi.WithMaxBodyBytes(c.maxBody))
	}
	if c.maxTransfer > 0 {
		apiOpts = append(apiOpts, httpapi.WithMaxTransferBytes(c.maxTransfer))
	}
	if c.writeTimeout > 0 {
		apiOpts = append(apiOpts, httpapi.WithWriteTimeout(c.writeTimeout))
	}
	api, err := httpapi.New(m, apiOpts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &daemon{url: srv.URL, m: m, srv: srv}
}

// do sends a JSON request and returns the status and body.
func (d *daemon) do(t testing.TB, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	case io.Reader:
		r = b
	default:
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, d.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// A connection each request that is not a stream: some daemons here
	// close idle connections after 2 s, and a POST on a kept-alive
	// connection the server closes at that moment fails with EOF (net/http
	// retries only idempotent requests). A stream keeps the connection, so
	// that a server refusing it early drains some of it before closing
	// rather than resetting the connection under the client's write.
	_, stream := body.(io.Reader)
	req.Close = !stream
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// create makes a session for token with settings and returns its ID.
func (d *daemon) create(t testing.TB, token string, settings any) string {
	t.Helper()
	code, body := d.do(t, token, "POST", "/v1/sessions", settings)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var info struct{ ID string }
	json.Unmarshal(body, &info)
	return info.ID
}

type apiResult struct {
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	Structured json.RawMessage `json:"structuredContent"`
	IsError    bool            `json:"isError"`
}

func (d *daemon) call(t testing.TB, token, id, tool string, args any) apiResult {
	t.Helper()
	code, body := d.do(t, token, "POST", "/v1/sessions/"+id+"/tools/"+tool, map[string]any{"arguments": args})
	if code != http.StatusOK {
		t.Fatalf("call %s: %d %s", tool, code, body)
	}
	for _, s := range []string{fakeSecret, outsideSecret} {
		if bytes.Contains(body, []byte(s)) {
			t.Errorf("call %s leaked a secret: %s", tool, body)
		}
	}
	var res apiResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// sandboxdBinary builds cmd/sandboxd once per test binary, for tests of
// what only the real `sandboxd serve` process configures (its HTTP server's
// timeouts, its environment).
func sandboxdBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		if agentBuilt {
			buildDir = filepath.Dir(os.Getenv(docker.EnvAgent))
		} else if buildDir, buildErr = os.MkdirTemp("", "sandboxd-adversarial-"); buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, "sandboxd"), "./cmd/sandboxd")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/sandboxd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "sandboxd")
}
