package memory

import (
	"io/fs"
	"syscall"
)

// sysStat returns a host file's inode number, status-change time and link
// count.
func sysStat(fi fs.FileInfo) (ino uint64, ctime int64, links uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino, st.Ctim.Nano(), uint64(st.Nlink)
	}
	return 0, 0, 1
}
