//go:build unix

package localfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	mathrand "math/rand/v2"
	"os"
	"path"
	"sync"
	"syscall"

	"github.com/sandboxd/sandboxd/workspace"
	"golang.org/x/sys/unix"
)

// tmpInfix marks WriteFile's temporary files: ".NAME.sandboxd-tmp-RANDOM".
const tmpInfix = ".sandboxd-tmp-"

// WriteFile replaces the named regular file with data, or creates it.
//
// It opens the parent directory through the root (with O_DIRECTORY, so never
// a pipe) and does everything else relative to that descriptor, naming single
// entries with openat, fstatat and renameat: it creates a temporary file
// beside the target (O_CREAT|O_EXCL|O_NOFOLLOW, hidden, with an unpredictable
// name), writes and syncs it,
// gives it the target's permission bits and owner (or perm less the umask for
// a new file) and renames it over the target (on Linux, an existing target is
// exchanged with it and the old file unlinked: see replaceEntry, which spares
// a write ext4's flush of a rename over a file). So readers see the old contents
// or the new, never a mix; a file with other hard links is replaced, never
// written through; and a directory swapped for a link while WriteFile runs
// cannot redirect the write, since the descriptor stays on the directory that
// was resolved inside the root. On failure the temporary file is removed and
// the target is unchanged.
//
// When name is a link, the link's target is written and the link stays; a link
// that leads outside the workspace fails with workspace.ErrOutsideWorkspace.
// A directory, pipe, socket or device fails with workspace.ErrNotAFile, never
// opened. What a replaced file loses: extended attributes, ACLs, and its
// owner when the process may not chown.
func (f *FS) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if err := f.check(ctx, "write", name); err != nil {
		return err
	}
	target := name
	// A link at the target is resolved and the resolved name written; a few
	// rounds cover a link that a concurrent process keeps replacing.
	for range 4 {
		err := f.replace(ctx, target, data, perm)
		var link linkError
		if !errors.As(err, &link) {
			if err != nil {
				return pathError("write", name, err)
			}
			return nil
		}
		if target, err = f.realPath(ctx, target); err != nil {
			return pathError("write", name, err)
		}
	}
	return &fs.PathError{Op: "write", Path: name, Err: &workspace.Error{Kind: workspace.ErrInvalidArgument, Msg: syscall.ELOOP.Error(), Err: syscall.ELOOP}}
}

// linkError says the name to replace is a link, to be resolved first.
type linkError struct{}

func (linkError) Error() string { return "is a symbolic link" }

// replace writes data to name, whose last element must not be a link.
func (f *FS) replace(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if name == "." {
		return workspace.ErrNotAFile
	}
	// The parent is resolved through the root, and opened with O_DIRECTORY
	// so that nothing else (a pipe) is ever opened; from here on every call
	// is relative to its descriptor and names one entry, not following links.
	dirName, base := path.Dir(name), path.Base(name)
	openDir := func(name string) (*os.File, error) {
		return f.root.OpenFile(name, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	}
	dir, err := openDir(dirName)
	if alt, ok := f.retryName(ctx, dirName, true, err); ok {
		dir, err = openDir(alt)
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	var st unix.Stat_t
	switch err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == unix.ENOENT:
		return f.writeEntry(dir, base, nil, data, perm, nil)
	case err != nil:
		return err
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return linkError{}
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return workspace.ErrNotAFile
	}
	return f.writeEntry(dir, base, &st, data, perm, nil)
}

// writeEntry puts data in place of base in the open directory dir: old is
// base's lstat(2) when it is a regular file, nil when there is none. A new
// file is created with perm, less the umask; an existing file's
// replacement is created private and given the file's bits (and owner,
// where the process may) once written. When st is not nil it is set to the
// new file's stat(2).
func (f *FS) writeEntry(dir *os.File, base string, old *unix.Stat_t, data []byte, perm fs.FileMode, st *unix.Stat_t) error {
	dfd := int(dir.Fd())
	if old != nil {
		perm = 0o600
	}
	tmpName, fd, err := createTemp(dfd, base, perm)
	if err != nil {
		return err
	}
	// The descriptor is used as it is, not as an *os.File (whose making
	// asks the kernel whether it is non-blocking): each call saved is a
	// trap under gVisor.
	err = func() error {
		defer func() {
			if fd >= 0 {
				unix.Close(fd)
			}
		}()
		if err := writeAll(fd, data); err != nil {
			return err
		}
		if old != nil {
			if err := matchOwnerAndMode(fd, old, st); err != nil {
				return err
			}
		}
		if f.opts.sync {
			if err := unix.Fsync(fd); err != nil {
				return err
			}
		}
		if st != nil && old == nil {
			if err := unix.Fstat(fd, st); err != nil {
				return err
			}
		}
		err := unix.Close(fd)
		fd = -1
		return err
	}()
	if err == nil {
		if old != nil {
			err = replaceEntry(dfd, tmpName, base)
		} else {
			err = unix.Renameat(dfd, tmpName, dfd, base)
		}
	}
	if err != nil {
		unix.Unlinkat(dfd, tmpName, 0)
		return err
	}
	if f.opts.sync {
		dir.Sync() // best effort: some file systems refuse to sync a directory
	}
	return nil
}

// matchOwnerAndMode gives the new file fd the owner (where the process may)
// and the permission bits of old, the file it replaces, and sets st, when
// not nil, to what fstat(2) says of it then. It changes only what differs:
// the file is described first, and its owner is most often the process's
// already. (A change of mode alters only the mode and the change time, so
// st is that first description with the mode set, its change time the
// earlier one.)
func matchOwnerAndMode(fd int, old *unix.Stat_t, st *unix.Stat_t) error {
	var cur unix.Stat_t
	if err := unix.Fstat(fd, &cur); err != nil {
		return err
	}
	if cur.Uid != old.Uid || cur.Gid != old.Gid {
		unix.Fchown(fd, int(old.Uid), int(old.Gid)) // where the process may
		if err := unix.Fchmod(fd, uint32(old.Mode)&0o7777); err != nil {
			return err
		}
		if st != nil {
			return unix.Fstat(fd, st)
		}
		return nil
	}
	if want := old.Mode & 0o7777; cur.Mode&0o7777 != want { // Mode's type differs by system
		if err := unix.Fchmod(fd, uint32(want)); err != nil {
			return err
		}
		cur.Mode = cur.Mode&^0o7777 | want
	}
	if st != nil {
		*st = cur
	}
	return nil
}

// writeAll writes data to fd, whatever the kernel takes per call.
func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := ignoringEINTR(func() (int, error) { return unix.Write(fd, data) })
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// createTemp creates a new hidden file beside base in the directory dfd with
// perm (less the umask), under a name no other process can predict (from
// tempNames), and returns its name and descriptor.
func createTemp(dfd int, base string, perm fs.FileMode) (string, int, error) {
	if len(base) > 128 { // leave room for the rest within NAME_MAX
		base = base[:128]
	}
	mode := uint32(perm.Perm())
	for bit, m := range map[fs.FileMode]uint32{fs.ModeSetuid: unix.S_ISUID, fs.ModeSetgid: unix.S_ISGID, fs.ModeSticky: unix.S_ISVTX} {
		if perm&bit != 0 {
			mode |= m
		}
	}
	for range 8 {
		var r [8]byte
		tempNames.read(r[:])
		name := "." + base + tmpInfix + hex.EncodeToString(r[:])
		fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != unix.EEXIST {
			return name, fd, err
		}
	}
	return "", -1, unix.EEXIST
}

// tempNames is where temporary names come from: a ChaCha8 stream (a
// cryptographically secure generator) seeded once from crypto/rand, so that
// a name costs no system call (crypto/rand's getrandom(2) is one where the
// kernel has no vDSO for it, as under gVisor).
var tempNames chachaSource

type chachaSource struct {
	once sync.Once
	mu   sync.Mutex
	r    *mathrand.ChaCha8
}

func (c *chachaSource) read(p []byte) {
	c.once.Do(func() {
		var seed [32]byte
		rand.Read(seed[:])
		c.r = mathrand.NewChaCha8(seed)
	})
	c.mu.Lock()
	c.r.Read(p)
	c.mu.Unlock()
}

var _ workspace.AppendFS = (*FS)(nil)

// AppendFile appends data to the named regular file, creating it with perm
// (less the umask) when it does not exist: one open(2) with O_APPEND through
// the root, one write, no temporary file. A link is followed inside the
// workspace; what is not a regular file by stat(2) fails with
// workspace.ErrNotAFile before it is opened, and the descriptor is checked
// with fstat(2) before the write (a pipe swapped in meanwhile is opened with
// O_NONBLOCK, never waited on). With sync (WithSync), the data is flushed
// before it returns.
func (f *FS) AppendFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	return do0(ctx, f, "append", name, true, func(name string) error {
		if info, err := f.root.Stat(name); err == nil && !info.Mode().IsRegular() {
			return workspace.ErrNotAFile
		}
		file, err := f.root.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK|syscall.O_NOCTTY, perm)
		if err != nil {
			return err
		}
		defer file.Close()
		if info, err := file.Stat(); err != nil {
			return err
		} else if !info.Mode().IsRegular() {
			return workspace.ErrNotAFile
		}
		if _, err := file.Write(data); err != nil {
			return err
		}
		if f.opts.sync {
			if err := file.Sync(); err != nil {
				return err
			}
		}
		return file.Close()
	})
}
