package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/policy"
)

// TestServeOnFreshEngine is `sandboxd serve` on a machine that has Docker
// and nothing else: a second engine with empty data, and an empty image
// build cache. serve, told to (buildMissing), must build the default image
// (saying so; without it serve refuses to start, TestServeBuildsMissingImage), listen, and
// run a session's commands in a container; after SIGTERM nothing is left.
// The engine is then restarted under the running session: the session
// either ended with its container (410 SessionEnded, saying so) or works,
// and new sessions start once the engine is back.
//
// It starts its own dockerd, so it needs root; it runs under CI (which
// fails without root) or with SANDBOXD_FRESH_ENGINE=1.
func TestServeOnFreshEngine(t *testing.T) {
	if os.Getenv("SANDBOXD_FRESH_ENGINE") == "" && os.Getenv("CI") == "" {
		t.Skip("starts a second dockerd (needs root): set SANDBOXD_FRESH_ENGINE=1")
	}
	if os.Geteuid() != 0 {
		t.Fatal("a second dockerd needs root: run as root, or unset CI and SANDBOXD_FRESH_ENGINE")
	}
	dir, err := os.MkdirTemp("", "sbx-fresh-") // short: a unix socket lives here
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(conf, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "docker.sock")
	cli, err := client.New(client.WithHost("unix://" + sock))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	engineLog := &syncBuffer{}
	var engine *exec.Cmd
	startEngine := func() {
		t.Helper()
		engine = exec.Command("dockerd", "--config-file", conf, "--data-root", filepath.Join(dir, "data"),
			"--exec-root", filepath.Join(dir, "exec"), "--pidfile", filepath.Join(dir, "pid"), "--host", "unix://"+sock,
			"--bridge", "none", "--iptables=false", "--ip6tables=false", "--storage-driver", "vfs")
		engine.Stdout, engine.Stderr = engineLog, engineLog
		if err := engine.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if _, err := cli.Ping(context.Background(), client.PingOptions{NegotiateAPIVersion: true}); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("the second engine did not start: %v\n%s", err, engineLog)
			}
		}
	}
	stopEngine := func() {
		engine.Process.Signal(os.Interrupt)
		engine.Wait()
	}
	startEngine()
	t.Cleanup(func() { stopEngine() })

	buildMissing := func(cfg map[string]any) { cfg["buildMissing"] = true }
	d := start(t, config(t, "docker", daemonName(t), buildMissing), "DOCKER_HOST=unix://"+sock, "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
	for _, want := range []string{"is not built yet; building it now", "importing", "built sandboxd/minimal:"} {
		if !strings.Contains(d.stderr.String(), want) {
			t.Errorf("serve's progress lacks %q:\n%s", want, d.stderr)
		}
	}
	var info struct{ ID, Backend string }
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &info)
	r := d.call(acmeToken, info.ID, "bash", map[string]any{"command": "id -u; hostname"})
	uid, host, _ := strings.Cut(fmt.Sprint(r.StructuredContent["output"]), "\n")
	if n, _ := strconv.Atoi(uid); info.Backend != "docker" || r.IsError || host != "sandbox\n" || !policy.DefaultSessionUIDs.Contains(n) {
		t.Fatalf("session %+v, bash %+v", info, r)
	}

	// The engine restarts under the session (no live-restore: its
	// container dies with it).
	stopEngine()
	startEngine()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := d.request(acmeToken, "POST", "/v1/sessions/"+info.ID+"/tools/bash", strings.NewReader(`{"arguments":{"command":"echo alive"}}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if bytes.Contains(body, []byte("alive")) || (resp.StatusCode == http.StatusGone && bytes.Contains(body, []byte("SessionEnded"))) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the engine restarted, the session neither works nor ended: %d %s", resp.StatusCode, body)
		}
	}
	if resp, err := d.request(acmeToken, "DELETE", "/v1/sessions/"+info.ID, nil); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusGone {
		t.Fatalf("deleting the session after the restart: %d", resp.StatusCode)
	}
	var again struct{ ID string }
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &again)
	if r := d.call(acmeToken, again.ID, "bash", map[string]any{"command": "echo back"}); r.IsError || r.StructuredContent["output"] != "back\n" {
		t.Fatalf("a new session after the engine restarted: %+v", r)
	}

	d.stop()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		t.Errorf("left on the engine after SIGTERM: %s %v (%s, %s), labels %v", c.ID[:12], c.Names, c.State, c.Status, c.Labels)
	}
	if t.Failed() {
		t.Logf("serve's log:\n%s", d.stderr)
	}
}
