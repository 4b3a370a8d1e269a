package workspace_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestRealPath resolves names through links the way the kernel does: a
// ".." in a link's target leaves the directory the link led to, not the
// link's name (a lexical answer would let "a/l => x/../config", with
// "a/x => ../.git/hooks", pass a protect check as "a/config").
func TestRealPath(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	for _, d := range []string{".git/hooks", "a", "b/c"} {
		if err := workspace.MkdirAll(ctx, fsys, d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fsys.WriteFile(ctx, ".git/config", []byte("[core]\n"), 0o644)
	for _, l := range []struct{ target, name string }{
		{"../.git/hooks", "a/x"},
		{"x/../config", "a/l"},
		{"/workspace/b/c", "a/abs"},
		{"/workspace/b/c/../../.git", "a/absdots"},
		{"../..", "a/up"},
		{"/etc", "a/etc"},
		{"/workspace/../workspace/b", "a/respelt"},
		{"missing/../../.git/config", "a/gap"},
	} {
		if err := fsys.Symlink(ctx, l.target, l.name); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, want string
		err        *workspace.Kind
	}{
		{"a/l", ".git/config", nil},
		{"a/x/pre-commit", ".git/hooks/pre-commit", nil},
		{"a/abs/new.txt", "b/c/new.txt", nil},
		{"a/absdots/config", ".git/config", nil},
		{"new/file", "new/file", nil},
		{"a/up", "", workspace.ErrOutsideWorkspace},
		{"a/etc/passwd", "", workspace.ErrOutsideWorkspace},
		{"a/respelt", "", workspace.ErrOutsideWorkspace},
		{"a/gap", "", workspace.ErrNotFound},
	} {
		got, err := workspace.RealPath(ctx, fsys, "/workspace", tc.name)
		switch {
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("RealPath(%s) = %q, %v; want %v", tc.name, got, err, tc.err.Name())
		case tc.err == nil && (err != nil || got != tc.want):
			t.Errorf("RealPath(%s) = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
