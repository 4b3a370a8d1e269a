package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
)

// BookkeepingDir is sandboxd's own directory at a workspace's root: spilled
// outputs, the bash state, materialised sources, a container session's
// home. It is protected from the tools, left out of searches, never
// delivered, and ignored by git (see Bookkeeping).
const BookkeepingDir = ".sandboxd"

// Bookkeeping creates dir, a name under BookkeepingDir, with its parents,
// and BookkeepingDir/.gitignore, which ignores everything there (itself
// included), when it is missing: sandboxd's bookkeeping never shows in git
// status, whichever backend and whatever the repository's own ignores. A
// dir outside BookkeepingDir is only created.
func Bookkeeping(ctx context.Context, fsys FileSystem, dir string, perm fs.FileMode) error {
	if err := MkdirAll(ctx, fsys, dir, perm); err != nil {
		return err
	}
	if dir != BookkeepingDir && !strings.HasPrefix(dir, BookkeepingDir+"/") {
		return nil
	}
	ignore := BookkeepingDir + "/.gitignore"
	if _, err := fsys.Lstat(ctx, ignore); !errors.Is(err, ErrNotFound) {
		return err
	}
	return fsys.WriteFile(ctx, ignore, []byte("# sandboxd's bookkeeping, never part of the work\n*\n"), 0o644)
}

// MkdirAll creates name and any missing parents, like os.MkdirAll. It uses
// the adapter's own MkdirAll when it has one. It fails with ErrNotADirectory
// when a component exists and is not a directory.
func MkdirAll(ctx context.Context, fsys FileSystem, name string, perm fs.FileMode) error {
	if m, ok := fsys.(MkdirAllFS); ok {
		return m.MkdirAll(ctx, name, perm)
	}
	if name == "." {
		return nil
	}
	info, err := fsys.Stat(ctx, name)
	if err == nil {
		if info.IsDir() {
			return nil
		}
		return PathError("mkdir", name, ErrNotADirectory)
	}
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	if err := MkdirAll(ctx, fsys, path.Dir(name), perm); err != nil {
		return err
	}
	err = fsys.Mkdir(ctx, name, perm)
	if errors.Is(err, ErrExists) { // lost a race with another creator: fine if it is a directory
		if info, serr := fsys.Stat(ctx, name); serr == nil && info.IsDir() {
			return nil
		}
	}
	return err
}

// RemoveAll removes name and everything below it, like os.RemoveAll: a
// missing name is not an error, and links are removed, never followed. It uses
// the adapter's own RemoveAll when it has one.
func RemoveAll(ctx context.Context, fsys FileSystem, name string) error {
	if r, ok := fsys.(RemoveAllFS); ok {
		return r.RemoveAll(ctx, name)
	}
	if name == "." {
		return PathError("removeall", name, ErrInvalidArgument)
	}
	info, err := fsys.Lstat(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.IsDir() {
		entries, err := fsys.ReadDir(ctx, name)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		for _, e := range entries {
			if err := RemoveAll(ctx, fsys, path.Join(name, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := fsys.Remove(ctx, name); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Lock takes the write lock for name: the adapter's own (which may reach
// across processes) when it is a LockFS, otherwise a lock shared by the
// callers in this process that use the same FileSystem value.
func Lock(ctx context.Context, fsys FileSystem, name string) (unlock func(), err error) {
	if l, ok := fsys.(LockFS); ok {
		return l.Lock(ctx, name)
	}
	return processLocks.lock(ctx, lockKey{fsys, name})
}

type lockKey struct {
	fsys FileSystem
	name string
}

// KeyedMutex is a set of mutexes addressed by key, each of which can be waited
// for with a context. The zero value is ready to use. Adapters use it to
// serialise writers of one file within a process.
type KeyedMutex[K comparable] struct {
	mu    sync.Mutex
	locks map[K]*keyedLock
}

type keyedLock struct {
	ch      chan struct{} // holds one token while locked
	waiters int
}

var processLocks KeyedMutex[lockKey]

// Lock blocks until the caller holds key's lock, or ctx ends.
func (m *KeyedMutex[K]) Lock(ctx context.Context, key K) (unlock func(), err error) {
	return m.lock(ctx, key)
}

func (m *KeyedMutex[K]) lock(ctx context.Context, key K) (func(), error) {
	m.mu.Lock()
	if m.locks == nil {
		m.locks = make(map[K]*keyedLock)
	}
	l := m.locks[key]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		m.locks[key] = l
	}
	l.waiters++
	m.mu.Unlock()

	release := func() {
		m.mu.Lock()
		l.waiters--
		if l.waiters == 0 {
			delete(m.locks, key)
		}
		m.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-l.ch
			release()
		})
	}, nil
}

// maxLinkHops bounds how many links a NameWalk follows, as the kernel does.
const maxLinkHops = 40

// RootRelative returns an absolute link target relative to root with its
// components as written — not cleaned: a ".." in it must be walked as the
// kernel walks it, from the directory actually reached (see RealPath) — and
// false when it does not start at root. A target that reaches root by
// another spelling ("/x/../workspace") counts as outside: refusing is the
// safe answer.
func RootRelative(root, target string) (string, bool) {
	root = path.Clean("/" + root)
	if target == root || target == root+"/" {
		return ".", true
	}
	prefix := root + "/"
	if root == "/" {
		prefix = "/"
	}
	rel, ok := strings.CutPrefix(target, prefix)
	return rel, ok
}

// RealPath returns name with every symbolic link in it resolved, as a name in
// the workspace. root is the workspace root as an absolute path, used to read
// links whose targets are absolute. A link that leads outside the workspace
// fails with ErrOutsideWorkspace. Components that do not exist are kept as
// written, so RealPath also tells where a new file would land.
//
// RealPath is a lookup, not a lock: a concurrent change can make its answer
// stale. Use it to apply checks by name (protect globs) — confinement itself is
// the adapter's and does not depend on it.
func RealPath(ctx context.Context, fsys FileSystem, root, name string) (string, error) {
	if _, ok := fsys.(SymlinkFS); !ok {
		return name, nil
	}
	real, _, err := NameWalk{Root: root, Follow: true}.Resolve(ctx, fsys, name)
	return real, err
}

// NameWalk resolves workspace names through a FileSystem the way the kernel
// resolves paths: a link's target is walked component by component from the
// link's directory (or from Root, when absolute), and ".." leaves the
// directory actually reached — never a lexical shortcut through a link. It is
// what checks by name (RealPath, rules of what may be seen) are built on.
type NameWalk struct {
	// Root is the workspace root as an absolute path, as absolute link
	// targets name it; a target under no other spelling of it is outside.
	Root string
	// Follow follows a link that ends the name; links before the end are
	// always followed.
	Follow bool
	// Passing, when set, is shown each entry the walk passes through on its
	// way, before it goes on: every link it follows, every directory it
	// enters, and a file that stands where a directory should. It is not
	// shown the entry the name ends at. An error from it ends the walk and is
	// returned as it is.
	Passing func(name string, info fs.FileInfo) error
}

// errLinkLoop is a name whose resolution follows too many links.
var errLinkLoop = fmt.Errorf("too many levels of symbolic links: %w", ErrInvalidArgument)

// Resolve returns the workspace name that name leads to, and what is there.
// When a component is missing, or a file stands where a directory should,
// the rest is kept as written and info is nil: the answer says where a new
// entry would land (a "missing/.." fails with ErrNotFound, as the kernel's
// walk would). A walk that leaves the root fails with ErrOutsideWorkspace;
// more than 40 links, or a link that cannot be read on a FileSystem that is
// not a SymlinkFS, fail too. Errors of the FileSystem are returned as they
// are.
func (w NameWalk) Resolve(ctx context.Context, fsys FileSystem, name string) (string, fs.FileInfo, error) {
	if !fs.ValidPath(name) {
		return "", nil, PathError("resolve", name, ErrInvalidArgument)
	}
	sl, _ := fsys.(SymlinkFS)
	todo := strings.Split(name, "/")
	done := "." // resolved: no link in it
	var info fs.FileInfo
	hops := 0
	for len(todo) > 0 {
		elem := todo[0]
		todo = todo[1:]
		switch elem {
		case ".", "":
			continue
		case "..":
			if done == "." {
				return "", nil, PathError("resolve", name, ErrOutsideWorkspace)
			}
			done, info = path.Dir(done), nil
			continue
		}
		next := path.Join(done, elem)
		fi, err := fsys.Lstat(ctx, next)
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotADirectory) {
			if slices.Contains(todo, "..") { // the kernel stops at the missing directory
				return "", nil, PathError("resolve", name, ErrNotFound)
			}
			return path.Join(append([]string{next}, todo...)...), nil, nil
		}
		if err != nil {
			return "", nil, err
		}
		last := len(todo) == 0
		isLink := fi.Mode()&fs.ModeSymlink != 0
		if last && (!isLink || !w.Follow) {
			return next, fi, nil
		}
		if w.Passing != nil {
			if err := w.Passing(next, fi); err != nil {
				return "", nil, err
			}
		}
		switch {
		case isLink:
			if hops++; hops > maxLinkHops {
				return "", nil, &fs.PathError{Op: "resolve", Path: name, Err: errLinkLoop}
			}
			if sl == nil {
				return "", nil, PathError("resolve", name, ErrNotFound)
			}
			target, err := sl.Readlink(ctx, next)
			if err != nil {
				return "", nil, err
			}
			if path.IsAbs(target) {
				rel, ok := RootRelative(w.Root, target)
				if !ok {
					return "", nil, PathError("resolve", name, ErrOutsideWorkspace)
				}
				target, done = rel, "."
			}
			todo = append(strings.Split(target, "/"), todo...)
			info = nil
		case !fi.IsDir(): // a file where a directory should be: the operation will fail
			return path.Join(append([]string{next}, todo...)...), nil, nil
		default:
			done, info = next, fi
		}
	}
	if info == nil { // the walk ended on a directory reached by ".." or a link
		fi, err := fsys.Lstat(ctx, done)
		if err != nil {
			return "", nil, err
		}
		info = fi
	}
	return done, info, nil
}
