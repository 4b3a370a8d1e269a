package workspace

import (
	"context"
	"errors"
	"io/fs"
)

// SwapRequest asks to replace a file's contents, as WriteFile does, and to be
// told what was there.
type SwapRequest struct {
	// Name, Data and Perm are WriteFile's.
	Name string
	Data []byte
	Perm fs.FileMode
	// Root is the workspace root as an absolute path, used as RealPath uses
	// it to resolve Name.
	Root string
	// Max bounds the old contents returned: a file over Max bytes is
	// described, its contents are not returned.
	Max int64
}

// SwapResult is what a swap replaced and what it left.
type SwapResult struct {
	// Real is Name with its links resolved (RealPath): the file written.
	Real string
	// Old describes Real just before the write (as Lstat does); nil when
	// nothing was there.
	Old fs.FileInfo
	// OldData is Old's contents when Old is a regular file of at most Max
	// bytes (empty, not nil, for an empty file); nil otherwise.
	OldData []byte
	// New describes Real just after the write (as Lstat does); nil when it
	// could not be read (a concurrent removal, say).
	New fs.FileInfo
}

// Swap writes req.Data to req.Name as WriteFile does and returns what the
// write replaced: through the adapter's SwapFS when it has one, otherwise
// with SwapGeneric. A swap that fails has written nothing; one that
// succeeds has written, even when ctx ended meanwhile (an adapter checks
// ctx before the write, not after), so that what it replaced is never lost.
//
// Old, OldData and New are read around the write, not under a lock with it:
// a concurrent writer of the same file can slip in between, as it can
// between WriteFile and a Stat.
func Swap(ctx context.Context, fsys FileSystem, req SwapRequest) (SwapResult, error) {
	if s, ok := fsys.(SwapFS); ok {
		return s.Swap(ctx, req)
	}
	return SwapGeneric(ctx, fsys, req)
}

// SwapGeneric is Swap over the core FileSystem methods (and Readlink, for
// RealPath) alone. Adapters that implement SwapFS may call it; the
// conformance kit compares the two.
func SwapGeneric(ctx context.Context, fsys FileSystem, req SwapRequest) (SwapResult, error) {
	real, err := RealPath(ctx, fsys, req.Root, req.Name)
	if err != nil {
		return SwapResult{}, err
	}
	res := SwapResult{Real: real}
	res.Old, err = fsys.Lstat(ctx, real)
	switch {
	case errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotADirectory):
		res.Old = nil // WriteFile says what is wrong with the name
	case err != nil:
		return SwapResult{}, err
	case res.Old.Mode().IsRegular() && res.Old.Size() <= req.Max:
		res.OldData, err = fsys.ReadFile(ctx, real, req.Max)
		switch {
		case errors.Is(err, ErrFileTooLarge): // grew since the Lstat
			res.OldData = nil
		case err != nil:
			return SwapResult{}, err
		case res.OldData == nil:
			res.OldData = []byte{}
		}
	}
	if err := fsys.WriteFile(ctx, req.Name, req.Data, req.Perm); err != nil {
		return SwapResult{}, err
	}
	if info, err := fsys.Lstat(context.WithoutCancel(ctx), real); err == nil {
		res.New = info
	}
	return res, nil
}
