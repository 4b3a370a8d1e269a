package runner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// TestDiffFirstTree: a session's first tree is kept outside its workspace
// for its diff, the diff shows the session's change against it, and the
// tree goes with the session.
func TestDiffFirstTree(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // not parallel: os.MkdirTemp reads it
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite))
	s := create(t, m, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"read", "edit"}})
	ctx := context.Background()
	if r, err := s.Call(ctx, "write", json.RawMessage(`{"path":"a.txt","content":"a\n"}`), tools.CallOptions{}); err != nil || r.IsError {
		t.Fatalf("write: %+v, %v", r, err)
	}
	patch, err := diffOf(ctx, s)
	if err != nil || !strings.HasPrefix(patch, "diff --git a/a.txt b/a.txt\nnew file mode 100644\n") {
		t.Fatalf("diff: %v\n%s", err, patch)
	}
	if kept, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-delivery-*")); len(kept) != 1 {
		t.Fatalf("stores in the daemon's directory after the diff: %q, want the first tree's alone", kept)
	}
	if err := m.Delete(ctx, "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-delivery-*")); len(left) != 0 {
		t.Fatalf("the first tree outlived its session: %q", left)
	}
}

// TestDiffLeavesOutIgnored: the files a session adds that its project's
// .gitignore files ignore are not in its diff, and its header says so.
func TestDiffLeavesOutIgnored(t *testing.T) {
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite))
	s := create(t, m, "acme", runner.Settings{Grants: []string{tools.GrantFSWrite}, Always: []string{"read", "edit"}})
	ctx := context.Background()
	for name, content := range map[string]string{".gitignore": "*.log\n", "sub/.gitignore": "build/\n", "a.go": "package a\n", "debug.log": "x\n", "sub/build/out.bin": "y\n", "sub/keep.txt": "z\n"} {
		args, _ := json.Marshal(map[string]string{"path": name, "content": content})
		if r, err := s.Call(ctx, "write", args, tools.CallOptions{}); err != nil || r.IsError {
			t.Fatalf("write %s: %+v, %v", name, r, err)
		}
	}
	patch, err := diffOf(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	p := patch
	for _, want := range []string{"b/a.go", "b/.gitignore", "b/sub/keep.txt", "ignored by the project's .gitignore: debug.log, sub/build/out.bin\n"} {
		if !strings.Contains(p, want) {
			t.Errorf("the diff lacks %q:\n%s", want, p)
		}
	}
	if strings.Contains(p, "b/debug.log") || strings.Contains(p, "b/sub/build/out.bin") {
		t.Errorf("the diff carries ignored files:\n%s", p)
	}
}

// diffOf is the session's diff as a patch.
func diffOf(ctx context.Context, s *runner.Session) (string, error) {
	var patch bytes.Buffer
	err := s.Do(ctx, "diff", func(ctx context.Context) (bool, error) {
		d, err := s.Diff(ctx, runner.DiffRequest{})
		if err != nil {
			return false, err
		}
		defer d.Close()
		return false, d.WritePatch(ctx, &patch)
	})
	return patch.String(), err
}
