package interp

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// Mutator applies the guardrails shared by the shell's write commands and
// redirections and by the profile's structured mutations
// (workspaceshell.WriteFile and the others): every change goes through
// workspace.Guard over Env.Protect, a path to change is refused as written
// before anything starts (Target), and files are replaced atomically under
// their write lock. Its methods take workspace names that Target (or
// Resolve, for a path only read) returned.
type Mutator struct {
	fs      workspace.FileSystem // guarded
	root    string
	maxFile int64
}

// NewMutator returns the Mutator of env's workspace, behind env's guard.
func NewMutator(env Env) Mutator {
	env = env.guarded()
	return Mutator{fs: env.FS, root: env.root(), maxFile: env.maxFileBytes()}
}

func (r *runner) mutator() Mutator { return NewMutator(r.env) }

// Resolve turns a path an agent wrote into a workspace name, without the
// checks of Target: for a path that is only read (a copy's source).
func (m Mutator) Resolve(arg string) (string, error) { return workspace.Resolve(m.root, arg) }

// MakeDir creates name and any missing parents; created is false when name
// was a directory already.
func (m Mutator) MakeDir(ctx context.Context, name string) (created bool, err error) {
	_, statErr := m.fs.Stat(ctx, name)
	if err := workspace.MkdirAll(ctx, m.fs, name, 0o755); err != nil {
		return false, err
	}
	return errors.Is(statErr, workspace.ErrNotFound), nil
}

// Target resolves a path an agent wrote to the workspace name to change,
// refusing the workspace root and what the guard refuses (protected paths,
// as written and with links resolved).
func (m Mutator) Target(ctx context.Context, arg string) (string, error) {
	if m.fs == nil {
		return "", workspace.Errorf(workspace.ErrInvalidArgument, "no workspace file system")
	}
	name, err := workspace.Resolve(m.root, arg)
	if err != nil {
		return "", err
	}
	if name == "." {
		return "", workspace.Errorf(workspace.ErrInvalidArgument, "%s is the workspace root, which cannot be replaced, moved or deleted", arg)
	}
	_, err = workspace.CheckChange(ctx, m.fs, m.root, name)
	return name, err
}

// Destination readies to for a copy or move of from: checkClobber, then
// to's missing parents made.
func (m Mutator) Destination(ctx context.Context, from, to string, overwrite, follow bool) error {
	if err := m.checkClobber(ctx, from, to, overwrite, follow); err != nil {
		return err
	}
	return workspace.MkdirAll(ctx, m.fs, path.Dir(to), 0o755)
}

// checkClobber refuses copying or moving from onto an existing to, unless
// overwrite is set and both are files, and a directory into itself.
func (m Mutator) checkClobber(ctx context.Context, from, to string, overwrite, follow bool) error {
	if to == from || strings.HasPrefix(to, from+"/") {
		return workspace.Errorf(workspace.ErrInvalidArgument, "cannot copy or move %s into itself (%s)", from, to)
	}
	src, err := m.lstatOrStat(ctx, from, follow)
	if err != nil {
		return err
	}
	dst, err := m.fs.Stat(ctx, to)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return nil
	case err != nil:
		return err
	case dst.IsDir():
		return workspace.Errorf(workspace.ErrExists, "%s exists and is a directory, which is never replaced", to)
	case !overwrite:
		return workspace.Errorf(workspace.ErrExists, "%s exists; set overwrite to replace it", to)
	case src.IsDir():
		return workspace.Errorf(workspace.ErrNotADirectory, "cannot replace the file %s with the directory %s", to, from)
	}
	return nil
}

func (m Mutator) lstatOrStat(ctx context.Context, name string, follow bool) (fs.FileInfo, error) {
	if follow {
		return m.fs.Stat(ctx, name)
	}
	return m.fs.Lstat(ctx, name)
}

// WriteFile replaces or creates the file name (already a target) under its
// write lock; mkParents creates missing parent directories.
func (m Mutator) WriteFile(ctx context.Context, name string, data []byte, mkParents bool) (created bool, err error) {
	unlock, err := m.lock(ctx, name)
	if err != nil {
		return false, err
	}
	defer unlock()
	created, err = m.prepare(ctx, name, mkParents)
	if err != nil {
		return false, err
	}
	return created, m.fs.WriteFile(ctx, name, data, 0o644)
}

// AppendFile adds data to the end of name under its write lock and returns
// the file's size afterwards; created says the file was missing.
func (m Mutator) AppendFile(ctx context.Context, name string, data []byte, mkParents bool) (size int64, created bool, err error) {
	unlock, err := m.lock(ctx, name)
	if err != nil {
		return 0, false, err
	}
	defer unlock()
	created, err = m.prepare(ctx, name, mkParents)
	if err != nil {
		return 0, false, err
	}
	if int64(len(data)) > m.maxFile {
		return 0, false, workspace.Errorf(workspace.ErrFileTooLarge, "appending %d bytes to %s would pass the %d-byte file limit", len(data), name, m.maxFile)
	}
	var old []byte
	if !created {
		if old, err = m.fs.ReadFile(ctx, name, m.maxFile-int64(len(data))); err != nil {
			return 0, false, err
		}
	}
	all := append(old[:len(old):len(old)], data...)
	if err := m.fs.WriteFile(ctx, name, all, 0o644); err != nil {
		return 0, false, err
	}
	return int64(len(all)), created, nil
}

func (m Mutator) lock(ctx context.Context, name string) (func(), error) {
	real, err := workspace.RealPath(ctx, m.fs, m.root, name)
	if err != nil {
		return nil, err
	}
	return workspace.Lock(ctx, m.fs, real)
}

// prepare checks that name is a regular file or missing (created is then
// true), and creates its parents when asked.
func (m Mutator) prepare(ctx context.Context, name string, mkParents bool) (created bool, err error) {
	info, err := m.fs.Stat(ctx, name)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		if mkParents {
			return true, workspace.MkdirAll(ctx, m.fs, path.Dir(name), 0o755)
		}
		return true, nil
	case err != nil:
		return false, err
	case info.IsDir():
		return false, workspace.Errorf(workspace.ErrNotAFile, "%s is a directory", name)
	case !info.Mode().IsRegular():
		return false, workspace.Errorf(workspace.ErrNotAFile, "%s is not a regular file", name)
	}
	return false, nil
}

// Copy copies from to to, which the caller checked; follow says whether a
// link named as from is followed. It returns the entries created. A
// directory's tree is listed by one workspace.Walk before anything is
// written. Each entry is written through the guard, so a protected name
// below to stops the copy there (in the tool set, the journal then puts back
// what the call wrote).
func (m Mutator) Copy(ctx context.Context, from, to string, follow bool) (int, error) {
	info, err := m.lstatOrStat(ctx, from, follow)
	if err != nil {
		return 0, err
	}
	n, err := m.copyEntry(ctx, from, to, info.Mode(), "")
	if err != nil || !info.IsDir() {
		return n, err
	}
	w, err := workspace.Walk(ctx, m.fs, workspace.WalkRequest{Dir: from, Info: true, Errors: true})
	if err != nil {
		return n, err
	}
	for _, e := range w.Entries {
		if e.Err != nil {
			return n, e.Err
		}
		mode := e.Mode
		if _, ok := e.FileInfo(); !ok { // not described: changed since it was listed
			info, err := m.fs.Lstat(ctx, e.Path)
			if err != nil {
				return n, err
			}
			mode, e.Link = info.Mode(), ""
		}
		k, err := m.copyEntry(ctx, e.Path, path.Join(to, strings.TrimPrefix(e.Path, from+"/")), mode, e.Link)
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// copyEntry copies the one entry from, of the mode given, to to (a
// directory without its entries); link is a link's target, or "" to read it.
func (m Mutator) copyEntry(ctx context.Context, from, to string, mode fs.FileMode, link string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	switch typ := mode.Type(); {
	case typ == fs.ModeDir:
		if err := m.fs.Mkdir(ctx, to, mode.Perm()|0o700); err == nil {
			return 1, nil
		} else if !errors.Is(err, workspace.ErrExists) {
			return 0, err
		} else if ti, serr := m.fs.Stat(ctx, to); serr != nil || !ti.IsDir() {
			return 0, workspace.Errorf(workspace.ErrNotADirectory, "cannot copy the directory %s onto the file %s", from, to)
		}
		return 0, nil
	case typ == fs.ModeSymlink:
		sl, ok := m.fs.(workspace.SymlinkFS)
		if !ok {
			return 0, workspace.Errorf(workspace.ErrInvalidArgument, "%s is a link, and this workspace cannot make links", from)
		}
		target := link
		if target == "" {
			var err error
			if target, err = sl.Readlink(ctx, from); err != nil {
				return 0, err
			}
		}
		if err := m.fs.Remove(ctx, to); err != nil && !errors.Is(err, workspace.ErrNotFound) {
			return 0, err
		}
		return 1, sl.Symlink(ctx, target, to)
	case typ == 0:
		data, err := m.fs.ReadFile(ctx, from, m.maxFile)
		if err != nil {
			return 0, err
		}
		if err := m.fs.WriteFile(ctx, to, data, mode.Perm()); err != nil {
			return 0, err
		}
		return 1, nil
	}
	return 0, workspace.Errorf(workspace.ErrNotAFile, "%s is a special file, which is not copied", from)
}

// Move renames from to to; the guard refuses it when either tree holds a
// protected name.
func (m Mutator) Move(ctx context.Context, from, to string) error {
	if to == from || strings.HasPrefix(to, from+"/") {
		return workspace.Errorf(workspace.ErrInvalidArgument, "cannot move %s into itself (%s)", from, to)
	}
	return m.fs.Rename(ctx, from, to)
}

// Remove deletes name (a target); recursive allows a directory with
// entries. It returns the entries removed.
func (m Mutator) Remove(ctx context.Context, name string, recursive bool) (int, error) {
	info, err := m.fs.Lstat(ctx, name)
	if err != nil {
		return 0, err
	}
	if !info.IsDir() || !recursive {
		if err := m.fs.Remove(ctx, name); err != nil {
			if errors.Is(err, workspace.ErrNotEmpty) {
				return 0, workspace.Errorf(workspace.ErrNotEmpty, "%s is a directory with entries; delete it recursively to remove them too", name)
			}
			return 0, err
		}
		return 1, nil
	}
	walk, err := workspace.Walk(ctx, m.fs, workspace.WalkRequest{Dir: name})
	if err != nil {
		return 0, err
	}
	// The guard refuses the whole tree when it holds a protected name.
	if err := workspace.RemoveAll(ctx, m.fs, name); err != nil {
		return 0, err
	}
	return len(walk.Entries) + 1, nil
}
