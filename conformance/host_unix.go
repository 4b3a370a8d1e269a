//go:build unix

package conformance

import (
	"fmt"
	"io/fs"
	"syscall"
)

func mknod(path string, typ fs.FileMode) error {
	var mode uint32
	switch typ {
	case fs.ModeNamedPipe:
		mode = syscall.S_IFIFO
	case fs.ModeSocket:
		mode = syscall.S_IFSOCK
	default:
		return fmt.Errorf("conformance: cannot make a %v", typ)
	}
	if err := syscall.Mknod(path, mode|0o644, 0); err != nil {
		return &fs.PathError{Op: "mknod", Path: path, Err: err}
	}
	return nil
}
