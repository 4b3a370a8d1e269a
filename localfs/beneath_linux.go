package localfs

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// noOpenat2 is set once the kernel (or a seccomp filter) has refused
// openat2(2) as unknown, so that each later call does not try again.
var noOpenat2 atomic.Bool

// openBeneath opens name relative to the directory dirfd in one call that
// the kernel confines to it: openat2(2) with RESOLVE_BENEATH, which follows
// relative links that stay below dirfd and refuses ".." above it, absolute
// links and /proc magic links. A failure may mean only that the name needs
// the slower resolution (EXDEV, ELOOP, EAGAIN), or that the system lacks the
// call (errors.ErrUnsupported). With noLinks, any link in name fails it
// (ELOOP): what is opened is then name itself, not where links lead.
func openBeneath(dirfd int, name string, flags int, noLinks bool) (int, error) {
	if noOpenat2.Load() {
		return -1, errors.ErrUnsupported
	}
	how := unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	if noLinks {
		how.Resolve |= unix.RESOLVE_NO_SYMLINKS
	}
	fd, err := ignoringEINTR(func() (int, error) { return unix.Openat2(dirfd, name, &how) })
	if err == unix.ENOSYS {
		noOpenat2.Store(true)
		return -1, errors.ErrUnsupported
	}
	return fd, err
}

// sysStat is st as os.Lstat's Sys gives it on Linux.
func sysStat(st *unix.Stat_t) any {
	return &syscall.Stat_t{Dev: st.Dev, Ino: st.Ino, Nlink: st.Nlink, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid,
		Rdev: st.Rdev, Size: st.Size, Blksize: st.Blksize, Blocks: st.Blocks,
		Atim: syscall.Timespec(st.Atim), Mtim: syscall.Timespec(st.Mtim), Ctim: syscall.Timespec(st.Ctim)}
}

// replaceEntry puts the file tmp in place of the existing entry base, both
// in the directory dfd, in one atomic step, as a rename over it does: base
// names the old file or the new, never neither. It exchanges the two
// (renameat2 RENAME_EXCHANGE) and unlinks what tmp then names, the old
// file. On ext4 a rename over an existing file starts the writeback of the
// new file's data before it returns (auto_da_alloc), which costs a write
// on a busy disk a quarter of a millisecond at the median and milliseconds
// at the tail; an exchange does not. A session's workspace is not kept
// across a crash of its host, so that flush buys it nothing; WriteFile with
// sync flushes the data itself. Where the file system cannot exchange, it
// renames.
//
// When base turned out to be a directory (put there since WriteFile looked),
// the exchange is undone and the write fails as a rename would.
func replaceEntry(dfd int, tmp, base string) error {
	switch err := unix.Renameat2(dfd, tmp, dfd, base, unix.RENAME_EXCHANGE); err {
	case nil:
	case unix.EINVAL, unix.ENOSYS, unix.EOPNOTSUPP, unix.ENOENT:
		// No exchange here, or base is gone since WriteFile looked: rename.
		return unix.Renameat(dfd, tmp, dfd, base)
	default:
		return err
	}
	if err := unix.Unlinkat(dfd, tmp, 0); err == unix.EISDIR || err == unix.EPERM {
		// tmp is a directory now: put it back, and leave tmp ours to remove.
		if xerr := unix.Renameat2(dfd, tmp, dfd, base, unix.RENAME_EXCHANGE); xerr != nil {
			return xerr
		}
		return unix.EISDIR
	}
	// The new file is in place: any other failure to unlink the old one
	// (gone meanwhile, say) leaves at most a hidden file behind.
	return nil
}

// followsNoFollow reports whether the kernel follows a symbolic link that
// open(2) is told not to follow when the flags also hold O_DIRECTORY, as
// gVisor's runsc does (its releases to date treat O_DIRECTORY as a trailing
// slash). os.Root, and the walks of this package, open each directory of a
// name with O_NOFOLLOW|O_DIRECTORY and rely on that open failing on a link:
// on such a kernel a link would take them outside the root. It tries
// /proc/self, a link on Linux and on gVisor alike, so it writes nothing;
// without /proc it makes a link in a temporary directory. When neither can
// be tried it reports false.
func followsNoFollow() bool {
	const flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_DIRECTORY | unix.O_CLOEXEC
	var st unix.Stat_t
	if unix.Lstat("/proc/self", &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		fd, err := unix.Open("/proc/self", flags, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err == nil
	}
	dir, err := os.MkdirTemp("", "sandboxd-nofollow-")
	if err != nil {
		return false
	}
	defer os.RemoveAll(dir)
	link := filepath.Join(dir, "l")
	if os.Symlink(".", link) != nil {
		return false
	}
	fd, err := unix.Open(link, flags, 0)
	if err == nil {
		unix.Close(fd)
	}
	return err == nil
}
