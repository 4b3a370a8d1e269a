package journal

import (
	"io/fs"
	"syscall"
)

// sysStat returns the inode and status-change time the adapter reports, or
// zeros.
func sysStat(info fs.FileInfo) (ino uint64, ctime int64) {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Ino, st.Ctim.Nano()
	}
	return 0, 0
}
