package localfs

import (
	"errors"
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
// call (errors.ErrUnsupported).
func openBeneath(dirfd int, name string, flags int) (int, error) {
	if noOpenat2.Load() {
		return -1, errors.ErrUnsupported
	}
	how := unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
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
