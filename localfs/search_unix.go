//go:build unix

package localfs

import (
	"context"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
	"golang.org/x/sys/unix"
)

var (
	_ workspace.WalkEachFS = (*FS)(nil)
	_ workspace.GrepFS     = (*FS)(nil)
)

// Walk lists a tree. Its result is workspace.WalkGeneric's — it is that walk —
// but each directory below the start is opened relative to its parent's
// descriptor, one entry at a time (openat(2) with O_NOFOLLOW and
// O_DIRECTORY), rather than by resolving its whole name through the root
// again. The start is opened through the root like any name. A directory
// swapped for a link while the walk runs is skipped, never followed.
func (f *FS) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	t := &dirStack{FS: f}
	defer t.close()
	return workspace.WalkGeneric(ctx, t, req)
}

// WalkEach is Walk handing each entry to fn as it is found (see
// workspace.WalkGenericEach): Grep's walk, which stops where the search
// does.
func (f *FS) WalkEach(ctx context.Context, req workspace.WalkRequest, fn func(workspace.WalkEntry) error) error {
	t := &dirStack{FS: f}
	defer t.close()
	return workspace.WalkGenericEach(ctx, t, req, fn)
}

// dirStack is f for one workspace.WalkGeneric: its ReadDir keeps each
// directory it lists open while the walk is below it, and opens the next
// directory relative to its parent. A walk lists depth first, so the open
// directories are the chain from the start to the current one. Not safe for
// concurrent use.
type dirStack struct {
	*FS
	open []heldDir
}

type heldDir struct {
	name string
	file *os.File
}

func (t *dirStack) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	parent := path.Dir(name)
	for len(t.open) > 0 && (t.open[len(t.open)-1].name != parent || name == ".") {
		t.pop()
	}
	var d *os.File
	if len(t.open) == 0 {
		var err error
		if d, err = t.openDir(ctx, name); err != nil {
			return nil, err
		}
		// The os package lists a directory opened through a Root with an
		// lstat of every entry; the walk describes an entry only when
		// asked (atEntry). So it lists the start through a descriptor of
		// its own, of the directory the root resolved.
		if own, err := reopenDir(d, filepath.Join(t.canon, filepath.FromSlash(name))); err == nil {
			d.Close()
			d = own
		}
	} else {
		if err := ctx.Err(); err != nil {
			return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
		}
		fd, err := ignoringEINTR(func() (int, error) {
			return unix.Openat(int(t.open[len(t.open)-1].file.Fd()), path.Base(name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		})
		if err != nil {
			return nil, pathError("readdir", name, err)
		}
		// Named as os.Root names what it opens, for the lstat that a
		// file system without entry types in its listings needs.
		d = os.NewFile(uintptr(fd), filepath.Join(t.canon, filepath.FromSlash(name)))
	}
	entries, err := readDirSorted(d)
	if err != nil {
		d.Close()
		return nil, pathError("readdir", name, err)
	}
	for i, e := range entries {
		entries[i] = atEntry{e, d}
	}
	t.open = append(t.open, heldDir{name, d})
	return entries, nil
}

// reopenDir opens the directory d again ("." relative to it), as a file
// of its own named name.
func reopenDir(d *os.File, name string) (*os.File, error) {
	rc, err := d.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	if cerr := rc.Control(func(dfd uintptr) {
		fd, err = ignoringEINTR(func() (int, error) {
			return unix.Openat(int(dfd), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		})
	}); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// atEntry is an entry of a directory the walk holds open: its Info is
// fstatat(2) relative to that descriptor, not lstat(2) of its whole name
// (which resolves every directory above it again — in a container, through
// the overlay, ~110 µs an entry).
type atEntry struct {
	fs.DirEntry
	dir *os.File
}

func (e atEntry) Info() (fs.FileInfo, error) {
	rc, err := e.dir.SyscallConn()
	if err != nil {
		return e.DirEntry.Info()
	}
	var st unix.Stat_t
	var serr error
	// Control holds the descriptor: once the walk has closed it, Control
	// fails and the entry is described by its name instead.
	if err := rc.Control(func(fd uintptr) {
		_, serr = ignoringEINTR(func() (int, error) {
			return 0, unix.Fstatat(int(fd), e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW)
		})
	}); err != nil {
		return e.DirEntry.Info()
	}
	if serr != nil {
		return nil, &fs.PathError{Op: "lstat", Path: e.Name(), Err: serr}
	}
	return &statInfo{name: e.Name(), st: st}, nil
}

// statInfo is an fs.FileInfo from a stat(2) structure, as package os
// describes one; Sys is the *syscall.Stat_t os would give, where sysStat can
// make one.
type statInfo struct {
	name string
	st   unix.Stat_t
}

func (i *statInfo) Name() string       { return i.name }
func (i *statInfo) Size() int64        { return i.st.Size }
func (i *statInfo) IsDir() bool        { return i.Mode().IsDir() }
func (i *statInfo) ModTime() time.Time { return time.Unix(i.st.Mtim.Unix()) }
func (i *statInfo) Sys() any           { return sysStat(&i.st) }

func (i *statInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.st.Mode & 0o777)
	switch i.st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	}
	if i.st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if i.st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if i.st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func (t *dirStack) pop() {
	t.open[len(t.open)-1].file.Close()
	t.open = t.open[:len(t.open)-1]
}

func (t *dirStack) close() {
	for len(t.open) > 0 {
		t.pop()
	}
}

// Grep searches file contents. Its result is workspace.GrepGeneric's: it is
// workspace.GrepWithBuffers over WalkEach (so a search that reaches its
// limit lists no more of the tree), with a cheaper reader that reuses its
// buffers. Where the system can open a name confined to a directory in one
// call (Linux's openat2(2) with RESOLVE_BENEATH), each file is opened so
// beneath the root's descriptor, checked with fstat(2) and read; whatever
// that call refuses (a link leading out, an absolute link, an old kernel),
// and every file on other systems, is read with ReadFile, which decides.
func (f *FS) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	r := fileReader{FS: f}
	if root, err := f.root.Open("."); err == nil {
		defer root.Close()
		r.root = int(root.Fd())
	} else {
		r.root = -1
	}
	return workspace.GrepWithBuffers(ctx, f, req, r.readFile)
}

// fileReader reads the files of one search.
type fileReader struct {
	*FS
	root int // a descriptor of the root, or -1
}

// readFile behaves as ReadFile, opening name beneath the root in one call
// when it can and then reading into buf.
func (r fileReader) readFile(ctx context.Context, name string, max int64, buf []byte) ([]byte, error) {
	if r.root < 0 || ctx.Err() != nil {
		return r.ReadFile(ctx, name, max)
	}
	fd, err := openBeneath(r.root, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, false)
	if err != nil {
		return r.ReadFile(ctx, name, max)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, pathError("read", name, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, workspace.PathError("read", name, workspace.ErrNotAFile)
	case st.Size > max:
		return nil, workspace.PathError("read", name, workspace.ErrFileTooLarge)
	}
	data, err := readAll(fdReader(fd), st.Size, max, buf)
	if err != nil {
		return nil, pathError("read", name, err)
	}
	return data, nil
}

// fdReader reads a descriptor without the os package's poller, which a
// regular file does not need.
type fdReader int

func (fd fdReader) Read(p []byte) (int, error) {
	n, err := ignoringEINTR(func() (int, error) { return unix.Read(int(fd), p) })
	switch {
	case err != nil:
		return 0, err
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

func ignoringEINTR(fn func() (int, error)) (int, error) {
	for {
		n, err := fn()
		if err != unix.EINTR {
			return n, err
		}
	}
}
