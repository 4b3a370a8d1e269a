package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/runner"
)

// TestServeBuildsMissingImage starts serve against an engine without
// sandboxd's images: it stops at once, naming the build to run and
// --build-missing, with which it builds the default image, saying so, and
// then listens on it.
func TestServeBuildsMissingImage(t *testing.T) {
	e := &fakeEngine{api: "1.47", info: healthyInfo(), images: map[string]int64{}}
	e.start(t)
	minimal, _ := images.Lookup("minimal")

	// Without the agent, nothing could run: serve says so and stops.
	t.Setenv("SANDBOXD_AGENT", "")
	t.Setenv("PATH", t.TempDir())
	code, _, errs := runInProcess(t, "serve", "--listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errs, "no sandboxd-agent binary") {
		t.Errorf("serve without an agent: exit %d, %s", code, errs)
	}
	agentHere(t)
	code, _, errs = runInProcess(t, "serve", "--listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errs, "sandboxd image build minimal") || !strings.Contains(errs, "--build-missing") {
		t.Errorf("serve without its image: exit %d, %s", code, errs)
	}
	e.mu.Lock()
	built := len(e.imported)
	e.mu.Unlock()
	if built != 0 {
		t.Fatal("serve without --build-missing built an image")
	}
	out, serr := serveUntil(t, "", "--build-missing")
	errs = serr.String()
	for _, want := range []string{"image minimal: image " + minimal.Ref() + " is not built yet; building it now", "importing", "built " + minimal.Ref()} {
		if !strings.Contains(errs, want) {
			t.Errorf("serve's progress lacks %q:\n%s", want, errs)
		}
	}
	if !strings.Contains(out.String(), "backend docker, image "+minimal.Ref()) {
		t.Errorf("welcome: %s", out.String())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.imported) != 1 || e.imported[0] != minimal.Ref() {
		t.Errorf("imported %v, want %s once", e.imported, minimal.Ref())
	}
}

// TestServeKubernetesNeedsTheTag: a build without -tags kubernetes (the
// default, which leaves client-go out) refuses --backend kubernetes,
// naming the build that has it.
func TestServeKubernetesNeedsTheTag(t *testing.T) {
	if withKubernetes {
		t.Skip("this test binary has the kubernetes backend")
	}
	code, _, errs := runInProcess(t, "serve", "--listen", "127.0.0.1:0", "--backend", "kubernetes")
	if code != 1 || !strings.Contains(errs, "go build -tags kubernetes") {
		t.Errorf("serve --backend kubernetes: exit %d, %s", code, errs)
	}
}

// serveUntil runs serve in process with args until it has said where it
// listens and its standard error holds want, then stops it, and returns its
// output.
func serveUntil(t *testing.T, want string, args ...string) (stdout, stderr *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out, errs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, stdio{in: strings.NewReader(""), out: &out, err: &errs}, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...))
	}()
	for deadline := time.Now().Add(5 * time.Minute); !strings.Contains(out.String(), "listening on") || !strings.Contains(errs.String(), want); time.Sleep(20 * time.Millisecond) {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d:\n%s%s", code, out.String(), errs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start, or did not say %q:\n%s", want, errs.String())
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve exited %d after its context ended:\n%s", code, errs.String())
	}
	return &out, &errs
}

// TestServeReportsPoolFill: serve shows its warm pools filling at start.
func TestServeReportsPoolFill(t *testing.T) {
	config := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(config, []byte(`{"backend": "memory", "tenants": [{"name": "a", "tokens": ["sha256:0000000000000000000000000000000000000000000000000000000000000000"]}], "pools": [{"size": 3}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs := serveUntil(t, "warm pool sandboxd/minimal:latest: 3/3 workspaces started: ready", "--config", config)
	var counts []string
	for _, m := range regexp.MustCompile(`\] warm pool sandboxd/minimal:latest: ([0-3])/3 workspaces started`).FindAllStringSubmatch(errs.String(), -1) {
		counts = append(counts, m[1])
	}
	rising := len(counts) > 0
	for i := 1; i < len(counts); i++ {
		rising = rising && counts[i] > counts[i-1]
	}
	if !rising {
		t.Errorf("pool progress %v: want counts rising to 3\n%s", counts, errs)
	}
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

// startServe runs serve in process with args on a free loopback port until
// the test ends, and returns its URL and what it printed first.
func startServe(t *testing.T, args ...string) (url, welcome string) {
	t.Helper()
	url, out, _ := serveLogged(t, args...)
	return url, out.String()
}

// serveLogged is startServe, and the daemon's standard output and
// standard error (its log) as they grow.
func serveLogged(t *testing.T, args ...string) (url string, stdout, stderr *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var out, errs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, stdio{in: strings.NewReader(""), out: &out, err: &errs}, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...))
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d after its context ended:\n%s", code, errs.String())
		}
	})
	listening := regexp.MustCompile(`listening on (http://\S+)`)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out.String(), "/v1/config.schema.json\n"); time.Sleep(20 * time.Millisecond) {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("serve exited %d:\n%s%s", code, out.String(), errs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s%s", out.String(), errs.String())
		}
	}
	return listening.FindStringSubmatch(out.String())[1], &out, &errs
}

// TestFirstCallPastes: the lines serve prints for a first call work when
// pasted into a shell, with the development token it made and with a
// configured tenant's token in SANDBOXD_TOKEN; the configuration's schema
// is served.
func TestFirstCallPastes(t *testing.T) {
	const token = "sbx_pasted"
	config := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(config, []byte(`{"tenants": [{"name": "a", "tokens": ["`+httpapi.HashToken(token)+`"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{"development", nil, nil},
		{"configured", []string{"--config", config}, []string{"SANDBOXD_TOKEN=" + token}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, welcome := startServe(t, append([]string{"--backend", "memory"}, tc.args...)...)
			var script []string // the indented lines: commands to paste
			for l := range strings.Lines(welcome) {
				if cmd, ok := strings.CutPrefix(l, "  "); ok && !strings.Contains(cmd, "sandboxd session") {
					script = append(script, cmd)
				}
			}
			sh := exec.CommandContext(t.Context(), "sh", "-c", strings.Join(script, ""))
			sh.Env = append(os.Environ(), tc.env...)
			out, err := sh.CombinedOutput()
			var info runner.Info
			if err != nil || json.Unmarshal(out, &info) != nil || !strings.HasPrefix(info.ID, "s-") {
				t.Errorf("pasting\n%s\ngave %v: %s", strings.Join(script, ""), err, out)
			}
			res, err := http.Get(url + "/v1/config.schema.json")
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if body, _ := io.ReadAll(res.Body); res.StatusCode != 200 || !bytes.Equal(body, configSchema) {
				t.Errorf("GET /v1/config.schema.json: %s, %d bytes, want the checked-in schema", res.Status, len(body))
			}
		})
	}
}

// TestSessionCallExitStatus: session call exits with the status of the
// command it ran, and the session commands name themselves in errors;
// session rm --all ends every session of the tenant.
func TestSessionCallExitStatus(t *testing.T) {
	url, welcome := startServe(t, "--backend", "memory")
	t.Setenv("SANDBOXD_URL", url)
	t.Setenv("SANDBOXD_TOKEN", regexp.MustCompile(`SANDBOXD_TOKEN=(\S+)`).FindStringSubmatch(welcome)[1])
	code, out, errs := runInProcess(t, "session", "create", "--grant", "shell.exec", "--always", "read,shell")
	if code != 0 {
		t.Fatalf("session create: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	for _, tc := range []struct {
		tool, args string
		code       int
		out, err   string // substrings of standard output and error
	}{
		{"bash", `{"command":"echo hi"}`, 0, "hi\n", ""},
		{"bash", `{"command":"echo bye; exit 3"}`, 3, "bye\n", ""},
		{"bash", `{"command":"kill -9 $$"}`, 128 + 9, "SIGKILL", ""},
		{"bash", `{"command":"sleep 30", "timeout": 0.5}`, 124, "Timed out", ""},
		// Without bashSessionEnv, no SANDBOXD_* variable over memory.
		{"bash", `{"command":"echo ${SANDBOXD_WORKSPACE-unset}"}`, 0, "unset\n", ""},
		{"read", `{"path":"nope"}`, 1, "NotFound", "sandboxd session call: the tool reported a failure"},
		{"nosuchtool", `{}`, 1, "", "sandboxd session call: "},
	} {
		t.Run(tc.tool+" "+tc.args, func(t *testing.T) {
			code, out, errs := runInProcess(t, "session", "call", id, tc.tool, tc.args)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errs, tc.err) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", code, out, errs, tc.code, tc.out, tc.err)
			}
		})
	}
	code, out, errs = runInProcess(t, "session", "ls")
	if code != 0 || !strings.Contains(out, "CALLS RUNNING") || !strings.Contains(out, id) {
		t.Errorf("session ls: exit %d\n%s%s", code, out, errs)
	}
	// session rm --all ends every session of the tenant.
	if code, _, errs := runInProcess(t, "session", "create"); code != 0 {
		t.Fatalf("session create: exit %d: %s", code, errs)
	}
	if code, _, errs := runInProcess(t, "session", "rm", "--all", id); code != 2 {
		t.Errorf("session rm --all ID: exit %d (%s), want a usage error", code, errs)
	}
	if code, _, errs := runInProcess(t, "session", "rm", "--all"); code != 0 {
		t.Fatalf("session rm --all: exit %d: %s", code, errs)
	}
	code, out, errs = runInProcess(t, "session", "ls", "--json")
	if code != 0 || strings.Contains(out, `"id"`) {
		t.Errorf("session ls after rm --all: exit %d\n%s%s", code, out, errs)
	}
}

// TestJournalStore: the daemon gives each session's journal a directory of
// its own in the host's temporary directory, closed to others, that drop
// removes.
func TestJournalStore(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	store, drop, err := journalStore(runner.JournalStoreRequest{Session: "s-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.WriteFile(t.Context(), "x", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-journal-*"))
	if len(dirs) != 1 {
		t.Fatalf("stores in TMPDIR: %q, want one", dirs)
	}
	if fi, err := os.Stat(dirs[0]); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the store %s: %v, %v; want mode 0700", dirs[0], fi.Mode(), err)
	}
	if err := drop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dirs[0]); !os.IsNotExist(err) {
		t.Fatalf("the store outlived drop: %v", err)
	}
}
