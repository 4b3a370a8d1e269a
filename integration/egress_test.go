package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// TestServeEgress: `sandboxd serve` with an egress section gives sessions
// over /v1 and over /mcp the proxy: a loopback server of the test's is
// reached because the configuration lists it (and its private address),
// another port of the same host is refused with the 403, the connection is
// in the daemon's log and in /metrics, and a session that narrows its
// egress to nothing has no proxy.
func TestServeEgress(t *testing.T) {
	dockertest.Client(t) // fails under CI without an engine; skips elsewhere
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "reached") }))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	file := withImage(t, config(t, "docker", daemonName(t)), "dev") // curl
	var cfg map[string]any
	data, _ := os.ReadFile(file)
	json.Unmarshal(data, &cfg)
	cfg["egress"] = map[string]any{"allow": []string{"127.0.0.1:" + u.Port()}, "allowPrivate": []string{"127.0.0.1"}}
	data, _ = json.Marshal(cfg)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, file)
	// NO_PROXY keeps 127.0.0.1 off the proxy; --noproxy '' sends it there.
	fetch := func(port string) string {
		return `curl -sS --noproxy '' --proxy "$HTTP_PROXY" http://127.0.0.1:` + port + `/; echo`
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	closedPort := func() string { u, _ := url.Parse(closed.URL); return u.Port() }()
	closed.Close()

	t.Run("HTTP", func(t *testing.T) {
		id := session(t, d)
		runs(t, d, id, fetch(u.Port()), "reached\n")
		r := d.call(acmeToken, id, "bash", map[string]any{"command": fetch(closedPort)})
		if out, _ := r.StructuredContent["output"].(string); !strings.Contains(out, "127.0.0.1:"+closedPort+" refused") || !strings.Contains(out, "egress.allow") {
			t.Errorf("a port the configuration does not list: %q", out)
		}
	})
	t.Run("MCP", func(t *testing.T) {
		ctx := context.Background()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "integration", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint:   d.url + "/mcp?grant=shell.exec&always=shell",
			HTTPClient: &http.Client{Transport: bearer(acmeToken)},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": fetch(u.Port())}})
		if err != nil || res.IsError {
			t.Fatalf("bash over /mcp: %v %+v", err, res)
		}
		if out := res.StructuredContent.(map[string]any)["output"]; out != "reached\n" {
			t.Errorf("through the proxy over /mcp: %q", out)
		}
	})
	t.Run("NarrowedToNothing", func(t *testing.T) {
		var s struct{ ID string }
		st := everything
		st.Egress = []string{}
		d.do(acmeToken, "POST", "/v1/sessions", st, http.StatusCreated, &s)
		defer d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)
		runs(t, d, s.ID, `echo "${HTTP_PROXY-no proxy}"`, "no proxy\n")
		wide := everything
		wide.Egress = []string{"127.0.0.1:" + closedPort}
		if body := string(d.do(acmeToken, "POST", "/v1/sessions", wide, http.StatusForbidden, nil)); !strings.Contains(body, "egress") {
			t.Errorf("a session widening egress: %s", body)
		}
	})
	t.Run("CLI", func(t *testing.T) {
		cli := func(args ...string) (string, error) {
			cmd := exec.Command(filepath.Join(binDir, "sandboxd"), args...)
			cmd.Env = append(cmd.Environ(), "SANDBOXD_URL="+d.url, "SANDBOXD_TOKEN="+acmeToken)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := cli("session", "create", "--egress", "127.0.0.1:"+closedPort); err == nil || !strings.Contains(out, "egress") {
			t.Errorf("session create --egress past the daemon's: %v\n%s", err, out)
		}
		out, err := cli("session", "create", "--grant", "shell.exec", "--always", "shell", "--egress", "")
		if err != nil {
			t.Fatalf("session create --egress '': %v\n%s", err, out)
		}
		id := strings.TrimSpace(out)
		defer cli("session", "rm", id)
		if out, err := cli("session", "call", id, "bash", `{"command":"echo ${HTTP_PROXY-none}"}`); err != nil || !strings.Contains(out, "none") {
			t.Errorf("a session created with --egress '': %v\n%s", err, out)
		}
	})
	t.Run("Audited", func(t *testing.T) {
		metrics := string(d.do(metricsToken, "GET", "/metrics", nil, http.StatusOK, nil))
		if !strings.Contains(metrics, `sandboxd_egress_connections_total{outcome="refused"} 1`) || !strings.Contains(metrics, `sandboxd_egress_connections_total{outcome="ok"}`) {
			t.Errorf("/metrics:\n%s", metrics)
		}
		if log := d.stderr.String(); !strings.Contains(log, "egress") || !strings.Contains(log, "127.0.0.1:"+u.Port()) {
			t.Errorf("no audit line for the connection in the daemon's log:\n%s", log)
		}
	})
}

// TestServeEgressWarnsOffDocker: on the memory backend, whose commands use
// the host's network, an egress section is said at start not to bound them.
func TestServeEgressWarnsOffDocker(t *testing.T) {
	file := config(t, "memory", daemonName(t))
	var cfg map[string]any
	data, _ := os.ReadFile(file)
	json.Unmarshal(data, &cfg)
	cfg["egress"] = map[string]any{"allow": []string{"go"}}
	data, _ = json.Marshal(cfg)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, file)
	// Logged before the daemon says it listens; its standard error is
	// copied on, so wait for it a while.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(d.stderr.String(), "egress applies to the docker and kubernetes backends only"); {
		if time.Now().After(deadline) {
			t.Fatalf("no warning that egress does not bound the memory backend:\n%s", d.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
