package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// budget is a memory budget for DetachRequest.Hold: it refuses what would
// pass its size, and counts what is held.
type budget struct {
	mu         sync.Mutex
	size, held int64
}

func (b *budget) hold(_ context.Context, n int64) (func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.size {
		return nil, fmt.Errorf("the test's memory budget of %d bytes has no room", b.size)
	}
	b.held += n
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.held -= n
			b.mu.Unlock()
		})
	}, nil
}

func (b *budget) set(size int64) { b.mu.Lock(); b.size = size; b.mu.Unlock() }
func (b *budget) inUse() int64   { b.mu.Lock(); defer b.mu.Unlock(); return b.held }

// detachRead reads path detached, holding from b, and waits for its end.
func detachRead(t *testing.T, s *runner.Session, path string, b *budget) *runner.Detached {
	t.Helper()
	d, err := s.Detach(runner.DetachRequest{Tool: "read", Args: json.RawMessage(`{"path":"` + path + `"}`), Hold: b.hold})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	case <-time.After(time.Minute):
		t.Fatal("a detached read did not end within a minute")
	}
	return d
}

// notKept fails unless d's result is gone for the reason that says why.
func notKept(t *testing.T, d *runner.Detached, why string) {
	t.Helper()
	res, err, ok := d.Result()
	if !ok || !errors.Is(err, runner.ErrResultNotKept) || !strings.Contains(err.Error(), why) || res.Text != "" || d.Size() != 0 {
		t.Errorf("call %s: %.40q, %v, %v, size %d; want its result gone saying %q", d.ID, res.Text, err, ok, d.Size(), why)
	}
}

func kept(t *testing.T, d *runner.Detached) {
	t.Helper()
	res, err, ok := d.Result()
	if _, raw := res.Structured.(json.RawMessage); !ok || err != nil || res.IsError || !raw || d.Size() == 0 {
		t.Errorf("call %s: %.40q, %v, %v, size %d; want its result kept", d.ID, res.Text, err, ok, d.Size())
	}
}

// TestDetachedResultsBounded: the results of detached calls are kept
// within a session's bytes (a newer one displacing the oldest, one too
// large on its own not kept) and the Hold given with the call (older ones
// forgotten to make room, then the new one refused), each saying why it
// is gone, and the Hold is given everything back when the session ends.
func TestDetachedResultsBounded(t *testing.T) {
	content := strings.Repeat("twenty bytes a line\n", 200)
	write := func(s *runner.Session) {
		toolCall[tools.WriteResult](t, s, "write", map[string]any{"path": "a.txt", "content": content})
		toolCall[tools.WriteResult](t, s, "write", map[string]any{"path": "big.txt", "content": strings.Repeat(content, 15)})
	}
	// The size of one read's result, as a session keeps it.
	m := newManager(t, memory.Backend{})
	s := create(t, m, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"edit"}})
	write(s)
	b := &budget{size: 1 << 30}
	n := detachRead(t, s, "a.txt", b).Size()
	if n < int64(len(content)) || b.inUse() != n {
		t.Fatalf("a read of %d bytes keeps %d, holding %d", len(content), n, b.inUse())
	}

	m = newManager(t, memory.Backend{}, runner.WithDetachedResults(2*n+n/2, time.Hour))
	s = create(t, m, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"edit"}})
	write(s)
	b = &budget{size: 1 << 30}
	c1, c2, c3 := detachRead(t, s, "a.txt", b), detachRead(t, s, "a.txt", b), detachRead(t, s, "a.txt", b)
	notKept(t, c1, "a newer call's result took its place (a session keeps")
	kept(t, c2)
	kept(t, c3)
	if b.inUse() != 2*n {
		t.Errorf("two results kept hold %d, want %d", b.inUse(), 2*n)
	}

	// The budget shrinks below what is kept: the oldest goes, then the
	// new one has room.
	b.set(n + n/2)
	c4 := detachRead(t, s, "a.txt", b)
	notKept(t, c2, "limits.detachedResultBytes")
	notKept(t, c3, "the memory budget had no room for both")
	kept(t, c4)
	// Then to less than one: nothing older makes room, and the new one is
	// not kept.
	b.set(n / 2)
	c5 := detachRead(t, s, "a.txt", b)
	notKept(t, c4, "the memory budget had no room for both")
	notKept(t, c5, "the test's memory budget of")
	if b.inUse() != 0 {
		t.Errorf("with nothing kept, %d bytes held", b.inUse())
	}
	b.set(1 << 30)
	notKept(t, detachRead(t, s, "big.txt", b), "bytes of results a session keeps (limits.detachedResultBytes)")
	if b.inUse() != 0 {
		t.Errorf("a result too large for the session holds %d", b.inUse())
	}
	for _, c := range []*runner.Detached{c1, c5} {
		if got, err := s.Detached(c.ID); err != nil || got != c {
			t.Errorf("Detached(%s) = %v, %v: a call whose result is gone is still found", c.ID, got, err)
		}
	}
	if _, err := s.Detached("call-none"); !errors.Is(err, runner.ErrNotFound) {
		t.Errorf("Detached(call-none): %v", err)
	}

	c6 := detachRead(t, s, "a.txt", b)
	kept(t, c6)
	if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if b.inUse() != 0 {
		t.Errorf("after the session's end, its results hold %d", b.inUse())
	}
}

// TestDetachedResultsExpire: a kept result is forgotten its time after its
// call ended, saying so, and its memory is given back.
func TestDetachedResultsExpire(t *testing.T) {
	m := newManager(t, memory.Backend{}, runner.WithDetachedResults(0, 200*time.Millisecond), runner.WithSweepInterval(10*time.Millisecond))
	s := create(t, m, "acme", runner.Settings{})
	b := &budget{size: 1 << 30}
	d := detachRead(t, s, ".", b)
	deadline := time.Now().Add(time.Minute)
	for d.Size() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	notKept(t, d, "it expired, 200ms after its call ended (limits.detachedResultTTL)")
	if b.inUse() != 0 {
		t.Errorf("an expired result holds %d", b.inUse())
	}
}
