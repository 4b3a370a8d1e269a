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
	var patch bytes.Buffer
	err := s.Do(ctx, "diff", func(ctx context.Context) (bool, error) {
		d, err := s.Diff(ctx, runner.DiffRequest{})
		if err != nil {
			return false, err
		}
		defer d.Close()
		return false, d.WritePatch(ctx, &patch)
	})
	if err != nil || !strings.HasPrefix(patch.String(), "diff --git a/a.txt b/a.txt\nnew file mode 100644\n") {
		t.Fatalf("diff: %v\n%s", err, patch.String())
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
