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
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
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
	e := newSecondEngine(t)
	dir, sock, cli := e.dir, e.sock, e.cli
	startEngine, stopEngine := e.start, e.stop

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

// secondEngine is a dockerd of the test's own, with empty data, on a
// socket of its own; it needs root, and runs under CI (which fails
// without root) or with SANDBOXD_FRESH_ENGINE=1.
type secondEngine struct {
	t               *testing.T
	dir, conf, sock string
	cli             *client.Client
	log             *syncBuffer
	cmd             *exec.Cmd
}

// newSecondEngine starts a second engine, stopped at the test's end.
func newSecondEngine(t *testing.T) *secondEngine {
	t.Helper()
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
	e := &secondEngine{t: t, dir: dir, conf: filepath.Join(dir, "daemon.json"), sock: filepath.Join(dir, "docker.sock"), log: &syncBuffer{}}
	e.configure("{}")
	if e.cli, err = client.New(client.WithHost("unix://" + e.sock)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.cli.Close() })
	e.start()
	t.Cleanup(func() {
		if e.cmd.ProcessState == nil {
			e.stop()
		}
	})
	return e
}

// configure writes the engine's daemon.json, which its next start reads.
func (e *secondEngine) configure(conf string) {
	e.t.Helper()
	if err := os.WriteFile(e.conf, []byte(conf), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *secondEngine) start() {
	e.t.Helper()
	e.cmd = exec.Command("dockerd", "--config-file", e.conf, "--data-root", filepath.Join(e.dir, "data"),
		"--exec-root", filepath.Join(e.dir, "exec"), "--pidfile", filepath.Join(e.dir, "pid"), "--host", "unix://"+e.sock,
		"--bridge", "none", "--iptables=false", "--ip6tables=false", "--storage-driver", "vfs")
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	if err := e.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, err := e.cli.Ping(context.Background(), client.PingOptions{NegotiateAPIVersion: true}); err == nil {
			break
		} else if time.Now().After(deadline) {
			e.t.Fatalf("the second engine did not start: %v\n%s", err, e.log)
		}
	}
}

func (e *secondEngine) stop() {
	e.cmd.Process.Signal(os.Interrupt)
	e.cmd.Wait()
}

// TestServeKilledAcrossEngineRestart: `sandboxd serve` killed with SIGKILL,
// then the engine restarted while no daemon runs, then the daemon started
// again. Without live-restore the session's container stopped with the
// engine: the daemon's next start removes it, its volume and its record,
// answers 404 for it and starts new sessions. With the engine's
// live-restore the container ran on through the engine's restart: the
// same session ID answers, with its file, and its background command's
// output has the lines written while neither the daemon nor the engine
// ran.
func TestServeKilledAcrossEngineRestart(t *testing.T) {
	e := newSecondEngine(t)
	ref := dockertest.Image(t) // on the host's engine: copied, not built
	saved, err := dockertest.Client(t).ImageSave(t.Context(), []string{ref})
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := e.cli.ImageLoad(t.Context(), saved)
	if err == nil {
		_, err = io.Copy(io.Discard, loaded)
		loaded.Close()
	}
	saved.Close()
	if err != nil {
		t.Fatalf("loading %s into the second engine: %v", ref, err)
	}
	name := daemonName(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	file := config(t, "docker", name, func(cfg map[string]any) {
		cfg["endSessionsOnExit"] = false
		cfg["stateDir"] = stateDir
	})
	env := "DOCKER_HOST=unix://" + e.sock
	restart := func(d *daemon) *daemon {
		t.Helper()
		d.kill()
		e.stop()
		e.start()
		return start(t, file, env)
	}
	record := func(id string) string {
		return filepath.Join(stateDir, "docker", "daemon-"+name, id+".json")
	}

	t.Run("stopped", func(t *testing.T) {
		d := start(t, file, env)
		s, _ := countingSession(t, d, dockertest.Counting)
		if _, err := os.Stat(record(s.ID)); err != nil {
			t.Fatalf("the session's record: %v", err)
		}
		d = restart(d)
		defer d.stop()
		d.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusNotFound, nil)
		if _, err := os.Stat(record(s.ID)); err == nil {
			t.Errorf("the record of the session whose container stopped is left")
		}
		f := make(client.Filters).Add("label", policy.LabelSession+"="+s.ID)
		if cs, err := e.cli.ContainerList(t.Context(), client.ContainerListOptions{All: true, Filters: f}); err != nil || len(cs.Items) != 0 {
			t.Errorf("the stopped session's containers after the daemon's start: %v %v", err, cs.Items)
		}
		if vs, err := e.cli.VolumeList(t.Context(), client.VolumeListOptions{Filters: f}); err != nil || len(vs.Items) != 0 {
			t.Errorf("the stopped session's volumes after the daemon's start: %v %v", err, vs.Items)
		}
		var again runner.Info
		d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &again)
		runs(t, d, again.ID, "echo back", "back\n")
		d.do(acmeToken, "DELETE", "/v1/sessions/"+again.ID, nil, http.StatusNoContent, nil)
	})

	t.Run("live-restore", func(t *testing.T) {
		e.stop()
		e.configure(`{"live-restore": true}`)
		e.start()
		// A container left would outlive the engine's stop, live-restore
		// keeping it: whatever this part leaves is removed first.
		t.Cleanup(func() {
			cs, _ := e.cli.ContainerList(context.Background(), client.ContainerListOptions{All: true})
			for _, c := range cs.Items {
				e.cli.ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
			}
		})
		d := start(t, file, env)
		s, bg := countingSession(t, d, dockertest.Counting)
		before := 0
		for before < 3 {
			before = max(before, dockertest.LastTick(bgOutput(t, d, s.ID, bg, 0.5)))
		}
		d.kill()
		e.stop()
		e.start()
		meanwhile := countsOn(t, e.cli, s.Workspace, before) // the engine back, the daemon not yet
		d = start(t, file, env)
		defer d.stop()
		var back runner.Info
		d.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &back)
		if r := d.call(acmeToken, s.ID, "read", map[string]any{"path": "kept.txt"}); r.IsError || !strings.Contains(r.Content[0].Text, "kept") {
			t.Fatalf("its file after the restarts: %+v", r)
		}
		if out := bgOutput(t, d, s.ID, bg, 0.5); !strings.Contains(out, fmt.Sprintf("tick %d\n", meanwhile)) {
			t.Fatalf("bash_output %q lacks tick %d, written while no daemon ran", out, meanwhile)
		}
		d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)
	})
	if t.Failed() {
		t.Logf("the engine's log:\n%s", e.log)
	}
}
