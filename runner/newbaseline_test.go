package runner_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// writing are settings that write and edit files.
var writing = runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"read", "edit"}}

// rebaseline takes a new baseline of s, as its own call.
func rebaseline(ctx context.Context, s *runner.Session, req runner.BaselineRequest) (runner.BaselineInfo, error) {
	var info runner.BaselineInfo
	err := s.Do(ctx, "baseline", func(ctx context.Context) (bool, error) {
		var err error
		info, err = s.Rebaseline(ctx, req)
		return false, err
	})
	return info, err
}

// TestRebaseline: right after a new baseline the diff is empty; a change
// after it shows, one before it does not; a later baseline replaces it
// again.
func TestRebaseline(t *testing.T) {
	for _, b := range []backend.Backend{&local.Backend{Dir: t.TempDir()}, memory.Backend{TempDir: t.TempDir()}} {
		t.Run(b.Name(), func(t *testing.T) {
			m := newManager(t, b, runner.WithGrants(tools.GrantFSWrite))
			s := create(t, m, "acme", writing)
			ctx := context.Background()
			callOK(t, s, "write", map[string]any{"path": "a.txt", "content": "one\n"})
			callOK(t, s, "write", map[string]any{"path": "src/b.txt", "content": "bee\n"})
			if patch, err := diffOf(ctx, s); err != nil || !strings.Contains(patch, "new file mode") {
				t.Fatalf("the diff since the start: %v\n%s", err, patch)
			}
			info, err := rebaseline(ctx, s, runner.BaselineRequest{})
			if err != nil || info.Files != 2 || info.Taken.IsZero() {
				t.Fatalf("Rebaseline = %+v, %v; want 2 files", info, err)
			}
			if patch, err := diffOf(ctx, s); err != nil || patch != "" {
				t.Fatalf("the diff right after a new baseline: %v\n%s", err, patch)
			}
			callOK(t, s, "edit", map[string]any{"path": "a.txt", "edits": []map[string]string{{"oldText": "one", "newText": "two"}}})
			callOK(t, s, "write", map[string]any{"path": "c.txt", "content": "see\n"})
			patch, err := diffOf(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"diff --git a/a.txt b/a.txt\n", "-one\n", "+two\n", "b/c.txt"} {
				if !strings.Contains(patch, want) {
					t.Errorf("the diff after a change lacks %q:\n%s", want, patch)
				}
			}
			if strings.Contains(patch, "b.txt") || strings.Contains(patch, "a/a.txt b/a.txt\nnew file") {
				t.Errorf("the diff shows what changed before the new baseline:\n%s", patch)
			}
			if _, err := rebaseline(ctx, s, runner.BaselineRequest{}); err != nil {
				t.Fatal(err)
			}
			if patch, err := diffOf(ctx, s); err != nil || patch != "" {
				t.Fatalf("the diff right after a second new baseline: %v\n%s", err, patch)
			}
		})
	}
}

// changing starts a call of s that may change the workspace (an upload)
// and returns once it runs: it then waits until end is called (at the
// latest as the test ends, before the manager's shutdown waits for it),
// runs then, and sends its error on done.
func changing(t *testing.T, s *runner.Session, then func(context.Context) error) (done <-chan error, end func()) {
	inside, finish := make(chan struct{}), make(chan struct{})
	var once sync.Once
	end = func() { once.Do(func() { close(finish) }) }
	t.Cleanup(end)
	errs := make(chan error, 1)
	go func() {
		errs <- s.Do(context.Background(), "upload", func(ctx context.Context) (bool, error) {
			close(inside)
			<-finish
			return false, then(ctx)
		})
	}()
	<-inside
	return errs, end
}

// rebaselineWaiting starts a new baseline of s and returns once it waits
// for the calls in flight (holding, from WatchNewBaselines); its error
// comes on done.
func rebaselineWaiting(t *testing.T, ctx context.Context, s *runner.Session, holding <-chan struct{}) (done <-chan error) {
	t.Helper()
	errs := make(chan error, 1)
	go func() { _, err := rebaseline(ctx, s, runner.BaselineRequest{}); errs <- err }()
	select {
	case <-holding:
	case err := <-errs:
		t.Fatalf("the new baseline did not wait for the call in flight: %v", err)
	}
	return errs
}

// TestRebaselineWaitsForChanges: a new baseline waits for the call in
// flight that may change the workspace, and captures its change; a call
// that may change the workspace and comes meanwhile waits for the new
// baseline, so its change shows in the diff; a call that only reads is
// answered meanwhile.
func TestRebaselineWaitsForChanges(t *testing.T) {
	holding, waiting := runner.WatchNewBaselines(t)
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite))
	s := create(t, m, "acme", writing)
	ctx := context.Background()
	callOK(t, s, "write", map[string]any{"path": "before.txt", "content": "b\n"})
	first, end := changing(t, s, func(ctx context.Context) error {
		return s.FS().WriteFile(ctx, "during.txt", []byte("d\n"), 0o644)
	})
	based := rebaselineWaiting(t, ctx, s, holding)
	callOK(t, s, "read", map[string]any{"path": "before.txt"})
	later := make(chan error, 1)
	go func() {
		_, err := s.Call(ctx, "write", []byte(`{"path":"after.txt","content":"a\n"}`), tools.CallOptions{})
		later <- err
	}()
	select {
	case <-waiting:
	case err := <-later:
		t.Fatalf("a write ran while a new baseline waited for the call in flight: %v", err)
	}
	end()
	for _, c := range []<-chan error{first, based, later} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	patch, err := diffOf(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(patch, "b/after.txt") || strings.Contains(patch, "during.txt") || strings.Contains(patch, "before.txt") {
		t.Fatalf("the diff after the new baseline: want after.txt alone\n%s", patch)
	}
}

// TestRebaselineGivesUp: a new baseline whose context ends while it waits
// for a call in flight takes none, and lets the calls that waited go on.
func TestRebaselineGivesUp(t *testing.T) {
	holding, waiting := runner.WatchNewBaselines(t)
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite))
	s := create(t, m, "acme", writing)
	ctx := context.Background()
	callOK(t, s, "write", map[string]any{"path": "a.txt", "content": "a\n"})
	first, end := changing(t, s, func(context.Context) error { return nil })
	bctx, cancel := context.WithCancel(ctx)
	based := rebaselineWaiting(t, bctx, s, holding)
	later := make(chan error, 1)
	go func() {
		_, err := s.Call(ctx, "write", []byte(`{"path":"b.txt","content":"b\n"}`), tools.CallOptions{})
		later <- err
	}()
	<-waiting
	cancel()
	if err := <-based; !errors.Is(err, context.Canceled) {
		t.Fatalf("Rebaseline cut short = %v, want context.Canceled", err)
	}
	if err := <-later; err != nil {
		t.Fatal(err)
	}
	end()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if patch, err := diffOf(ctx, s); err != nil || !strings.Contains(patch, "b/a.txt") || !strings.Contains(patch, "b/b.txt") {
		t.Fatalf("the diff after a new baseline cut short: %v, want both files since the start\n%s", err, patch)
	}
}

// TestRebaselineAndUndo: the journal outlives a new baseline: undoing a
// commit made before it puts the file back, and the diff shows that as a
// change since the baseline.
func TestRebaselineAndUndo(t *testing.T) {
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite))
	s := create(t, m, "acme", writing)
	ctx := context.Background()
	callOK(t, s, "write", map[string]any{"path": "a.txt", "content": "one\n"})
	callOK(t, s, "write", map[string]any{"path": "a.txt", "content": "two\n"})
	ids := journalIDs(t, s)
	if _, err := rebaseline(ctx, s, runner.BaselineRequest{}); err != nil {
		t.Fatal(err)
	}
	callOK(t, s, "journal_revert", map[string]any{"to": ids[1]})
	patch, err := diffOf(ctx, s)
	if err != nil || !strings.Contains(patch, "-two\n+one\n") {
		t.Fatalf("the diff once a commit made before the new baseline is undone: %v\n%s", err, patch)
	}
}

// TestRebaselineWithChange: the change a new baseline runs first (an
// upload) is in the baseline, so the diff is empty after it; a Change that
// fails leaves the baseline as it was.
func TestRebaselineWithChange(t *testing.T) {
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite))
	s := create(t, m, "acme", writing)
	ctx := context.Background()
	put := func(name string, fail error) func(context.Context) error {
		return func(ctx context.Context) error {
			if err := s.FS().WriteFile(ctx, name, []byte("x\n"), 0o644); err != nil {
				return err
			}
			return fail
		}
	}
	if _, err := rebaseline(ctx, s, runner.BaselineRequest{Change: put("up.txt", nil)}); err != nil {
		t.Fatal(err)
	}
	if patch, err := diffOf(ctx, s); err != nil || patch != "" {
		t.Fatalf("the diff after an upload taken as the baseline: %v\n%s", err, patch)
	}
	boom := errors.New("boom")
	if _, err := rebaseline(ctx, s, runner.BaselineRequest{Change: put("half.txt", boom)}); !errors.Is(err, boom) {
		t.Fatalf("Rebaseline with a failing change = %v, want it", err)
	}
	if patch, err := diffOf(ctx, s); err != nil || !strings.Contains(patch, "b/half.txt") {
		t.Fatalf("the diff after a failed change: %v, want half.txt since the baseline before\n%s", err, patch)
	}
}

// statedBackend is the memory backend with a state directory for each
// session, as Docker's: the session keeps its baseline there.
type statedBackend struct {
	memory.Backend
	dir string
}

func (b statedBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.Backend.Open(ctx, spec)
	if err == nil {
		inst.StateDir = func(id string) (string, error) {
			d := filepath.Join(b.dir, id+".state")
			return d, os.MkdirAll(d, 0o700)
		}
	}
	return inst, err
}

// TestRebaselineKept: a new baseline replaces the kept one in the
// session's state directory, its tree and contents, leaving no content the
// new tree does not name; one whose read fails midway leaves the kept one
// as it was, and the diff against it.
func TestRebaselineKept(t *testing.T) {
	state := t.TempDir()
	m := newManager(t, statedBackend{memory.Backend{TempDir: t.TempDir()}, state}, runner.WithGrants(tools.GrantFSWrite))
	s := create(t, m, "acme", writing)
	ctx := context.Background()
	callOK(t, s, "write", map[string]any{"path": "a.txt", "content": "one\n"})
	kept := filepath.Join(state, s.ID()+".state", "baseline")
	waitFor(t, func() bool { return runner.BaselineComplete(s) })
	first, err := delivery.ReadKeptTree(kept)
	if err != nil || len(first.Files) != 0 {
		t.Fatalf("the kept first tree: %+v, %v; want an empty one", first, err)
	}
	if _, err := rebaseline(ctx, s, runner.BaselineRequest{}); err != nil {
		t.Fatal(err)
	}
	callOK(t, s, "write", map[string]any{"path": "a.txt", "content": "two\n"})
	callOK(t, s, "write", map[string]any{"path": "b.txt", "content": "bee\n"})
	if _, err := rebaseline(ctx, s, runner.BaselineRequest{}); err != nil {
		t.Fatal(err)
	}
	tree, err := delivery.ReadKeptTree(kept)
	if err != nil || len(tree.Files) != 2 || tree.Files["a.txt"].OID != delivery.BlobOID([]byte("two\n")) {
		t.Fatalf("the kept tree after a new baseline: %+v, %v; want a.txt (two) and b.txt", tree, err)
	}
	var want []string
	for _, e := range tree.Files {
		want = append(want, e.OID)
	}
	if got := objectNames(t, kept); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("the kept contents: %q, want the new tree's alone %q", got, want)
	}
	treeFile := filepath.Join(kept, "tree.json")
	before, err := os.ReadFile(treeFile)
	if err != nil {
		t.Fatal(err)
	}

	// A read that fails after it stored a content: the kept tree stays.
	callOK(t, s, "write", map[string]any{"path": "c.txt", "content": "see\n"})
	var calls atomic.Int32
	boom := errors.New("boom")
	hold := func(context.Context, int64) (func(), error) {
		if calls.Add(1) > 1 {
			return nil, boom
		}
		return func() {}, nil
	}
	if _, err := rebaseline(ctx, s, runner.BaselineRequest{Hold: hold}); !errors.Is(err, boom) {
		t.Fatalf("Rebaseline cut short = %v, want it", err)
	}
	if after, err := os.ReadFile(treeFile); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the kept tree after a failed new baseline changed: %v", err)
	}
	if patch, err := diffOf(ctx, s); err != nil || strings.Count(patch, "diff --git") != 1 || !strings.Contains(patch, "b/c.txt") {
		t.Fatalf("the diff after a failed new baseline: %v, want c.txt alone\n%s", err, patch)
	}
}

// objectNames are the names of the contents kept in dir/objects, sorted.
func objectNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
