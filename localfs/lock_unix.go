//go:build unix

package localfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// Lock blocks until the caller holds the write lock for name, or ctx ends.
//
// Writers of one file wait for each other within the process (a
// workspace.KeyedMutex) and across processes: the holder also keeps an
// flock(2) on a lock file of its own for the name, kept outside the workspace
// so that locking neither adds entries to the tree nor depends on the file
// (which need not exist, and which WriteFile replaces by rename). Lock files
// live in the lock directory (WithLockDir; by default "sandboxd-locks-UID" in
// os.TempDir, which must be a directory of this user's that no one else may
// write), in a directory per workspace named by a hash of the root's real
// path, one empty file per name, named by a hash of the name with its links
// resolved — so a link and its target share one lock.
//
// Processes exclude each other only when they agree on the root's real path
// and on the lock directory: the same tree seen through two different mounts
// (a bind mount, a container volume) is two workspaces to Lock. Lock files
// are left in place, since removing one that another process is waiting on
// would let two holders in. The lock is advisory: writers that do not call
// Lock (a shell command, an editor) are not held back by it. With
// WithProcessLocks, only the writers within the process wait for each other.
func (f *FS) Lock(ctx context.Context, name string) (unlock func(), err error) {
	if err := f.check(ctx, "lock", name); err != nil {
		return nil, err
	}
	key := name
	if real, err := f.realPath(ctx, name); err == nil {
		key = real
	}
	return f.lockReal(ctx, name, key)
}

// lockReal is Lock of name, whose real name (its links resolved) is key.
func (f *FS) lockReal(ctx context.Context, name, key string) (unlock func(), err error) {
	release, err := f.locks.Lock(ctx, key)
	if err != nil {
		return nil, &fs.PathError{Op: "lock", Path: name, Err: err}
	}
	if f.opts.processLocks {
		return release, nil
	}
	file, err := f.lockFile(key)
	if err == nil {
		err = flock(ctx, file)
		if err != nil {
			file.Close()
		}
	}
	if err != nil {
		release()
		return nil, pathError("lock", name, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			file.Close() // closing the last descriptor releases the flock
			release()
		})
	}, nil
}

// lockFile opens the lock file of the workspace name key.
func (f *FS) lockFile(key string) (*os.File, error) {
	base := f.opts.lockDir
	if err := os.Mkdir(base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	if f.opts.defaultLockDir {
		if err := checkPrivate(base); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(base, hash(f.canon))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return os.OpenFile(filepath.Join(dir, hash(key)), os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
}

// checkPrivate makes sure the shared temporary directory's lock directory is
// this user's own and writable by no one else, so that another user cannot
// plant links or hold the locks.
func checkPrivate(dir string) error {
	info, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !info.IsDir() || !ok || int(st.Uid) != os.Getuid() || info.Mode().Perm()&0o022 != 0 {
		return workspace.ErrForbidden
	}
	return nil
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// flock takes an exclusive flock on file, polling so that ctx can end the wait.
func flock(ctx context.Context, file *os.File) error {
	conn, err := file.SyscallConn()
	if err != nil {
		return err
	}
	wait := time.Millisecond
	for {
		var ferr error
		if err := conn.Control(func(fd uintptr) {
			ferr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
		}); err != nil {
			return err
		}
		if ferr == nil {
			return nil
		}
		if ferr != syscall.EWOULDBLOCK && ferr != syscall.EINTR {
			return ferr
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

func userID() string { return strconv.Itoa(os.Getuid()) }
