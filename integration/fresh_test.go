package integration

import (
	"context"
	"fmt"
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
// build cache. serve must build the default image (saying so), listen, and
// run a session's commands in a container; after SIGTERM nothing is left.
// It starts its own dockerd, so it needs root: set SANDBOXD_FRESH_ENGINE=1.
func TestServeOnFreshEngine(t *testing.T) {
	if os.Getenv("SANDBOXD_FRESH_ENGINE") == "" {
		t.Skip("starts a second dockerd (needs root): set SANDBOXD_FRESH_ENGINE=1")
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
	engine := exec.Command("dockerd", "--config-file", conf, "--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"), "--pidfile", filepath.Join(dir, "pid"), "--host", "unix://"+sock,
		"--bridge", "none", "--iptables=false", "--ip6tables=false", "--storage-driver", "vfs")
	engineLog := &syncBuffer{}
	engine.Stdout, engine.Stderr = engineLog, engineLog
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		engine.Process.Signal(os.Interrupt)
		engine.Wait()
	})
	cli, err := client.New(client.WithHost("unix://" + sock))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, err := cli.Ping(context.Background(), client.PingOptions{NegotiateAPIVersion: true}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the second engine did not start: %v\n%s", err, engineLog)
		}
	}

	d := start(t, config(t, "docker", daemonName(t)), "DOCKER_HOST=unix://"+sock, "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
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
	d.stop()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("%d containers left on the engine after SIGTERM", len(list.Items))
	}
}
