//go:build unix && !linux

package memory

import (
	"io/fs"
	"syscall"
)

// sysStat returns a host file's inode number and link count; the
// status-change time, whose field differs between systems, is compared on
// Linux only.
func sysStat(fi fs.FileInfo) (ino uint64, ctime int64, links uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino), 0, uint64(st.Nlink)
	}
	return 0, 0, 1
}
