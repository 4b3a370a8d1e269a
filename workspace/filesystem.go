package workspace

import (
	"context"
	"io/fs"
)

// FileSystem is a workspace's files, seen from inside the workspace.
//
// Every name is an io/fs name relative to the workspace root (see the package
// documentation); a name that is not fs.ValidPath fails with
// ErrInvalidArgument. Implementations must be safe for concurrent use.
//
// Confinement. Symbolic links are followed only while they stay inside the
// workspace: a name whose resolution leaves the root, by a link, by a chain of
// links, or as a new entry under a linked directory, fails with
// ErrOutsideWorkspace. Resolution and use are one step — an adapter must not
// check a path and then open it by name — so a link swapped in by a concurrent
// process cannot redirect an operation outside the root.
//
// Special files. Pipes, sockets and devices are never opened for reading or
// writing; such an operation fails with ErrNotAFile at once, without blocking.
//
// Errors are *fs.PathError values carrying a Kind. Besides the kinds named on
// each method, any method may fail with ErrOutsideWorkspace, ErrInvalidArgument,
// ErrForbidden (the host refused), ErrUnavailable (the backend is gone) or the
// context's error.
type FileSystem interface {
	// Stat describes the named file, following symbolic links.
	// Fails with ErrNotFound when it does not exist.
	Stat(ctx context.Context, name string) (fs.FileInfo, error)

	// Lstat describes the named file; a symbolic link is described itself.
	// Fails with ErrNotFound when it does not exist.
	Lstat(ctx context.Context, name string) (fs.FileInfo, error)

	// ReadDir lists a directory, sorted by name. An entry's type is that of the
	// entry itself (a link is reported as a link, not as what it points to).
	// Fails with ErrNotFound, or ErrNotADirectory for a file.
	ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error)

	// ReadFile returns the contents of a regular file of at most max bytes.
	// Fails with ErrNotFound; ErrNotAFile for a directory, pipe, socket or
	// device (without blocking); ErrFileTooLarge, without reading, for a file
	// over max bytes.
	ReadFile(ctx context.Context, name string, max int64) ([]byte, error)

	// WriteFile replaces the named regular file with data, or creates it with
	// perm. Readers see the old contents or the new, never a mix: the data is
	// written to a temporary file beside the target and renamed over it. An
	// existing file keeps its permission bits. A file with other hard links is
	// replaced, not written through, so an inode shared with a path outside the
	// workspace is never changed. When name is a link to a file inside the
	// workspace, the link's target is replaced and the link stays.
	// The parent directory must exist (ErrNotFound otherwise); writing to a
	// directory or a special file fails with ErrNotAFile.
	WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error

	// Mkdir creates one directory. Fails with ErrExists when name exists and
	// ErrNotFound when its parent does not.
	Mkdir(ctx context.Context, name string, perm fs.FileMode) error

	// Remove removes a file, a link (not its target) or an empty directory.
	// Fails with ErrNotFound, or ErrNotEmpty for a directory with entries.
	Remove(ctx context.Context, name string) error

	// Rename moves oldname to newname, replacing a file at newname. Links are
	// moved as links. Fails with ErrNotFound when oldname does not exist.
	Rename(ctx context.Context, oldname, newname string) error
}

// SymlinkFS is a FileSystem that can make and read symbolic links.
type SymlinkFS interface {
	FileSystem
	// Symlink creates name as a link to target. The target is stored as given;
	// it is not checked, but following it later is confined like any path.
	// Fails with ErrExists when name exists.
	Symlink(ctx context.Context, target, name string) error
	// Readlink returns the target of the link name. Fails with ErrInvalidArgument
	// when name is not a link.
	Readlink(ctx context.Context, name string) (string, error)
}

// MkdirAllFS is a FileSystem with its own MkdirAll.
type MkdirAllFS interface {
	FileSystem
	MkdirAll(ctx context.Context, name string, perm fs.FileMode) error
}

// AppendFS is a FileSystem that appends to a file without rewriting it.
// Its AppendFile must leave the tree AppendFileGeneric leaves.
type AppendFS interface {
	FileSystem
	AppendFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error
}

// RemoveAllFS is a FileSystem with its own RemoveAll.
type RemoveAllFS interface {
	FileSystem
	RemoveAll(ctx context.Context, name string) error
}

// LockFS is a FileSystem that can serialise writers of one file across
// processes and sessions sharing the same storage.
type LockFS interface {
	FileSystem
	// Lock blocks until the caller holds the write lock for name (which need
	// not exist), or ctx ends. The returned function releases it.
	Lock(ctx context.Context, name string) (unlock func(), err error)
}

// WalkFS is a FileSystem that lists a tree itself (in one round trip, say).
// Its result must equal WalkGeneric's for the same request.
type WalkFS interface {
	FileSystem
	Walk(ctx context.Context, req WalkRequest) (WalkResult, error)
}

// WalkEachFS is a WalkFS that can also hand a walk's entries out as it
// finds them (see WalkGenericEach), so that a caller that needs only the
// first of them (a search that stops at its limit) does not list the rest.
// The entries, in order, must be its Walk's.
type WalkEachFS interface {
	WalkFS
	WalkEach(ctx context.Context, req WalkRequest, fn func(WalkEntry) error) error
}

// CheckFS is a FileSystem that refuses some changes by rule (the protect
// guard of Guard, a scope's commit rules) and can say so before anything is
// attempted: a command that changes several entries asks first, so that it
// refuses the whole change rather than fail halfway.
type CheckFS interface {
	FileSystem
	// CheckChange returns the error a change to name (writing, creating,
	// removing or renaming it) would fail with by the file system's rules;
	// or, when there is none, where name leads with its links resolved (as
	// RealPath: what a writer locks). It changes nothing. No error is no
	// promise that the change will succeed: the entry may be missing, a
	// directory, or read-only.
	CheckChange(ctx context.Context, name string) (real string, err error)
}

// GrepFS is a FileSystem that searches file contents itself.
// Its result must equal GrepGeneric's for the same request.
type GrepFS interface {
	FileSystem
	Grep(ctx context.Context, req GrepRequest) (GrepResult, error)
}

// SwapFS is a FileSystem that writes a file and reports, from the same step
// (one round trip, say), what the write replaced and what it left: what a
// journal must keep of a change, without reading the file before and after.
// Its result must equal SwapGeneric's for the same request and tree.
type SwapFS interface {
	FileSystem
	Swap(ctx context.Context, req SwapRequest) (SwapResult, error)
}
