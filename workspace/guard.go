package workspace

import (
	"context"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/bmatcuk/doublestar/v4"
)

// Resolve turns a path an agent wrote into a workspace name (see the package
// documentation). root is the workspace root as an absolute slash path; p may
// be relative to it, or absolute and inside it. Resolve is lexical: it cleans
// p ("a/./b//c", "sub/../x") and refuses, with ErrOutsideWorkspace, a path
// that leaves the root by ".." or names a place outside it. An empty path is
// the root. A path containing a NUL byte fails with ErrInvalidArgument.
//
// What Resolve does not do is follow links: confinement against symbolic
// links is the FileSystem's, done at the moment of use.
func Resolve(root, p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", PathError("resolve", p, ErrInvalidArgument)
	}
	if p == "" {
		return ".", nil
	}
	if path.IsAbs(p) {
		root = path.Clean("/" + root)
		clean := path.Clean(p)
		if clean == root {
			return ".", nil
		}
		prefix := root + "/"
		if root == "/" {
			prefix = "/"
		}
		rel, ok := strings.CutPrefix(clean, prefix)
		if !ok {
			return "", PathError("resolve", p, ErrOutsideWorkspace)
		}
		return rel, nil
	}
	clean := path.Clean(p)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", PathError("resolve", p, ErrOutsideWorkspace)
	}
	return clean, nil
}

// NameMax and PathMax are what a Linux file system holds, and so what a
// workspace does, on every backend: a name element of at most NameMax bytes
// (NAME_MAX), a whole path, with its terminating NUL, of fewer than PathMax
// (PATH_MAX). A name past them could be kept by some FileSystem (memfs; a
// disk reached with openat one element at a time), but no command could use
// it: a memory workspace's mirror, git or a shell on the host would fail on
// it.
const (
	NameMax = 255
	PathMax = 4096
)

// CheckNameLength refuses, with ErrInvalidArgument ("file name too long"), a
// workspace name with an element over NameMax bytes or whose path from root
// (an absolute slash path, the root as the host sees it) reaches PathMax.
// It is what every FileSystem checks a name against.
func CheckNameLength(root, name string) error {
	if len(root)+1+len(name) >= PathMax {
		return Errorf(ErrInvalidArgument, "file name too long: %d bytes from the root %s, and a path may be %d at most (PATH_MAX)", len(name), root, PathMax-1)
	}
	for elem := range strings.SplitSeq(name, "/") {
		if len(elem) > NameMax {
			return Errorf(ErrInvalidArgument, "file name too long: an element of %d bytes, and one may be %d at most (NAME_MAX)", len(elem), NameMax)
		}
	}
	return nil
}

// DefaultProtect are the globs write and edit refuse unless configured.
var DefaultProtect = Protect{".git/**", ".sandboxd/**"}

// Protect is a list of doublestar globs (github.com/bmatcuk/doublestar/v4)
// naming paths every mutation refuses. A glob ending in "/**" also covers the
// directory itself. Matching is on the cleaned name and ignores case, so
// ".GIT/config" is protected by ".git/**" — on a case-insensitive disk it is
// the same file, and on others refusing it costs nothing.
type Protect []string

// Match reports whether name (a workspace name) is protected.
func (p Protect) Match(name string) bool {
	name = strings.ToLower(path.Clean(name))
	for _, glob := range p {
		glob = strings.ToLower(glob)
		if ok, _ := doublestar.Match(glob, name); ok {
			return true
		}
		if dir, ok := strings.CutSuffix(glob, "/**"); ok {
			if ok, _ := doublestar.Match(dir, name); ok {
				return true
			}
		}
	}
	return false
}

// Validate reports the first glob that doublestar cannot parse.
func (p Protect) Validate() error {
	for _, g := range p {
		if !doublestar.ValidatePattern(g) {
			return PathError("protect", g, ErrInvalidArgument)
		}
	}
	return nil
}

// DefaultExclude are the names walks skip unless configured.
var DefaultExclude = Exclude{"node_modules", ".git", ".sandboxd"}

// Exclude lists what walks (find, grep) never enter. An entry without a slash
// is a name, matched against every path component's base name (a doublestar
// glob, so "*.egg-info" works); an entry with a slash is a path from the
// workspace root ("build/out" skips that directory wherever a walk starts).
type Exclude []string

// Skip reports whether the workspace name is excluded.
func (e Exclude) Skip(name string) bool {
	if name == "." || name == "" {
		return false
	}
	base := path.Base(name)
	for _, x := range e {
		if strings.Contains(x, "/") {
			x = strings.Trim(path.Clean(x), "/")
			if ok, _ := doublestar.Match(x, name); ok {
				return true
			}
			continue
		}
		if ok, _ := doublestar.Match(x, base); ok {
			return true
		}
	}
	return false
}

// DefaultEnvAllow is the part of the host environment a local command sees
// unless configured otherwise. An entry ending in "*" is a prefix.
var DefaultEnvAllow = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_*", "TERM", "SHELL", "TMPDIR", "TZ"}

// CommandEnv builds a command's environment: the host variables that allow
// names (or every host variable when inherit is set), then vars, which win.
// The result is sorted by name so it is the same for the same inputs. Nothing
// of the host outside allow reaches a command unless inherit is set.
func CommandEnv(host []string, allow []string, inherit bool, vars map[string]string) []string {
	m := make(map[string]string, len(vars)+len(allow))
	for _, kv := range host {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if inherit || EnvAllowed(allow, k) {
			m[k] = v
		}
	}
	for k, v := range vars {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// EnvAllowed reports whether allow (entries as in DefaultEnvAllow) lets a
// host variable named key through.
func EnvAllowed(allow []string, key string) bool {
	for _, a := range allow {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(key, p) {
				return true
			}
		} else if a == key {
			return true
		}
	}
	return false
}

// ProtectedError is a change refused because Protect matches the name, as
// written or with its links resolved. It matches ErrProtected. Guard returns
// it as the Err of an *fs.PathError.
type ProtectedError struct {
	// Name is the name Protect matched: the name changed, or where its
	// links lead.
	Name    string
	Protect Protect
}

func (e *ProtectedError) Error() string {
	return e.Name + " is protected: changes to paths matching " + strings.Join(e.Protect, ", ") + " are refused"
}

func (e *ProtectedError) Unwrap() error { return ErrProtected }

// Guard returns fsys with every change to a name p protects refused. It is
// the one place write protection is checked: the tool set builds its view
// of the workspace on it, and every tool — write, edit, the shell's commands
// and mutations — changes files through that view. root is the workspace
// root as an absolute slash path, against which absolute link targets are
// resolved. An empty p returns fsys itself.
//
// What it guarantees:
//
//   - A change to a protected name fails with a *ProtectedError (in an
//     *fs.PathError naming the name as given) before anything is changed.
//     WriteFile, Mkdir, MkdirAll, Remove, RemoveAll, Rename (both ends) and
//     Symlink check the name as written and where it leads with its links
//     resolved (workspace.RealPath: a link into .git is refused), so a link
//     is no way around the globs.
//   - RemoveAll and Rename of a directory check every entry below it (for
//     Rename, under its new name too) and refuse the whole change when one
//     is protected: a tree that holds a protected entry is neither removed
//     nor moved, not even in part.
//   - Reads, walks and searches go straight to fsys, its fast paths
//     included. The result is a CheckFS (CheckChange is the check above,
//     without the tree), a MkdirAllFS, RemoveAllFS, LockFS, WalkFS and
//     GrepFS, and a SymlinkFS exactly when fsys is one.
//
// What it does not guarantee: the link check is a lookup made just before
// the change, not a lock; a process that swaps links in the workspace
// between the two can redirect that one change (never outside the root:
// confinement stays the adapter's). Commands a Bash runs are not bound by it.
func Guard(fsys FileSystem, root string, p Protect) FileSystem {
	if len(p) == 0 {
		return fsys
	}
	g := &guardFS{inner: fsys, root: root, protect: slices.Clone(p)}
	if sl, ok := fsys.(SymlinkFS); ok {
		g.links = sl
		return &guardLinkFS{g}
	}
	return g
}

// CheckChange asks fsys whether it would refuse a change to name by its
// rules (see CheckFS) and, if not, where name leads. A FileSystem that is no
// CheckFS refuses none, and the name leads where RealPath says (root is the
// workspace root, as for RealPath).
func CheckChange(ctx context.Context, fsys FileSystem, root, name string) (string, error) {
	if c, ok := fsys.(CheckFS); ok {
		return c.CheckChange(ctx, name)
	}
	return RealPath(ctx, fsys, root, name)
}

type guardFS struct {
	inner   FileSystem
	links   SymlinkFS // inner, when it is one
	root    string
	protect Protect

	// checked is the last name CheckChange let through and where it led,
	// for the change of that name the same call (ctx) makes next: the
	// caller resolved it just before, as a writer that locks the file does,
	// so the change need not resolve it again. Any other change forgets it.
	mu      sync.Mutex
	checked struct {
		ctx        context.Context
		name, real string
	}
}

type guardLinkFS struct{ *guardFS }

var (
	_ CheckFS     = (*guardFS)(nil)
	_ MkdirAllFS  = (*guardFS)(nil)
	_ RemoveAllFS = (*guardFS)(nil)
	_ LockFS      = (*guardFS)(nil)
	_ WalkFS      = (*guardFS)(nil)
	_ GrepFS      = (*guardFS)(nil)
	_ SwapFS      = (*guardFS)(nil)
	_ SymlinkFS   = (*guardLinkFS)(nil)
)

// check refuses a change to name when name, or where its links lead, is
// protected, and returns where it leads. A name CheckChange let through for
// this ctx just before is not resolved again (see checked).
func (g *guardFS) check(ctx context.Context, op, name string) (string, error) {
	if g.protect.Match(name) {
		return "", g.refuse(op, name, name)
	}
	g.mu.Lock()
	c := g.checked
	g.checked.ctx = nil
	g.mu.Unlock()
	real := c.real
	if c.ctx != ctx || c.name != name {
		var err error
		if real, err = RealPath(ctx, g.inner, g.root, name); err != nil {
			return "", err
		}
	}
	if real != name && g.protect.Match(real) {
		return "", g.refuse(op, name, real)
	}
	return real, nil
}

// checkOnly is check for a change whose real name is not needed.
func (g *guardFS) checkOnly(ctx context.Context, op, name string) error {
	_, err := g.check(ctx, op, name)
	return err
}

func (g *guardFS) refuse(op, name, matched string) error {
	return &fs.PathError{Op: op, Path: name, Err: &ProtectedError{Name: matched, Protect: g.protect}}
}

// checkTree checks name and, when it is a directory, every entry below it;
// with to set, each entry's name under to as well. A link below name is one
// entry, never followed.
func (g *guardFS) checkTree(ctx context.Context, op, name, to string) error {
	if err := g.checkOnly(ctx, op, name); err != nil {
		return err
	}
	if info, err := g.inner.Lstat(ctx, name); err != nil || !info.IsDir() {
		return nil // the operation itself reports what is wrong
	}
	w, err := Walk(ctx, g.inner, WalkRequest{Dir: name})
	if err != nil {
		return err
	}
	for _, e := range w.Entries {
		if g.protect.Match(e.Path) {
			return g.refuse(op, name, e.Path)
		}
		if moved := path.Join(to, strings.TrimPrefix(e.Path, name+"/")); to != "" && g.protect.Match(moved) {
			return g.refuse(op, name, moved)
		}
	}
	return nil
}

func (g *guardFS) CheckChange(ctx context.Context, name string) (string, error) {
	real, err := g.check(ctx, "change", name)
	if err != nil {
		return "", err
	}
	if c, ok := g.inner.(CheckFS); ok { // rules below this guard
		if real, err = c.CheckChange(ctx, name); err != nil {
			return "", err
		}
	}
	g.mu.Lock()
	g.checked.ctx, g.checked.name, g.checked.real = ctx, name, real
	g.mu.Unlock()
	return real, nil
}

func (g *guardFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	return g.inner.Stat(ctx, name)
}

func (g *guardFS) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	return g.inner.Lstat(ctx, name)
}

func (g *guardFS) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	return g.inner.ReadDir(ctx, name)
}

func (g *guardFS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	return g.inner.ReadFile(ctx, name, max)
}

func (g *guardFS) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if err := g.checkOnly(ctx, "write", name); err != nil {
		return err
	}
	return g.inner.WriteFile(ctx, name, data, perm)
}

// Swap checks the change as WriteFile does, and swaps through the inner
// file system's SwapFS when it has one (one call on Docker), or with
// SwapGeneric over it. It does not resolve the name first: it checks the
// name as written, and where the caller's Real condition or, without one,
// a CheckChange of this call just before says it leads — else the name
// itself, a guess that it has no links — and makes the swap write only
// there (SwapRequest.Real). When the name leads elsewhere, that swap
// writes nothing and reports where: the guard checks that and swaps again.
// So the file written is always one the guard checked, at the cost of one
// swap more for a name through a link.
func (g *guardFS) Swap(ctx context.Context, req SwapRequest) (SwapResult, error) {
	const op = "write"
	if g.protect.Match(req.Name) {
		return SwapResult{}, g.refuse(op, req.Name, req.Name)
	}
	own := req.Real == "" // the Real condition is the guard's own, not the caller's
	if own {
		req.Real = req.Name
		g.mu.Lock()
		if c := g.checked; c.ctx == ctx && c.name == req.Name {
			req.Real = c.real
		}
		g.checked.ctx = nil
		g.mu.Unlock()
	}
	for range 8 {
		if req.Real != req.Name && g.protect.Match(req.Real) {
			return SwapResult{}, g.refuse(op, req.Name, req.Real)
		}
		res, err := Swap(ctx, g.inner, req)
		if err != nil || !res.Unmet || !own || res.Real == req.Real {
			return res, err // an Unmet left is the caller's own condition's
		}
		req.Real = res.Real
	}
	return SwapResult{}, &fs.PathError{Op: op, Path: req.Name, Err: errLinkLoop}
}

func (g *guardFS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	if err := g.checkOnly(ctx, "mkdir", name); err != nil {
		return err
	}
	return g.inner.Mkdir(ctx, name, perm)
}

func (g *guardFS) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	if err := g.checkOnly(ctx, "mkdir", name); err != nil {
		return err
	}
	return MkdirAll(ctx, g.inner, name, perm)
}

func (g *guardFS) Remove(ctx context.Context, name string) error {
	if err := g.checkOnly(ctx, "remove", name); err != nil {
		return err
	}
	return g.inner.Remove(ctx, name)
}

func (g *guardFS) RemoveAll(ctx context.Context, name string) error {
	if err := g.checkTree(ctx, "removeall", name, ""); err != nil {
		return err
	}
	return RemoveAll(ctx, g.inner, name)
}

func (g *guardFS) Rename(ctx context.Context, oldname, newname string) error {
	if err := g.checkTree(ctx, "rename", oldname, newname); err != nil {
		return err
	}
	if err := g.checkOnly(ctx, "rename", newname); err != nil {
		return err
	}
	return g.inner.Rename(ctx, oldname, newname)
}

func (g *guardFS) Lock(ctx context.Context, name string) (func(), error) {
	return Lock(ctx, g.inner, name)
}

func (g *guardFS) Walk(ctx context.Context, req WalkRequest) (WalkResult, error) {
	return Walk(ctx, g.inner, req)
}

func (g *guardFS) Grep(ctx context.Context, req GrepRequest) (GrepResult, error) {
	return Grep(ctx, g.inner, req)
}

func (g *guardLinkFS) Symlink(ctx context.Context, target, name string) error {
	if err := g.checkOnly(ctx, "symlink", name); err != nil {
		return err
	}
	return g.links.Symlink(ctx, target, name)
}

func (g *guardLinkFS) Readlink(ctx context.Context, name string) (string, error) {
	return g.links.Readlink(ctx, name)
}
