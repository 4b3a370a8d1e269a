package conformance

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/workspace"
)

// WrapperHarness tells TestWrapper how to make the decorator under test.
type WrapperHarness struct {
	// New returns a fresh, empty FileSystem for one subtest, with every
	// optional interface the wrapper may forward (memfs is one), and its
	// root as an absolute slash path.
	New func(t *testing.T) (inner workspace.FileSystem, root string)
	// Wrap returns the decorator over inner, rooted at root.
	Wrap func(t *testing.T, inner workspace.FileSystem, root string) workspace.FileSystem
}

// TestWrapper checks that a FileSystem decorator (workspace.Guard, scope,
// the journal's recorder) says truly what it can do, over inner file
// systems of each shape: New's, and New's seen as the core alone and as
// the core with links.
//
// A wrapper is a workspace.SymlinkFS exactly when its inner one is: links
// have no fallback, so a wrapper that claims them over an inner without
// refuses every Symlink a caller chose it for, and one that drops them
// hides the links there are. Every other optional interface the wrapper
// has must work over every inner, as the helper that falls back to the
// core would (workspace.MkdirAll, RemoveAll, Lock, Walk, Grep, Swap,
// AppendFile, CheckChange): a wrapper may add one, never claim one it
// cannot serve.
func TestWrapper(t *testing.T, h WrapperHarness) {
	shapes := []struct {
		name string
		view func(workspace.FileSystem) workspace.FileSystem
	}{
		{"Full", func(f workspace.FileSystem) workspace.FileSystem { return f }},
		{"Core", func(f workspace.FileSystem) workspace.FileSystem { return struct{ workspace.FileSystem }{f} }},
		{"CoreAndLinks", func(f workspace.FileSystem) workspace.FileSystem {
			if sl, ok := f.(workspace.SymlinkFS); ok {
				return struct{ workspace.SymlinkFS }{sl}
			}
			return struct{ workspace.FileSystem }{f}
		}},
	}
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			fsys, root := h.New(t)
			inner := shape.view(fsys)
			w := h.Wrap(t, inner, root)
			_, innerLinks := inner.(workspace.SymlinkFS)
			if _, links := w.(workspace.SymlinkFS); links != innerLinks {
				t.Errorf("the wrapper is a SymlinkFS: %v; its inner one: %v (they must be the same)", links, innerLinks)
			}
			for _, c := range wrapperCases {
				if !c.has(w) {
					continue
				}
				if err := c.use(t.Context(), w, root); err != nil {
					t.Errorf("the wrapper is a %s, but over this inner one it fails: %v", c.name, err)
				}
			}
		})
	}
}

// wrapperCases use each optional interface a wrapper may have once, on a
// small tree of their own.
var wrapperCases = []struct {
	name string
	has  func(workspace.FileSystem) bool
	use  func(ctx context.Context, fsys workspace.FileSystem, root string) error
}{
	{"SymlinkFS", implements[workspace.SymlinkFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		sl := fsys.(workspace.SymlinkFS)
		if err := sl.Symlink(ctx, "target", "link"); err != nil {
			return err
		}
		got, err := sl.Readlink(ctx, "link")
		return want(got, "target", err)
	}},
	{"MkdirAllFS", implements[workspace.MkdirAllFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		if err := fsys.(workspace.MkdirAllFS).MkdirAll(ctx, "mk/a/b", 0o755); err != nil {
			return err
		}
		_, err := fsys.Stat(ctx, "mk/a/b")
		return err
	}},
	{"RemoveAllFS", implements[workspace.RemoveAllFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		if err := put(ctx, fsys, "rm/a", "f"); err != nil {
			return err
		}
		if err := fsys.(workspace.RemoveAllFS).RemoveAll(ctx, "rm"); err != nil {
			return err
		}
		if _, err := fsys.Lstat(ctx, "rm"); !errors.Is(err, workspace.ErrNotFound) {
			return fmt.Errorf("rm after RemoveAll: %v", err)
		}
		return nil
	}},
	{"LockFS", implements[workspace.LockFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		unlock, err := fsys.(workspace.LockFS).Lock(ctx, "locked")
		if err == nil {
			unlock()
		}
		return err
	}},
	{"WalkFS", implements[workspace.WalkFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		if err := put(ctx, fsys, "walk", "f"); err != nil {
			return err
		}
		res, err := fsys.(workspace.WalkFS).Walk(ctx, workspace.WalkRequest{Dir: "walk"})
		if err != nil {
			return err
		}
		var names []string
		for _, e := range res.Entries {
			names = append(names, e.Path)
		}
		return want(strings.Join(names, ","), "walk/f", nil)
	}},
	{"GrepFS", implements[workspace.GrepFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		if err := put(ctx, fsys, "grep", "f"); err != nil {
			return err
		}
		res, err := fsys.(workspace.GrepFS).Grep(ctx, workspace.GrepRequest{Dir: "grep", Pattern: "needle"})
		if err != nil {
			return err
		}
		return want(fmt.Sprint(res.Matches), "1", nil)
	}},
	{"SwapFS", implements[workspace.SwapFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		if _, err := fsys.(workspace.SwapFS).Swap(ctx, workspace.SwapRequest{Name: "swapped", Data: []byte("new"), Perm: 0o644}); err != nil {
			return err
		}
		got, err := fsys.ReadFile(ctx, "swapped", 1<<10)
		return want(string(got), "new", err)
	}},
	{"AppendFS", implements[workspace.AppendFS], func(ctx context.Context, fsys workspace.FileSystem, _ string) error {
		a := fsys.(workspace.AppendFS)
		for _, s := range []string{"a", "b"} {
			if err := a.AppendFile(ctx, "appended", []byte(s), 0o644); err != nil {
				return err
			}
		}
		got, err := fsys.ReadFile(ctx, "appended", 1<<10)
		return want(string(got), "ab", err)
	}},
	{"CheckFS", implements[workspace.CheckFS], func(ctx context.Context, fsys workspace.FileSystem, root string) error {
		_, err := fsys.(workspace.CheckFS).CheckChange(ctx, "checked")
		return err
	}},
}

// put makes the directories of dir and a file name in the last, holding
// "needle\n".
func put(ctx context.Context, fsys workspace.FileSystem, dir, name string) error {
	p := ""
	for _, part := range strings.Split(dir, "/") {
		p = path.Join(p, part)
		if err := fsys.Mkdir(ctx, p, 0o755); err != nil {
			return err
		}
	}
	return fsys.WriteFile(ctx, path.Join(dir, name), []byte("needle\n"), 0o644)
}

func implements[T any](fsys workspace.FileSystem) bool {
	_, ok := fsys.(T)
	return ok
}

// want is err, or an error when got is not w.
func want(got, w string, err error) error {
	if err == nil && got != w {
		err = fmt.Errorf("got %q, want %q", got, w)
	}
	return err
}
