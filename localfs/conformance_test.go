package localfs_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localfs"
)

func TestConformance(t *testing.T) {
	conformance.TestFileSystem(t, conformance.FileSystemHarness{
		New: func(t *testing.T) conformance.Instance {
			// Sibling temporary directories: the workspace, the outside the
			// kit must never reach, and the lock files.
			dir, outside := t.TempDir(), t.TempDir()
			fsys, err := localfs.New(dir, localfs.WithLockDir(t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fsys.Close() })
			return conformance.HostInstance(t, fsys, dir, outside)
		},
	})
}
