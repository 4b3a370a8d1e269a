package memfs

import (
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/workspace"
)

// FromDir returns a workspace holding a copy of the host directory dir: its
// directories, regular files and symbolic links, with their permission bits
// and modification times. Special files (pipes, sockets, devices) are left
// out, and are never opened. Link targets are copied as they are, except that
// an absolute target inside dir is rewritten to the same place under the
// workspace root, so a link that stays inside dir on disk stays inside the
// workspace in memory.
//
// The copy is read through an os.Root, so links in dir cannot make FromDir
// read outside it; it is a snapshot of a directory nobody is changing, not
// an atomic one. Any error reading dir, or ctx ending, fails FromDir.
func FromDir(ctx context.Context, dir string, opts ...Option) (*FS, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f := New(opts...)
	hostRoots := hostPaths(dir)
	src := root.FS()
	err = fs.WalkDir(src, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n := &node{mode: info.Mode(), modTime: info.ModTime()}
		switch info.Mode().Type() {
		case fs.ModeDir:
			if name == "." {
				f.root.mode, f.root.modTime = n.mode, n.modTime
				return nil
			}
			n.entries = map[string]*node{}
		case 0:
			if err := f.reserve("copy", name, info.Size()); err != nil {
				return err // before reading a file that cannot fit
			}
			n.data, err = readRegular(root, name)
		case fs.ModeSymlink:
			n.target, err = fs.ReadLink(src, name)
			n.target = f.rebase(n.target, hostRoots)
		default:
			return nil
		}
		if err != nil {
			return err
		}
		// Attached without put, so the copied directories keep their times.
		l, err := f.resolve(name, false)
		if err != nil {
			return pathErr("copy", name, err)
		}
		if err := f.reserve("copy", name, n.bytes()); err != nil {
			return err
		}
		f.attach(l, n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// readRegular reads a file the walk saw as regular. It opens it without
// blocking and checks it again, in case it has since been replaced by a pipe.
func readRegular(root *os.Root, name string) ([]byte, error) {
	file, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, pathErr("read", name, workspace.ErrNotAFile)
	}
	return io.ReadAll(file)
}

// hostPaths are the absolute paths by which links may name dir.
func hostPaths(dir string) []string {
	var out []string
	if abs, err := filepath.Abs(dir); err == nil {
		out = append(out, abs)
		if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
			out = append(out, real)
		}
	}
	return out
}

// rebase turns a host link target into a workspace one: an absolute target
// inside one of hostRoots moves under the workspace root.
func (f *FS) rebase(target string, hostRoots []string) string {
	if !filepath.IsAbs(target) {
		return filepath.ToSlash(target)
	}
	clean := filepath.Clean(target)
	for _, h := range hostRoots {
		if clean == h {
			return f.rootPath
		}
		if rel, ok := strings.CutPrefix(clean, strings.TrimSuffix(h, string(filepath.Separator))+string(filepath.Separator)); ok {
			return strings.TrimSuffix(f.rootPath, "/") + "/" + filepath.ToSlash(rel)
		}
	}
	return target
}

// Mknod creates a special file, so that tests can check what a workspace
// does with one: mode is fs.ModeNamedPipe, fs.ModeSocket, fs.ModeDevice or
// fs.ModeDevice|fs.ModeCharDevice, with permission bits (less the umask).
// Reading or writing the file fails with ErrNotAFile; it can be listed,
// renamed and removed. Mknod fails with ErrExists when name exists and
// ErrInvalidArgument for any other mode.
func (f *FS) Mknod(name string, mode fs.FileMode) error {
	switch mode.Type() {
	case fs.ModeNamedPipe, fs.ModeSocket, fs.ModeDevice, fs.ModeDevice | fs.ModeCharDevice:
	default:
		return pathErr("mknod", name, workspace.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.create("mknod", name, &node{mode: mode.Type() | f.perm(mode), modTime: f.now()})
}

// Link makes newname another name of the file oldname — a hard link, so
// tests can check that WriteFile replaces a shared file rather than writing
// through it. A link at oldname is linked itself, not followed. It fails
// with ErrNotFound when oldname does not exist, ErrExists when newname does
// and ErrForbidden for a directory.
func (f *FS) Link(oldname, newname string) error {
	return f.LinkFrom(f, oldname, newname)
}

// LinkFrom is Link with oldname in src, which may be another FS: a file
// shared between two workspaces, as a hard link from outside a workspace on
// disk would be.
func (f *FS) LinkFrom(src *FS, oldname, newname string) error {
	src.mu.RLock()
	l, err := src.lookup("link", oldname, false)
	src.mu.RUnlock()
	if err != nil {
		return err
	}
	if l.n.isDir() {
		return pathErr("link", oldname, workspace.ErrForbidden)
	}
	// A file node is never changed once in a tree, so sharing it is safe.
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.create("link", newname, l.n)
}
