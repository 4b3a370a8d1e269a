package journal

import (
	"context"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// sandboxd's own directory, .sandboxd/ (spilled output, sources'
// snapshots), is written by sandboxd alone: a workspace session (Exec, a
// provider session) lists it with the rest of the workspace, and at its end
// puts back whatever changed there, whether the run succeeded or not,
// unless sandboxd itself made the change and said so with Own. It is never
// committed.

// Own tells the journal that sandboxd itself just wrote names (paths under
// .sandboxd/: files written, directories made, entries removed): a
// workspace session open now keeps them as they are at this call, where it
// would put back a process's change. A directory is taken with everything
// below it, and each name with its parents. Outside a workspace session it
// does nothing. It never waits for the journal's lock, so it may be called
// from within Exec's run.
func (j *Journal) Own(ctx context.Context, names ...string) {
	j.ownMu.Lock()
	defer j.ownMu.Unlock()
	if j.owned == nil {
		return // no session is open
	}
	var take func(p string)
	take = func(p string) {
		info, err := j.fs.Lstat(ctx, p)
		if err != nil {
			j.owned[p] = nil // gone (or unreadable): sandboxd left it absent
			return
		}
		m := manOf(info)
		j.owned[p] = &m
		if m.typ != fs.ModeDir {
			return
		}
		entries, err := j.fs.ReadDir(ctx, p)
		if err != nil {
			return
		}
		for _, d := range entries {
			take(path.Join(p, d.Name()))
		}
	}
	for _, name := range names {
		name = path.Clean(name)
		if !ignored(name) {
			continue
		}
		for q := path.Dir(name); ignored(q); q = path.Dir(q) {
			if _, ok := j.owned[q]; !ok {
				j.owned[q] = &parentDir
			}
		}
		take(name)
	}
}

// parentDir marks, in owned, a directory sandboxd wrote in and said
// nothing more of: it is kept as a directory where the session began
// without one, and judged as any other path where it had one (its mode
// was not sandboxd's to change).
var parentDir = manEntry{typ: fs.ModeDir | fs.ModeIrregular}

// watchOwn begins a workspace session's record of what sandboxd writes in
// its own directory; endOwn ends it and returns it.
func (j *Journal) watchOwn() {
	j.ownMu.Lock()
	j.owned = map[string]*manEntry{}
	j.ownMu.Unlock()
}

func (j *Journal) endOwn() map[string]*manEntry {
	j.ownMu.Lock()
	defer j.ownMu.Unlock()
	owned := j.owned
	j.owned = nil
	return owned
}

// putBackDaemonDir settles the changed paths under .sandboxd/: each is kept
// as it is when sandboxd left it so (owned, nil for absent), and put back
// otherwise — to its state at the session's start, or, where sandboxd
// wrote it during the session, to what sandboxd left (a directory's mode;
// a file of sandboxd's that a process changed after is removed, its
// contents not kept). They are taken out of changed and cur is updated to
// what the workspace holds there. It returns the paths put back, sorted
// (those below another put back absent left out), those not put back
// exactly, and the paths it settled.
func (j *Journal) putBackDaemonDir(ctx context.Context, changed map[string]bool, cur map[string]manEntry, owned map[string]*manEntry) (put, unrestored []string, settled map[string]bool, err error) {
	want := map[string]Entry{}
	settled = map[string]bool{}
	keep := func(p string, m manEntry) error {
		st, err := j.state(ctx, p)
		if err != nil {
			return err
		}
		m.state = st
		cur[p] = m
		return nil
	}
	for p := range changed {
		if !ignored(p) {
			continue
		}
		delete(changed, p)
		settled[p] = true
		m, exists := cur[p]
		o, mine := owned[p]
		if o == &parentDir {
			if exists && m.typ == fs.ModeDir && !j.base[p].state.Exists() {
				if err := keep(p, m); err != nil {
					return nil, nil, nil, err
				}
				continue
			}
			mine = false
		}
		switch {
		case exists && j.inside && strings.HasPrefix(j.dir+"/", p+"/"):
			// A directory of the journal's own store, in the workspace.
			if err := keep(p, m); err != nil {
				return nil, nil, nil, err
			}
			continue
		case mine && o == nil && !exists:
			continue
		case mine && o != nil && exists && sameAs(*o, m):
			if err := keep(p, m); err != nil {
				return nil, nil, nil, err
			}
			continue
		case mine && o != nil && o.typ == fs.ModeDir:
			want[p] = Entry{Type: "dir", Mode: o.mode}
		case mine && o != nil:
			want[p] = Entry{}
			unrestored = append(unrestored, p+" (written by sandboxd, then changed by a process: removed)")
		case mine:
			want[p] = Entry{}
		default:
			base := j.base[p].state
			if exists && base.Exists() {
				// Listed as changed, but maybe only its ctime moved (an entry
				// of sandboxd's added to a directory): compare states.
				if st, err := j.state(ctx, p); err == nil && st.same(base) {
					m.state = st
					cur[p] = m
					continue
				}
			}
			want[p] = base
		}
		put = append(put, p)
	}
	if len(put) == 0 {
		return nil, unrestored, settled, nil
	}
	slices.SortFunc(put, byDepth)
	more, err := j.apply(ctx, want)
	unrestored = append(unrestored, more...)
	for p, w := range want {
		if w.Exists() {
			cur[p] = manEntry{typ: fs.ModeIrregular, state: w} // a listing never matches it: read again next time
		} else {
			delete(cur, p)
		}
	}
	var shown []string
	for _, p := range put {
		if !slices.ContainsFunc(shown, func(q string) bool { return strings.HasPrefix(p, q+"/") && !want[q].Exists() }) {
			shown = append(shown, p)
		}
	}
	slices.Sort(shown)
	return shown, unrestored, settled, err
}

// sameAs reports whether a listing shows what sandboxd left: the same
// listing data, or, for a directory, whose listing moves with its entries,
// a directory of the same mode.
func sameAs(left, now manEntry) bool {
	if left.typ == fs.ModeDir {
		return now.typ == fs.ModeDir && now.mode == left.mode
	}
	return left.sameStat(now)
}
