//go:build unix

package localfs

import (
	"context"
	"io/fs"
	"os"
	"path"

	"github.com/sandboxd/sandboxd/workspace"
	"golang.org/x/sys/unix"
)

var _ workspace.SwapFS = (*FS)(nil)

// Swap is workspace.Swap in one pass over the file's directory, for the
// usual case: a name with no link in it, naming a regular file or nothing.
// The directory is opened once beneath the root (openat2 with
// RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS, so that the name is its own real
// name; the root's own descriptor for a file of the root), and the file is described, read and replaced relative to it, under
// the lock with req.Lock, as WriteFile replaces it. Any other case (a link,
// a directory, a missing parent, a system without openat2) is
// workspace.SwapGeneric's, before anything is written; the conformance kit
// holds the two to one answer.
func (f *FS) Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error) {
	if err := f.check(ctx, "write", req.Name); err != nil {
		return workspace.SwapResult{}, err
	}
	if req.Name == "." {
		return workspace.SwapGeneric(ctx, f, req)
	}
	dirName, base := path.Dir(req.Name), path.Base(req.Name)
	// A file of the root is swapped in the root's own descriptor; another
	// directory is opened for the swap.
	dir := f.dir
	if dirName != "." {
		dfd, err := openBeneath(int(f.dir.Fd()), dirName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC, true)
		if err != nil {
			return workspace.SwapGeneric(ctx, f, req)
		}
		dir = os.NewFile(uintptr(dfd), dirName)
		defer dir.Close()
	}
	res, done, err := f.swapIn(ctx, dir, base, req)
	if !done {
		return workspace.SwapGeneric(ctx, f, req)
	}
	return res, err
}

// swapIn is Swap of base in the open directory dir, whose path has no link.
// done is false, with nothing written, when base is neither a regular file
// nor absent: the case is SwapGeneric's.
func (f *FS) swapIn(ctx context.Context, dir *os.File, base string, req workspace.SwapRequest) (res workspace.SwapResult, done bool, err error) {
	if req.Lock {
		unlock, err := f.lockReal(ctx, req.Name, req.Name)
		if err != nil {
			return workspace.SwapResult{}, true, err
		}
		defer unlock()
		if err := ctx.Err(); err != nil { // taken as ctx ended
			return workspace.SwapResult{}, true, &fs.PathError{Op: "lock", Path: req.Name, Err: err}
		}
	}
	dfd := int(dir.Fd())
	res.Real = req.Name
	var old unix.Stat_t
	switch err := unix.Fstatat(dfd, base, &old, unix.AT_SYMLINK_NOFOLLOW); {
	case err == unix.ENOENT:
	case err != nil || old.Mode&unix.S_IFMT != unix.S_IFREG:
		return workspace.SwapResult{}, false, nil
	default:
		if old.Size <= req.Max {
			data, same, err := readEntry(dfd, base, &old, req.Max)
			if !same {
				return workspace.SwapResult{}, false, nil
			}
			if err != nil {
				return workspace.SwapResult{}, true, pathError("read", req.Name, err)
			}
			res.OldData = data
		}
		res.Old = &statInfo{name: base, st: old}
	}
	if !req.Met(res) {
		res.Unmet = true
		return res, true, nil
	}
	data, err := req.Edited(res)
	if err != nil {
		return workspace.SwapResult{}, true, err
	}
	if req.Edit != nil {
		res.Data = data
	}
	if err := ctx.Err(); err != nil {
		return workspace.SwapResult{}, true, &fs.PathError{Op: "write", Path: req.Name, Err: err}
	}
	var prev *unix.Stat_t
	if res.Old != nil {
		prev = &old
	}
	var st unix.Stat_t
	if err := f.writeEntry(dir, base, prev, data, req.Perm, &st); err != nil {
		return workspace.SwapResult{}, true, pathError("write", req.Name, err)
	}
	res.New = &statInfo{name: base, st: st}
	return res, true, nil
}

// readEntry reads base, the regular file of the directory dfd that old
// describes (of at most max bytes). same is false when base is another file
// by the time it is opened (replaced, or a link now).
func readEntry(dfd int, base string, old *unix.Stat_t, max int64) (data []byte, same bool, err error) {
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, nil
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != old.Dev || st.Ino != old.Ino {
		return nil, false, nil
	}
	*old = st // as read: the size may have changed since
	if st.Size > max {
		return nil, true, nil
	}
	data, err = readAll(fdReader(fd), st.Size, max, nil)
	switch {
	case err == workspace.ErrFileTooLarge: // grew while read
		return nil, true, nil
	case err == nil && data == nil:
		data = []byte{}
	}
	return data, true, err
}
