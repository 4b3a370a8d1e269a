package journal

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// manEntry is one path of a manifest: what a directory listing says of it,
// and, in the baseline, its kept state.
type manEntry struct {
	typ   fs.FileMode
	mode  fs.FileMode
	size  int64
	mtime int64 // ns
	ino   uint64
	ctime int64 // ns; 0 where the adapter does not say
	state Entry // in the baseline: the kept state (hash, target)
}

func manOf(info fs.FileInfo) manEntry {
	m := manEntry{typ: info.Mode().Type(), mode: info.Mode() & modeBits, size: info.Size(), mtime: info.ModTime().UnixNano()}
	m.ino, m.ctime = sysStat(info)
	if m.typ == fs.ModeDir {
		m.size, m.mtime = 0, 0 // a directory's own state is its mode; its entries are listed apart
	}
	return m
}

// sameStat reports whether a listing shows no change since m was taken.
func (m manEntry) sameStat(o manEntry) bool {
	return m.typ == o.typ && m.mode == o.mode && m.size == o.size && m.mtime == o.mtime &&
		m.ino == o.ino && m.ctime == o.ctime
}

// racyWindow: a file changed this close to the listing that saw it may be
// changed again without its modification time moving (on a file system with
// coarse timestamps); such entries are read again rather than trusted.
const racyWindow = 2 * time.Millisecond

func (m manEntry) racy(listed time.Time) bool {
	t := listed.UnixNano()
	if m.mtime%int64(time.Second) == 0 { // whole seconds: a coarse file system
		return m.mtime >= t-int64(2*time.Second)
	}
	return m.mtime >= t-int64(racyWindow)
}

// scan lists the workspace into a manifest, one directory listing per
// directory and no per-file call: .sandboxd/ too (see Own), but for the
// journal's own store when it is in the workspace.
func (j *Journal) scan(ctx context.Context) (map[string]manEntry, error) {
	out := make(map[string]manEntry, max(len(j.base), 64))
	var walk func(dir string) error
	walk = func(dir string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		entries, err := j.fs.ReadDir(ctx, dir)
		if err != nil {
			return err
		}
		for _, d := range entries {
			p := path.Join(dir, d.Name())
			if j.inside && (p == j.dir || strings.HasPrefix(p, j.dir+"/")) {
				continue
			}
			info, err := d.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // gone since the listing
			}
			if err != nil {
				return err
			}
			m := manOf(info)
			out[p] = m
			if m.typ == fs.ModeDir {
				if err := walk(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(".")
}

// syncBaseline brings the baseline up to date with the workspace, keeping
// the bytes of every file that changed since it was taken (by bash, another
// program, a structured tool): after it, every file's state can be
// restored. The first call reads the whole tree; later ones read only what
// the listing shows changed.
func (j *Journal) syncBaseline(ctx context.Context) error {
	listed := j.now()
	cur, err := j.scan(ctx)
	if err != nil {
		return err
	}
	for p, m := range cur {
		if old, ok := j.base[p]; ok && old.sameStat(m) && !old.racy(j.baseTime) {
			m.state = old.state
		} else if m.state, err = j.state(ctx, p); err != nil {
			if !errors.Is(err, workspace.ErrNotFound) {
				return err
			}
			delete(cur, p)
			continue
		}
		cur[p] = m
	}
	j.base, j.baseTime = cur, listed
	return nil
}

// Outcome is how a workspace session ended.
type Outcome struct {
	// Committed says the session's changes were kept: the run succeeded.
	// Commit is the commit they made (nil when nothing changed).
	Committed bool    `json:"committed"`
	Commit    *Commit `json:"commit,omitempty"`
	// Restored says the run failed and the workspace was put back as it was.
	Restored bool `json:"restored,omitempty"`
	// Unrestored are paths that could not be put back exactly.
	Unrestored []string `json:"unrestored,omitempty"`
	// OutOfScope are paths the run changed outside the commit scope
	// (WithCommitScope); they were put back and are not in Commit.
	OutOfScope []string `json:"outOfScope,omitempty"`
	// InSession says the call ran inside an active provider session, whose
	// End decides.
	InSession bool `json:"inSession,omitempty"`
	// Protected are paths the run changed under .sandboxd/, which only
	// sandboxd writes (Own): put back, whatever the run's outcome.
	Protected []string `json:"protected,omitempty"`
}

// Exec runs a process that changes the workspace behind the port (through
// the Bash port, say) in a workspace session of its own. run reports
// whether it succeeded (exit code 0). Success commits the changes with
// message; any other outcome — failure, an error, a cancelled ctx —
// restores the workspace: changed files get their old bytes and modes back,
// deleted entries return, new ones are removed. Nothing is committed then.
//
// Cost per call: two listings of the tree (one ReadDir per directory),
// plus reading the files that changed. Inside an active provider session,
// run runs directly and the session's End decides.
func (j *Journal) Exec(ctx context.Context, message string, run func(ctx context.Context) (ok bool, err error)) (Outcome, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.active != nil {
		_, err := run(ctx)
		return Outcome{InSession: true}, err
	}
	if err := j.syncBaseline(ctx); err != nil {
		return Outcome{}, errors.Join(workspace.Errorf(workspace.ErrUnavailable, "journal: the workspace could not be snapshot, so the command was not run"), err)
	}
	j.watchOwn()
	ok, err := run(ctx)
	out, ferr := j.finish(context.WithoutCancel(ctx), message, ok && err == nil)
	return out, errors.Join(err, ferr)
}

// finish ends a workspace session begun with syncBaseline: it commits what
// changed since, or restores it.
func (j *Journal) finish(ctx context.Context, message string, keep bool) (Outcome, error) {
	owned := j.endOwn()
	listed := j.now()
	cur, err := j.scan(ctx)
	if err != nil {
		return Outcome{}, err
	}
	changed := map[string]bool{}
	for p, m := range cur {
		if old, ok := j.base[p]; !ok || !old.sameStat(m) || old.racy(j.baseTime) {
			changed[p] = true
		}
	}
	for p := range j.base {
		if _, ok := cur[p]; !ok {
			changed[p] = true
		}
	}
	protected, unrestored, settled, err := j.putBackDaemonDir(ctx, changed, cur, owned)
	if err != nil {
		return Outcome{Protected: protected, Unrestored: unrestored}, err
	}
	if !keep {
		want := make(map[string]Entry, len(changed))
		for p := range changed {
			want[p] = j.base[p].state // absent for a new path
		}
		more, err := j.apply(ctx, want)
		return Outcome{Restored: err == nil, Unrestored: append(unrestored, more...), Protected: protected}, err
	}
	var outside []string
	if j.committable != nil {
		var more []string
		outside, more, err = j.restoreOutside(ctx, changed, cur)
		unrestored = append(unrestored, more...)
		if err != nil {
			return Outcome{OutOfScope: outside, Unrestored: unrestored, Protected: protected}, err
		}
	}
	var changes []Change
	for p := range changed {
		m, ok := cur[p]
		if ok {
			if m.state, err = j.state(ctx, p); err != nil {
				return Outcome{}, err
			}
			cur[p] = m
		}
		changes = append(changes, Change{Path: p, Before: j.base[p].state, After: m.state})
	}
	for p, m := range cur {
		if !changed[p] && !settled[p] {
			m.state = j.base[p].state
			cur[p] = m
		}
	}
	j.base, j.baseTime = cur, listed
	c, err := j.commit(ctx, message, changes)
	return Outcome{Committed: err == nil, Commit: c, OutOfScope: outside, Unrestored: unrestored, Protected: protected}, err
}

// restoreOutside puts back the changed paths outside the commit scope and
// takes them out of changed; cur is updated to say what the workspace now
// holds there (its listing data unknown, so the next baseline reads them
// again). It returns them sorted, and those that could not be put back.
func (j *Journal) restoreOutside(ctx context.Context, changed map[string]bool, cur map[string]manEntry) ([]string, []string, error) {
	keep := map[string]bool{}
	for p := range changed {
		if j.committable(p) {
			for q := p; q != "." && !keep[q]; q = path.Dir(q) {
				keep[q] = true
			}
		}
	}
	want := map[string]Entry{}
	var outside []string
	for p := range changed {
		if keep[p] {
			continue
		}
		if m, ok := cur[p]; ok && j.base[p].state.Exists() {
			// Listed as changed, but maybe only racy: compare contents.
			st, err := j.state(ctx, p)
			if err == nil && st.same(j.base[p].state) {
				m.state = st
				cur[p] = m
				delete(changed, p)
				continue
			}
		}
		want[p] = j.base[p].state
		outside = append(outside, p)
		delete(changed, p)
	}
	if len(outside) == 0 {
		return nil, nil, nil
	}
	slices.Sort(outside)
	unrestored, err := j.apply(ctx, want)
	for p, w := range want {
		if w.Exists() {
			cur[p] = manEntry{typ: fs.ModeIrregular, state: w} // a listing never matches it
		} else {
			delete(cur, p)
		}
	}
	return outside, unrestored, err
}

// Session is an active provider session (see Begin).
type Session struct {
	j       *Journal
	message string
}

// Begin opens a provider session: a workspace session that lasts until End
// and holds every change made meanwhile — by processes or by tool calls,
// which run in it without commits of their own. Only one session is active
// at a time.
func (j *Journal) Begin(ctx context.Context, message string) (*Session, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.active != nil {
		return nil, workspace.Errorf(workspace.ErrForbidden, "a provider session is already active")
	}
	if err := j.syncBaseline(ctx); err != nil {
		return nil, err
	}
	j.watchOwn()
	j.active = &Session{j: j, message: message}
	return j.active, nil
}

// Active reports whether a provider session is active.
func (j *Journal) Active() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.active != nil
}

// End ends the session: with commit, everything it changed becomes one
// commit (its message given to Begin), which is the session's result;
// without, the workspace is restored to where Begin found it.
func (s *Session) End(ctx context.Context, commit bool) (Outcome, error) {
	j := s.j
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.active != s {
		return Outcome{}, workspace.Errorf(workspace.ErrInvalidArgument, "the provider session has ended")
	}
	j.active = nil
	return j.finish(context.WithoutCancel(ctx), s.message, commit)
}
