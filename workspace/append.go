package workspace

import (
	"context"
	"errors"
	"io/fs"
)

// MaxAppendGeneric bounds the file AppendFileGeneric reads back: a larger
// one fails with ErrFileTooLarge.
const MaxAppendGeneric = 64 << 20

// AppendFile appends data to the regular file name, creating it with perm
// (less the umask) when it does not exist, as WriteFile would: a link is
// followed, and what is not a regular file fails with ErrNotAFile. It uses
// the adapter's AppendFS when it has one, which writes only data, and
// AppendFileGeneric otherwise, which rewrites the file.
//
// An append is not atomic for readers: one may see part of data. A failure
// may leave part of data appended (AppendFS) or none (AppendFileGeneric).
// Appenders of one file that do not lock it may interleave.
func AppendFile(ctx context.Context, fsys FileSystem, name string, data []byte, perm fs.FileMode) error {
	if a, ok := fsys.(AppendFS); ok {
		return a.AppendFile(ctx, name, data, perm)
	}
	return AppendFileGeneric(ctx, fsys, name, data, perm)
}

// AppendFileGeneric is AppendFile over ReadFile and WriteFile: it reads the
// file (of at most MaxAppendGeneric bytes) and writes it back with data
// after it, so its cost is the file's size.
func AppendFileGeneric(ctx context.Context, fsys FileSystem, name string, data []byte, perm fs.FileMode) error {
	old, err := fsys.ReadFile(ctx, name, MaxAppendGeneric)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return fsys.WriteFile(ctx, name, append(old[:len(old):len(old)], data...), perm)
}
