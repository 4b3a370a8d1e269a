package workspaceshell

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
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
	m := newMutator(env)
	name, err := m.target(ctx, req.Path)
	if err != nil {
		return WriteFileResult{}, err
	}
	created, err := m.writeFile(ctx, name, []byte(req.Content), true)
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
	m := newMutator(env)
	name, err := m.target(ctx, req.Path)
	if err != nil {
		return AppendFileResult{}, err
	}
	res, err := m.appendFile(ctx, name, []byte(req.Content), true)
	if err != nil {
		return AppendFileResult{}, err
	}
	res.Path, res.Bytes = name, len(req.Content)
	return res, nil
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
	m := newMutator(env)
	name, err := m.target(ctx, req.Path)
	if err != nil {
		return MakeDirResult{}, err
	}
	_, statErr := m.fs.Stat(ctx, name)
	if err := workspace.MkdirAll(ctx, m.fs, name, 0o755); err != nil {
		return MakeDirResult{}, err
	}
	return MakeDirResult{Path: name, Created: errors.Is(statErr, workspace.ErrNotFound)}, nil
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
	m := newMutator(env)
	from, err := workspace.Resolve(m.root, req.From)
	if err != nil {
		return CopyPathResult{}, err
	}
	to, err := m.target(ctx, req.To)
	if err != nil {
		return CopyPathResult{}, err
	}
	if err := m.destination(ctx, from, to, req.Overwrite, true); err != nil {
		return CopyPathResult{}, err
	}
	n, err := m.copy(ctx, from, to, true)
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
	m := newMutator(env)
	from, err := m.target(ctx, req.From)
	if err != nil {
		return MovePathResult{}, err
	}
	to, err := m.target(ctx, req.To)
	if err != nil {
		return MovePathResult{}, err
	}
	if err := m.destination(ctx, from, to, req.Overwrite, false); err != nil {
		return MovePathResult{}, err
	}
	if err := m.move(ctx, from, to); err != nil {
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
	m := newMutator(env)
	name, err := m.target(ctx, req.Path)
	if err != nil {
		return DeletePathResult{}, err
	}
	n, err := m.remove(ctx, name, req.Recursive)
	if err != nil {
		return DeletePathResult{}, err
	}
	return DeletePathResult{Path: name, Removed: n}, nil
}

// mutator applies the guardrails shared by the structured operations and the
// shell's write commands and redirections.
type mutator struct {
	fs      workspace.FileSystem // guarded
	root    string
	maxFile int64
}

func newMutator(env Env) mutator {
	env = env.guarded()
	return mutator{fs: env.FS, root: env.root(), maxFile: env.maxFileBytes()}
}

func (r *runner) mutator() mutator { return newMutator(r.env) }

// target resolves a path an agent wrote to the workspace name to change,
// refusing the workspace root and what the guard refuses (protected paths,
// as written and with links resolved).
func (m mutator) target(ctx context.Context, arg string) (string, error) {
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

// destination readies to for a copy or move of from: checkClobber, then
// to's missing parents made.
func (m mutator) destination(ctx context.Context, from, to string, overwrite, follow bool) error {
	if err := m.checkClobber(ctx, from, to, overwrite, follow); err != nil {
		return err
	}
	return workspace.MkdirAll(ctx, m.fs, path.Dir(to), 0o755)
}

// checkClobber refuses copying or moving from onto an existing to, unless
// overwrite is set and both are files, and a directory into itself.
func (m mutator) checkClobber(ctx context.Context, from, to string, overwrite, follow bool) error {
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

func (m mutator) lstatOrStat(ctx context.Context, name string, follow bool) (fs.FileInfo, error) {
	if follow {
		return m.fs.Stat(ctx, name)
	}
	return m.fs.Lstat(ctx, name)
}

// writeFile replaces or creates the file name (already a target) under its
// write lock; mkParents creates missing parent directories.
func (m mutator) writeFile(ctx context.Context, name string, data []byte, mkParents bool) (created bool, err error) {
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

// appendFile adds data to the end of name under its write lock.
func (m mutator) appendFile(ctx context.Context, name string, data []byte, mkParents bool) (AppendFileResult, error) {
	unlock, err := m.lock(ctx, name)
	if err != nil {
		return AppendFileResult{}, err
	}
	defer unlock()
	created, err := m.prepare(ctx, name, mkParents)
	if err != nil {
		return AppendFileResult{}, err
	}
	if int64(len(data)) > m.maxFile {
		return AppendFileResult{}, workspace.Errorf(workspace.ErrFileTooLarge, "appending %d bytes to %s would pass the %d-byte file limit", len(data), name, m.maxFile)
	}
	var old []byte
	if !created {
		if old, err = m.fs.ReadFile(ctx, name, m.maxFile-int64(len(data))); err != nil {
			return AppendFileResult{}, err
		}
	}
	all := append(old[:len(old):len(old)], data...)
	if err := m.fs.WriteFile(ctx, name, all, 0o644); err != nil {
		return AppendFileResult{}, err
	}
	return AppendFileResult{Size: int64(len(all)), Created: created}, nil
}

func (m mutator) lock(ctx context.Context, name string) (func(), error) {
	real, err := workspace.RealPath(ctx, m.fs, m.root, name)
	if err != nil {
		return nil, err
	}
	return workspace.Lock(ctx, m.fs, real)
}

// prepare checks that name is a regular file or missing (created is then
// true), and creates its parents when asked.
func (m mutator) prepare(ctx context.Context, name string, mkParents bool) (created bool, err error) {
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

// copy copies from to to, which the caller checked; follow says whether a
// link named as from is followed. It returns the entries created. A
// directory's tree is listed by one workspace.Walk before anything is
// written. Each entry is written through the guard, so a protected name
// below to stops the copy there (in the tool set, the journal then puts back
// what the call wrote).
func (m mutator) copy(ctx context.Context, from, to string, follow bool) (int, error) {
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
func (m mutator) copyEntry(ctx context.Context, from, to string, mode fs.FileMode, link string) (int, error) {
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

// move renames from to to; the guard refuses it when either tree holds a
// protected name.
func (m mutator) move(ctx context.Context, from, to string) error {
	if to == from || strings.HasPrefix(to, from+"/") {
		return workspace.Errorf(workspace.ErrInvalidArgument, "cannot move %s into itself (%s)", from, to)
	}
	return m.fs.Rename(ctx, from, to)
}

// remove deletes name (a target); recursive allows a directory with
// entries. It returns the entries removed.
func (m mutator) remove(ctx context.Context, name string, recursive bool) (int, error) {
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

// ---- the shell's write commands: front ends of the operations above with
// coreutils' arguments and messages.

var mkdirFlags = flagSpec{bools: "pv", values: "m", long: map[string]string{"parents": "p", "verbose": "v", "mode": "m="}}

func cmdMkdir(c *call) int {
	opts, ops, ok := c.parseFlags(mkdirFlags)
	if !ok {
		return 2
	}
	parents, verbose, perm := false, false, fs.FileMode(0o755)
	for _, f := range opts {
		switch f.name {
		case "p":
			parents = true
		case "v":
			verbose = true
		case "m":
			n, err := strconv.ParseUint(f.val, 8, 32)
			if err != nil || n > 0o7777 {
				return c.usage("invalid mode '%s' (an octal mode is expected)", f.val)
			}
			perm = fs.FileMode(n).Perm()
		}
	}
	if len(ops) == 0 {
		return c.usage("missing operand")
	}
	m := c.r.mutator()
	status := 0
	for _, a := range ops {
		name, err := m.target(c.ctx, a)
		if err == nil {
			if parents {
				err = workspace.MkdirAll(c.ctx, m.fs, name, perm)
			} else {
				err = m.fs.Mkdir(c.ctx, name, perm)
			}
		}
		if err != nil {
			c.errorf("cannot create directory '%s': %s", a, errText(err))
			status = 1
			continue
		}
		if verbose {
			c.printf("mkdir: created directory '%s'\n", a)
		}
	}
	return status
}

var touchFlags = flagSpec{bools: "cam", long: map[string]string{"no-create": "c"}}

// cmdTouch creates missing files. An existing file is left as it is: the
// FileSystem port has no way to set a file's times.
func cmdTouch(c *call) int {
	opts, ops, ok := c.parseFlags(touchFlags)
	if !ok {
		return 2
	}
	noCreate := slices.ContainsFunc(opts, func(o opt) bool { return o.name == "c" })
	if len(ops) == 0 {
		return c.usage("missing file operand")
	}
	m := c.r.mutator()
	status := 0
	for _, a := range ops {
		name, err := m.target(c.ctx, a)
		if err == nil {
			_, err = m.fs.Stat(c.ctx, name)
			if errors.Is(err, workspace.ErrNotFound) {
				err = nil
				if !noCreate {
					_, err = m.writeFile(c.ctx, name, nil, false)
				}
			}
		}
		if err != nil {
			c.errorf("cannot touch '%s': %s", a, errText(err))
			status = 1
		}
	}
	return status
}

var cpFlags = flagSpec{bools: "rRafnvpPdT", long: map[string]string{"recursive": "r", "archive": "a", "force": "f",
	"no-clobber": "n", "verbose": "v", "no-dereference": "P", "no-target-directory": "T", "preserve": "p?"}}

var mvFlags = flagSpec{bools: "fnvT", long: map[string]string{"force": "f", "no-clobber": "n", "verbose": "v",
	"no-target-directory": "T"}}

// copyMoveArgs sorts cp's and mv's operands into sources and destinations:
// into a directory when the last operand is one, else one source to a path.
func (c *call) copyMoveArgs(ops []string, noTarget bool) (srcs []string, dest func(src string) (string, string, error), ok bool) {
	if len(ops) == 0 {
		c.errorf("missing file operand")
		return nil, nil, false
	}
	if len(ops) == 1 {
		c.errorf("missing destination file operand after '%s'", ops[0])
		return nil, nil, false
	}
	last := ops[len(ops)-1]
	srcs = ops[:len(ops)-1]
	m := c.r.mutator()
	dname, err := workspace.Resolve(m.root, last)
	intoDir := false
	if err == nil && !noTarget {
		if info, serr := m.fs.Stat(c.ctx, dname); serr == nil && info.IsDir() {
			intoDir = true
		}
	}
	if len(srcs) > 1 && !intoDir {
		c.errorf("target '%s' is not a directory", last)
		return nil, nil, false
	}
	return srcs, func(src string) (string, string, error) {
		arg := last
		if intoDir {
			arg = display(last, baseName(src))
		}
		name, err := m.target(c.ctx, arg)
		return name, arg, err
	}, true
}

func cmdCp(c *call) int {
	opts, ops, ok := c.parseFlags(cpFlags)
	if !ok {
		return 2
	}
	var recursive, noClobber, verbose, noTarget, noDeref bool
	for _, f := range opts {
		switch f.name {
		case "r", "R":
			recursive = true
		case "a":
			recursive, noDeref = true, true
		case "n":
			noClobber = true
		case "v":
			verbose = true
		case "T":
			noTarget = true
		case "P", "d":
			noDeref = true
		}
	}
	srcs, dest, ok := c.copyMoveArgs(ops, noTarget)
	if !ok {
		return 1
	}
	m := c.r.mutator()
	status := 0
	for _, src := range srcs {
		if c.stopped() {
			break
		}
		follow := !recursive && !noDeref
		from, err := workspace.Resolve(m.root, src)
		var info fs.FileInfo
		if err == nil {
			info, err = m.lstatOrStat(c.ctx, from, follow)
		}
		if err != nil {
			c.errorf("cannot stat '%s': %s", src, errText(err))
			status = 1
			continue
		}
		if info.IsDir() && !recursive {
			c.errorf("-r not specified; omitting directory '%s'", src)
			status = 1
			continue
		}
		to, toArg, err := dest(src)
		if err != nil {
			c.errorf("cannot create '%s': %s", toArg, errText(err))
			status = 1
			continue
		}
		if to == from || strings.HasPrefix(to, from+"/") {
			c.errorf("cannot copy '%s' into itself, '%s'", src, toArg)
			status = 1
			continue
		}
		if ti, err := m.fs.Stat(c.ctx, to); err == nil {
			if noClobber {
				continue
			}
			if ti.IsDir() && !info.IsDir() {
				c.errorf("cannot overwrite directory '%s' with non-directory", toArg)
				status = 1
				continue
			}
		}
		if _, err := m.copy(c.ctx, from, to, follow); err != nil {
			c.errorf("cannot copy '%s' to '%s': %s", src, toArg, errText(err))
			status = 1
			continue
		}
		if verbose {
			c.printf("'%s' -> '%s'\n", src, toArg)
		}
	}
	return status
}

func cmdMv(c *call) int {
	opts, ops, ok := c.parseFlags(mvFlags)
	if !ok {
		return 2
	}
	var noClobber, verbose, noTarget bool
	for _, f := range opts {
		switch f.name {
		case "n":
			noClobber = true
		case "v":
			verbose = true
		case "T":
			noTarget = true
		}
	}
	srcs, dest, ok := c.copyMoveArgs(ops, noTarget)
	if !ok {
		return 1
	}
	m := c.r.mutator()
	status := 0
	for _, src := range srcs {
		if c.stopped() {
			break
		}
		from, err := m.target(c.ctx, src)
		var info fs.FileInfo
		if err == nil {
			info, err = m.fs.Lstat(c.ctx, from)
		}
		if err != nil {
			c.errorf("cannot move '%s': %s", src, errText(err))
			status = 1
			continue
		}
		to, toArg, err := dest(src)
		if err == nil {
			err = c.mvClear(info, to, toArg, noClobber)
		}
		if err == errSkip {
			continue
		}
		if err == nil {
			err = m.move(c.ctx, from, to)
		}
		if err != nil {
			c.errorf("cannot move '%s' to '%s': %s", src, toArg, errText(err))
			status = 1
			continue
		}
		if verbose {
			c.printf("renamed '%s' -> '%s'\n", src, toArg)
		}
	}
	return status
}

var errSkip = errors.New("skip")

// mvClear makes way for a move onto to: an empty directory is replaced by a
// directory, a file by a file; anything else is refused.
func (c *call) mvClear(src fs.FileInfo, to, toArg string, noClobber bool) error {
	fsys := c.r.env.FS
	ti, err := fsys.Lstat(c.ctx, to)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return nil
	case err != nil:
		return err
	case noClobber:
		return errSkip
	case ti.IsDir() && !src.IsDir():
		return workspace.Errorf(workspace.ErrExists, "cannot overwrite directory '%s' with non-directory", toArg)
	case !ti.IsDir() && src.IsDir():
		return workspace.Errorf(workspace.ErrNotADirectory, "cannot overwrite non-directory '%s' with directory", toArg)
	case ti.IsDir():
		if err := fsys.Remove(c.ctx, to); err != nil {
			return err
		}
	}
	return nil
}

var rmFlags = flagSpec{bools: "rRfdvI", long: map[string]string{"recursive": "r", "force": "f", "dir": "d", "verbose": "v"}}

func cmdRm(c *call) int {
	opts, ops, ok := c.parseFlags(rmFlags)
	if !ok {
		return 2
	}
	var recursive, force, emptyDirs, verbose bool
	for _, f := range opts {
		switch f.name {
		case "r", "R":
			recursive = true
		case "f":
			force = true
		case "d":
			emptyDirs = true
		case "v":
			verbose = true
		}
	}
	if len(ops) == 0 {
		if force {
			return 0
		}
		c.errorf("missing operand")
		return 1
	}
	m := c.r.mutator()
	status := 0
	for _, a := range ops {
		if c.stopped() {
			break
		}
		if b := baseName(a); b == "." || b == ".." {
			c.errorf("refusing to remove '.' or '..' directory: skipping '%s'", a)
			status = 1
			continue
		}
		name, err := m.target(c.ctx, a)
		var info fs.FileInfo
		if err == nil {
			info, err = m.fs.Lstat(c.ctx, name)
		}
		if errors.Is(err, workspace.ErrNotFound) && force {
			continue
		}
		if err == nil && info.IsDir() && !recursive && !emptyDirs {
			err = workspace.Errorf(workspace.ErrNotAFile, "cannot remove '%s': Is a directory", a)
		}
		if err == nil {
			_, err = m.remove(c.ctx, name, recursive)
		}
		if err != nil {
			if msg, ok := ownMessage(err); ok && strings.HasPrefix(msg, "cannot remove") {
				c.errorf("%s", msg)
			} else {
				c.errorf("cannot remove '%s': %s", a, errText(err))
			}
			status = 1
			continue
		}
		if verbose {
			what := "removed"
			if info.IsDir() {
				what = "removed directory"
			}
			c.printf("%s '%s'\n", what, a)
		}
	}
	return status
}
