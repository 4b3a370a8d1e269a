package integration

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// fail runs `sandboxd serve --config file` (args added), which must exit
// on its own with an error without ever listening, and returns what it
// wrote to standard error.
func fail(t *testing.T, file string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "sandboxd"), append([]string{"serve", "--config", file}, args...)...)
	cmd.Env = append(append(os.Environ(), "SANDBOXD_AGENT="+filepath.Join(binDir, "sandboxd-agent")), env...)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("sandboxd serve %v did not exit:\n%s", args, stderr.String())
	}
	if err == nil || listening.MatchString(stdout.String()) {
		t.Fatalf("sandboxd serve %v started (%v):\n%s\n%s", args, err, stdout.String(), stderr.String())
	}
	return stderr.String()
}

// withListen rewrites the configuration file's listening address.
func withListen(t testing.TB, file, addr string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["listen"] = addr
	data, _ = json.Marshal(cfg)
	p := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSecondDaemonLeavesFirstAlone: a second `sandboxd serve` of the same
// daemon on the same engine — one that cannot bind its address (in use,
// or malformed), and one that could — never touches the first daemon's
// containers, and refuses to start, naming the first. The first daemon's
// session and warm pool go on working.
func TestSecondDaemonLeavesFirstAlone(t *testing.T) {
	cli := dockertest.Client(t) // fails under CI without an engine; skips elsewhere
	name := daemonName(t)
	file := config(t, "docker", name)
	d := start(t, file)
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	if r := d.call(acmeToken, s.ID, "write", map[string]any{"path": "work.txt", "content": "kept\n"}); r.IsError {
		t.Fatal(r.Content)
	}
	before := daemonContainers(t, cli, name, 0)
	if len(before) < 2 {
		t.Fatalf("the first daemon holds %v: want its marker and its session's container at least", before)
	}
	pid := fmt.Sprintf("pid %d", d.cmd.Process.Pid)

	addr := strings.TrimPrefix(d.url, "http://")
	for _, tc := range []struct {
		name, listen, want string
	}{
		{"address in use", addr, "address already in use"},
		{"malformed address", "not-an-address", "--listen"},
		{"a free address", "127.0.0.1:0", pid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := fail(t, withListen(t, file, tc.listen), nil)
			t.Log(msg)
			if !strings.Contains(msg, tc.want) {
				t.Errorf("the second daemon's error does not say %q:\n%s", tc.want, msg)
			}
			if tc.want == pid && !strings.Contains(msg, `"daemon"`) {
				t.Errorf("the refusal does not say how to run a second daemon:\n%s", msg)
			}
			if after := daemonContainers(t, cli, name, 0); !slices.Equal(slices.Sorted(slices.Values(after)), slices.Sorted(slices.Values(before))) {
				t.Errorf("the second daemon touched the first's containers: before %v, after %v", before, after)
			}
		})
	}
	r := d.call(acmeToken, s.ID, "bash", map[string]any{"command": "cat work.txt"})
	if r.IsError || r.StructuredContent["output"] != "kept\n" {
		t.Fatalf("the first daemon's session after the second's attempts: %+v", r)
	}
	var list struct{ Sessions []runner.Info }
	d.do(acmeToken, "GET", "/v1/sessions", nil, http.StatusOK, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].ID != s.ID {
		t.Fatalf("the first daemon lists %+v", list)
	}

	// Once the first has stopped, the name is free again.
	d.stop()
	d2 := start(t, file)
	d2.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
}

// TestDockerUnreachableFailsClosed: without a reachable engine, `sandboxd
// serve` refuses to start rather than run tenants' commands on the host; it
// says how to reach the engine and that memory and local are for
// development, and starts on them only when they are named.
func TestDockerUnreachableFailsClosed(t *testing.T) {
	nowhere := "DOCKER_HOST=unix://" + filepath.Join(t.TempDir(), "no-docker.sock")
	for _, backend := range []string{"", "docker"} {
		t.Run("backend "+cmp.Or(backend, "unset"), func(t *testing.T) {
			file := config(t, backend, daemonName(t))
			msg := fail(t, file, []string{nowhere})
			for _, want := range []string{"DOCKER_HOST", "sandboxd doctor", "--backend memory", "without isolation"} {
				if !strings.Contains(msg, want) {
					t.Errorf("the error does not say %q:\n%s", want, msg)
				}
			}
		})
	}
	d := start(t, config(t, "memory", daemonName(t)), nowhere)
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", nil, http.StatusCreated, &s)
	if s.Backend != "memory" {
		t.Fatalf("session on %q", s.Backend)
	}
}
