package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	// Edit, when set, computes the new contents from the old ones, in place
	// of Data: the swap applies it to what it read, in the step that writes
	// (under the lock with Lock), so no writer that locks comes in between
	// and the file need not travel to the caller and back. The old file
	// must be a regular file of at most Max bytes: else the swap fails with
	// ErrNotFound, ErrNotAFile or ErrFileTooLarge. When Edit fails, the swap
	// writes nothing and returns Edit's error in an *fs.PathError whose Op
	// is "edit". Unmet conditions come first: they are reported as such,
	// whatever Edit would have said.
	Edit Editor
	// Root is the workspace root as an absolute path, used as RealPath uses
	// it to resolve Name.
	Root string
	// Max bounds the old contents returned: a file over Max bytes is
	// described, its contents are not returned.
	Max int64

	// The conditions, each unset by default. A swap checks them in the
	// step that writes, once it has read what it reports of the old file;
	// when one does not hold it writes nothing and returns, with no error,
	// a result with Unmet set that describes the file as it found it
	// (Real, Old and OldData; New nil). A request that sets none is never
	// Unmet.

	// Real, when set, is where Name must lead: the swap writes only when
	// Name's real name (RealPath) is Real. A caller that checked Real (a
	// guard refusing protected names) so knows that the file written is the
	// one it checked, without resolving Name first.
	Real string
	// OldSum, when not empty, is the SHA-256 of the contents the file must hold:
	// the swap writes only over a regular file of at most Max bytes whose
	// contents have that sum. An edit computed from contents read earlier
	// replaces them only if no one changed them since.
	OldSum []byte
	// Lock holds the write lock of the real name (Lock) from the reading of
	// the old file to the end of the write, so that writers who lock the
	// file do not come in between. A caller holding that lock leaves it
	// unset.
	Lock bool
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
	// Unmet says a condition of the request did not hold: nothing was
	// written, and New is nil.
	Unmet bool
	// Data is what a swap with an Edit wrote: Edit's result from OldData.
	// It is nil for a swap without one, and when Unmet.
	Data []byte
}

// An Editor computes a file's new contents from its old contents, for a
// swap with SwapRequest.Edit (textedit.Edit is the edit tool's). Apply must
// be a function of old alone: an adapter may apply it where the file is
// (an agent) and its client again to check what it reports. Its errors
// should carry a Kind.
type Editor interface {
	Apply(old []byte) ([]byte, error)
}

// Edited is what a swap for req writes over the file res describes (when
// req's conditions hold): req.Data, or req.Edit's result from res.OldData,
// with the errors SwapRequest.Edit describes. Adapters that implement SwapFS
// call it.
func (req SwapRequest) Edited(res SwapResult) ([]byte, error) {
	if req.Edit == nil {
		return req.Data, nil
	}
	var kind *Kind
	switch {
	case res.Old == nil:
		kind = ErrNotFound
	case !res.Old.Mode().IsRegular():
		kind = ErrNotAFile
	case res.OldData == nil:
		kind = ErrFileTooLarge
	}
	if kind != nil {
		return nil, PathError("edit", req.Name, kind)
	}
	data, err := req.Edit.Apply(res.OldData)
	if err != nil {
		return nil, &fs.PathError{Op: "edit", Path: req.Name, Err: err}
	}
	return data, nil
}

// Met reports whether res, found for req, meets req's conditions; a swap
// writes only when it does. Adapters that implement SwapFS call it.
func (req SwapRequest) Met(res SwapResult) bool {
	if req.Real != "" && res.Real != req.Real {
		return false
	}
	if len(req.OldSum) > 0 {
		sum := sha256.Sum256(res.OldData)
		return res.OldData != nil && res.Old != nil && res.Old.Mode().IsRegular() && bytes.Equal(sum[:], req.OldSum)
	}
	return true
}

// Sum is the SHA-256 of data, as SwapRequest.OldSum wants it.
func Sum(data []byte) []byte {
	sum := sha256.Sum256(data)
	return sum[:]
}

// Swap writes req.Data (or req.Edit's result) to req.Name as WriteFile does
// and returns what the write replaced: through the adapter's SwapFS when it
// has one, otherwise with SwapGeneric. A swap that fails has written
// nothing; one that succeeds has written, even when ctx ended meanwhile (an
// adapter checks ctx before the write, not after), so that what it replaced
// is never lost.
//
// Old, OldData and New are read around the write, not under a lock with it
// (unless req.Lock holds off the writers that lock): a concurrent writer of
// the same file can slip in between, as it can between WriteFile and a Stat.
// The conditions of req (Real, OldSum) are checked against what was read,
// in the same step.
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
	if req.Lock {
		unlock, err := Lock(ctx, fsys, real)
		if err != nil {
			return SwapResult{}, err
		}
		defer unlock()
		if err := ctx.Err(); err != nil { // taken as ctx ended
			return SwapResult{}, err
		}
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
	if !req.Met(res) {
		res.Unmet = true
		return res, nil
	}
	data, err := req.Edited(res)
	if err != nil {
		return SwapResult{}, err
	}
	if req.Edit != nil {
		res.Data = data
	}
	if err := fsys.WriteFile(ctx, req.Name, data, req.Perm); err != nil {
		return SwapResult{}, err
	}
	if info, err := fsys.Lstat(context.WithoutCancel(ctx), real); err == nil {
		res.New = info
	}
	return res, nil
}
