package journal

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"maps"
	"path"
	"slices"

	"github.com/sandboxd/sandboxd/workspace"
)

// Record runs one in-process mutation under the journal: fn changes the
// workspace through the FileSystem it is given, which keeps the
// before-image of each path just before its first change (for a removal or
// a rename, of the whole tree that goes). When fn returns nil, the changes
// become one commit with message (nil when nothing changed). When fn fails,
// what it changed is put back and nothing is committed; fn's error is
// returned.
//
// The cost is that of the paths fn touches, whatever the workspace's size:
// each is read once before and once after. A file fn writes costs no more
// than the write: the write itself reports what it replaced
// (workspace.Swap, one round trip on an adapter that is a SwapFS) and what
// it wrote is its after-image, unless fn changes something else after it. Inside an active provider
// session, fn runs on the workspace directly and the session's End commits.
func (j *Journal) Record(ctx context.Context, message string, fn func(fsys workspace.FileSystem) error) (*Commit, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.active != nil {
		return nil, fn(j.fs)
	}
	r := j.newRecorder()
	defer clear(j.pending) // kept in the commit's record, or needed no more
	err := fn(r.fs())
	ctx = context.WithoutCancel(ctx) // what was changed is recorded or put back, whatever happens to the caller
	after := map[string]Entry{}
	for _, p := range r.tops() {
		if err := r.afterState(ctx, p, after); err != nil {
			return nil, errors.Join(err, workspace.Errorf(workspace.ErrUnavailable, "journal: the change could not be recorded"))
		}
	}
	// rollback puts back what fn changed.
	rollback := func(err error) (*Commit, error) {
		want := maps.Clone(r.before)
		for p := range after {
			if _, ok := want[p]; !ok {
				want[p] = Entry{}
			}
		}
		if _, rerr := j.apply(ctx, want); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, err
	}
	if err != nil {
		return rollback(err)
	}
	var changes []Change
	for p, a := range after {
		changes = append(changes, Change{Path: p, Before: r.before[p], After: a})
	}
	for p, b := range r.before {
		if _, ok := after[p]; !ok {
			changes = append(changes, Change{Path: p, Before: b})
		}
	}
	c, err := j.commit(ctx, message, changes)
	if err != nil { // not kept, nor are the before-images it holds: put back
		return rollback(err)
	}
	return c, nil
}

// recorder is the FileSystem Record gives fn: reads go straight through;
// each change first captures what it is about to change. It is a
// MkdirAllFS, RemoveAllFS, LockFS, WalkFS, GrepFS and SwapFS (each falls
// back to the workspace helper over the inner FileSystem), and a SymlinkFS
// exactly when the inner FileSystem is one (recorderLinks; see fs).
type recorder struct {
	workspace.FileSystem
	j      *Journal
	before map[string]Entry
	deep   map[string]bool // captured with the whole tree below
	// written are the files as fn's last writes left them, by real name:
	// their after-images, until any other change through the recorder
	// (which could move or remove them) forgets them all.
	written map[string]written
}

// written is a file as a write left it.
type written struct {
	mode fs.FileMode
	data []byte
}

func (j *Journal) newRecorder() *recorder {
	return &recorder{FileSystem: j.fs, j: j, before: map[string]Entry{}, deep: map[string]bool{}, written: map[string]written{}}
}

// recorderLinks is a recorder over a SymlinkFS: links are made, and read,
// through it.
type recorderLinks struct {
	*recorder
	links workspace.SymlinkFS
}

// fs is r as the FileSystem fn is given: a SymlinkFS exactly when the
// workspace is one, so that a caller never finds links claimed and then
// refused.
func (r *recorder) fs() workspace.FileSystem {
	if sl, ok := r.FileSystem.(workspace.SymlinkFS); ok {
		return &recorderLinks{r, sl}
	}
	return r
}

var (
	_ workspace.SymlinkFS   = (*recorderLinks)(nil)
	_ workspace.MkdirAllFS  = (*recorder)(nil)
	_ workspace.RemoveAllFS = (*recorder)(nil)
	_ workspace.LockFS      = (*recorder)(nil)
	_ workspace.WalkFS      = (*recorder)(nil)
	_ workspace.GrepFS      = (*recorder)(nil)
	_ workspace.SwapFS      = (*recorder)(nil)
)

// covered reports whether a change to name is already accounted for: name
// was captured, or an ancestor was captured absent or with its tree (what is
// below it is then read in full afterwards).
func (r *recorder) covered(name string) bool {
	if _, ok := r.before[name]; ok {
		return true
	}
	for p := path.Dir(name); p != "." && p != "/"; p = path.Dir(p) {
		if b, ok := r.before[p]; ok && (r.deep[p] || !b.Exists()) {
			return true
		}
	}
	return false
}

// capture keeps the before-image of name (and of its tree with deep).
func (r *recorder) capture(ctx context.Context, name string, deep bool) error {
	if ignored(name) || name == "." || r.covered(name) {
		return nil
	}
	e, err := r.j.state(ctx, name)
	if err != nil {
		return err
	}
	r.before[name], r.deep[name] = e, deep
	if deep && e.Type == "dir" {
		return r.j.tree(ctx, name, r.before)
	}
	return nil
}

// tree reads the state of everything below dir into into, from one
// workspace.Walk; a directory below that cannot be read fails it.
func (j *Journal) tree(ctx context.Context, dir string, into map[string]Entry) error {
	w, err := workspace.Walk(ctx, j.fs, workspace.WalkRequest{Dir: dir, Info: true, Errors: true})
	if err != nil {
		return err
	}
	for _, d := range w.Entries {
		if d.Err != nil {
			return d.Err
		}
		if ignored(d.Path) {
			continue
		}
		var e Entry
		if _, ok := d.FileInfo(); !ok { // not described: changed since it was listed
			e, err = j.state(ctx, d.Path)
		} else {
			e, err = j.stateOf(ctx, d.Path, d.Mode, d.Size, func() (string, error) { return d.Link, nil })
		}
		if err != nil {
			return err
		}
		into[d.Path] = e
	}
	return nil
}

// tops are the captured paths no captured ancestor covers.
func (r *recorder) tops() []string {
	var out []string
	for p := range r.before {
		top := true
		for q := path.Dir(p); q != "."; q = path.Dir(q) {
			if b, ok := r.before[q]; ok && (r.deep[q] || !b.Exists()) {
				top = false
				break
			}
		}
		if top {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// afterState reads p's state now, with the tree below it when p was
// captured absent or with its tree.
func (r *recorder) afterState(ctx context.Context, p string, into map[string]Entry) error {
	if w, ok := r.written[p]; ok {
		e, err := r.j.heldState(ctx, w.mode, w.data)
		into[p] = e
		return err
	}
	e, err := r.j.state(ctx, p)
	if err != nil {
		return err
	}
	into[p] = e
	if b := r.before[p]; e.Type == "dir" && (r.deep[p] || !b.Exists()) {
		return r.j.tree(ctx, p, into)
	}
	return nil
}

// WriteFile writes through Swap.
func (r *recorder) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	_, err := r.Swap(ctx, workspace.SwapRequest{Name: name, Data: data, Perm: perm})
	return err
}

// Swap writes through workspace.Swap, which reports what the write replaced
// — the before-image — and what it left, with the caller's conditions and
// lock. Once begun, the swap runs to its end whatever becomes of ctx, so
// that no file is changed without its before-image coming back. A swap
// whose conditions do not hold changed nothing and records nothing.
//
// The swap resolves names against the journal's root and returns old
// contents up to the journal's bound, or req.Max when larger (conditions on
// the old contents are checked against those); the caller is given them
// within req.Max, as Swap promises. A swap with an Edit keeps req.Max, the
// edit's bound: its old contents are all there when it writes, and what it
// wrote is its result's Data.
func (r *recorder) Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error) {
	if err := ctx.Err(); err != nil {
		return workspace.SwapResult{}, err
	}
	ctx = context.WithoutCancel(ctx)
	limit := req.Max
	req.Root = r.j.root
	if req.Edit == nil { // an edit's old contents are within Max, or it fails
		req.Max = max(req.Max, r.j.maxBlob)
	}
	res, err := workspace.Swap(ctx, r.FileSystem, req)
	if err != nil {
		return workspace.SwapResult{}, err
	}
	if res.Unmet || ignored(res.Real) {
		return within(res, limit), nil
	}
	if !r.covered(res.Real) {
		e, err := r.j.swappedState(ctx, res)
		if err != nil { // not kept: put the file back as a rollback would
			return workspace.SwapResult{}, errors.Join(err, r.unswap(ctx, res))
		}
		r.before[res.Real], r.deep[res.Real] = e, false
	}
	data := req.Data
	if req.Edit != nil {
		data = res.Data
	}
	if res.New != nil && res.New.Mode().IsRegular() && res.New.Size() == int64(len(data)) {
		r.written[res.Real] = written{mode: res.New.Mode() & modeBits, data: bytes.Clone(data)}
	} else {
		delete(r.written, res.Real)
	}
	return within(res, limit), nil
}

// within is res with old contents over max left out.
func within(res workspace.SwapResult, max int64) workspace.SwapResult {
	if int64(len(res.OldData)) > max {
		res.OldData = nil
	}
	return res
}

// swappedState is the before-image a swap reports.
func (j *Journal) swappedState(ctx context.Context, res workspace.SwapResult) (Entry, error) {
	switch {
	case res.Old == nil:
		return Entry{}, nil
	case res.OldData != nil:
		return j.heldState(ctx, res.Old.Mode()&modeBits, res.OldData)
	case res.Old.Mode().IsRegular(): // over MaxBlobBytes: described, not kept
		return Entry{Type: "file", Mode: res.Old.Mode() & modeBits, Size: res.Old.Size()}, nil
	}
	// Not a file, so the write did not change it.
	return j.stateOf(ctx, res.Real, res.Old.Mode(), res.Old.Size(), j.target(ctx, res.Real))
}

// unswap puts back what a swap replaced, when that is known.
func (r *recorder) unswap(ctx context.Context, res workspace.SwapResult) error {
	switch {
	case res.Old == nil:
		return r.FileSystem.Remove(ctx, res.Real)
	case res.OldData != nil:
		return r.FileSystem.WriteFile(ctx, res.Real, res.OldData, res.Old.Mode().Perm())
	}
	return nil
}

func (r *recorder) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	clear(r.written)
	if err := r.capture(ctx, name, false); err != nil {
		return err
	}
	return r.FileSystem.Mkdir(ctx, name, perm)
}

func (r *recorder) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	clear(r.written)
	// The topmost missing directory stands for all that will be created.
	top := ""
	for p := name; p != "." && p != "/"; p = path.Dir(p) {
		if _, err := r.FileSystem.Lstat(ctx, p); !errors.Is(err, workspace.ErrNotFound) {
			break
		}
		top = p
	}
	if top != "" {
		if err := r.capture(ctx, top, false); err != nil {
			return err
		}
	}
	return workspace.MkdirAll(ctx, r.FileSystem, name, perm)
}

func (r *recorder) Remove(ctx context.Context, name string) error {
	clear(r.written)
	if err := r.capture(ctx, name, false); err != nil {
		return err
	}
	return r.FileSystem.Remove(ctx, name)
}

func (r *recorder) RemoveAll(ctx context.Context, name string) error {
	clear(r.written)
	if err := r.capture(ctx, name, true); err != nil {
		return err
	}
	return workspace.RemoveAll(ctx, r.FileSystem, name)
}

func (r *recorder) Rename(ctx context.Context, oldname, newname string) error {
	clear(r.written)
	if err := r.capture(ctx, oldname, true); err != nil {
		return err
	}
	if err := r.capture(ctx, newname, true); err != nil {
		return err
	}
	return r.FileSystem.Rename(ctx, oldname, newname)
}

func (r *recorderLinks) Symlink(ctx context.Context, target, name string) error {
	clear(r.written)
	if err := r.capture(ctx, name, false); err != nil {
		return err
	}
	return r.links.Symlink(ctx, target, name)
}

func (r *recorderLinks) Readlink(ctx context.Context, name string) (string, error) {
	return r.links.Readlink(ctx, name)
}

// Lock takes the underlying workspace's lock, so writers through the
// recorder and around it exclude each other.
func (r *recorder) Lock(ctx context.Context, name string) (func(), error) {
	return workspace.Lock(ctx, r.FileSystem, name)
}

func (r *recorder) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	return workspace.Walk(ctx, r.FileSystem, req)
}

func (r *recorder) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	return workspace.Grep(ctx, r.FileSystem, req)
}
