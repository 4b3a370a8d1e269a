package runner_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// mortalBackend is the gate backend whose workspaces can die from outside:
// kill ends one as a killed container would, noticed at once; with hush
// set, the pooled workspaces it makes die unnoticed (Done stays open, calls fail).
type mortalBackend struct {
	*gateBackend
	mu    sync.Mutex
	kills map[string]func() // by instance ID
	hush  atomic.Bool
	// breaking makes the instances opened from then on breakingFS.
	breaking atomic.Bool
}

// deadFS is a workspace whose container died before anyone noticed.
type deadFS struct{ workspace.FileSystem }

func (deadFS) Stat(context.Context, string) (fs.FileInfo, error) {
	return nil, workspace.PathError("stat", ".", workspace.ErrUnavailable)
}

func newMortal() *mortalBackend {
	return &mortalBackend{gateBackend: newGate(), kills: map[string]func(){}}
}

func (b *mortalBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	return b.mortal(b.gateBackend.Open(ctx, spec))
}

func (b *mortalBackend) Warm(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.gateBackend.Warm(ctx, spec)
	if err == nil && b.hush.Load() {
		inst.FS = deadFS{inst.FS}
		return inst, nil
	}
	return b.mortal(inst, err)
}

func (b *mortalBackend) mortal(inst *backend.Instance, err error) (*backend.Instance, error) {
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var once sync.Once
	inst.Done = done
	inst.Err = func() error {
		select {
		case <-done:
			return errors.New("the agent closed the stream (container exited, exit code 137)")
		default:
			return nil
		}
	}
	kill := func() { once.Do(func() { close(done) }) }
	b.mu.Lock()
	b.kills[inst.ID] = kill
	b.mu.Unlock()
	if b.breaking.Load() {
		inst.FS = breakingFS{FileSystem: inst.FS, noticed: kill}
	}
	return inst, nil
}

func (b *mortalBackend) kill(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kills[id]()
}

// TestWorkspaceDeathEndsSession: a session whose workspace dies ends at
// once — idle, or with a call in flight — and says why from then on,
// wrapping ErrWorkspaceEnded (410 SessionEnded over HTTP); its workspace is
// removed and the manager counts it lost.
func TestWorkspaceDeathEndsSession(t *testing.T) {
	b := newMortal()
	var mu sync.Mutex
	var outcomes []string
	m := newManager(t, b, runner.WithObserver(func(ev runner.CallEvent) {
		mu.Lock()
		outcomes = append(outcomes, ev.Outcome)
		mu.Unlock()
	}))

	idle := create(t, m, "acme", shell)
	busy := create(t, m, "acme", shell)
	call := startWait(t, busy)
	b.kill(idle.Info().Workspace)
	b.kill(busy.Info().Workspace)
	for _, s := range []*runner.Session{idle, busy} {
		select {
		case <-s.Done():
		case <-time.After(time.Minute):
			t.Fatal("the session outlived its workspace")
		}
	}
	if err := <-call; !errors.Is(err, runner.ErrWorkspaceEnded) || !strings.Contains(err.Error(), "exit code 137") {
		t.Fatalf("call in flight: %v", err)
	}
	for _, s := range []*runner.Session{idle, busy} {
		_, err := m.Get("acme", s.ID())
		if !errors.Is(err, runner.ErrWorkspaceEnded) || !errors.Is(err, runner.ErrClosed) || !strings.Contains(err.Error(), "exit code 137") {
			t.Errorf("Get after the workspace died: %v", err)
		}
		if _, err := m.Get("bolt", s.ID()); !errors.Is(err, runner.ErrNotFound) {
			t.Errorf("another tenant's Get: %v", err)
		}
		if _, err := s.Call(context.Background(), "read", []byte(`{"path":"x"}`), tools.CallOptions{}); !errors.Is(err, runner.ErrWorkspaceEnded) {
			t.Errorf("Call after the workspace died: %v", err)
		}
	}
	if got := len(m.List("acme")); got != 0 {
		t.Errorf("List shows %d dead sessions", got)
	}
	if got := m.Stats().Lost; got != 2 {
		t.Errorf("Stats().Lost = %d, want 2", got)
	}
	// Delete answers why, once the dead workspace is removed; then the
	// session is forgotten.
	for _, s := range []*runner.Session{idle, busy} {
		if err := m.Delete(context.Background(), "acme", s.ID()); !errors.Is(err, runner.ErrWorkspaceEnded) {
			t.Errorf("Delete after the workspace died: %v", err)
		}
		if _, err := m.Get("acme", s.ID()); !errors.Is(err, runner.ErrNotFound) {
			t.Errorf("Get after Delete: %v", err)
		}
	}
	if n := b.closed.Load(); n != 2 {
		t.Errorf("%d dead workspaces removed when Delete returned, want 2", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(outcomes, " "), runner.OutcomeClosed) {
		t.Errorf("outcomes %v: no call reported closed", outcomes)
	}
}

// TestPoolDropsDeadWorkspaces: a pooled workspace that dies while it waits
// is never handed out; the pool replaces it.
func TestPoolDropsDeadWorkspaces(t *testing.T) {
	b := newMortal()
	m := newManager(t, b, runner.WithPool(runner.PoolConfig{Size: 1}))
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 1 })
	b.mu.Lock()
	for _, kill := range b.kills {
		kill()
	}
	b.mu.Unlock()
	waitFor(t, func() bool { st := m.Stats().Pools[0]; return st.Lost == 1 && st.Ready == 1 })
	b.hush.Store(true) // the pool's next workspace dies unnoticed
	s := create(t, m, "acme", shell)
	if _, err := s.Call(context.Background(), "bash", []byte(`{"command":"true"}`), tools.CallOptions{}); err != nil || !s.Info().Pooled {
		t.Fatalf("a session got a dead pooled workspace, or none (pooled %v): %v", s.Info().Pooled, err)
	}

	// A workspace that died unnoticed fails the check a claim makes.
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 1 })
	b.hush.Store(false)
	s = create(t, m, "acme", shell)
	if _, ok := s.FS().(deadFS); ok {
		t.Fatal("a session got a pooled workspace that does not answer")
	}
	if st := m.Stats().Pools[0]; st.Lost != 2 {
		t.Errorf("pool stats %+v, want two lost", st)
	}
}

// TestLocalReapLeavesLivingOwners: two daemons sharing a local Dir — the
// second one's start removes only what an ended owner left, never the
// first one's living workspaces.
func TestLocalReapLeavesLivingOwners(t *testing.T) {
	dir := t.TempDir()
	self := backend.Self()
	if self.Start == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("the kernel does not say when a process started (no /proc), which CI's Linux must")
		}
		t.Skip("the kernel does not say when a process started (no /proc)")
	}
	first := newManager(t, &local.Backend{Dir: dir}, runner.WithDaemonName("first"))
	living := create(t, first, "acme", runner.Settings{})
	ended := backend.Owner{Host: self.Host, PID: self.PID, Start: "1"} // its PID reused by a later process
	crashed := newManager(t, &local.Backend{Dir: dir}, runner.WithDaemonName("crashed"), runner.WithLabels(ended.Labels()))
	dead := create(t, crashed, "acme", runner.Settings{})

	newManager(t, &local.Backend{Dir: dir}, runner.WithDaemonName("second"))
	if _, err := os.Stat(living.Root()); err != nil {
		t.Errorf("the living daemon's workspace was reaped: %v", err)
	}
	if _, err := os.Stat(dead.Root()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ended owner's workspace was left: %v", err)
	}
	if _, err := os.Stat(dead.Root() + ".owner"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ended owner's record was left: %v", err)
	}
}

// breakingFS is a workspace whose stream has just broken: each call fails
// as Unavailable and starts the backend finding out why, which it reports
// (closing the instance's Done) a moment after the call has returned.
type breakingFS struct {
	workspace.FileSystem
	noticed func()
}

func (f breakingFS) fail(op, name string) error {
	go func() {
		time.Sleep(100 * time.Millisecond) // the engine is asked how the container ended
		f.noticed()
	}()
	return workspace.PathError(op, name, workspace.ErrUnavailable)
}

func (f breakingFS) Stat(_ context.Context, name string) (fs.FileInfo, error) {
	return nil, f.fail("stat", name)
}

func (f breakingFS) Lstat(_ context.Context, name string) (fs.FileInfo, error) {
	return nil, f.fail("lstat", name)
}

func (f breakingFS) ReadFile(_ context.Context, name string, _ int64) ([]byte, error) {
	return nil, f.fail("read", name)
}

// TestCallSeesWorkspaceEndNoticedLate: a call that fails as Unavailable
// because its workspace's stream broke, a moment before the backend knows
// the workspace ended, is answered with ErrWorkspaceEnded and the cause —
// the session ended — not with the stream's stumble as a tool result.
func TestCallSeesWorkspaceEndNoticedLate(t *testing.T) {
	b := newMortal()
	b.breaking.Store(true)
	m := newManager(t, b)
	s := create(t, m, "acme", shell)
	res, err := s.Call(context.Background(), "read", []byte(`{"path":"x"}`), tools.CallOptions{})
	if !errors.Is(err, runner.ErrWorkspaceEnded) || !strings.Contains(err.Error(), "exit code 137") {
		t.Fatalf("read as the workspace ends: %v (result %+v)", err, res)
	}
}
