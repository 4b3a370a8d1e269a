package memexec

import (
	"io/fs"
	"syscall"
)

// sysStat returns a host file's inode number and status-change time.
func sysStat(fi fs.FileInfo) (ino uint64, ctime int64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino, st.Ctim.Nano()
	}
	return 0, 0
}
