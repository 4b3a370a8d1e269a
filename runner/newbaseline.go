package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/delivery"
)

// A client may replace a session's baseline — the tree Diff compares with,
// at first the session's first tree — with the workspace as it is now
// (Session.Rebaseline): a session that starts empty and gets its project
// by an upload then diffs against the upload, not against nothing.
//
// The new tree is read while no call that may change the workspace runs:
// Rebaseline waits for those in flight to end, and those that come
// meanwhile wait for it (changeGate), as each of the journal's mutations
// waits for the one before. Calls that only read go on. What it does not
// wait for is what runs outside a call: a background command started
// earlier (bash with background) may change files while the tree is read,
// and the read may see such a change in part.
//
// Where the session keeps its first tree in its state directory, the new
// one replaces it there whole or not at all: its contents are added to the
// kept store (content-addressed, so the old tree's stay readable), then its
// tree.json replaces the old one's by a rename, which is the moment the
// new baseline is taken; the old contents the new tree does not name are
// removed after. A daemon that dies before the rename resumes the session
// with the old baseline, after it with the new one, never with a mix.

// opBaseline is the op of a call that takes a new baseline (Do's op):
// Rebaseline keeps the calls that change the workspace out itself, so its
// call does not wait for them as theirs do.
const opBaseline = "baseline"

// BaselineRequest says how Rebaseline takes a session's new baseline.
type BaselineRequest struct {
	// Change, when set, runs first, with no other call that may change the
	// workspace running from its start to the end of the read (an upload,
	// say: the baseline is then exactly the tree just after it). Its error
	// ends Rebaseline with the baseline as it was; what Change wrote stays.
	Change func(ctx context.Context) error
	// MaxFileBytes leaves files over it out of the tree (named in Skipped;
	// a Diff with the same limit names them too); 0 is
	// delivery.MaxFileBytes.
	MaxFileBytes int64
	// Hold, when set, is the memory budget the read draws on: each file
	// while it is read.
	Hold delivery.Hold
}

// BaselineInfo describes a baseline Rebaseline took.
type BaselineInfo struct {
	// Files is how many files and links the tree holds.
	Files int `json:"files"`
	// Skipped names the paths left out, with why (over MaxFileBytes).
	Skipped map[string]string `json:"skipped,omitempty"`
	// Taken is when the read ended.
	Taken time.Time `json:"taken"`
}

// Rebaseline makes the workspace as it is now the session's baseline:
// Diff without Since compares with it from then on, and a daemon that
// resumes the session (Docker, with a state directory) keeps it. Call it
// within Do, with op "baseline". It first waits for the session's first
// tree, and for the calls in flight that may change the workspace; calls
// that may change it and come meanwhile wait until it returns (see
// changeGate). A Rebaseline that fails (ctx ended, a read error) leaves
// the baseline as it was.
//
// The journal is not touched: journal_revert still undoes a commit made
// before the new baseline, and Diff then shows what it put back as a
// change since the baseline; Diff with Since is as before.
func (s *Session) Rebaseline(ctx context.Context, req BaselineRequest) (BaselineInfo, error) {
	ctx, release, err := s.changes.hold(ctx)
	if err != nil {
		return BaselineInfo{}, err
	}
	defer release()
	old := s.currentBase()
	if err := old.wait(ctx); err != nil {
		return BaselineInfo{}, err
	}
	if req.Change != nil {
		if err := req.Change(ctx); err != nil {
			return BaselineInfo{}, err
		}
	}
	// The copy of a snapshot's pack into the state directory (keepPack)
	// is done with before the new tree takes its place there.
	old.keeping.Wait()
	dir := s.baselineDir()
	var st *delivery.Store
	if dir != "" {
		st, err = delivery.OpenStore(filepath.Join(dir, objectsDir))
	} else {
		st, err = delivery.NewStore()
	}
	if err != nil {
		return BaselineInfo{}, fmt.Errorf("runner: the new baseline has no store: %w", err)
	}
	opts := []delivery.SnapshotOption{delivery.WithMaxFileBytes(cmp.Or(req.MaxFileBytes, delivery.MaxFileBytes))}
	if req.Hold != nil {
		opts = append(opts, delivery.WithHold(req.Hold))
	}
	t, err := delivery.Snapshot(ctx, s.inst.FS, st, opts...)
	if err != nil {
		// A kept store keeps what the read added: the old tree does not
		// name it, and the next new baseline's sweep removes it.
		st.Close()
		return BaselineInfo{}, err
	}
	nb := &baseline{tree: t, store: st}
	s.baseMu.Lock()
	if err := context.Cause(s.ctx); err != nil {
		// The session is ending: its close lets go of the baseline it
		// finds, which is the old one.
		s.baseMu.Unlock()
		st.Close()
		return BaselineInfo{}, err
	}
	if dir != "" {
		if err = delivery.KeepTree(dir, t); err != nil {
			s.baseMu.Unlock()
			return BaselineInfo{}, fmt.Errorf("runner: the new baseline was not kept (the old one stays): %w", err)
		}
	}
	s.base = nb
	// No Diff holds the old baseline now (they hold baseMu while they
	// read it): its temporary store, or its pack, goes, and so do the
	// kept contents the new tree does not name.
	cerr := old.close()
	if dir != "" {
		cerr = errors.Join(cerr, sweepKept(filepath.Join(dir, objectsDir), t))
	}
	s.baseMu.Unlock()
	if cerr != nil {
		s.m.o.logger.Warn("the session's old baseline was not wholly removed", "session", s.id, "err", cerr)
	}
	return BaselineInfo{Files: len(t.Files), Skipped: t.Skipped, Taken: time.Now()}, nil
}

// sweepKept removes from the kept store in dir the contents t does not
// name (an old baseline's, a failed read's).
func sweepKept(dir string, t *delivery.Tree) error {
	keep := make(map[string]bool, len(t.Files))
	for _, e := range t.Files {
		keep[e.OID] = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !keep[e.Name()] {
			errs = append(errs, os.Remove(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// currentBase is the session's baseline now (Rebaseline replaces it).
func (s *Session) currentBase() *baseline {
	s.baseMu.RLock()
	defer s.baseMu.RUnlock()
	return s.base
}

// changeGate keeps a new baseline's read (Rebaseline) apart from the calls
// that may change the workspace: each such call holds a place (enter)
// while it runs; a new baseline waits until none does, and holds the gate
// alone (hold) until its read is done, new calls waiting meanwhile.
type changeGate struct {
	mu sync.Mutex
	// changing counts the calls holding a place; idle, while a new
	// baseline waits for them, is closed when the last one leaves.
	changing int
	idle     chan struct{}
	// taking is set while a new baseline holds the gate (or waits to),
	// closed when it lets go.
	taking chan struct{}
}

// inGate is the context key whose value is the changeGate the context's
// call holds a place in (or holds alone): calls made within it do not
// take another.
type inGate struct{}

// held reports whether ctx's call already holds a place in g.
func (g *changeGate) held(ctx context.Context) bool {
	v, _ := ctx.Value(inGate{}).(*changeGate)
	return v == g
}

// enter takes a place for a call that may change the workspace, waiting
// while a new baseline holds the gate, or until ctx ends. The context it
// returns marks the place, so that a call made within it takes none.
func (g *changeGate) enter(ctx context.Context) (context.Context, func(), error) {
	if g.held(ctx) {
		return ctx, func() {}, nil
	}
	if err := g.await(ctx, func() { g.changing++ }); err != nil {
		return ctx, nil, err
	}
	var once sync.Once
	return context.WithValue(ctx, inGate{}, g), func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.changing--
			if g.changing == 0 && g.idle != nil {
				close(g.idle)
				g.idle = nil
			}
		})
	}, nil
}

// await waits until no new baseline holds g (or ctx ends), then runs then
// under g's lock.
func (g *changeGate) await(ctx context.Context, then func()) error {
	g.mu.Lock()
	for g.taking != nil {
		t := g.taking
		g.mu.Unlock()
		if changeWaitHook != nil {
			changeWaitHook()
		}
		select {
		case <-t:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the session's new baseline: %w", context.Cause(ctx))
		}
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	if then != nil {
		then()
	}
	return nil
}

// hold takes g alone, for a new baseline: it waits for the calls holding
// a place to leave (or ctx to end), new ones waiting from then on, until
// release. A call that holds a place itself (ctx marked) could never see
// the others leave while it waits: it is refused.
func (g *changeGate) hold(ctx context.Context) (context.Context, func(), error) {
	if g.held(ctx) {
		return ctx, nil, errors.New("runner: a new baseline cannot be taken from within a call that may change the workspace (take it with its own call, op \"baseline\")")
	}
	var mine, idle chan struct{}
	err := g.await(ctx, func() {
		mine = make(chan struct{})
		g.taking = mine
		if g.changing > 0 {
			idle = make(chan struct{})
			g.idle = idle
		}
	})
	if err != nil {
		return ctx, nil, err
	}
	release := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.taking, g.idle = nil, nil
		close(mine)
	}
	if idle != nil {
		if baselineHoldHook != nil {
			baselineHoldHook()
		}
		select {
		case <-idle:
		case <-ctx.Done():
			release()
			return ctx, nil, fmt.Errorf("waiting for the calls in flight that may change the workspace: %w", context.Cause(ctx))
		}
	}
	return context.WithValue(ctx, inGate{}, g), release, nil
}

// baselineHoldHook, when set (by tests), is called by a new baseline that
// finds calls that may change the workspace in flight, before it waits for
// them; changeWaitHook by a call (or BeforeChange) that finds a new
// baseline holding the gate, before it waits.
var baselineHoldHook, changeWaitHook func()
