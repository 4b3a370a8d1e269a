package e2b_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/e2b"
	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
)

// pauseBackend is the memory backend with workspaces that pause: a pause
// keeps the workspace as it is (its files in memory) and a resume hands
// it back as a new instance, as Docker stops and starts a container. It
// counts both.
type pauseBackend struct {
	memory.Backend
	pauses, resumes *atomic.Int32
}

func newPauseBackend(t *testing.T) pauseBackend {
	return pauseBackend{Backend: memory.Backend{TempDir: t.TempDir()}, pauses: new(atomic.Int32), resumes: new(atomic.Int32)}
}

func (b pauseBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.Backend.Open(ctx, spec)
	if err == nil {
		pausable(inst, b.pauses, b.resumes)
	}
	return inst, err
}

// pausable makes inst pause as pauseBackend's do, counting its pauses
// and resumes.
func pausable(inst *backend.Instance, pauses, resumes *atomic.Int32) {
	ws := *inst
	inst.Pause = func(context.Context) (*backend.Paused, error) {
		pauses.Add(1)
		return &backend.Paused{ID: ws.ID, Root: ws.Root, Close: ws.Close,
			Resume: func(context.Context) (*backend.Instance, error) {
				resumes.Add(1)
				next := ws
				pausable(&next, pauses, resumes)
				return &next, nil
			}}, nil
	}
}

// pauseDialBackend is dialBackend with workspaces that pause.
type pauseDialBackend struct {
	dialBackend
	pauses, resumes *atomic.Int32
}

func (b pauseDialBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.dialBackend.Open(ctx, spec)
	if err == nil {
		pausable(inst, b.pauses, b.resumes)
	}
	return inst, err
}

// TestPortsAcrossPause: a paused sandbox's ports answer 502 naming the
// pause; resumed, they are served again, with the same traffic token.
func TestPortsAcrossPause(t *testing.T) {
	b := pauseDialBackend{dialBackend: newDialBackend(t), pauses: new(atomic.Int32), resumes: new(atomic.Int32)}
	m, srv := newServer(t, b, e2b.WithPorts(func(string) bool { return true }), e2b.WithDomain(testDomain+":443"))
	e := &env{t: t, url: serveHTTP(t, srv), m: m}
	ports := httptest.NewServer(srv.Ports())
	t.Cleanup(ports.Close)
	c := e.create("acme-key", `{"templateID":"base","timeout":300,"network":{"allowPublicTraffic":false}}`)
	port := program(t)
	get := func() (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", ports.URL+"/x", nil)
		req.Host = fmt.Sprintf("%d-%s.%s:443", port, c.SandboxID, testDomain)
		req.Header.Set(e2b.TrafficTokenHeader, c.TrafficToken)
		return send(t, req)
	}
	if st, body := get(); st != http.StatusOK {
		t.Fatalf("before the pause: %d %s", st, body)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d", st)
	}
	if st, body := get(); st != http.StatusBadGateway || !strings.Contains(body, "paused") {
		t.Fatalf("while paused: %d %s", st, body)
	}
	var back created
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/connect", `{"timeout":60}`, &back); st != http.StatusCreated || back.TrafficToken != c.TrafficToken {
		t.Fatalf("connect: %d %+v", st, back)
	}
	if st, body := get(); st != http.StatusOK || !strings.Contains(body, "hello from /x") {
		t.Fatalf("after the resume: %d %s", st, body)
	}
}

// described is E2B's SandboxDetail, as far as the tests read it.
type described struct {
	SandboxID       string            `json:"sandboxID"`
	State           string            `json:"state"`
	EndAt           time.Time         `json:"endAt"`
	Metadata        map[string]string `json:"metadata"`
	EnvdAccessToken string            `json:"envdAccessToken"`
	Code            int               `json:"code"`
	Message         string            `json:"message"`
}

// envdStatus is the status of GET /health of c's sandbox, as the SDK's
// is_running asks it.
func (e *env) envdStatus(c created) int {
	e.t.Helper()
	res, err := e.envd(c).Get(e.url + "/health")
	if err != nil {
		e.t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// listIDs is the IDs GET /v2/sandboxes answers the query with, in order.
func (e *env) listIDs(key, query string) []string {
	e.t.Helper()
	var listed []described
	if st := e.api(key, "GET", "/v2/sandboxes?"+query, "", &listed); st != http.StatusOK {
		e.t.Fatalf("list %s: %d", query, st)
	}
	var ids []string
	for _, d := range listed {
		ids = append(ids, d.SandboxID+":"+d.State)
	}
	return ids
}

// TestPauseResume: a sandbox pauses (its workspace paused through the
// runner), is listed, got and refused as paused, and comes back through
// connect with its files, env vars, metadata and access token; pausing it
// twice is 409, a missing or another tenant's sandbox 404, and kill ends a
// paused one.
func TestPauseResume(t *testing.T) {
	pb := newPauseBackend(t)
	e := startOn(t, pb)
	c := e.create("acme-key", `{"templateID":"base","secure":true,"timeout":300,"metadata":{"app":"one"},"envVars":{"GREETING":"hello"}}`)
	running := e.create("acme-key", `{"templateID":"base","metadata":{"app":"one"}}`)
	pc := processconnect.NewProcessClient(e.envd(c), e.url)
	if _, _, _, _, err := run(t, pc, "echo kept > note.txt", false); err != nil {
		t.Fatal(err)
	}

	var d described
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", &d); st != http.StatusNoContent {
		t.Fatalf("pause: %d %+v", st, d)
	}
	if pb.pauses.Load() != 1 {
		t.Fatalf("the workspace was paused %d times", pb.pauses.Load())
	}
	if st := e.envdStatus(c); st != http.StatusBadGateway {
		t.Fatalf("envd of a paused sandbox: %d, want 502 (is_running false)", st)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", &d); st != http.StatusConflict || d.Code != 409 {
		t.Fatalf("pausing it again: %d %+v", st, d)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":60}`, &d); st != http.StatusConflict || !strings.Contains(d.Message, "connect") {
		t.Fatalf("timeout of a paused sandbox: %d %+v", st, d)
	}
	if st := e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); st != http.StatusOK || d.State != "paused" || d.Metadata["app"] != "one" {
		t.Fatalf("get of a paused sandbox: %d %+v", st, d)
	}
	// Paused, its timeout does not run: it is kept for as long as the
	// operator's maximum lifetime allows (24 h here; E2B's 30 days).
	if left := time.Until(d.EndAt); left < 23*time.Hour {
		t.Fatalf("a paused sandbox ends in %v: its timeout ran on", left)
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"metadata=app%3Done", []string{running.SandboxID + ":running", c.SandboxID + ":paused"}},
		{"metadata=app%3Done&state=paused", []string{c.SandboxID + ":paused"}},
		{"metadata=app%3Done&state=running", []string{running.SandboxID + ":running"}},
		{"metadata=app%3Done&state=running,paused", []string{running.SandboxID + ":running", c.SandboxID + ":paused"}},
		{"metadata=app%3Done&state=paused&limit=1", []string{c.SandboxID + ":paused"}},
	} {
		if got := e.listIDs("acme-key", tc.query); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("list %s: %v, want %v", tc.query, got, tc.want)
		}
	}
	var v1 []described // GET /sandboxes lists the running ones, as E2B's
	if e.api("acme-key", "GET", "/sandboxes?metadata=app%3Done", "", &v1); len(v1) != 1 || v1[0].SandboxID != running.SandboxID {
		t.Errorf("GET /sandboxes: %+v, want %s alone", v1, running.SandboxID)
	}
	if got := e.listIDs("bolt-key", "state=paused"); len(got) != 0 {
		t.Errorf("bolt lists acme's paused sandbox: %v", got)
	}
	for _, tc := range []struct{ key, path string }{
		{"acme-key", "/sandboxes/nope/pause"},
		{"bolt-key", "/sandboxes/" + c.SandboxID + "/pause"},
		{"bolt-key", "/sandboxes/" + c.SandboxID + "/connect"},
		{"acme-key", "/sandboxes/nope/resume"},
	} {
		if st := e.api(tc.key, "POST", tc.path, `{"timeout":10}`, &d); st != http.StatusNotFound {
			t.Errorf("%s %s: %d %+v, want 404", tc.key, tc.path, st, d)
		}
	}

	var back described
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/connect", `{"timeout":60}`, &back); st != http.StatusCreated || back.EnvdAccessToken != c.EnvdAccessToken {
		t.Fatalf("connect of a paused sandbox: %d %+v (token %q)", st, back, c.EnvdAccessToken)
	}
	if pb.resumes.Load() != 1 {
		t.Fatalf("the workspace was resumed %d times", pb.resumes.Load())
	}
	if st := e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); st != http.StatusOK || d.State != "running" || d.Metadata["app"] != "one" {
		t.Fatalf("get of the resumed sandbox: %d %+v", st, d)
	}
	if left := time.Until(d.EndAt); left > time.Minute || left < 30*time.Second {
		t.Fatalf("the resumed sandbox ends in %v, want connect's 60 s", left)
	}
	if st := e.envdStatus(c); st != http.StatusNoContent {
		t.Fatalf("envd of the resumed sandbox: %d", st)
	}
	if _, out, _, _, err := run(t, pc, "cat note.txt; echo $GREETING", false); err != nil || out != "kept\nhello\n" {
		t.Fatalf("after the resume: %q %v", out, err)
	}
	if st := e.envdStatus(created{SandboxID: c.SandboxID, EnvdAccessToken: "ea_wrong"}); st != http.StatusUnauthorized {
		t.Fatalf("the resumed sandbox's envd with a wrong token: %d", st)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/connect", `{"timeout":60}`, &back); st != http.StatusOK {
		t.Fatalf("connect of a running sandbox: %d %+v", st, back)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/resume", `{}`, &d); st != http.StatusConflict {
		t.Fatalf("resume of a running sandbox: %d %+v", st, d)
	}

	// The deprecated resume: 201, its timeout from now (15 s by default).
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", nil); st != http.StatusNoContent {
		t.Fatalf("second pause: %d", st)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/resume", `{"timeout":120}`, &back); st != http.StatusCreated || back.SandboxID != c.SandboxID {
		t.Fatalf("resume: %d %+v", st, back)
	}
	if e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); d.State != "running" || time.Until(d.EndAt) < time.Minute {
		t.Fatalf("after resume: %+v", d)
	}

	// Killing a paused sandbox ends it.
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", nil); st != http.StatusNoContent {
		t.Fatalf("third pause: %d", st)
	}
	if st := e.api("acme-key", "DELETE", "/sandboxes/"+c.SandboxID, "", nil); st != http.StatusNoContent {
		t.Fatalf("kill of a paused sandbox: %d", st)
	}
	for _, path := range []string{"/sandboxes/" + c.SandboxID + "/connect", "/sandboxes/" + c.SandboxID + "/pause"} {
		if st := e.api("acme-key", "POST", path, `{"timeout":10}`, nil); st != http.StatusNotFound {
			t.Errorf("%s of a killed sandbox: %d", path, st)
		}
	}
	if len(e.m.Sessions("acme")) != 1 {
		t.Fatalf("sessions left: %+v", e.m.Sessions("acme"))
	}
}

// TestPauseThroughRunner: a sandbox paused, resumed or deleted through
// the runner (sandboxd's own API) is seen so through E2B's.
func TestPauseThroughRunner(t *testing.T) {
	e := startOn(t, newPauseBackend(t))
	c := e.create("acme-key", `{"templateID":"base","secure":true,"timeout":300}`)
	ctx := context.Background()
	if _, err := e.m.Pause(ctx, "acme", c.SandboxID); err != nil {
		t.Fatal(err)
	}
	var d described
	if e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); d.State != "paused" {
		t.Fatalf("paused through the runner: %+v", d)
	}
	if _, err := e.m.Resume(ctx, "acme", c.SandboxID); err != nil {
		t.Fatal(err)
	}
	if e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); d.State != "running" {
		t.Fatalf("resumed through the runner: %+v", d)
	}
	if _, out, _, _, err := run(t, processconnect.NewProcessClient(e.envd(c), e.url), "echo ok", false); err != nil || out != "ok\n" {
		t.Fatalf("envd after a resume through the runner: %q %v", out, err)
	}
	if _, err := e.m.Pause(ctx, "acme", c.SandboxID); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Delete(ctx, "acme", c.SandboxID); err != nil {
		t.Fatal(err)
	}
	if st := e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); st != http.StatusNotFound {
		t.Fatalf("deleted while paused, through the runner: %d %+v", st, d)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/connect", `{"timeout":10}`, nil); st != http.StatusNotFound {
		t.Fatalf("connect of a sandbox deleted while paused: %d", st)
	}
}

// TestAutoPause: an autoPause sandbox's timeout pauses it; connect
// resumes it with a new timeout, which pauses it again.
func TestAutoPause(t *testing.T) {
	e := startOn(t, newPauseBackend(t))
	c := e.create("acme-key", `{"templateID":"base","autoPause":true,"timeout":1}`)
	paused := func() bool {
		var d described
		if st := e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); st != http.StatusOK {
			t.Fatalf("get: %d %+v", st, d)
		}
		return d.State == "paused"
	}
	waitFor(t, "the timeout to pause it", paused)
	var d described
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/connect", `{"timeout":3600}`, &d); st != http.StatusCreated {
		t.Fatalf("connect: %d %+v", st, d)
	}
	if e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); d.State != "running" || time.Until(d.EndAt) < 50*time.Minute {
		t.Fatalf("after connect: %+v", d)
	}
	if info, _ := e.m.Describe("acme", c.SandboxID); info.ExpiresAt == nil || info.ExpiresAt.Before(d.EndAt) {
		t.Fatalf("the session ends at %v, before the sandbox's timeout %v pauses it", info.ExpiresAt, d.EndAt)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":1}`, nil); st != http.StatusNoContent {
		t.Fatalf("timeout: %d", st)
	}
	waitFor(t, "the new timeout to pause it", paused)
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/resume", `{"autoPause":false}`, &d); st != http.StatusNotImplemented {
		t.Fatalf("resume turning autoPause off: %d %+v", st, d)
	}
}

// waitFor waits until cond holds, for a minute at most.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// TestPauseNotSupported: where the backend cannot pause (local), pause
// and autoPause are E2B's error, 501 "not supported by this server", and
// nothing is left of a refused creation.
func TestPauseNotSupported(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base"}`)
	var d described
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", &d); st != http.StatusNotImplemented || d.Code != 501 || !strings.Contains(d.Message, "not supported by this server") {
		t.Fatalf("pause on local: %d %+v", st, d)
	}
	if e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", &d); d.State != "running" {
		t.Fatalf("after a refused pause: %+v", d)
	}
	if st := e.api("acme-key", "POST", "/sandboxes", `{"templateID":"base","autoPause":true}`, &d); st != http.StatusNotImplemented || !strings.Contains(d.Message, "not supported by this server") {
		t.Fatalf("autoPause on local: %d %+v", st, d)
	}
	if n := len(e.m.Sessions("acme")); n != 1 {
		t.Fatalf("%d sessions after a refused autoPause creation", n)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/resume", `{}`, &d); st != http.StatusConflict {
		t.Fatalf("resume of a running sandbox on local: %d %+v", st, d)
	}
}
