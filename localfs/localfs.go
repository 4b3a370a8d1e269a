// Package localfs is the local-disk adapter of workspace.FileSystem: a
// directory on the host, seen through Go's os.Root.
//
// Every operation resolves its name and acts on the result in one step: os.Root
// walks a name one component at a time with openat(2) and O_NOFOLLOW, holding a
// descriptor for each directory it passes, so a link swapped in by another
// process while an operation runs cannot redirect it outside the root. Links
// that stay inside are followed; a name that leaves the root, by "..", by a
// link, a chain of links or an absolute link, fails with
// workspace.ErrOutsideWorkspace.
//
// os.Root refuses every absolute link target and follows at most eight links
// per name. When it refuses a name for either reason, FS resolves the name with
// workspace.RealPath (which maps absolute targets inside the root and follows
// up to 40 links) and tries once more with the link-free name it gets. That
// second try goes through os.Root again, so confinement never rests on the
// lookup: a concurrent change can only make it fail, or land elsewhere inside.
//
// Walk and Grep, the fast paths of workspace.Walk and workspace.Grep, keep
// that rule with fewer calls: a walk opens each directory relative to its
// parent's descriptor, never following a link, and on Linux a search opens
// each file with one openat2(2) that the kernel confines beneath the root.
//
// Errors are *fs.PathError values naming the operation and the workspace name
// (never a host path), carrying a workspace.Kind.
//
// The package builds on Unix systems (Linux, macOS, the BSDs).
package localfs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/sandboxd/sandboxd/workspace"
)

// FS is a workspace on local disk. It is safe for concurrent use.
type FS struct {
	root  *os.Root
	dir   *os.File // the root, open, for calls relative to its descriptor (Swap)
	abs   string   // the root's absolute path, as given
	canon string   // abs with every link resolved
	opts  options
	locks workspace.KeyedMutex[string]
}

var (
	_ workspace.FileSystem  = (*FS)(nil)
	_ workspace.SymlinkFS   = (*FS)(nil)
	_ workspace.MkdirAllFS  = (*FS)(nil)
	_ workspace.RemoveAllFS = (*FS)(nil)
	_ workspace.LockFS      = (*FS)(nil)
)

// Option configures New.
type Option func(*options)

type options struct {
	sync           bool
	lockDir        string
	defaultLockDir bool
	processLocks   bool
}

// WithSync says whether WriteFile flushes the new contents and the directory
// entry to stable storage (fsync) before it returns. The default is true.
// Turning it off keeps writes atomic for readers but not across a crash.
func WithSync(on bool) Option { return func(o *options) { o.sync = on } }

// WithLockDir sets the directory that holds Lock's lock files (see Lock).
// The default is "sandboxd-locks-UID" in os.TempDir.
func WithLockDir(dir string) Option { return func(o *options) { o.lockDir = dir } }

// WithProcessLocks makes Lock exclude the writers of this process only,
// without lock files: for a workspace no other process locks, such as a
// session container's, where the agent is the one writer that locks. It
// spares each Lock the lock file's opening and flock, which in a container
// cost a journaled write a third of a millisecond.
func WithProcessLocks() Option { return func(o *options) { o.processLocks = true } }

// New opens the directory dir as a workspace. The directory must exist.
// The FS holds a descriptor for it until Close; if the directory is moved, the
// FS follows it.
func New(dir string, opts ...Option) (*FS, error) {
	o := options{sync: true}
	for _, opt := range opts {
		opt(&o)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: workspace.ErrInvalidArgument}
	}
	canon, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: kindOf(err)}
	}
	if info, err := os.Stat(canon); err != nil || !info.IsDir() { // nor open a pipe
		return nil, &fs.PathError{Op: "open", Path: dir, Err: workspace.ErrNotADirectory}
	}
	if kernelFollows() {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: ErrKernelFollowsLinks}
	}
	root, err := os.OpenRoot(canon)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: kindOf(err)}
	}
	if o.lockDir == "" {
		o.lockDir = filepath.Join(os.TempDir(), "sandboxd-locks-"+userID())
		o.defaultLockDir = true
	}
	rootDir, err := root.Open(".")
	if err != nil {
		root.Close()
		return nil, &fs.PathError{Op: "open", Path: dir, Err: kindOf(err)}
	}
	return &FS{root: root, dir: rootDir, abs: abs, canon: canon, opts: o}, nil
}

// ErrKernelFollowsLinks is why New refuses a workspace on a kernel that
// follows a symbolic link open(2) is told not to follow
// (O_NOFOLLOW|O_DIRECTORY), as gVisor's runsc releases to date do: every
// name is walked that way, so there a link would lead outside the
// workspace. It is a workspace.ErrUnavailable.
var ErrKernelFollowsLinks = fmt.Errorf("%w: the kernel follows symbolic links that open(2) is told not to follow "+
	"(O_NOFOLLOW|O_DIRECTORY), so links would lead outside the workspace; this is gVisor's runsc before the fix "+
	"that .ci/gvisor.sh applies: run the session under runc, or under a runsc built with that fix", workspace.ErrUnavailable)

// kernelFollows is followsNoFollow, asked once per process.
var kernelFollows = sync.OnceValue(followsNoFollow)

// Close releases the directory. Operations after Close fail with
// workspace.ErrUnavailable.
func (f *FS) Close() error {
	f.dir.Close()
	return f.root.Close()
}

// Dir returns the workspace root's absolute path on the host, as given to New.
func (f *FS) Dir() string { return f.abs }

// Stat describes the named file, following links inside the workspace.
func (f *FS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	info, err := do(ctx, f, "stat", name, true, f.root.Stat)
	if err == nil && info.Name() != path.Base(name) { // found under its resolved name
		info = namedInfo{info, path.Base(name)}
	}
	return info, err
}

// namedInfo is a FileInfo under the name it was asked for.
type namedInfo struct {
	fs.FileInfo
	name string
}

func (i namedInfo) Name() string { return i.name }

// Lstat describes the named file; a link is described itself.
func (f *FS) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	return do(ctx, f, "lstat", name, false, f.root.Lstat)
}

// ReadDir lists a directory sorted by name. The entries carry the type and
// information of each entry itself, read when the directory was listed.
func (f *FS) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	d, err := f.openDir(ctx, name)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	entries, err := readDirSorted(d)
	if err != nil {
		return nil, pathError("readdir", name, err)
	}
	return entries, nil
}

// openDir opens the directory name through the root, following links inside
// it. O_DIRECTORY fails at once on anything else, a pipe included.
func (f *FS) openDir(ctx context.Context, name string) (*os.File, error) {
	return do(ctx, f, "readdir", name, true, func(name string) (*os.File, error) {
		return f.root.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
	})
}

// readDirSorted lists the open directory d, sorted by name.
func readDirSorted(d *os.File) ([]fs.DirEntry, error) {
	entries, err := d.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return cmp.Compare(a.Name(), b.Name()) })
	return entries, err
}

// ReadFile returns the contents of a regular file of at most max bytes.
//
// The file is opened with O_NONBLOCK and O_NOCTTY and checked with fstat(2) on
// the open descriptor, so a pipe, socket or device fails with
// workspace.ErrNotAFile at once and what is read is what was checked. (A name
// that is not a regular file by stat(2) is refused before it is opened, so a
// device is not even opened in the usual case.) A file over max bytes fails
// with workspace.ErrFileTooLarge without being read; at most max+1 bytes are
// ever read, so a file that grows while being read fails the same way.
func (f *FS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	if max < 0 {
		return nil, workspace.PathError("read", name, workspace.ErrInvalidArgument)
	}
	return do(ctx, f, "read", name, true, func(name string) ([]byte, error) {
		if info, err := f.root.Stat(name); err != nil {
			return nil, err
		} else if !info.Mode().IsRegular() {
			return nil, workspace.ErrNotAFile
		}
		file, err := f.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		info, err := file.Stat()
		switch {
		case err != nil:
			return nil, err
		case !info.Mode().IsRegular():
			return nil, workspace.ErrNotAFile
		case info.Size() > max:
			return nil, workspace.ErrFileTooLarge
		}
		return readAll(file, info.Size(), max, nil)
	})
}

// readAll reads r, an open regular file of size bytes (at most max), to its
// end, appending to buf[:0] (which it grows as needed). It never reads more
// than max+1 bytes: a file that grows past max while it is read fails with
// workspace.ErrFileTooLarge.
//
// A read that gives fewer bytes than asked for and so reaches size, as
// fstat(2) gave it, ends the file: one that had grown since would have
// given more, and one that grows after is as if it grew once read. That
// spares the read that would return nothing (under gVisor, a trap).
func readAll(r io.Reader, size, max int64, buf []byte) ([]byte, error) {
	limit := min(max, math.MaxInt64-1) + 1
	buf = slices.Grow(buf[:0], int(size)+1) // size <= max
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(int64(len(buf)), limit-int64(len(buf)))))
		}
		p := buf[len(buf):min(int64(cap(buf)), limit)]
		n, err := r.Read(p)
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
		if n > 0 && n < len(p) && int64(len(buf)) == size {
			return buf, nil
		}
	}
	return nil, workspace.ErrFileTooLarge
}

// Mkdir creates one directory with perm (less the umask).
func (f *FS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	return do0(ctx, f, "mkdir", name, false, func(name string) error { return f.root.Mkdir(name, perm) })
}

// MkdirAll creates name and any missing parents, like os.MkdirAll. It fails
// with workspace.ErrNotADirectory when a component is not a directory.
func (f *FS) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	err := do0(ctx, f, "mkdir", name, true, func(name string) error { return f.root.MkdirAll(name, perm) })
	if errors.Is(err, workspace.ErrExists) { // what exists is not a directory
		return workspace.PathError("mkdir", name, workspace.ErrNotADirectory)
	}
	return err
}

// Remove removes a file, a link (not its target) or an empty directory.
func (f *FS) Remove(ctx context.Context, name string) error {
	if name == "." {
		return workspace.PathError("remove", name, workspace.ErrInvalidArgument)
	}
	return do0(ctx, f, "remove", name, false, f.root.Remove)
}

// RemoveAll removes name and everything below it, never following links. A
// missing name is not an error; the root itself cannot be removed.
func (f *FS) RemoveAll(ctx context.Context, name string) error {
	if name == "." {
		return workspace.PathError("removeall", name, workspace.ErrInvalidArgument)
	}
	return do0(ctx, f, "removeall", name, false, f.root.RemoveAll)
}

// Rename moves oldname to newname with rename(2), replacing a file at newname.
func (f *FS) Rename(ctx context.Context, oldname, newname string) error {
	if err := f.check(ctx, "rename", newname); err != nil {
		return err
	}
	if oldname == "." || newname == "." {
		return workspace.PathError("rename", oldname, workspace.ErrInvalidArgument)
	}
	return do0(ctx, f, "rename", oldname, false, func(oldname string) error {
		err := f.root.Rename(oldname, newname)
		if alt, ok := f.retryName(ctx, newname, false, err); ok {
			err = f.root.Rename(oldname, alt)
		}
		return err
	})
}

// Symlink creates name as a link to target, stored as given.
func (f *FS) Symlink(ctx context.Context, target, name string) error {
	if target == "" {
		return workspace.PathError("symlink", name, workspace.ErrInvalidArgument)
	}
	return do0(ctx, f, "symlink", name, false, func(name string) error { return f.root.Symlink(target, name) })
}

// Readlink returns the target of the link name.
func (f *FS) Readlink(ctx context.Context, name string) (string, error) {
	return do(ctx, f, "readlink", name, false, f.root.Readlink)
}

// check refuses a name that is not an io/fs name, and a done context.
func (f *FS) check(ctx context.Context, op, name string) error {
	if err := ctx.Err(); err != nil {
		return &fs.PathError{Op: op, Path: name, Err: err}
	}
	if !fs.ValidPath(name) {
		return workspace.PathError(op, name, workspace.ErrInvalidArgument)
	}
	if err := workspace.CheckNameLength(f.abs, name); err != nil {
		return &fs.PathError{Op: op, Path: name, Err: err}
	}
	return nil
}

// do runs fn on name through the root; when the root refuses name for an
// absolute link or a long chain, it runs fn once more on the link-free name
// (see retryName). follow says whether fn follows a link in the last element.
func do[T any](ctx context.Context, f *FS, op, name string, follow bool, fn func(string) (T, error)) (T, error) {
	if err := f.check(ctx, op, name); err != nil {
		var zero T
		return zero, err
	}
	v, err := fn(name)
	if alt, ok := f.retryName(ctx, name, follow, err); ok {
		v, err = fn(alt)
	}
	if err != nil {
		return v, pathError(op, name, err)
	}
	return v, nil
}

func do0(ctx context.Context, f *FS, op, name string, follow bool, fn func(string) error) error {
	_, err := do(ctx, f, op, name, follow, func(name string) (struct{}, error) { return struct{}{}, fn(name) })
	return err
}

// retryName returns the name to try again after err, if any: when os.Root
// refused name because a link in it is absolute or the chain is longer than
// it follows, the name with its links resolved by workspace.RealPath (only
// the parent's when follow is false). The answer is a lookup, not a check:
// the retry goes through the root like the first try.
func (f *FS) retryName(ctx context.Context, name string, follow bool, err error) (string, bool) {
	if err == nil || !isEscape(err) && !errors.Is(err, syscall.ELOOP) {
		return "", false
	}
	dir, base := name, ""
	if !follow {
		dir, base = path.Dir(name), path.Base(name)
	}
	real, rerr := f.realPath(ctx, dir)
	if rerr != nil {
		return "", false
	}
	return path.Join(real, base), true
}

// realPath resolves every link in name (see workspace.RealPath), accepting an
// absolute target written with either spelling of the root's path.
func (f *FS) realPath(ctx context.Context, name string) (string, error) {
	raw := rawFS{f}
	real, err := workspace.RealPath(ctx, raw, f.canon, name)
	if errors.Is(err, workspace.ErrOutsideWorkspace) && f.abs != f.canon {
		real, err = workspace.RealPath(ctx, raw, f.abs, name)
	}
	return real, err
}

// rawFS is f for workspace.RealPath: its Lstat and Readlink do not retry, so
// a lookup never starts another.
type rawFS struct{ *FS }

func (r rawFS) Lstat(_ context.Context, name string) (fs.FileInfo, error) {
	info, err := r.root.Lstat(name)
	if err != nil {
		return nil, pathError("lstat", name, err)
	}
	return info, nil
}

func (r rawFS) Readlink(_ context.Context, name string) (string, error) {
	target, err := r.root.Readlink(name)
	if err != nil {
		return "", pathError("readlink", name, err)
	}
	return target, nil
}

// pathError turns err from the os package into a workspace error about name.
func pathError(op, name string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && isKind(pe.Err) {
		return &fs.PathError{Op: op, Path: name, Err: pe.Err}
	}
	return &fs.PathError{Op: op, Path: name, Err: kindOf(err)}
}

func isKind(err error) bool {
	var k *workspace.Kind
	return errors.As(err, &k)
}

// kindOf classifies an error of the os package. The result is a
// *workspace.Kind, or, where the kind alone would hide what happened (a loop
// of links, a full disk), a *workspace.Error that carries both; it never holds a
// host path.
func kindOf(err error) error {
	err = cause(err)
	if isKind(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if isEscape(err) {
		return workspace.ErrOutsideWorkspace
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		if errors.Is(err, os.ErrClosed) {
			return workspace.ErrUnavailable
		}
		return &workspace.Error{Kind: workspace.ErrUnavailable, Msg: err.Error(), Err: err}
	}
	switch errno {
	case syscall.ENOENT:
		return workspace.ErrNotFound
	case syscall.ENOTDIR:
		return workspace.ErrNotADirectory
	case syscall.EEXIST:
		return workspace.ErrExists
	case syscall.ENOTEMPTY:
		return workspace.ErrNotEmpty
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return workspace.ErrForbidden
	case syscall.EISDIR:
		return workspace.ErrNotAFile
	case syscall.EINVAL:
		return workspace.ErrInvalidArgument
	case syscall.ENOSPC, syscall.EDQUOT:
		return &workspace.Error{Kind: workspace.ErrNoSpace, Msg: errno.Error(), Err: errno}
	case syscall.ELOOP, syscall.ENAMETOOLONG, syscall.EXDEV, syscall.EBUSY:
		return &workspace.Error{Kind: workspace.ErrInvalidArgument, Msg: errno.Error(), Err: errno}
	}
	return &workspace.Error{Kind: workspace.ErrUnavailable, Msg: errno.Error(), Err: errno}
}

// cause unwraps the os package's path-carrying error types down to what they
// carry, so that no host path reaches an error message.
func cause(err error) error {
	for {
		switch e := err.(type) {
		case *fs.PathError:
			err = e.Err
		case *os.LinkError:
			err = e.Err
		case *os.SyscallError:
			err = e.Err
		default:
			return err
		}
	}
}

// isEscape reports os.Root's refusal of a name that leaves it. The os package
// does not export that error, so it is recognised by its text.
func isEscape(err error) bool {
	err = cause(err)
	return err != nil && err.Error() == "path escapes from parent"
}
