package workspace

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
)

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

// maxLinkHops bounds how many links RealPath follows, as the kernel does.
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
	sl, ok := fsys.(SymlinkFS)
	if !ok {
		return name, nil
	}
	if !fs.ValidPath(name) {
		return "", PathError("realpath", name, ErrInvalidArgument)
	}
	// done is resolved (no link in it); todo are the components still to
	// walk, taken as the kernel takes them: a link's target is walked
	// component by component from the link's directory, and ".." leaves the
	// directory actually reached — never a lexical shortcut through a link.
	todo := strings.Split(name, "/")
	done := "."
	hops := 0
	for len(todo) > 0 {
		elem := todo[0]
		todo = todo[1:]
		switch elem {
		case ".", "":
			continue
		case "..":
			if done == "." {
				return "", PathError("realpath", name, ErrOutsideWorkspace)
			}
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, elem)
		info, err := fsys.Lstat(ctx, next)
		if errors.Is(err, ErrNotFound) {
			if slices.Contains(todo, "..") { // the kernel stops at the missing directory
				return "", PathError("realpath", name, ErrNotFound)
			}
			return path.Join(append([]string{next}, todo...)...), nil
		}
		if err != nil {
			return "", err
		}
		if info.Mode()&fs.ModeSymlink == 0 {
			done = next
			continue
		}
		if hops++; hops > maxLinkHops {
			return "", PathError("realpath", name, ErrInvalidArgument)
		}
		target, err := sl.Readlink(ctx, next)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			rel, ok := RootRelative(root, target)
			if !ok {
				return "", PathError("realpath", name, ErrOutsideWorkspace)
			}
			target, done = rel, "."
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return done, nil
}
