package memfs_test

import (
	"io/fs"
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
)

func TestConformance(t *testing.T) {
	conformance.TestFileSystem(t, conformance.FileSystemHarness{
		New: func(t *testing.T) conformance.Instance {
			fsys := memfs.New()
			// The outside is a second in-memory tree: links to it are never
			// followed, and a file shared with it stands for a hard link.
			outside := memfs.New(memfs.WithRoot("/outside"))
			return conformance.Instance{
				FS:          fsys,
				Root:        fsys.Root(),
				MakeSpecial: func(name string, typ fs.FileMode) error { return fsys.Mknod(name, typ|0o644) },
				Outside:     conformance.OutsideFS(outside, outside.Root()),
				Hardlink:    func(outsideName, name string) error { return fsys.LinkFrom(outside, outsideName, name) },
			}
		},
	})
}
