// Package scope applies a session's rules — which paths the agent may see and
// which it may commit — to a workspace.FileSystem, as a decorator every tool
// goes through. See Rules for the globs and New for what the decorator
// guarantees.
package scope

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// New returns fsys seen through r. Zero Rules return fsys itself. root is the
// workspace root as an absolute slash path, as the adapter's absolute links
// name it (Session.Root); links with absolute targets are resolved against it.
// New fails, with workspace.ErrInvalidArgument, on rules Validate refuses and
// on a root that is not absolute.
//
// What the decorator guarantees, for every method and extension:
//
//   - Invisible is absent. A path r does not show fails with
//     workspace.ErrNotFound (an *fs.PathError naming the path as given), and
//     ReadDir, Walk and Grep leave it out. A path is shown when it is visible
//     (Rules.IsVisible), or is a directory something visible may lie below: with
//     Visible ["src/**"] the root lists only "src"; with ["**/*.go"] every
//     directory is listed and entered, and of the rest only .go files. Whether
//     something visible may lie below a directory is judged by comparing it,
//     segment by segment, with each glob's leading segments up to the first
//     "**" (or brace, class or escape, which count as "may"): sound — a visible
//     path is never missed — and at worst it shows an empty directory.
//   - Links are judged by name and by destination. Every operation resolves
//     its name as the kernel does (".." in a link target goes up from where the
//     link led, not lexically) and applies the rules both to the name as given
//     and to where it leads; each link followed on the way must itself be shown.
//     A visible link to an invisible file therefore behaves as a dangling link:
//     Lstat, ReadDir and Readlink show the link, Stat and ReadFile fail with
//     ErrNotFound. A link is an entry of its own, not a directory: it is listed
//     only when its name is visible. Links whose resolution leaves the root
//     fail with workspace.ErrOutsideWorkspace, as the adapter's would; so do
//     absolute links that name the root otherwise than root does (stricter
//     than an adapter that knows two spellings of its root).
//   - Writes stay in the commit scope. WriteFile, Mkdir, Remove, Rename (both
//     ends), Symlink, MkdirAll and RemoveAll on an invisible path fail with
//     ErrNotFound; on a visible one outside Commit, with workspace.ErrProtected
//     and a message saying it is outside the session's commit scope. A file, a
//     link or a special file needs Rules.IsCommittable; a directory created or
//     removed empty needs only that something committable may lie below it
//     (MkdirAll checks each directory it creates).
//     RemoveAll and Rename of a directory take everything below along, so the
//     directory itself must be committable (and then all below it is, by the
//     ancestor rule); otherwise they are refused with ErrProtected.
//   - The extensions the inner FileSystem has are kept: the result is a
//     workspace.SymlinkFS exactly when fsys is one, and always a MkdirAllFS,
//     RemoveAllFS, LockFS, CheckFS, WalkFS and GrepFS whose answers equal the generic
//     helpers' over the decorator. With Visible nil, reads, walks and searches
//     go straight to fsys (its fast paths included); otherwise a walk and a
//     search use the adapter's WalkFS and GrepFS and filter their answers (a
//     search stopped at its limit after dropping a match is done again file
//     by file), so a Grep limit counts visible matches only. Lock takes the
//     adapter's lock for a name that is shown.
//
// What it does not guarantee:
//
//   - Existence can show through errors that cannot be hidden: Remove of a
//     shown, empty-looking directory fails with ErrNotEmpty when it holds
//     invisible entries; Mkdir or WriteFile of a name an invisible entry holds
//     fails with ErrNotFound, not success.
//   - Like workspace.RealPath, the checks are lookups made just before the
//     operation, not locks. A process that swaps links in the workspace
//     between the check and the use can redirect that one operation (never
//     outside the root: confinement stays the adapter's). Only the agent's own
//     commands could do that, and commands (bash, workspace_exec) are not
//     bound by these rules at all: a session that must not see past Visible
//     must not have shell.exec.
//   - The rules bind names, not inodes: a hard link with a visible name shows
//     the contents of a file that is invisible under its other name. (Writes
//     replace such a file rather than write through it, by the port's
//     contract, so the other name keeps its contents.)
func New(fsys workspace.FileSystem, root string, r Rules) (workspace.FileSystem, error) {
	if r.IsZero() {
		return fsys, nil
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if !path.IsAbs(root) {
		return nil, fmt.Errorf("scope: the workspace root %q is not an absolute path: %w", root, workspace.ErrInvalidArgument)
	}
	s := &scopedFS{
		inner: fsys,
		root:  path.Clean(root),
		r:     Rules{Visible: slices.Clone(r.Visible), Commit: slices.Clone(r.Commit)},
	}
	if sl, ok := fsys.(workspace.SymlinkFS); ok {
		s.links = sl
		return &linkFS{s}, nil
	}
	return s, nil
}

// scopedFS is the decorator over a FileSystem that has no SymlinkFS; linkFS
// adds Symlink and Readlink when it has.
type scopedFS struct {
	inner workspace.FileSystem
	links workspace.SymlinkFS // inner, when it is one
	root  string
	r     Rules
}

type linkFS struct{ *scopedFS }

// outer is the decorator as New returned it: s, or s with its links, so a
// generic helper over it reads links as callers do.
func (s *scopedFS) outer() workspace.FileSystem {
	if s.links != nil {
		return &linkFS{s}
	}
	return s
}

var (
	_ workspace.FileSystem  = (*scopedFS)(nil)
	_ workspace.MkdirAllFS  = (*scopedFS)(nil)
	_ workspace.RemoveAllFS = (*scopedFS)(nil)
	_ workspace.LockFS      = (*scopedFS)(nil)
	_ workspace.WalkFS      = (*scopedFS)(nil)
	_ workspace.GrepFS      = (*scopedFS)(nil)
	_ workspace.CheckFS     = (*scopedFS)(nil)
	_ workspace.SymlinkFS   = (*linkFS)(nil)
	_ workspace.WalkFS      = (*linkFS)(nil)
	_ workspace.GrepFS      = (*linkFS)(nil)
)

// target is where a name leads.
type target struct {
	real string      // the workspace name it leads to, links resolved
	info fs.FileInfo // what is there (a link itself, when not followed); nil: nothing
}

// isDir says whether the entry is a directory; when there is none, whether
// the operation would make one.
func (t target) isDir(creates bool) bool {
	if t.info == nil {
		return creates
	}
	return t.info.IsDir()
}

// resolve finds where name leads, following links on the way and, when
// follow is set, a link at the end, as the kernel does (workspace.NameWalk):
// ".." in a link target goes up from the directory the walk has reached. A
// missing component ends the walk: the rest is kept as written, so real also
// tells where a new entry would land, and info is nil; so it is when a file
// stands on the way (the operation will fail). Everything passed on the way —
// links followed, directories, a file — must be shown by the rules, or the
// name fails with ErrNotFound.
func (s *scopedFS) resolve(ctx context.Context, op, name string, follow bool) (target, error) {
	walk := workspace.NameWalk{Root: s.root, Follow: follow, Passing: func(n string, info fs.FileInfo) error {
		shown := s.r.IsVisible(n) // a file in the way
		if info.IsDir() || info.Mode()&fs.ModeSymlink != 0 {
			// A directory not shown cannot be passed, even to come back
			// by "..": that would tell whether it exists.
			shown = s.r.seen(n, true)
		}
		if !shown {
			return errHidden
		}
		return nil
	}}
	real, info, err := walk.Resolve(ctx, s.inner, name)
	switch {
	case errors.Is(err, errHidden):
		return target{}, workspace.PathError(op, name, workspace.ErrNotFound)
	case err != nil:
		return target{}, reword(op, name, err)
	}
	return target{real: real, info: info}, nil
}

// errHidden stops a resolution at an entry the rules do not show.
var errHidden = errors.New("hidden by the rules")

// reword reports err, an inner failure on some path of the resolution, as
// op's failure on name, so that no resolved (perhaps invisible) name leaks.
func reword(op, name string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

// access is what an operation does with the entry a name leads to.
type access int

const (
	look       access = iota // read it
	change                   // create, replace or remove that one entry
	changeTree               // move or remove it with everything below it
)

// check applies the rules to name, which leads to t; dir says whether the
// entry is (or will be) a directory.
func (s *scopedFS) check(op, name string, t target, dir bool, a access) error {
	for _, n := range [2]string{name, t.real} {
		if !s.r.seen(n, dir) {
			return workspace.PathError(op, name, workspace.ErrNotFound)
		}
	}
	for _, n := range [2]string{name, t.real} {
		switch {
		case a == change && !s.r.changeable(n, dir):
			return s.protected(op, name, "outside this session's commit scope")
		case a == changeTree && !s.r.IsCommittable(n):
			if dir {
				return s.protected(op, name, "a directory is moved or removed whole only when it is itself in this session's commit scope")
			}
			return s.protected(op, name, "outside this session's commit scope")
		}
	}
	return nil
}

// lookup resolves name for a read and checks it may be seen; a name that
// leads nowhere fails with ErrNotFound.
func (s *scopedFS) lookup(ctx context.Context, op, name string, follow bool) (target, error) {
	t, err := s.resolve(ctx, op, name, follow)
	if err != nil {
		return target{}, err
	}
	if t.info == nil {
		return target{}, workspace.PathError(op, name, workspace.ErrNotFound)
	}
	return t, s.check(op, name, t, t.info.IsDir(), look)
}

// prepare resolves name for a change and checks it is allowed; creates says
// whether a missing name would become a directory.
func (s *scopedFS) prepare(ctx context.Context, op, name string, follow, creates bool, a access) (target, error) {
	t, err := s.resolve(ctx, op, name, follow)
	if err != nil {
		return target{}, err
	}
	return t, s.check(op, name, t, t.isDir(creates), a)
}

func (s *scopedFS) protected(op, name, why string) error {
	globs := s.r.Commit
	if globs == nil {
		globs = s.r.Visible
	}
	return &fs.PathError{Op: op, Path: name, Err: workspace.Errorf(workspace.ErrProtected, "%s (%s)", why, strings.Join(globs, ", "))}
}

// readsAll says reads need no checks: everything is visible.
func (s *scopedFS) readsAll() bool { return s.r.Visible == nil }

// mayRead checks that name may be read (followed to its end when follow is
// set).
func (s *scopedFS) mayRead(ctx context.Context, op, name string, follow bool) error {
	if s.readsAll() {
		return nil
	}
	_, err := s.lookup(ctx, op, name, follow)
	return err
}

func (s *scopedFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	if err := s.mayRead(ctx, "stat", name, true); err != nil {
		return nil, err
	}
	return s.inner.Stat(ctx, name)
}

func (s *scopedFS) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	if err := s.mayRead(ctx, "lstat", name, false); err != nil {
		return nil, err
	}
	return s.inner.Lstat(ctx, name)
}

func (s *scopedFS) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	if s.readsAll() {
		return s.inner.ReadDir(ctx, name)
	}
	t, err := s.lookup(ctx, "readdir", name, true)
	if err != nil {
		return nil, err
	}
	entries, err := s.inner.ReadDir(ctx, name)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(entries, func(e fs.DirEntry) bool {
		return !s.shown(path.Join(name, e.Name()), path.Join(t.real, e.Name()), e.IsDir())
	}), nil
}

// shown says whether an entry listed under both its name and its real name
// is shown.
func (s *scopedFS) shown(name, real string, dir bool) bool {
	return s.r.seen(name, dir) && s.r.seen(real, dir)
}

func (s *scopedFS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	if err := s.mayRead(ctx, "read", name, true); err != nil {
		return nil, err
	}
	return s.inner.ReadFile(ctx, name, max)
}

func (s *scopedFS) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if _, err := s.prepare(ctx, "write", name, true, false, change); err != nil {
		return err
	}
	return s.inner.WriteFile(ctx, name, data, perm)
}

func (s *scopedFS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	if _, err := s.prepare(ctx, "mkdir", name, false, true, change); err != nil {
		return err
	}
	return s.inner.Mkdir(ctx, name, perm)
}

func (s *scopedFS) Remove(ctx context.Context, name string) error {
	if _, err := s.prepareRemoval(ctx, "remove", name, change); err != nil {
		return err
	}
	return s.inner.Remove(ctx, name)
}

// prepareRemoval checks that name, which must exist and not be the root,
// may be removed (or moved away), and returns the entry.
func (s *scopedFS) prepareRemoval(ctx context.Context, op, name string, a access) (target, error) {
	if name == "." {
		return target{}, workspace.PathError(op, name, workspace.ErrInvalidArgument)
	}
	t, err := s.lookup(ctx, op, name, false)
	if err != nil {
		return target{}, err
	}
	return t, s.check(op, name, t, t.info.IsDir(), a)
}

func (s *scopedFS) Rename(ctx context.Context, oldname, newname string) error {
	const op = "rename"
	old, err := s.prepareRemoval(ctx, op, oldname, changeTree)
	if err != nil {
		return err
	}
	if newname == "." {
		return workspace.PathError(op, newname, workspace.ErrInvalidArgument)
	}
	t, err := s.resolve(ctx, op, newname, false)
	if err != nil {
		return err
	}
	// The new name takes the moved entry, and replaces what is there.
	if err := s.check(op, newname, t, old.info.IsDir(), changeTree); err != nil {
		return err
	}
	if t.info != nil {
		if err := s.check(op, newname, t, t.info.IsDir(), changeTree); err != nil {
			return err
		}
	}
	return s.inner.Rename(ctx, oldname, newname)
}

// MkdirAll creates name and its missing parents, each through Mkdir and so
// each checked.
func (s *scopedFS) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	return workspace.MkdirAll(ctx, coreFS{s}, name, perm)
}

// coreFS hides every extension of a FileSystem, so that a helper falls back
// to the core methods.
type coreFS struct{ workspace.FileSystem }

// RemoveAll removes name and all below it; a missing name that may be seen is
// not an error.
func (s *scopedFS) RemoveAll(ctx context.Context, name string) error {
	const op = "removeall"
	if name == "." {
		return workspace.PathError(op, name, workspace.ErrInvalidArgument)
	}
	t, err := s.resolve(ctx, op, name, false)
	if err != nil {
		return err
	}
	if t.info == nil {
		if !s.shown(name, t.real, true) {
			return workspace.PathError(op, name, workspace.ErrNotFound)
		}
		return nil
	}
	if err := s.check(op, name, t, t.info.IsDir(), changeTree); err != nil {
		return err
	}
	return workspace.RemoveAll(ctx, s.inner, name)
}

// Lock takes the inner workspace's lock for name, which must be shown (it
// need not exist), so writers through the decorator and around it exclude
// each other.
func (s *scopedFS) Lock(ctx context.Context, name string) (func(), error) {
	if !s.readsAll() {
		if _, err := s.prepare(ctx, "lock", name, true, false, look); err != nil {
			return nil, err
		}
	}
	return workspace.Lock(ctx, s.inner, name)
}

// CheckChange asks the inner workspace's rules (a protect guard below the
// scope) about a name that is shown, and where it leads; the commit scope
// itself is applied by each change.
func (s *scopedFS) CheckChange(ctx context.Context, name string) (string, error) {
	if !s.readsAll() {
		if _, err := s.prepare(ctx, "check", name, true, false, look); err != nil {
			return "", err
		}
	}
	return workspace.CheckChange(ctx, s.inner, s.root, name)
}

func (s *linkFS) Symlink(ctx context.Context, dest, name string) error {
	if _, err := s.prepare(ctx, "symlink", name, false, false, change); err != nil {
		return err
	}
	return s.links.Symlink(ctx, dest, name)
}

func (s *linkFS) Readlink(ctx context.Context, name string) (string, error) {
	if err := s.mayRead(ctx, "readlink", name, false); err != nil {
		return "", err
	}
	return s.links.Readlink(ctx, name)
}
