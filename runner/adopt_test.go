package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// sharedBackend is the memory backend as replicas would share it
// (backend.Adopter): one workspace per session, which the last replica to
// adopt it holds; the one that held it before sees its instance end with
// backend.ErrMoved.
type sharedBackend struct {
	memory.Backend
	mu sync.Mutex
	ws map[string]*sharedWorkspace // by session
}

type sharedWorkspace struct {
	mem     *backend.Instance
	rec     backend.Record
	tenant  string
	holder  *heldInstance
	removed bool
}

// heldInstance is one replica's hold on a shared workspace.
type heldInstance struct {
	done  chan struct{}
	moved bool
}

func (b *sharedBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	mem, err := b.Backend.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	w := &sharedWorkspace{mem: mem, tenant: spec.Tenant}
	b.mu.Lock()
	if b.ws == nil {
		b.ws = map[string]*sharedWorkspace{}
	}
	b.ws[spec.Session] = w
	b.mu.Unlock()
	return b.hold(w), nil
}

// hold makes a new holder of w, ending the former one's instance.
func (b *sharedBackend) hold(w *sharedWorkspace) *backend.Instance {
	h := &heldInstance{done: make(chan struct{})}
	b.mu.Lock()
	if old := w.holder; old != nil {
		old.moved = true
		close(old.done)
	}
	w.holder = h
	b.mu.Unlock()
	return &backend.Instance{
		FS: w.mem.FS, Bash: w.mem.Bash, Root: w.mem.Root, ID: w.mem.ID, Done: h.done,
		Err: func() error {
			b.mu.Lock()
			defer b.mu.Unlock()
			if h.moved {
				return fmt.Errorf("%w: test", backend.ErrMoved)
			}
			return nil
		},
		Publish: func(_ context.Context, rec backend.Record) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			w.rec = rec
			return nil
		},
		Leave: func(context.Context) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			if w.holder == h {
				w.holder = nil
				close(h.done)
			}
			return nil
		},
		Close: func(ctx context.Context) error {
			b.mu.Lock()
			moved := h.moved
			if !moved {
				w.removed = true
			}
			b.mu.Unlock()
			if moved {
				return nil
			}
			return w.mem.Close(ctx)
		},
	}
}

func (b *sharedBackend) Adopt(_ context.Context, session string, labels map[string]string) (*backend.Instance, backend.Record, error) {
	b.mu.Lock()
	w := b.ws[session]
	ok := w != nil && !w.removed && w.tenant == labels[policy.LabelTenant]
	b.mu.Unlock()
	if !ok {
		return nil, backend.Record{}, workspace.ErrNotFound
	}
	inst := b.hold(w)
	b.mu.Lock()
	defer b.mu.Unlock()
	return inst, w.rec, nil
}

// TestAdoptAcrossReplicas: a session made through one manager is served by
// another over the same backend, alternately, with its settings and files;
// the replica it moved from forgets it without removing its workspace;
// another tenant never finds it; Delete through either removes it.
func TestAdoptAcrossReplicas(t *testing.T) {
	b := &sharedBackend{}
	a := newManager(t, b, runner.WithLifetime(time.Hour, 0))
	c := newManager(t, b, runner.WithLifetime(time.Hour, 0))
	s := create(t, a, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"read", "edit"}})
	write := func(m *runner.Manager, content string) {
		t.Helper()
		got, err := m.Get("acme", s.ID())
		if err != nil {
			t.Fatal(err)
		}
		args, _ := json.Marshal(map[string]string{"path": "a.txt", "content": content})
		if res, err := got.Call(context.Background(), "write", args, tools.CallOptions{}); err != nil || res.IsError {
			t.Fatalf("write: %+v %v", res, err)
		}
	}
	read := func(m *runner.Manager) string {
		t.Helper()
		got, err := m.Get("acme", s.ID())
		if err != nil {
			t.Fatal(err)
		}
		data, err := got.FS().ReadFile(context.Background(), "a.txt", 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	write(a, "one")
	if got := read(c); got != "one" {
		t.Fatalf("read through the second replica: %q", got)
	}
	waitFor(t, func() bool { return len(a.List("acme")) == 0 })
	if errors.Is(s.Err(), runner.ErrClosed) || !errors.Is(s.Err(), backend.ErrMoved) {
		t.Fatalf("the first replica's session ended with %v, want ErrMoved", s.Err())
	}
	write(a, "two")
	if got := read(c); got != "two" {
		t.Fatalf("alternating: %q", got)
	}
	got, _ := c.Get("acme", s.ID())
	if in := got.Info(); !in.Created.Equal(s.Info().Created) || in.ExpiresAt == nil || in.Settings.Grants[0] != tools.GrantFSWrite {
		t.Fatalf("adopted info %+v", in)
	}
	if _, err := a.Get("bolt", s.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("another tenant: %v", err)
	}
	if err := a.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("acme", s.ID()); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("after Delete through the other replica: %v", err)
	}
}

// TestShutdownLeavesSessionsToReplicas: a replica that stops leaves its
// sessions' workspaces to the others (Instance.Leave), as in a rolling
// update: the next request through another replica takes the session over,
// files and settings intact.
func TestShutdownLeavesSessionsToReplicas(t *testing.T) {
	b := &sharedBackend{}
	a := newManager(t, b, runner.WithLifetime(time.Hour, 0))
	c := newManager(t, b, runner.WithLifetime(time.Hour, 0))
	s := create(t, a, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"read", "edit"}})
	ctx := context.Background()
	if err := s.FS().WriteFile(ctx, "kept.txt", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Err(), runner.ErrShuttingDown) {
		t.Errorf("the stopped replica's session ended with %v, want ErrShuttingDown", s.Err())
	}
	got, err := c.Get("acme", s.ID())
	if err != nil {
		t.Fatalf("the session after its replica stopped: %v", err)
	}
	if data, err := got.FS().ReadFile(ctx, "kept.txt", 1<<20); err != nil || string(data) != "kept" {
		t.Fatalf("its file: %q, %v", data, err)
	}
	if in := got.Info(); !in.Created.Equal(s.Info().Created) || in.Settings.Grants[0] != tools.GrantFSWrite {
		t.Fatalf("adopted info %+v", in)
	}
}
