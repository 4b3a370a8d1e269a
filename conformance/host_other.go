//go:build !unix

package conformance

import (
	"errors"
	"io/fs"
)

func mknod(path string, typ fs.FileMode) error {
	return &fs.PathError{Op: "mknod", Path: path, Err: errors.ErrUnsupported}
}
