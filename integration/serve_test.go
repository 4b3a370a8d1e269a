// Package integration drives `sandboxd serve` as a user would: it builds
// the binaries, starts the daemon as a process with a configuration of two
// tenants, and talks to it over HTTP and MCP. The memory backend always
// runs; the Docker backend runs when the engine answers, and must when CI
// is set.
package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/testharness/k8stest"
)

const (
	acmeToken    = "acme-secret"
	boltToken    = "bolt-secret"
	metricsToken = "metrics-secret"
)

var binDir string

func TestMain(m *testing.M) {
	os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	dir, err := os.MkdirTemp("", "sandboxd-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	// The agent runs in images without a C library: it is built static.
	// sandboxd is built with its kubernetes backend, which the cluster
	// tests serve.
	for _, b := range []struct{ name, pkg, cgo string }{{"sandboxd", "./cmd/sandboxd", ""}, {"sandboxd-agent", "./cmd/sandboxd-agent", "CGO_ENABLED=0"}} {
		cmd := exec.Command("go", "build", "-tags", "kubernetes", "-o", filepath.Join(dir, b.name), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", b.pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon is a running `sandboxd serve`.
type daemon struct {
	t       testing.TB
	url     string
	cmd     *exec.Cmd
	stderr  *syncBuffer
	done    chan error
	started time.Time // when its process was started
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// config writes a configuration of two tenants for backend, with a daemon
// name of the test's own, changed by each of set in turn, and returns its
// path.
func config(t testing.TB, backend, name string, set ...func(cfg map[string]any)) string {
	t.Helper()
	cfg := map[string]any{
		"listen":  "127.0.0.1:0",
		"backend": backend,
		"daemon":  name,
		"tenants": []httpapi.Tenant{
			{Name: "acme", Tokens: []string{httpapi.HashToken(acmeToken)}},
			{Name: "bolt", Tokens: []string{httpapi.HashToken(boltToken)}, MaxSessions: 1},
		},
		"metricsTokens":   []string{httpapi.HashToken(metricsToken)},
		"tools":           map[string]any{"progressMs": 50},
		"limits":          map[string]any{"maxTransferBytes": 1 << 20},
		"shutdownTimeout": "20s",
		// The test's own, not the user's state directory.
		"snapshots": map[string]any{"dir": filepath.Join(t.TempDir(), "snapshots")},
		"stateDir":  filepath.Join(t.TempDir(), "state"),
		// Sessions end with the daemon, as the tests that count what a
		// stop leaves expect; those about sessions that outlive it
		// (TestServeRestartKeepsSessions) set it false.
		"endSessionsOnExit": true,
	}
	withCluster(cfg)
	for _, f := range set {
		f(cfg)
	}
	data, _ := json.Marshal(cfg)
	p := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// withCluster adds the test cluster's "kubernetes" key to cfg when its
// backend is kubernetes.
func withCluster(cfg map[string]any) {
	if cfg["backend"] == "kubernetes" {
		cfg["kubernetes"] = map[string]any{
			"kubeconfig": os.Getenv(k8stest.EnvKubeconfig), "namespace": k8stest.Namespace(), "agentImage": os.Getenv(k8stest.EnvAgentImage),
		}
	}
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// start runs `sandboxd serve --config file` until the test ends (SIGTERM,
// then a check that it exited cleanly), with env added to its environment.
func start(t testing.TB, file string, env ...string) *daemon {
	t.Helper()
	return startBinary(t, filepath.Join(binDir, "sandboxd"), file, env...)
}

// startBinary is start with the sandboxd binary exe.
func startBinary(t testing.TB, exe, file string, env ...string) *daemon {
	t.Helper()
	cmd := exec.Command(exe, "serve", "--config", file)
	cmd.Env = append(append(os.Environ(), "SANDBOXD_AGENT="+filepath.Join(binDir, "sandboxd-agent")), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = d.stderr
	d.started = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		d.done <- cmd.Wait()
	}()
	select {
	case d.url = <-urls:
	case <-time.After(3 * time.Minute): // a first image build is slow
		cmd.Process.Kill()
		t.Fatalf("sandboxd serve did not start:\n%s", d.stderr)
	}
	t.Cleanup(func() { d.stop() })
	return d
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() {
	d.t.Helper()
	if d.cmd.ProcessState != nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		if err != nil {
			d.t.Errorf("sandboxd serve exited with %v:\n%s", err, d.stderr)
		}
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		d.t.Errorf("sandboxd serve did not stop on SIGTERM:\n%s", d.stderr)
	}
}

// kill ends the daemon with SIGKILL, as a crash would.
func (d *daemon) kill() {
	d.cmd.Process.Kill()
	<-d.done
}

func (d *daemon) request(token, method, path string, body io.Reader, header ...string) (*http.Response, error) {
	req, err := http.NewRequest(method, d.url+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return http.DefaultClient.Do(req)
}

// do sends a request, checks its status and decodes its JSON answer.
func (d *daemon) do(token, method, path string, in any, want int, out any) []byte {
	d.t.Helper()
	var body io.Reader
	if b, ok := in.([]byte); ok {
		body = bytes.NewReader(b)
	} else if in != nil {
		data, _ := json.Marshal(in)
		body = bytes.NewReader(data)
	}
	res, err := d.request(token, method, path, body)
	if err != nil {
		d.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		d.t.Fatalf("%s %s: %d, want %d: %s", method, path, res.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			d.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return data
}

type result struct {
	Content           []struct{ Type, Text string }
	StructuredContent map[string]any
	IsError           bool
}

func (d *daemon) call(token, id, tool string, args any) result {
	d.t.Helper()
	var r result
	d.do(token, "POST", "/v1/sessions/"+id+"/tools/"+tool, map[string]any{"arguments": args}, http.StatusOK, &r)
	return r
}

var everything = runner.Settings{Grants: []string{"fs.write", "shell.exec"}, Always: []string{"read", "edit", "shell"}}

// backends are the backends a run covers: memory always, docker when the
// engine answers, kubernetes when a cluster is given (both always under CI).
func backends(t *testing.T) []string {
	out := []string{"memory"}
	if _, err := dockertest.Connect(context.Background()); err == nil {
		out = append(out, "docker")
	} else if os.Getenv("CI") != "" {
		t.Fatalf("Docker is required when CI is set: %v", err)
	} else {
		t.Logf("Docker unavailable, the docker backend is not covered: %v", err)
	}
	switch {
	case os.Getenv(k8stest.EnvKubeconfig) != "":
		out = append(out, "kubernetes")
	case os.Getenv("CI") != "":
		t.Fatalf("a Kubernetes cluster is required when CI is set: %s is not set (.ci/k8s/up.sh starts one)", k8stest.EnvKubeconfig)
	default:
		t.Logf("no Kubernetes cluster (%s), the kubernetes backend is not covered", k8stest.EnvKubeconfig)
	}
	return out
}

func daemonName(t testing.TB) string {
	return "itest-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())) + fmt.Sprint(time.Now().UnixNano()%1e6)
}

func TestServe(t *testing.T) {
	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) {
			name := daemonName(t)
			d := start(t, config(t, backend, name))
			t.Run("tenants", func(t *testing.T) { testTenants(t, d) })
			t.Run("bash streams", func(t *testing.T) { testStream(t, d) })
			t.Run("tar", func(t *testing.T) { testTar(t, d) })
			t.Run("mcp", func(t *testing.T) { testMCP(t, d) })
			t.Run("long commands", func(t *testing.T) { testLongCommands(t, d) })
			if !strings.Contains(d.stderr.String(), `"msg":"tool call"`) {
				t.Errorf("no audit line in the log:\n%s", d.stderr)
			}
			switch backend {
			case "docker":
				d.stop()
				if left := daemonContainers(t, dockertest.Client(t), name, 0); len(left) != 0 {
					t.Errorf("left after SIGTERM: %v", left)
				}
			case "kubernetes":
				d.stop()
				if left := daemonPods(t, name); len(left) != 0 {
					t.Errorf("left after SIGTERM: %v", left)
				}
			}
		})
	}
}

func testTenants(t *testing.T, d *daemon) {
	d.t = t
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	defer d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)
	if r := d.call(acmeToken, s.ID, "write", map[string]any{"path": "notes.txt", "content": "acme only\n"}); r.IsError {
		t.Fatal(r.Content)
	}
	r := d.call(acmeToken, s.ID, "bash", map[string]any{"command": "cat notes.txt; id -u"})
	if out, _ := r.StructuredContent["output"].(string); r.IsError || !strings.HasPrefix(out, "acme only\n") {
		t.Fatalf("bash: %+v", r)
	}
	d.do(boltToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusNotFound, nil)
	d.do(boltToken, "POST", "/v1/sessions/"+s.ID+"/tools/read", map[string]any{"arguments": map[string]any{"path": "notes.txt"}}, http.StatusNotFound, nil)
	d.do(boltToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNotFound, nil)
	d.do("wrong", "GET", "/v1/sessions", nil, http.StatusUnauthorized, nil)

	var b runner.Info
	d.do(boltToken, "POST", "/v1/sessions", nil, http.StatusCreated, &b)
	d.do(boltToken, "POST", "/v1/sessions", nil, http.StatusTooManyRequests, nil) // bolt may hold one
	d.do(boltToken, "POST", "/v1/sessions", runner.Settings{Privileged: true}, http.StatusForbidden, nil)
	d.do(boltToken, "DELETE", "/v1/sessions/"+b.ID, nil, http.StatusNoContent, nil)
}

func testStream(t *testing.T, d *daemon) {
	d.t = t
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	defer d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)
	body := strings.NewReader(`{"arguments":{"command":"echo early; sleep 2; echo late"}}`)
	res, err := d.request(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/bash", body, "Accept", "text/event-stream")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var firstOutput, resultAt time.Time
	var first, last string
	sc := bufio.NewScanner(res.Body)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			event = name
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			if event == "output" && first == "" {
				first, firstOutput = data, time.Now()
			}
			if event == "result" {
				last, resultAt = data, time.Now()
			}
		}
	}
	if !strings.Contains(first, `early`) || strings.Contains(first, "late") {
		t.Fatalf("first output event %q", first)
	}
	if gap := resultAt.Sub(firstOutput); gap < time.Second {
		t.Fatalf("the first output came %v before the result: not while the command ran", gap)
	}
	if !strings.Contains(last, `"output":"early\nlate\n"`) {
		t.Fatalf("result %s", last)
	}
}

func makeTar(t *testing.T, entries ...*tar.Header) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Name))
			body = h.Name
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func testTar(t *testing.T, d *daemon) {
	d.t = t
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	defer d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)
	files := "/v1/sessions/" + s.ID + "/files/"
	up := makeTar(t,
		&tar.Header{Name: "src/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "src/a.go", Typeflag: tar.TypeReg},
		&tar.Header{Name: "src/deep/b.go", Typeflag: tar.TypeReg},
		&tar.Header{Name: "src/l", Typeflag: tar.TypeSymlink, Linkname: "a.go"},
	)
	d.do(acmeToken, "PUT", files+"up", up, http.StatusOK, nil)
	if r := d.call(acmeToken, s.ID, "bash", map[string]any{"command": "cat up/src/l; find up | sort"}); r.StructuredContent["output"] != "src/a.go"+"up\nup/src\nup/src/a.go\nup/src/deep\nup/src/deep/b.go\nup/src/l\n" {
		t.Fatalf("after upload: %+v", r.StructuredContent["output"])
	}
	data := d.do(acmeToken, "GET", files+"up/src", nil, http.StatusOK, nil)
	var got []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		b, _ := io.ReadAll(tr)
		got = append(got, fmt.Sprintf("%s %c %s%s", h.Name, h.Typeflag, b, h.Linkname))
	}
	want := "a.go 0 src/a.go|deep/ 5 |deep/b.go 0 src/deep/b.go|l 2 a.go"
	if strings.Join(got, "|") != want {
		t.Fatalf("downloaded %q, want %q", strings.Join(got, "|"), want)
	}

	// A link out, then a write through it: refused, nothing written.
	evil := makeTar(t,
		&tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg},
		&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
		&tar.Header{Name: "out/evil", Typeflag: tar.TypeReg},
	)
	d.do(acmeToken, "PUT", files+"bad", evil, http.StatusBadRequest, nil)
	for _, bad := range [][]byte{
		makeTar(t, &tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg}, &tar.Header{Name: "../x", Typeflag: tar.TypeReg}),
		makeTar(t, &tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg}, &tar.Header{Name: "/abs", Typeflag: tar.TypeReg}),
		makeTar(t, &tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg}, &tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}),
	} {
		d.do(acmeToken, "PUT", files+"bad", bad, http.StatusBadRequest, nil)
	}
	var big bytes.Buffer
	tw := tar.NewWriter(&big)
	tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2 << 20})
	tw.Write(make([]byte, 2<<20))
	tw.Close()
	d.do(acmeToken, "PUT", files+"bad", big.Bytes(), http.StatusRequestEntityTooLarge, nil)
	if r := d.call(acmeToken, s.ID, "ls", map[string]any{"path": "."}); strings.Contains(r.Content[0].Text, "bad") || strings.Contains(r.Content[0].Text, "ok.txt") {
		t.Fatalf("a refused upload wrote: %s", r.Content[0].Text)
	}
}

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

func testMCP(t *testing.T, d *daemon) {
	d.t = t
	ctx := context.Background()
	cl := mcp.NewClient(&mcp.Implementation{Name: "integration", Version: "1"}, nil)
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   d.url + "/mcp?grant=fs.write&grant=shell.exec&always=read,edit,shell",
		HTTPClient: &http.Client{Transport: bearer(acmeToken)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "echo over mcp > m.txt; cat m.txt"}})
	if err != nil || res.IsError {
		t.Fatalf("bash over MCP: %v %+v", err, res)
	}
	if out := res.StructuredContent.(map[string]any)["output"]; out != "over mcp\n" {
		t.Fatalf("output %q", out)
	}
	// An MCP client has no turn to finish: without maxCallsPerRun in the
	// daemon's configuration, a session takes calls past the contract's 64.
	for i := range 100 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"path": "m.txt"}})
		if err != nil || res.IsError {
			t.Fatalf("call %d over MCP: %v %+v", i+2, err, res)
		}
	}
	var list struct{ Sessions []runner.Info }
	d.do(acmeToken, "GET", "/v1/sessions", nil, http.StatusOK, &list)
	if len(list.Sessions) != 1 {
		t.Fatalf("sessions %+v", list)
	}
	d.do(boltToken, "GET", "/v1/sessions/"+list.Sessions[0].ID, nil, http.StatusNotFound, nil)
	if _, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: d.url + "/mcp", HTTPClient: &http.Client{Transport: bearer("nope")}, MaxRetries: -1}, nil); err == nil {
		t.Fatal("MCP with a bad token connected")
	}
	cs.Close()
	deadline := time.Now().Add(10 * time.Second)
	for d.do(acmeToken, "GET", "/v1/sessions", nil, http.StatusOK, &list); len(list.Sessions) > 0; d.do(acmeToken, "GET", "/v1/sessions", nil, http.StatusOK, &list) {
		if time.Now().After(deadline) {
			t.Fatalf("the MCP session's session outlived it: %+v", list)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCrashThenRestart: kill -9 during a call leaves containers; the next
// start resumes the session and reaps the rest, and new sessions work. A container killed from outside
// makes its session's calls fail at once.
func TestCrashThenRestart(t *testing.T) {
	cli := dockertest.Client(t) // fails under CI without an engine; skips elsewhere
	name := daemonName(t)
	file := config(t, "docker", name)
	d := start(t, file)
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	go d.request(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/bash", strings.NewReader(`{"arguments":{"command":"sleep 30"}}`))
	time.Sleep(500 * time.Millisecond)
	d.kill()
	if n := len(daemonContainers(t, cli, name, 0)); n == 0 {
		t.Fatal("no container left by the killed daemon: the test proves nothing")
	}

	d2 := start(t, file)
	// Its session is resumed (TestServeRestartKeepsSessions); nothing else
	// of the killed run is left.
	d2.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, nil)
	left := slices.DeleteFunc(daemonContainers(t, cli, name, d2.cmd.Process.Pid), func(w string) bool { return strings.Contains(w, s.Workspace) })
	if len(left) != 0 {
		t.Fatalf("containers of the killed run left after the restart: %v", left)
	}
	var s2 runner.Info
	d2.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s2)
	if r := d2.call(acmeToken, s2.ID, "bash", map[string]any{"command": "echo alive"}); r.StructuredContent["output"] != "alive\n" {
		t.Fatalf("after the restart: %+v", r)
	}
	if _, err := cli.ContainerKill(context.Background(), s2.Workspace, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	// The session ends with its container: 410 SessionEnded, with the
	// cause, for its calls and its lookups alike, and it is counted; the
	// resumed one lives on.
	var e struct{ Error, Message string }
	d2.do(acmeToken, "POST", "/v1/sessions/"+s2.ID+"/tools/bash", map[string]any{"arguments": map[string]any{"command": "echo never"}}, http.StatusGone, &e)
	if e.Error != "SessionEnded" || !strings.Contains(e.Message, "exit code 137") {
		t.Fatalf("call into a killed container: %+v", e)
	}
	d2.do(acmeToken, "GET", "/v1/sessions/"+s2.ID, nil, http.StatusGone, &e)
	if !strings.Contains(e.Message, "exit code 137") {
		t.Fatalf("the session of a killed container: %+v", e)
	}
	if metrics := string(d2.do(metricsToken, "GET", "/metrics", nil, http.StatusOK, nil)); !strings.Contains(metrics, "\nsandboxd_sessions_lost_total 1\n") || !strings.Contains(metrics, "\nsandboxd_sessions 1\n") {
		t.Fatalf("metrics after the container died:\n%s", metrics)
	}
	d2.stop()
	if left := daemonContainers(t, cli, name, 0); len(left) != 0 {
		t.Fatalf("containers left after SIGTERM: %v", left)
	}
}

// daemonContainers lists what a daemon named name left in the engine: its
// containers (its marker among them), and its volumes (a session's
// workspace, the agent's); all but those of the run whose PID is except.
func daemonContainers(t *testing.T, cli *client.Client, name string, except int) []string {
	t.Helper()
	f := make(client.Filters)
	f.Add("label", backend.LabelDaemon+"="+name)
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	mine := func(labels map[string]string) bool {
		return except != 0 && labels[backend.LabelOwnerPID] == fmt.Sprint(except)
	}
	for _, c := range list.Items {
		if !mine(c.Labels) {
			left = append(left, "container "+c.ID[:12]+" "+strings.Join(c.Names, ","))
		}
	}
	vols, err := cli.VolumeList(context.Background(), client.VolumeListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols.Items {
		if !mine(v.Labels) {
			left = append(left, "volume "+v.Name)
		}
	}
	return left
}

// daemonPods names the session pods of the daemon name that are not being
// deleted.
func daemonPods(t *testing.T, name string) []string {
	t.Helper()
	b := k8stest.Backend(t)
	list, err := b.Client().CoreV1().Pods(b.Namespace()).List(context.Background(), metav1.ListOptions{LabelSelector: backend.LabelDaemon + "=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	return names
}
