package scope_test

import (
	"context"
	"io/fs"
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/workspace"
)

// everything are rules that allow all, spelt out so that every check runs.
var everything = scope.Rules{Visible: []string{"**"}, Commit: []string{"**"}}

// walkingFS gives a FileSystem a WalkFS and a GrepFS of its own (the
// generic walk and search over it), so that the decorator's filtered fast
// paths are taken.
type walkingFS struct{ workspace.SymlinkFS }

func (w walkingFS) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	return workspace.WalkGeneric(ctx, w.SymlinkFS, req)
}

// Grep gives it a GrepFS of its own too (the generic search over it), so
// that the decorator's filtered search is taken.
func (w walkingFS) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	return workspace.GrepGeneric(ctx, w.SymlinkFS, req)
}

// TestConformance runs the kit over the decorator with rules that allow
// everything: with them, nothing but the checks may differ from the adapter.
func TestConformance(t *testing.T) {
	memHarness := func(r scope.Rules, wrap func(*memfs.FS) workspace.FileSystem) conformance.FileSystemHarness {
		return conformance.FileSystemHarness{New: func(t *testing.T) conformance.Instance {
			inner := memfs.New()
			outside := memfs.New(memfs.WithRoot("/outside"))
			fsys, err := scope.New(wrap(inner), inner.Root(), r)
			if err != nil {
				t.Fatal(err)
			}
			return conformance.Instance{
				FS:          fsys,
				Root:        inner.Root(),
				MakeSpecial: func(name string, typ fs.FileMode) error { return inner.Mknod(name, typ|0o644) },
				Outside:     conformance.OutsideFS(outside, outside.Root()),
				Hardlink:    func(outsideName, name string) error { return inner.LinkFrom(outside, outsideName, name) },
			}
		}}
	}
	plain := func(f *memfs.FS) workspace.FileSystem { return f }
	walking := func(f *memfs.FS) workspace.FileSystem { return walkingFS{f} }

	t.Run("memfs/zero", func(t *testing.T) {
		conformance.TestFileSystem(t, memHarness(scope.Rules{}, plain))
	})
	t.Run("memfs/everything", func(t *testing.T) {
		conformance.TestFileSystem(t, memHarness(everything, plain))
	})
	t.Run("memfs/commit", func(t *testing.T) {
		conformance.TestFileSystem(t, memHarness(scope.Rules{Commit: []string{"**"}}, plain))
	})
	t.Run("walkfs/everything", func(t *testing.T) {
		conformance.TestFileSystem(t, memHarness(everything, walking))
	})
	t.Run("localfs/everything", func(t *testing.T) {
		conformance.TestFileSystem(t, conformance.FileSystemHarness{New: func(t *testing.T) conformance.Instance {
			dir, outside := t.TempDir(), t.TempDir()
			inner, err := localfs.New(dir, localfs.WithLockDir(t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { inner.Close() })
			inst := conformance.HostInstance(t, inner, dir, outside)
			if inst.FS, err = scope.New(inner, inst.Root, everything); err != nil {
				t.Fatal(err)
			}
			return inst
		}})
	})
}

// TestWrapper: the decorator claims links exactly when its inner file
// system has them, and every extension it claims works.
func TestWrapper(t *testing.T) {
	conformance.TestWrapper(t, conformance.WrapperHarness{
		New: func(t *testing.T) (workspace.FileSystem, string) {
			fsys := memfs.New()
			return fsys, fsys.Root()
		},
		Wrap: func(t *testing.T, inner workspace.FileSystem, root string) workspace.FileSystem {
			scoped, err := scope.New(inner, root, everything)
			if err != nil {
				t.Fatal(err)
			}
			return scoped
		},
	})
}
