package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
)

// TestSnapshotsAPI: snapshot, list, restore, fork, delete over HTTP, each
// refusal with its status and kind, another tenant's 404, the metrics.
func TestSnapshotsAPI(t *testing.T) {
	dir := t.TempDir()
	st, err := snapshot.Open(dir, snapshot.WithSync(false), snapshot.WithLimits(snapshot.Limits{Count: 2}))
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, config{runner: []runner.Option{runner.WithSnapshots(st)}})
	src := e.create(acmeToken, runner.Settings{Grants: []string{"fs.write"}, Always: []string{"read", "edit"}})
	e.json(acmeToken, "POST", "/v1/sessions/"+src.ID+"/tools/write", map[string]any{"arguments": map[string]any{"path": "a/b.txt", "content": "hello"}}, http.StatusOK, nil)

	status, body, h := e.do(acmeToken, "POST", "/v1/sessions/"+src.ID+"/snapshots", nil)
	if status != http.StatusCreated || !strings.HasPrefix(h.Get("Location"), "/v1/snapshots/snap-") {
		t.Fatalf("snapshot: %d %s %v", status, body, h)
	}
	var info snapshot.Info
	e.json(acmeToken, "GET", h.Get("Location"), nil, http.StatusOK, &info)
	if info.Files != 1 || info.Bytes != 5 || info.Session != src.ID {
		t.Errorf("snapshot %+v", info)
	}
	var list httpapi.SnapshotList
	e.json(acmeToken, "GET", "/v1/snapshots", nil, http.StatusOK, &list)
	if len(list.Snapshots) != 1 || list.Usage.Count != 1 || list.Limits.Count != 2 {
		t.Errorf("list %+v", list)
	}
	// Another tenant: nothing.
	e.json(boltToken, "GET", "/v1/snapshots", nil, http.StatusOK, &list)
	if len(list.Snapshots) != 0 {
		t.Errorf("bolt lists %+v", list)
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/snapshots/" + info.ID}, {"DELETE", "/v1/snapshots/" + info.ID},
		{"POST", "/v1/sessions/" + src.ID + "/snapshots"}, {"POST", "/v1/sessions/" + src.ID + "/fork"},
	} {
		if status, body, _ := e.do(boltToken, r.method, r.path, strings.NewReader(`{"count":1}`)); status != http.StatusNotFound {
			t.Errorf("bolt %s %s: %d %s", r.method, r.path, status, body)
		}
	}
	if status, body, _ := e.do(boltToken, "POST", "/v1/sessions", strings.NewReader(`{"snapshot":"`+info.ID+`"}`)); status != http.StatusNotFound {
		t.Errorf("bolt restores acme's: %d %s", status, body)
	}

	restored := e.create(acmeToken, runner.Settings{Snapshot: info.ID, Always: []string{"read"}})
	var res struct{ Content []struct{ Text string } }
	e.json(acmeToken, "POST", "/v1/sessions/"+restored.ID+"/tools/read", map[string]any{"arguments": map[string]any{"path": "a/b.txt"}}, http.StatusOK, &res)
	if len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, "hello") {
		t.Errorf("restored read %+v", res)
	}
	var forks httpapi.ForkResult
	e.json(acmeToken, "POST", "/v1/sessions/"+src.ID+"/fork", map[string]any{"count": 2, "settings": map[string]any{"always": []string{"read"}}}, http.StatusCreated, &forks)
	if len(forks.Sessions) != 2 || forks.Sessions[0].ForkOf != src.ID || len(forks.Sessions[1].Settings.Always) != 1 {
		t.Errorf("forks %+v", forks)
	}
	for _, bad := range []string{`{"count":0}`, `{"count":1,"settings":{"snapshot":"x"}}`, `{"count":1,"settings":{"nonesuch":1}}`} {
		if status, body, _ := e.do(acmeToken, "POST", "/v1/sessions/"+src.ID+"/fork", strings.NewReader(bad)); status != http.StatusBadRequest {
			t.Errorf("fork %s: %d %s", bad, status, body)
		}
	}

	// The cap: a second is made, a third refused.
	e.json(acmeToken, "POST", "/v1/sessions/"+src.ID+"/snapshots", nil, http.StatusCreated, nil)
	if status, body, _ := e.do(acmeToken, "POST", "/v1/sessions/"+src.ID+"/snapshots", nil); status != http.StatusInsufficientStorage || !strings.Contains(string(body), `"SnapshotLimit"`) {
		t.Errorf("over the cap: %d %s", status, body)
	}
	// A damaged one is refused, 422.
	packs, _ := filepath.Glob(filepath.Join(dir, "tenants", "*", info.ID, "data.tar"))
	os.Truncate(packs[0], 700)
	if status, body, _ := e.do(acmeToken, "POST", "/v1/sessions", strings.NewReader(`{"snapshot":"`+info.ID+`"}`)); status != http.StatusUnprocessableEntity || !strings.Contains(string(body), `"SnapshotCorrupt"`) {
		t.Errorf("damaged: %d %s", status, body)
	}
	e.json(acmeToken, "DELETE", "/v1/snapshots/"+info.ID, nil, http.StatusNoContent, nil)
	e.json(acmeToken, "GET", "/v1/snapshots/"+info.ID, nil, http.StatusNotFound, nil)
	var tl httpapi.TemplateList
	e.json(acmeToken, "GET", "/v1/templates", nil, http.StatusOK, &tl)

	_, metrics, _ := e.do(scraperToken, "GET", "/metrics", nil)
	for _, want := range []string{
		"sandboxd_snapshots 1\n", "sandboxd_snapshots_bytes ",
		`sandboxd_snapshot_operations_total{op="snapshot",outcome="ok"} 2`,
		`sandboxd_snapshot_operations_total{op="snapshot",outcome="limit"} 1`,
		`sandboxd_snapshot_operations_total{op="restore",outcome="corrupt"} 1`,
		`sandboxd_snapshot_operations_total{op="fork",outcome="ok"} 1`,
		`sandboxd_tool_calls_total{tool="snapshot",outcome="ok"}`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestSnapshotsOff: a daemon without a store says so, 501.
func TestSnapshotsOff(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, runner.Settings{})
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/sessions/" + s.ID + "/snapshots", ""}, {"GET", "/v1/snapshots", ""},
		{"POST", "/v1/sessions", `{"snapshot":"snap-x"}`}, {"POST", "/v1/sessions/" + s.ID + "/fork", `{"count":1}`},
	} {
		if status, body, _ := e.do(acmeToken, r.method, r.path, strings.NewReader(r.body)); status != http.StatusNotImplemented || !strings.Contains(string(body), "snapshots.dir") {
			t.Errorf("%s %s: %d %s", r.method, r.path, status, body)
		}
	}
}

// TestPauseOff: a backend that cannot pause (memory) answers 501 PauseOff
// to a pause, and the session runs on; a resume of a running session
// answers it as it is; another tenant's session is 404.
func TestPauseOff(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, runner.Settings{})
	status, body, _ := e.do(acmeToken, "POST", "/v1/sessions/"+s.ID+"/pause", nil)
	if status != http.StatusNotImplemented || !strings.Contains(string(body), `"PauseOff"`) {
		t.Fatalf("pause on memory: %d %s", status, body)
	}
	status, body, _ = e.do(acmeToken, "POST", "/v1/sessions/"+s.ID+"/resume", nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"state":"running"`) {
		t.Fatalf("resume of a running session: %d %s", status, body)
	}
	if status, body, _ := e.do(boltToken, "POST", "/v1/sessions/"+s.ID+"/pause", nil); status != http.StatusNotFound {
		t.Fatalf("another tenant's pause: %d %s", status, body)
	}
}

// pausable is the local backend with Instance.Pause: a paused workspace
// keeps its directory (nothing of the host's to stop), and its Resume
// gives the same workspace back; it counts both.
type pausable struct {
	*local.Backend
	paused, resumed atomic.Int32
}

func (b *pausable) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.Backend.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	inst.Pause = func(context.Context) (*backend.Paused, error) {
		b.paused.Add(1)
		return &backend.Paused{ID: inst.ID, Root: inst.Root, Close: inst.Close, Resume: func(context.Context) (*backend.Instance, error) {
			b.resumed.Add(1)
			return inst, nil
		}}, nil
	}
	return inst, nil
}

// TestPausedCalls: a call to a paused session answers 409 Paused, its
// message naming POST …/resume and sessions.autoResume, and GET says
// paused; after POST …/resume the call succeeds. With autoResume the call
// itself resumes the session, and succeeds.
func TestPausedCalls(t *testing.T) {
	for _, auto := range []bool{false, true} {
		t.Run(fmt.Sprintf("autoResume=%v", auto), func(t *testing.T) {
			b := &pausable{Backend: &local.Backend{Dir: t.TempDir()}}
			e := start(t, config{backend: b, runner: []runner.Option{runner.WithAutoResume(auto)}})
			s := e.create(acmeToken, runner.Settings{Grants: []string{"fs.write"}, Always: []string{"read", "edit"}})
			e.json(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/write", map[string]any{"arguments": map[string]any{"path": "f.txt", "content": "kept"}}, http.StatusOK, nil)
			var in runner.Info
			e.json(acmeToken, "POST", "/v1/sessions/"+s.ID+"/pause", nil, http.StatusOK, &in)
			if in.State != runner.StatePaused || b.paused.Load() != 1 {
				t.Fatalf("paused as %+v (%d pauses)", in, b.paused.Load())
			}
			read := func() (int, []byte) {
				status, body, _ := e.do(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/read", strings.NewReader(`{"arguments":{"path":"f.txt"}}`))
				return status, body
			}
			status, body := read()
			if auto {
				if status != http.StatusOK || !strings.Contains(string(body), "kept") || b.resumed.Load() != 1 {
					t.Fatalf("a call to a paused session with autoResume: %d %s (%d resumes)", status, body, b.resumed.Load())
				}
				e.json(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &in)
				if in.State != runner.StateRunning {
					t.Fatalf("after the call that resumed it: %+v", in)
				}
				return
			}
			var eb struct{ Error, Message string }
			if err := json.Unmarshal(body, &eb); status != http.StatusConflict || err != nil || eb.Error != "Paused" ||
				!strings.Contains(eb.Message, "POST /v1/sessions/"+s.ID+"/resume") || !strings.Contains(eb.Message, "sessions.autoResume") {
				t.Fatalf("a call to a paused session: %d %s, want 409 Paused naming resume and sessions.autoResume", status, body)
			}
			e.json(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &in)
			if in.State != runner.StatePaused || b.resumed.Load() != 0 {
				t.Fatalf("the paused session after a call: %+v (%d resumes)", in, b.resumed.Load())
			}
			e.json(acmeToken, "POST", "/v1/sessions/"+s.ID+"/resume", nil, http.StatusOK, &in)
			if status, body := read(); in.State != runner.StateRunning || status != http.StatusOK || !strings.Contains(string(body), "kept") {
				t.Fatalf("a call after the resume: %d %s (%+v)", status, body, in)
			}
		})
	}
}
