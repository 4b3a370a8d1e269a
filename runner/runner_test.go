package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// gateBackend is the memory backend with a scripted shell: a command named
// "wait" blocks until the gate closes or its context ends. It counts what
// it opens and closes.
type gateBackend struct {
	memory.Backend
	gate            chan struct{}
	opened, closed  atomic.Int64
	warmed          atomic.Int64
	ids             map[string]bool // instances handed out, by ID
	reapedWithLabel map[string]string
}

func newGate() *gateBackend {
	return &gateBackend{gate: make(chan struct{}), ids: map[string]bool{}}
}

func (b *gateBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	b.opened.Add(1)
	return b.wrap(b.Backend.Open(ctx, spec))
}

func (b *gateBackend) Warm(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	b.warmed.Add(1)
	return b.wrap(b.Backend.Warm(ctx, spec))
}

func (b *gateBackend) wrap(inst *backend.Instance, err error) (*backend.Instance, error) {
	if err != nil {
		return nil, err
	}
	inst.Bash = gateBash{b.gate}
	closeMem := inst.Close
	inst.Close = func(ctx context.Context) error { b.closed.Add(1); return closeMem(ctx) }
	return inst, nil
}

func (b *gateBackend) Reap(_ context.Context, labels map[string]string) (int, error) {
	b.reapedWithLabel = labels
	return 0, nil
}

type gateBash struct{ gate chan struct{} }

func (g gateBash) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	if cmd.Script == "wait" {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return workspace.Result{ExitCode: -1, Signal: "SIGKILL"}, ctx.Err()
		}
	}
	return workspace.Result{}, nil
}

var shell = runner.Settings{Grants: []string{tools.GrantShellExec}, Always: []string{"read", "shell"}}

func newManager(t *testing.T, b backend.Backend, opts ...runner.Option) *runner.Manager {
	t.Helper()
	m, err := runner.New(context.Background(), b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	return m
}

func create(t testing.TB, m *runner.Manager, tenant string, st runner.Settings) *runner.Session {
	t.Helper()
	s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: tenant, Settings: st})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startWait starts "wait" in s and returns when the call holds its slot.
func startWait(t *testing.T, s *runner.Session) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := s.Call(context.Background(), "bash", json.RawMessage(`{"command":"wait"}`), tools.CallOptions{})
		done <- err
	}()
	waitFor(t, func() bool { return s.Info().CallsInFlight > 0 })
	return done
}

// waitFor polls cond until it holds; a minute bounds it, long enough for
// a loaded machine (it returns as soon as cond holds).
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within a minute")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestTenantsSeeOnlyTheirSessions(t *testing.T) {
	m := newManager(t, memory.Backend{})
	a := create(t, m, "acme", runner.Settings{})
	b := create(t, m, "bolt", runner.Settings{})
	if got, err := m.Get("acme", a.ID()); err != nil || got != a {
		t.Fatalf("Get own: %v, %v", got, err)
	}
	if _, err := m.Get("acme", b.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("Get other tenant's: %v, want ErrNotFound", err)
	}
	if err := m.Delete(context.Background(), "acme", b.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("Delete other tenant's: %v, want ErrNotFound", err)
	}
	if l := m.List("acme"); len(l) != 1 || l[0] != a {
		t.Fatalf("List(acme) = %v", l)
	}
	if err := m.Delete(context.Background(), "acme", a.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get("acme", a.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	if !errors.Is(a.Err(), runner.ErrClosed) {
		t.Fatalf("Err after Delete = %v", a.Err())
	}
	if _, err := a.Call(context.Background(), "ls", nil, tools.CallOptions{}); !errors.Is(err, runner.ErrClosed) {
		t.Fatalf("call on a deleted session: %v", err)
	}
	if _, err := m.Get("bolt", b.ID()); err != nil {
		t.Fatal(err)
	}
}

func TestSessionCapPerTenant(t *testing.T) {
	b := newGate()
	m := newManager(t, b, runner.WithMaxSessions(3))
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for range 10 {
		wg.Go(func() {
			_, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme"})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, runner.ErrTooManySessions):
				refused.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 3 || refused.Load() != 7 {
		t.Fatalf("created %d, refused %d; want 3 and 7", ok.Load(), refused.Load())
	}
	if b.opened.Load() != 3 {
		t.Fatalf("opened %d workspaces for 3 sessions", b.opened.Load())
	}
	create(t, m, "bolt", runner.Settings{}) // another tenant has its own cap
	if _, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", MaxSessions: 4}); err != nil {
		t.Fatalf("a tenant's own cap: %v", err)
	}
	s := m.List("acme")[0]
	if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", MaxSessions: 4}); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
}

func TestCallsInFlightCap(t *testing.T) {
	b := newGate()
	var mu sync.Mutex
	var events []runner.CallEvent
	m := newManager(t, b, runner.WithMaxCallsInFlight(1), runner.WithObserver(func(ev runner.CallEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}))
	s := create(t, m, "acme", shell)
	done := startWait(t, s)
	if _, err := s.Call(context.Background(), "ls", nil, tools.CallOptions{}); !errors.Is(err, runner.ErrBusy) {
		t.Fatalf("second call: %v, want ErrBusy", err)
	}
	close(b.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	res, err := s.Call(context.Background(), "read", json.RawMessage(`{"path":"missing"}`), tools.CallOptions{})
	if err != nil || !res.IsError {
		t.Fatalf("read missing: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"ls:" + runner.OutcomeBusy, "bash:" + runner.OutcomeOK, "read:" + runner.OutcomeError}
	if len(events) != len(want) {
		t.Fatalf("events %+v", events)
	}
	for i, ev := range events {
		if got := ev.Tool + ":" + ev.Outcome; got != want[i] || ev.Tenant != "acme" || ev.Session != s.ID() {
			t.Errorf("event %d = %+v, want %s", i, ev, want[i])
		}
	}
}

func TestDeleteCancelsCallsInFlight(t *testing.T) {
	b := newGate()
	m := newManager(t, b)
	s := create(t, m, "acme", shell)
	done := startWait(t, s)
	if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, runner.ErrClosed) {
		t.Fatalf("call cut by Delete: %v, want ErrClosed", err)
	}
	if b.closed.Load() != 1 {
		t.Fatalf("closed %d workspaces", b.closed.Load())
	}
}

func TestExpiry(t *testing.T) {
	b := newGate()
	m := newManager(t, b, runner.WithSweepInterval(5*time.Millisecond),
		runner.WithIdleTimeout(0, time.Hour), runner.WithLifetime(0, time.Hour))
	idle := create(t, m, "acme", runner.Settings{IdleTimeout: runner.Duration(60 * time.Millisecond)})
	short := create(t, m, "acme", runner.Settings{Lifetime: runner.Duration(60 * time.Millisecond)})
	keep := create(t, m, "acme", runner.Settings{})
	// Its call starts at once, within its idle timeout even on a loaded
	// machine: a call in flight is not idleness.
	busy := create(t, m, "acme", runner.Settings{Grants: shell.Grants, Always: shell.Always, IdleTimeout: runner.Duration(200 * time.Millisecond)})
	done := startWait(t, busy)

	for _, s := range []*runner.Session{idle, short} {
		select {
		case <-s.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("session %s did not expire", s.ID())
		}
		if !errors.Is(s.Err(), runner.ErrClosed) {
			t.Fatalf("Err = %v", s.Err())
		}
		if _, err := m.Get("acme", s.ID()); !errors.Is(err, runner.ErrNotFound) {
			t.Fatalf("expired session still listed: %v", err)
		}
	}
	if busy.Err() != nil || keep.Err() != nil {
		t.Fatalf("sessions ended early: %v, %v", busy.Err(), keep.Err())
	}
	close(b.gate)
	<-done
	<-busy.Done() // idle once its call is over

	_, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Lifetime: runner.Duration(2 * time.Hour)}})
	var se *runner.SettingError
	if !errors.As(err, &se) || se.Setting != "lifetime" {
		t.Fatalf("lifetime over the maximum: %v", err)
	}
}

func TestShutdownDrainsCallsThenRemoves(t *testing.T) {
	b := newGate()
	m, err := runner.New(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	s := create(t, m, "acme", shell)
	create(t, m, "bolt", runner.Settings{})
	done := startWait(t, s)
	stopped := make(chan error, 1)
	go func() { stopped <- m.Shutdown(context.Background()) }()
	waitFor(t, func() bool {
		_, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme"})
		return errors.Is(err, runner.ErrShuttingDown)
	})
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned with a call in flight: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := s.Call(context.Background(), "ls", nil, tools.CallOptions{}); !errors.Is(err, runner.ErrClosed) {
		t.Fatalf("new call while draining: %v", err)
	}
	close(b.gate)
	if err := <-done; err != nil {
		t.Fatalf("drained call: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	// Sessions created while Shutdown began are removed too.
	if b.closed.Load() != b.opened.Load() || b.opened.Load() < 2 {
		t.Fatalf("closed %d of %d workspaces", b.closed.Load(), b.opened.Load())
	}
}

func TestShutdownDeadlineCancelsCalls(t *testing.T) {
	b := newGate()
	m, err := runner.New(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	s := create(t, m, "acme", shell)
	done := startWait(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, runner.ErrShuttingDown) {
		t.Fatalf("call past the deadline: %v", err)
	}
	if b.closed.Load() != 1 {
		t.Fatal("workspace not removed")
	}
}

func TestWarmPool(t *testing.T) {
	b := newGate()
	m := newManager(t, b, runner.WithPool(runner.PoolConfig{Size: 3}))
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 3 })
	if b.opened.Load() != 0 {
		t.Fatal("pool used Open")
	}

	var mu sync.Mutex
	seen := map[*runner.Session]string{}
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme"})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			seen[s] = s.Root()
			mu.Unlock()
		})
	}
	wg.Wait()
	pooled := 0
	fsys := map[workspace.FileSystem]bool{}
	for s := range seen {
		if s.Info().Pooled {
			pooled++
		}
		if fsys[s.FS()] {
			t.Fatal("one workspace went to two sessions")
		}
		fsys[s.FS()] = true
	}
	if pooled == 0 || int64(pooled) > b.warmed.Load() {
		t.Fatalf("%d sessions pooled of %d warmed", pooled, b.warmed.Load())
	}
	if int64(12-pooled) != b.opened.Load() {
		t.Fatalf("%d cold sessions, %d opened", 12-pooled, b.opened.Load())
	}
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 3 }) // refilled

	// A profile other than the pool's is started cold.
	priv := runner.Settings{Image: "other"}
	m2 := newManager(t, b, runner.WithPool(runner.PoolConfig{Size: 1}), runner.WithPolicy(policy.Policy{Images: []string{"other"}}))
	waitFor(t, func() bool { return m2.Stats().Pools[0].Ready == 1 })
	if s := create(t, m2, "acme", priv); s.Info().Pooled {
		t.Fatal("a session of another image came from the pool")
	}

	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m2.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b.closed.Load() != b.opened.Load()+b.warmed.Load() {
		t.Fatalf("closed %d of %d opened and %d warmed", b.closed.Load(), b.opened.Load(), b.warmed.Load())
	}
}

func TestSettingsRefused(t *testing.T) {
	b := newGate()
	m := newManager(t, b, runner.WithPolicy(policy.Policy{Networks: []string{"bridge"}}), runner.WithGrants(tools.GrantFSWrite))
	for _, tc := range []struct {
		name     string
		settings runner.Settings
		setting  string
		denied   bool
	}{
		{"privileged", runner.Settings{Privileged: true}, "privileged", true},
		{"host network", runner.Settings{Network: "host"}, "network", true},
		{"host mount", runner.Settings{HostMounts: []runner.Mount{{Source: "/etc", Target: "/etc"}}}, "host mount", true},
		{"capability", runner.Settings{CapAdd: []string{"SYS_ADMIN"}}, "capability", true},
		{"image", runner.Settings{Image: "evil/miner"}, "image", true},
		{"runtime", runner.Settings{Runtime: "kata"}, "runtime", true},
		{"memory", runner.Settings{Limits: runner.Limits{MemoryBytes: 64 << 30}}, "memory", true},
		{"grant", runner.Settings{Grants: []string{tools.GrantShellExec}}, "grant", true},
		{"always without grant", runner.Settings{Always: []string{"edit"}}, "always", false},
		{"host env", runner.Settings{Options: json.RawMessage(`{"bashInheritEnv":true}`)}, "options.bashInheritEnv", false},
		{"host sources", runner.Settings{Options: json.RawMessage(`{"sources":[{"name":"etc","kind":"dir","path":"/etc"}]}`)}, "options.sources", false},
		{"operator's rules", runner.Settings{Options: json.RawMessage(`{"visible":["**"]}`)}, "options.visible", false},
		{"bad scope", runner.Settings{Scope: scope.Rules{Commit: []string{"src/[a"}}}, "scope", false},
		{"unknown option", runner.Settings{Options: json.RawMessage(`{"maxLinez":3}`)}, "options", false},
		{"bad option", runner.Settings{Options: json.RawMessage(`{"maxLines":-1}`)}, "maxLines", false},
		{"a variable that runs code, without shell.exec", runner.Settings{Vars: map[string]string{"LD_PRELOAD": "/workspace/x.so"}}, "vars", true},
		{"protect widened", runner.Settings{Options: json.RawMessage(`{"protect":[]}`)}, "options.protect", true},
		{"a file read past the operator's cap", runner.Settings{Options: json.RawMessage(`{"maxFileBytes":943718400}`)}, "options.maxFileBytes", true},
		{"programs without shell.exec", runner.Settings{Grants: []string{tools.GrantFSWrite},
			Options: json.RawMessage(`{"profile":"workspace-shell","driver":"provider","workspaceShell":{"mode":"write","commands":"all"}}`)}, "options.profile", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: tc.settings})
			var de *policy.DeniedError
			var se *runner.SettingError
			switch {
			case tc.denied && errors.As(err, &de) && de.Setting == tc.setting:
			case !tc.denied && errors.As(err, &se) && se.Setting == tc.setting:
			default:
				t.Fatalf("err = %v, want a refusal naming %q", err, tc.setting)
			}
		})
	}
	if n := b.opened.Load(); n != 0 {
		t.Fatalf("refused settings opened %d workspaces", n)
	}
	s := create(t, m, "acme", runner.Settings{Network: "bridge", Grants: []string{tools.GrantFSWrite},
		Options: json.RawMessage(`{"maxLines":7}`), Vars: map[string]string{"A": "1"}})
	if got := s.Tools().Config().MaxLines; got != 7 {
		t.Fatalf("maxLines = %d", got)
	}
	if got := tools.DefaultConfig().MaxLines; got == 7 {
		t.Fatal("a session's options leaked into the defaults")
	}
}

func TestReapAtStart(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, "ws-left-by-a-crash")
	other := filepath.Join(dir, "not-ours")
	for _, d := range []string{left, other} {
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := newManager(t, &local.Backend{Dir: dir})
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover workspace not reaped: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("a directory not sandboxd's was removed: %v", err)
	}
	s := create(t, m, "acme", runner.Settings{Grants: shell.Grants})
	res, err := s.Call(context.Background(), "load_skill", json.RawMessage(`{"skill":"shell"}`), tools.CallOptions{})
	if err != nil || res.IsError {
		t.Fatal(err, res.Text)
	}
	res, err = s.Call(context.Background(), "bash", json.RawMessage(`{"command":"pwd"}`), tools.CallOptions{})
	if err != nil || res.IsError {
		t.Fatal(err, res.Text)
	}
	if got := res.Structured.(*tools.BashResult).Output; got != s.Root()+"\n" {
		t.Fatalf("pwd = %q, want %q", got, s.Root())
	}
	if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Root()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("workspace directory left after Delete: %v", err)
	}

	b := newGate()
	newManager(t, b, runner.WithDaemonName("d2"))
	if b.reapedWithLabel[backend.LabelDaemon] != "d2" || b.reapedWithLabel[policy.LabelSandboxd] != "1" {
		t.Fatalf("reaped with labels %v", b.reapedWithLabel)
	}
}

// TestSource: a session may start from a copy of a host directory (memory)
// or work on one in place (Dir); a source never takes a pooled workspace.
func TestSource(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.txt"), []byte("from disk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	call := func(s *runner.Session, tool, args string) tools.Result {
		t.Helper()
		res, err := s.Call(context.Background(), tool, json.RawMessage(args), tools.CallOptions{})
		if err != nil || res.IsError {
			t.Fatalf("%s %s: %v %s", tool, args, err, res.Text)
		}
		return res
	}
	edit := runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"read", "edit"}}

	m := newManager(t, memory.Backend{}, runner.WithPool(runner.PoolConfig{Size: 1}))
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 1 })
	s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "cli", Source: src, Settings: edit})
	if err != nil {
		t.Fatal(err)
	}
	if s.Info().Pooled || s.Root() != "/workspace" {
		t.Fatalf("memory session from a source: %+v", s.Info())
	}
	if res := call(s, "read", `{"path":"a.txt"}`); res.Structured.(*tools.ReadResult).Content != "from disk\n" {
		t.Fatalf("read: %q", res.Text)
	}
	call(s, "write", `{"path":"a.txt","content":"changed\n"}`)
	if data, _ := os.ReadFile(filepath.Join(src, "a.txt")); string(data) != "from disk\n" {
		t.Fatalf("the memory backend wrote back to its source: %q", data)
	}

	d := newManager(t, local.Dir{Path: src})
	s = create(t, d, "cli", edit)
	if abs, _ := filepath.Abs(src); s.Root() != filepath.ToSlash(abs) {
		t.Fatalf("root %q, want %q", s.Root(), abs)
	}
	call(s, "write", `{"path":"b.txt","content":"in place\n"}`)
	if err := d.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(src, "b.txt")); string(data) != "in place\n" {
		t.Fatalf("Dir: b.txt %q after the session, want it kept", data)
	}

	l := newManager(t, &local.Backend{Dir: t.TempDir()})
	if _, err := l.Create(context.Background(), runner.CreateRequest{Tenant: "cli", Source: src}); err == nil {
		t.Fatal("the local backend took a source it cannot copy")
	}
}

// TestSessionScope: the scope setting reaches every tool of the session.
func TestSessionScope(t *testing.T) {
	m := newManager(t, memory.Backend{}, runner.WithGrants(tools.GrantFSWrite, tools.GrantShellExec))
	s := create(t, m, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite, tools.GrantShellExec},
		Always: []string{"read", "edit"},
		Scope:  scope.Rules{Visible: []string{"src/**", "notes.txt"}, Commit: []string{"src/**"}}})
	call := func(tool, args string) tools.Result {
		t.Helper()
		r, err := s.Call(context.Background(), tool, json.RawMessage(args), tools.CallOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, c := range []struct{ tool, args, kind string }{
		{"write", `{"path":"src/a.txt","content":"a"}`, ""},
		{"write", `{"path":"notes.txt","content":"n"}`, "Protected"},
		{"write", `{"path":"top.txt","content":"t"}`, "NotFound"},
		{"read", `{"path":"src/a.txt"}`, ""},
	} {
		r := call(c.tool, c.args)
		kind := ""
		if r.IsError {
			kind = r.Structured.(*tools.ErrorResult).Error
		}
		if kind != c.kind {
			t.Errorf("%s %s: %s, want %q", c.tool, c.args, r.Text, c.kind)
		}
	}
	for _, tl := range s.Tools().List() {
		if tl.Name == "bash" {
			t.Error("a scoped session was offered bash")
		}
	}
}

// TestSessionPicksSources: a session names which of the operator's sources
// it gets; the gateway it is given sends only those.
func TestSessionPicksSources(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "answer") }))
	defer api.Close()
	cfg := tools.DefaultConfig()
	cfg.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
	cfg.Sources = sources.Decls{
		{Name: "docs", Kind: sources.KindDir, Path: t.TempDir()},
		{Name: "api", Kind: sources.KindHTTP, HTTPDecl: sources.HTTPDecl{URL: api.URL, Requests: []sources.RequestShape{{Method: "GET", Path: "/x"}}}},
		{Name: "api2", Kind: sources.KindHTTP, HTTPDecl: sources.HTTPDecl{URL: api.URL + "/two", Requests: []sources.RequestShape{{Method: "GET", Path: "/x"}}}},
	}
	m := newManager(t, memory.Backend{}, runner.WithTools(cfg))
	call := func(s *runner.Session, tool, args string) tools.Result {
		t.Helper()
		r, err := s.Call(context.Background(), tool, json.RawMessage(args), tools.CallOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	all := create(t, m, "acme", runner.Settings{})
	if r := call(all, "materialize_sources", `{}`); r.IsError || !strings.Contains(r.Text, "docs (dir)") || !strings.Contains(r.Text, "api2 (http)") {
		t.Fatalf("all sources: %s", r.Text)
	}
	some := create(t, m, "acme", runner.Settings{Sources: []string{"docs", "api"}})
	if r := call(some, "materialize_sources", `{}`); r.IsError || strings.Contains(r.Text, "api2") {
		t.Fatalf("docs and api: %s", r.Text)
	}
	if r := call(some, "shell", `{"command":"curl -s `+api.URL+`/x"}`); r.IsError || !strings.Contains(r.Text, "answer") {
		t.Fatalf("curl of a picked source: %s", r.Text)
	}
	if r := call(some, "shell", `{"command":"curl -s `+api.URL+`/two/x"}`); !r.IsError || !strings.Contains(r.Text, "refused") {
		t.Fatalf("curl of a source not picked: %s", r.Text)
	}
	none := create(t, m, "acme", runner.Settings{Sources: []string{}})
	if r := call(none, "shell", `{"command":"curl -s `+api.URL+`/x"}`); !r.IsError || !strings.Contains(r.Text, "no API-backed sources") {
		t.Fatalf("curl without sources: %s", r.Text)
	}
	_, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Sources: []string{"etc"}}})
	var se *runner.SettingError
	if !errors.As(err, &se) || se.Setting != "sources" || !strings.Contains(se.Reason, "docs, api, api2") {
		t.Fatalf("an undeclared source: %v", err)
	}
}

// TestMissingCredentialStopsStart: a daemon whose http source's credential
// cannot be read does not start, and says where it looked.
func TestMissingCredentialStopsStart(t *testing.T) {
	cfg := tools.DefaultConfig()
	cfg.Sources = sources.Decls{{Name: "api", Kind: sources.KindHTTP, HTTPDecl: sources.HTTPDecl{URL: "https://api.example.com",
		Requests:   []sources.RequestShape{{Method: "GET", Path: "/x"}},
		Credential: &sources.Credential{Header: "Authorization", Secret: sources.Secret{Env: "SANDBOXD_TEST_NEVER_SET"}}}}}
	_, err := runner.New(context.Background(), memory.Backend{}, runner.WithTools(cfg))
	if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "SANDBOXD_TEST_NEVER_SET") {
		t.Fatalf("err = %v", err)
	}
}

// privateJournals makes journal stores as the daemon does: in the
// session's state directory when it has one (kept: drop leaves it), else a
// new private directory of TMPDIR's, which drop removes.
func privateJournals(req runner.JournalStoreRequest) (workspace.FileSystem, func() error, error) {
	dir := req.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "sandboxd-journal-"); err != nil {
			return nil, nil, err
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	fsys, err := localfs.New(dir, localfs.WithSync(false))
	if err != nil {
		return nil, nil, err
	}
	if req.Dir != "" {
		return fsys, fsys.Close, nil
	}
	return fsys, func() error { return errors.Join(fsys.Close(), os.RemoveAll(dir)) }, nil
}

// TestJournalStoreOutsideTheWorkspace: a session's journal is kept in the
// store WithJournalStores makes — here a private directory, as the
// daemon's — not in the workspace its commands can write, and the store
// goes with the session.
func TestJournalStoreOutsideTheWorkspace(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // not parallel: os.MkdirTemp reads it
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite), runner.WithJournalStores(privateJournals))
	s := create(t, m, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"read", "edit"}})
	r, err := s.Call(context.Background(), "write", json.RawMessage(`{"path":"a.txt","content":"a\n"}`), tools.CallOptions{})
	if err != nil || r.IsError || r.Commit == nil {
		t.Fatalf("write: %+v, %v", r, err)
	}
	if _, err := s.FS().Lstat(context.Background(), ".sandboxd"); !errors.Is(err, workspace.ErrNotFound) {
		t.Fatalf(".sandboxd in the workspace: %v, want none", err)
	}
	stores, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-journal-*", "commits", "*.log"))
	if len(stores) != 1 {
		t.Fatalf("journal commits in the daemon's directory: %q, want one", stores)
	}
	if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-journal-*")); len(left) != 0 {
		t.Fatalf("the journal store outlived its session: %q", left)
	}
}
