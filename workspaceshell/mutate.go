package workspaceshell

import (
	"context"

	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// The structured mutations of write mode: writeFile, appendFile, makeDir,
// copyPath, movePath and deletePath. Each takes paths as an agent writes them
// (relative to the workspace root, or absolute inside it) and keeps the
// guardrails of write and edit:
//
//   - confinement: a path that leaves the workspace, lexically or through a
//     link, fails with workspace.ErrOutsideWorkspace (the FileSystem port
//     enforces it at the moment of use);
//   - protect globs: a path matching Env.Protect, as written or with its links
//     resolved, fails with workspace.ErrProtected (a *workspace.ProtectedError),
//     and so does a move or delete of a directory with a protected path
//     anywhere below it — the whole tree is checked before anything changes.
//     The check is workspace.Guard's, the one every tool changes files
//     through; the operations ask it (workspace.CheckChange) before they
//     start, so a refused path is named as the argument that led to it;
//   - no half-written files: files are written with FileSystem.WriteFile,
//     which replaces a file atomically, and appends hold workspace.Lock.
//
// What they do not guarantee: a copy, move or delete of a tree is a series of
// single-file operations, so a failure midway (the disk fills) leaves the
// part done in place, and a concurrent writer may interleave with it.

// Env is the workspace the mutations work on: the shell's ([interp.Env]),
// its Protect globs and MaxFileBytes applying to them too.
type Env = interp.Env

// WriteFileRequest replaces or creates a file.
type WriteFileRequest struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// WriteFileResult says what WriteFile did.
type WriteFileResult struct {
	Path    string `json:"path"` // the workspace name
	Bytes   int    `json:"bytes"`
	Created bool   `json:"created"`
}

// WriteFile writes req.Content to req.Path atomically, creating missing
// parent directories. A directory or special file at the path fails with
// workspace.ErrNotAFile.
func WriteFile(ctx context.Context, env Env, req WriteFileRequest) (WriteFileResult, error) {
	m := interp.NewMutator(env)
	name, err := m.Target(ctx, req.Path)
	if err != nil {
		return WriteFileResult{}, err
	}
	created, err := m.WriteFile(ctx, name, []byte(req.Content), true)
	if err != nil {
		return WriteFileResult{}, err
	}
	return WriteFileResult{Path: name, Bytes: len(req.Content), Created: created}, nil
}

// AppendFileRequest adds to the end of a file.
type AppendFileRequest struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// AppendFileResult says what AppendFile did.
type AppendFileResult struct {
	Path    string `json:"path"`
	Bytes   int    `json:"bytes"` // appended
	Size    int64  `json:"size"`  // of the file afterwards
	Created bool   `json:"created"`
}

// AppendFile adds req.Content to the end of req.Path, creating the file and
// its parents when missing. It holds the file's write lock (workspace.Lock)
// from reading the old contents to writing the new, so appends through this
// package never lose each other's data, and it replaces the file atomically.
func AppendFile(ctx context.Context, env Env, req AppendFileRequest) (AppendFileResult, error) {
	m := interp.NewMutator(env)
	name, err := m.Target(ctx, req.Path)
	if err != nil {
		return AppendFileResult{}, err
	}
	size, created, err := m.AppendFile(ctx, name, []byte(req.Content), true)
	if err != nil {
		return AppendFileResult{}, err
	}
	return AppendFileResult{Path: name, Bytes: len(req.Content), Size: size, Created: created}, nil
}

// MakeDirRequest creates a directory and its missing parents.
type MakeDirRequest struct {
	Path string `json:"path"`
}

// MakeDirResult says what MakeDir did.
type MakeDirResult struct {
	Path    string `json:"path"`
	Created bool   `json:"created"` // false: it already existed
}

// MakeDir creates req.Path and any missing parents. An existing directory is
// not an error; an existing file fails with workspace.ErrNotADirectory.
func MakeDir(ctx context.Context, env Env, req MakeDirRequest) (MakeDirResult, error) {
	m := interp.NewMutator(env)
	name, err := m.Target(ctx, req.Path)
	if err != nil {
		return MakeDirResult{}, err
	}
	created, err := m.MakeDir(ctx, name)
	if err != nil {
		return MakeDirResult{}, err
	}
	return MakeDirResult{Path: name, Created: created}, nil
}

// CopyPathRequest copies a file or a directory tree to a new path.
type CopyPathRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Overwrite lets a file replace a file at To. A directory at To is never
	// replaced.
	Overwrite bool `json:"overwrite,omitempty"`
}

// CopyPathResult says what CopyPath did.
type CopyPathResult struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Entries int    `json:"entries"` // files, directories and links created
}

// CopyPath copies req.From to exactly req.To (not into it), creating To's
// missing parents. A directory is copied with everything below it; links
// inside it are copied as links. A link named as From is followed. An
// existing To fails with workspace.ErrExists unless Overwrite is set and
// both are files.
func CopyPath(ctx context.Context, env Env, req CopyPathRequest) (CopyPathResult, error) {
	m := interp.NewMutator(env)
	from, err := m.Resolve(req.From)
	if err != nil {
		return CopyPathResult{}, err
	}
	to, err := m.Target(ctx, req.To)
	if err != nil {
		return CopyPathResult{}, err
	}
	if err := m.Destination(ctx, from, to, req.Overwrite, true); err != nil {
		return CopyPathResult{}, err
	}
	n, err := m.Copy(ctx, from, to, true)
	if err != nil {
		return CopyPathResult{}, err
	}
	return CopyPathResult{From: from, To: to, Entries: n}, nil
}

// MovePathRequest moves (renames) a file or directory.
type MovePathRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Overwrite lets a file replace a file at To. A directory at To is never
	// replaced.
	Overwrite bool `json:"overwrite,omitempty"`
}

// MovePathResult says what MovePath did.
type MovePathResult struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// MovePath renames req.From to exactly req.To, creating To's missing parents.
// A link is moved as a link. An existing To fails with workspace.ErrExists
// unless Overwrite is set and both are files.
func MovePath(ctx context.Context, env Env, req MovePathRequest) (MovePathResult, error) {
	m := interp.NewMutator(env)
	from, err := m.Target(ctx, req.From)
	if err != nil {
		return MovePathResult{}, err
	}
	to, err := m.Target(ctx, req.To)
	if err != nil {
		return MovePathResult{}, err
	}
	if err := m.Destination(ctx, from, to, req.Overwrite, false); err != nil {
		return MovePathResult{}, err
	}
	if err := m.Move(ctx, from, to); err != nil {
		return MovePathResult{}, err
	}
	return MovePathResult{From: from, To: to}, nil
}

// DeletePathRequest deletes a file, a link or a directory.
type DeletePathRequest struct {
	Path string `json:"path"`
	// Recursive allows deleting a directory that has entries.
	Recursive bool `json:"recursive,omitempty"`
}

// DeletePathResult says what DeletePath did.
type DeletePathResult struct {
	Path    string `json:"path"`
	Removed int    `json:"removed"` // entries removed, the path itself included
}

// DeletePath removes req.Path: a file, a link (never its target), an empty
// directory, or with Recursive a whole tree. The workspace root is never
// deleted. A missing path fails with workspace.ErrNotFound; a directory with
// entries, without Recursive, with workspace.ErrNotEmpty.
func DeletePath(ctx context.Context, env Env, req DeletePathRequest) (DeletePathResult, error) {
	m := interp.NewMutator(env)
	name, err := m.Target(ctx, req.Path)
	if err != nil {
		return DeletePathResult{}, err
	}
	n, err := m.Remove(ctx, name, req.Recursive)
	if err != nil {
		return DeletePathResult{}, err
	}
	return DeletePathResult{Path: name, Removed: n}, nil
}
