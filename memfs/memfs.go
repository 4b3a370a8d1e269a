// Package memfs is an in-memory workspace.FileSystem: the memory backend of
// sandboxd, and a fast, exact stand-in for a disk in tests.
//
// It keeps a tree of directories, regular files, symbolic links and special
// files (pipes, sockets, devices, made with Mknod), each with permission bits
// and a modification time. Links are confined the way a disk adapter built on
// os.Root confines them: followed while they stay inside the workspace, whose
// absolute path is "/workspace" unless WithRoot says otherwise, and refused
// with workspace.ErrOutsideWorkspace as soon as they would leave it.
//
//	fsys := memfs.New()
//	err := fsys.WriteFile(ctx, "a/b.txt", data, 0o644) // ErrNotFound: no "a"
//
// An FS is safe for concurrent use. Every operation resolves its names and
// acts under one lock, so no concurrent change can come between the two.
// File contents are never modified in place: a write installs a new byte
// slice, so a reader sees the old contents or the new, never a mix.
//
// Permission bits are kept and reported but not enforced: every caller may
// read and write everything, as root may on a disk.
package memfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

var (
	_ workspace.FileSystem  = (*FS)(nil)
	_ workspace.SymlinkFS   = (*FS)(nil)
	_ workspace.MkdirAllFS  = (*FS)(nil)
	_ workspace.RemoveAllFS = (*FS)(nil)
	_ workspace.LockFS      = (*FS)(nil)
	_ workspace.AppendFS    = (*FS)(nil)
)

// DefaultRoot is the absolute path of a memfs workspace unless WithRoot says
// otherwise; absolute link targets under it stay inside the workspace.
const DefaultRoot = "/workspace"

// maxLinkHops bounds how many links one resolution follows, as the kernel does.
const maxLinkHops = 40

// errLinkLoop is what resolving a chain of more than maxLinkHops links fails
// with: an invalid argument, in the words of the kernel's ELOOP.
var errLinkLoop = fmt.Errorf("too many levels of symbolic links: %w", workspace.ErrInvalidArgument)

// FS is an in-memory workspace file system. Create one with New or FromDir;
// the zero value is not usable.
type FS struct {
	mu    sync.RWMutex
	root  *node
	locks workspace.KeyedMutex[string]

	rootPath string
	umask    fs.FileMode
	now      func() time.Time
	maxBytes int64 // 0: no limit
	used     int64 // bytes of file contents, counted once per name
	log      struct {
		gen   uint64   // bumped by every change
		names []string // where the last len(names) changes were
	}
}

// Option configures an FS made by New or FromDir.
type Option func(*FS)

// WithUmask sets the bits cleared from the permissions of every file,
// directory and special file created (default 022). Files seeded by FromDir
// keep their modes as they are on disk.
func WithUmask(mask fs.FileMode) Option {
	return func(f *FS) { f.umask = mask & fs.ModePerm }
}

// WithClock sets the source of modification times (default time.Now).
func WithClock(now func() time.Time) Option {
	return func(f *FS) { f.now = now }
}

// WithRoot sets the workspace's absolute path (default DefaultRoot): absolute
// link targets under it are followed, all others lead outside the workspace.
// A relative path is taken from "/".
func WithRoot(root string) Option {
	return func(f *FS) { f.rootPath = path.Clean("/" + root) }
}

// WithMaxBytes bounds the bytes of file contents the workspace holds (0, the
// default, is no bound), so that a runaway writer fails instead of
// exhausting the process's memory. A write, link or FromDir copy that would
// go over it fails with workspace.ErrForbidden and changes nothing. A file
// with several names (see Link) counts once per name; directories, links and
// special files count nothing.
func WithMaxBytes(n int64) Option {
	return func(f *FS) { f.maxBytes = max(n, 0) }
}

// New returns an empty workspace: a root directory with mode 0755.
func New(opts ...Option) *FS {
	f := &FS{rootPath: DefaultRoot, umask: 0o022, now: time.Now}
	for _, o := range opts {
		o(f)
	}
	f.root = &node{mode: fs.ModeDir | 0o755, modTime: f.now(), entries: map[string]*node{}}
	return f
}

// Root returns the workspace's absolute path, for workspace.Resolve and
// workspace.RealPath.
func (f *FS) Root() string { return f.rootPath }

// Used returns the bytes of file contents the workspace holds, as
// WithMaxBytes counts them.
func (f *FS) Used() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.used
}

// node is one file. Directories are changed in place under the FS's write
// lock; a regular file's data is never changed once the node is in the tree —
// a write installs a new node — so a slice taken under the read lock stays
// valid after it is released.
type node struct {
	mode    fs.FileMode // type and permission bits
	modTime time.Time
	data    []byte           // regular file
	target  string           // symbolic link
	entries map[string]*node // directory
	// grown says an append has taken the spare capacity of data for the
	// node that replaced this one (AppendFile): a node is never changed,
	// but the first append after it may write past its length.
	grown atomic.Bool
}

func (n *node) isDir() bool  { return n.mode.IsDir() }
func (n *node) isLink() bool { return n.mode&fs.ModeSymlink != 0 }

// bytes is what n and everything under it count against WithMaxBytes.
func (n *node) bytes() int64 {
	if n == nil {
		return 0
	}
	sum := int64(len(n.data))
	for _, child := range n.entries {
		sum += child.bytes()
	}
	return sum
}

func (n *node) info(name string) fs.FileInfo {
	fi := &fileInfo{name: name, mode: n.mode, modTime: n.modTime}
	switch {
	case n.mode.IsRegular():
		fi.size = int64(len(n.data))
	case n.isLink():
		fi.size = int64(len(n.target))
	}
	return fi
}

// fileInfo is a snapshot of a node, taken under the lock.
type fileInfo struct {
	name    string
	size    int64
	mode    fs.FileMode
	modTime time.Time
}

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.size }
func (fi *fileInfo) Mode() fs.FileMode  { return fi.mode }
func (fi *fileInfo) ModTime() time.Time { return fi.modTime }
func (fi *fileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi *fileInfo) Sys() any           { return nil }
func (fi *fileInfo) String() string     { return fs.FormatFileInfo(fi) }

// loc is where a name resolved to: the directory holding the final entry, the
// entry's name in it, the entry (nil when it does not exist yet) and the
// entry's real workspace name. The root has no parent: dir is nil.
type loc struct {
	dir  *node
	base string
	n    *node
	path string
}

// resolve walks name from the root. Links in the directories on the way are
// followed; a link as the final element is followed only when follow is set.
// A missing final element is not an error (loc.n is nil); a missing directory
// on the way is ErrNotFound, and a file on the way is ErrNotADirectory.
// Leaving the root — by a relative ".." past it or an absolute target outside
// rootPath — is ErrOutsideWorkspace. The caller holds f.mu.
//
// ".." in a link target goes to the parent of the directory actually reached,
// as the kernel and os.Root do, not to a lexical parent.
func (f *FS) resolve(name string, follow bool) (loc, error) {
	if !validName(name) {
		return loc{}, workspace.ErrInvalidArgument
	}
	if err := workspace.CheckNameLength(f.rootPath, name); err != nil {
		return loc{}, err
	}
	dirs := []*node{f.root} // the directories reached; dirs[i+1] is named names[i]
	var names []string
	todo := split(name)
	hops := 0
	for len(todo) > 0 {
		elem := todo[0]
		todo = todo[1:]
		switch elem {
		case "", ".":
			continue
		case "..":
			if len(names) == 0 {
				return loc{}, workspace.ErrOutsideWorkspace
			}
			dirs, names = dirs[:len(dirs)-1], names[:len(names)-1]
			continue
		}
		cur := dirs[len(dirs)-1]
		child := cur.entries[elem]
		last := len(todo) == 0
		switch {
		case child == nil && last:
			return loc{dir: cur, base: elem, path: strings.Join(append(names, elem), "/")}, nil
		case child == nil:
			return loc{}, workspace.ErrNotFound
		case child.isLink() && (follow || !last):
			if hops++; hops > maxLinkHops {
				return loc{}, errLinkLoop
			}
			target := child.target // never empty: Symlink refuses that
			if path.IsAbs(target) {
				rel, ok := workspace.RootRelative(f.rootPath, target)
				if !ok {
					return loc{}, workspace.ErrOutsideWorkspace
				}
				target = rel
				dirs, names = dirs[:1], names[:0]
			}
			todo = append(split(target), todo...)
		case last:
			return loc{dir: cur, base: elem, n: child, path: strings.Join(append(names, elem), "/")}, nil
		case !child.isDir():
			return loc{}, workspace.ErrNotADirectory
		default:
			dirs, names = append(dirs, child), append(names, elem)
		}
	}
	// The walk ended on a directory it had entered: the root, or one reached
	// through a link whose target ends in a directory.
	if len(names) == 0 {
		return loc{base: ".", n: f.root, path: "."}, nil
	}
	return loc{dir: dirs[len(dirs)-2], base: names[len(names)-1], n: dirs[len(dirs)-1], path: strings.Join(names, "/")}, nil
}

// validName reports whether name is an io/fs name a disk could hold: valid
// for fs.ValidPath and free of NUL bytes.
func validName(name string) bool {
	return fs.ValidPath(name) && strings.IndexByte(name, 0) < 0
}

func split(name string) []string {
	if name == "." {
		return nil
	}
	return strings.Split(name, "/")
}

// pathErr wraps a resolution or operation failure for op on name.
func pathErr(op, name string, err error) error {
	return &fs.PathError{Op: op, Path: name, Err: err}
}

// ctxErr reports a context that has ended as op's failure on name.
func ctxErr(ctx context.Context, op, name string) error {
	if err := ctx.Err(); err != nil {
		return pathErr(op, name, err)
	}
	return nil
}

// lookup resolves name for op and requires it to exist (ErrNotFound). The
// caller holds f.mu.
func (f *FS) lookup(op, name string, follow bool) (loc, error) {
	l, err := f.resolve(name, follow)
	if err == nil && l.n == nil {
		err = workspace.ErrNotFound
	}
	if err != nil {
		return loc{}, pathErr(op, name, err)
	}
	return l, nil
}

// perm is the permission part of a requested mode, less the umask.
func (f *FS) perm(mode fs.FileMode) fs.FileMode {
	return mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky) &^ f.umask
}

// reserve checks that the workspace has room for delta more bytes.
func (f *FS) reserve(op, name string, delta int64) error {
	if f.maxBytes > 0 && delta > 0 && f.used+delta > f.maxBytes {
		return pathErr(op, name, fmt.Errorf("workspace full: %d of its %d bytes used, %d more needed: %w",
			f.used, f.maxBytes, delta, workspace.ErrNoSpace))
	}
	return nil
}

// attach makes n the entry at l, in place of what was there, and counts
// the bytes. The caller holds f.mu for writing and has reserved room.
func (f *FS) attach(l loc, n *node) {
	f.used += n.bytes() - l.dir.entries[l.base].bytes()
	l.dir.entries[l.base] = n
	f.changed(l.path)
}

// put is attach that also stamps l's directory as modified.
func (f *FS) put(l loc, n *node) {
	f.attach(l, n)
	l.dir.modTime = f.now()
}

// maxLogged bounds the changes the FS remembers for Changes.
const maxLogged = 4096

// changed logs a change at name (and under it). The caller holds f.mu for
// writing.
func (f *FS) changed(name string) {
	f.log.gen++
	if len(f.log.names) == maxLogged {
		f.log.names = append(f.log.names[:0], f.log.names[maxLogged/2:]...)
	}
	f.log.names = append(f.log.names, name)
}

// Changes reports where the tree changed after generation since, and the
// generation now: the real names (links on the way resolved) of the
// entries created, written, removed or renamed (both names), each standing
// for everything under it too, oldest first and possibly repeated. A caller
// that mirrors the tree keeps now and asks again with it. ok is false when
// the FS no longer remembers back to since (it keeps the last few thousand
// changes): then anything may have changed. A new FS is at generation 0,
// and FromDir's copy counts as changes.
func (f *FS) Changes(since uint64) (names []string, now uint64, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if since > f.log.gen || f.log.gen-since > uint64(len(f.log.names)) {
		return nil, f.log.gen, false
	}
	return slices.Clone(f.log.names[len(f.log.names)-int(f.log.gen-since):]), f.log.gen, true
}

// Stat describes the named file, following links.
func (f *FS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	return f.stat(ctx, "stat", name, true)
}

// Lstat describes the named file; a link is described itself.
func (f *FS) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	return f.stat(ctx, "lstat", name, false)
}

func (f *FS) stat(ctx context.Context, op, name string, follow bool) (fs.FileInfo, error) {
	if err := ctxErr(ctx, op, name); err != nil {
		return nil, err
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	l, err := f.lookup(op, name, follow)
	if err != nil {
		return nil, err
	}
	return l.n.info(path.Base(name)), nil
}

// ReadDir lists a directory, following links to it, sorted by name; each
// entry describes the entry itself (a link as a link).
func (f *FS) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	if err := ctxErr(ctx, "open", name); err != nil {
		return nil, err
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	l, err := f.lookup("open", name, true)
	if err != nil {
		return nil, err
	}
	if !l.n.isDir() {
		return nil, pathErr("readdir", name, workspace.ErrNotADirectory)
	}
	names := slices.Sorted(maps.Keys(l.n.entries))
	out := make([]fs.DirEntry, len(names))
	for i, base := range names {
		out[i] = fs.FileInfoToDirEntry(l.n.entries[base].info(base))
	}
	return out, nil
}

// ReadFile returns a copy of a regular file's contents. It fails with
// ErrNotAFile for a directory or special file and, without copying anything,
// with ErrFileTooLarge for a file of more than max bytes.
func (f *FS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	if err := ctxErr(ctx, "open", name); err != nil {
		return nil, err
	}
	f.mu.RLock()
	l, err := f.lookup("open", name, true)
	var data []byte
	switch {
	case err != nil:
	case !l.n.mode.IsRegular():
		err = pathErr("read", name, workspace.ErrNotAFile)
	case int64(len(l.n.data)) > max:
		err = pathErr("read", name, workspace.ErrFileTooLarge)
	default:
		data = l.n.data // never changed in place: safe to copy unlocked
	}
	f.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	return append(make([]byte, 0, len(data)), data...), nil
}

// WriteFile replaces the named regular file with a copy of data, or creates
// it with perm less the umask. An existing file keeps its permission bits;
// it is replaced by a new file, so another hard link to the old one (see
// Link) keeps the old contents. A link to a file inside the workspace is
// followed: its target is replaced and the link stays.
func (f *FS) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if err := ctxErr(ctx, "open", name); err != nil {
		return err
	}
	data = append(make([]byte, 0, len(data)), data...)
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.resolve(name, true)
	if err != nil {
		return pathErr("open", name, err)
	}
	mode := f.perm(perm)
	if l.n != nil {
		if !l.n.mode.IsRegular() {
			return pathErr("open", name, workspace.ErrNotAFile)
		}
		mode = l.n.mode
	}
	if err := f.reserve("write", name, int64(len(data))-l.n.bytes()); err != nil {
		return err
	}
	f.put(l, &node{mode: mode, modTime: f.now(), data: data})
	return nil
}

// AppendFile appends data to the named regular file, or creates it with
// perm less the umask, as WriteFile would; its cost is data's, not the
// file's (the file is replaced by a node sharing its bytes, whose spare
// capacity only the first append after it takes).
func (f *FS) AppendFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if err := ctxErr(ctx, "open", name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.resolve(name, true)
	if err != nil {
		return pathErr("open", name, err)
	}
	n := &node{mode: f.perm(perm), modTime: f.now()}
	if l.n != nil {
		if !l.n.mode.IsRegular() {
			return pathErr("open", name, workspace.ErrNotAFile)
		}
		n.mode, n.data = l.n.mode, l.n.data
		if !l.n.grown.CompareAndSwap(false, true) { // its spare capacity is another's
			n.data = slices.Clip(n.data)
		}
	}
	if err := f.reserve("write", name, int64(len(data))); err != nil {
		return err
	}
	n.data = append(n.data, data...)
	f.put(l, n)
	return nil
}

// Mkdir creates one directory with perm less the umask. A link at name is
// not followed: it exists, so Mkdir fails with ErrExists.
func (f *FS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	if err := ctxErr(ctx, "mkdir", name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.create("mkdir", name, f.newDir(perm))
}

func (f *FS) newDir(perm fs.FileMode) *node {
	return &node{mode: fs.ModeDir | f.perm(perm), modTime: f.now(), entries: map[string]*node{}}
}

// create adds n as name, which must not exist (not even as a dangling link).
// The caller holds f.mu for writing.
func (f *FS) create(op, name string, n *node) error {
	l, err := f.resolve(name, false)
	if err == nil && l.n != nil {
		err = workspace.ErrExists
	}
	if err != nil {
		return pathErr(op, name, err)
	}
	if err := f.reserve(op, name, n.bytes()); err != nil {
		return err
	}
	f.put(l, n)
	return nil
}

// Remove removes a file, a link (never its target), a special file or an
// empty directory. The root cannot be removed (ErrInvalidArgument).
func (f *FS) Remove(ctx context.Context, name string) error {
	if err := ctxErr(ctx, "remove", name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.lookup("remove", name, false)
	switch {
	case err != nil:
		return err
	case l.dir == nil:
		return pathErr("remove", name, workspace.ErrInvalidArgument)
	case l.n.isDir() && len(l.n.entries) > 0:
		return pathErr("remove", name, workspace.ErrNotEmpty)
	}
	f.unlink(l)
	return nil
}

// unlink removes the entry l, with everything under it.
func (f *FS) unlink(l loc) {
	f.used -= l.n.bytes()
	delete(l.dir.entries, l.base)
	l.dir.modTime = f.now()
	f.changed(l.path)
}

// Rename moves oldname to newname; links at either name are not followed.
// It replaces a file (or link, or special file) at newname, or an empty
// directory when oldname is a directory. It fails with ErrNotFound when
// oldname does not exist; ErrExists to put a file over a directory;
// ErrNotADirectory to put a directory over a file; ErrNotEmpty to put a
// directory over one with entries; ErrInvalidArgument to move the root, onto
// the root, or a directory into itself. Renaming a name onto itself, or onto
// another hard link of the same file, does nothing.
func (f *FS) Rename(ctx context.Context, oldname, newname string) error {
	if err := ctxErr(ctx, "rename", oldname); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src, err := f.lookup("rename", oldname, false)
	if err != nil {
		return err
	}
	dst, err := f.resolve(newname, false)
	if err != nil {
		return pathErr("rename", newname, err)
	}
	switch {
	case src.dir == nil:
		return pathErr("rename", oldname, workspace.ErrInvalidArgument)
	case dst.dir == nil:
		return pathErr("rename", newname, workspace.ErrInvalidArgument)
	case src.n == dst.n:
		return nil
	case src.n.isDir() && strings.HasPrefix(dst.path, src.path+"/"):
		return pathErr("rename", newname, workspace.ErrInvalidArgument)
	case dst.n == nil:
	case src.n.isDir() && !dst.n.isDir():
		return pathErr("rename", newname, workspace.ErrNotADirectory)
	case !src.n.isDir() && dst.n.isDir():
		return pathErr("rename", newname, workspace.ErrExists)
	case dst.n.isDir() && len(dst.n.entries) > 0:
		return pathErr("rename", newname, workspace.ErrNotEmpty)
	}
	if dst.n != nil {
		f.unlink(dst) // a file, link, special file or empty directory
	}
	// Moved by hand rather than by unlink and put, which would count the
	// bytes of a whole moved tree twice over.
	delete(src.dir.entries, src.base)
	dst.dir.entries[dst.base] = src.n
	src.dir.modTime, dst.dir.modTime = f.now(), f.now()
	f.changed(src.path)
	f.changed(dst.path)
	return nil
}

// Symlink creates name as a link to target, stored as given. Following it
// later is confined like any path. It fails with ErrExists when name exists
// and ErrInvalidArgument for an empty target or one holding a NUL byte.
func (f *FS) Symlink(ctx context.Context, target, name string) error {
	if err := ctxErr(ctx, "symlink", name); err != nil {
		return err
	}
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		return pathErr("symlink", name, workspace.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.create("symlink", name, &node{mode: fs.ModeSymlink | fs.ModePerm, modTime: f.now(), target: target})
}

// Readlink returns the target of the link name, as it was stored. It fails
// with ErrInvalidArgument when name is not a link.
func (f *FS) Readlink(ctx context.Context, name string) (string, error) {
	if err := ctxErr(ctx, "readlink", name); err != nil {
		return "", err
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	l, err := f.lookup("readlink", name, false)
	if err != nil {
		return "", err
	}
	if !l.n.isLink() {
		return "", pathErr("readlink", name, workspace.ErrInvalidArgument)
	}
	return l.n.target, nil
}

// MkdirAll creates name and any missing parents with perm less the umask,
// atomically. Existing directories, and links to directories, are fine; a
// component that is a file fails with ErrNotADirectory, and a dangling link
// with ErrExists, as os.MkdirAll does.
func (f *FS) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	if err := ctxErr(ctx, "mkdir", name); err != nil {
		return err
	}
	if !validName(name) {
		return pathErr("mkdir", name, workspace.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, elems := 0, split(name); i < len(elems); i++ {
		prefix := strings.Join(elems[:i+1], "/")
		l, err := f.resolve(prefix, true)
		switch {
		case err != nil:
			return pathErr("mkdir", prefix, err)
		case l.n == nil:
			if err := f.create("mkdir", prefix, f.newDir(perm)); err != nil {
				return err
			}
		case !l.n.isDir():
			return pathErr("mkdir", prefix, workspace.ErrNotADirectory)
		}
	}
	return nil
}

// RemoveAll removes name and everything below it, atomically. Links are
// removed, never followed. A missing name is not an error; the root cannot be
// removed (ErrInvalidArgument).
func (f *FS) RemoveAll(ctx context.Context, name string) error {
	if err := ctxErr(ctx, "removeall", name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.resolve(name, false)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return nil
	case err != nil:
		return pathErr("removeall", name, err)
	case l.dir == nil:
		return pathErr("removeall", name, workspace.ErrInvalidArgument)
	case l.n == nil:
		return nil
	}
	f.unlink(l)
	return nil
}

// Lock takes the in-process write lock for name, which need not exist. Links
// in name are resolved first, so writers through a link and through its
// target share one lock; a name that leads outside the workspace fails with
// ErrOutsideWorkspace. The lock is advisory: it serialises the callers of
// Lock, nothing else.
func (f *FS) Lock(ctx context.Context, name string) (func(), error) {
	if err := ctxErr(ctx, "lock", name); err != nil {
		return nil, err
	}
	if !validName(name) {
		return nil, pathErr("lock", name, workspace.ErrInvalidArgument)
	}
	key, err := workspace.RealPath(ctx, f, f.rootPath, name)
	switch {
	case errors.Is(err, workspace.ErrOutsideWorkspace):
		return nil, pathErr("lock", name, workspace.ErrOutsideWorkspace)
	case err != nil:
		key = name // unresolvable (a file on the way, say): lock the name as written
	}
	unlock, err := f.locks.Lock(ctx, key)
	if err != nil {
		return nil, pathErr("lock", name, err)
	}
	return unlock, nil
}
