package runner

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/workspace"
)

// A session's first tree (its baseline, for Diff) is read in the
// background, off the path of Create and of the session's first answer:
// the read starts once the first call that only reads has been answered,
// or at once when a call that may change the workspace (or Diff) comes
// first. The session is handed out, and calls that only read are
// answered, while it is read. Every call that may change the workspace
// waits until it is read (Session.BeforeChange), so the baseline is the
// tree as it was before any change, as when it was read before the
// session was handed out. While no call waits for it, the read gives way
// to the calls that only read: it reads one file at a time, and none while
// such a call is answered.

// backgroundRead is the state of a baseline's read in the background.
type backgroundRead struct {
	// ready is closed once the baseline's tree, store and err are set.
	ready chan struct{}
	// start is closed (once, by kick) when the read may begin.
	start     chan struct{}
	startOnce sync.Once

	mu sync.Mutex
	// answering counts the calls that only read being answered, waiting
	// the calls waiting for the read; changed is closed (and replaced)
	// when either changes.
	answering, waiting int
	changed            chan struct{}
}

// baselineHook, when set (by tests), is called by the background read of
// a baseline once its store is made, before it reads the workspace.
var baselineHook func(ctx context.Context)

// baselineWaitHook, when set (by tests), is called by a wait that finds
// the baseline not yet complete, before it waits.
var baselineWaitHook func()

// baselineReaders is how many files a baseline reads at a time: one, so
// that the calls the session answers meanwhile keep the other CPUs.
const baselineReaders = 1

// takeBaseline starts reading the tree of a new session's workspace (its
// files' contents into a private store) in the background, once kicked
// (see kick): in the session's state directory when it has one
// (keptBaseline reads it back there), else in the host's temporary
// directory. The read ends with the session (s.ctx): close waits for it
// and removes a temporary store.
func (m *Manager) takeBaseline(s *Session) *baseline {
	bg := &backgroundRead{ready: make(chan struct{}), start: make(chan struct{}), changed: make(chan struct{})}
	b := &baseline{bg: bg}
	if dir := s.baselineDir(); dir != "" {
		// There from the start: a run that resumes the session before
		// the read has kept a tree reads it again (keptBaseline), which
		// is exact, as nothing changes the workspace before the read.
		if err := os.MkdirAll(dir, 0o700); err != nil {
			m.o.logger.Warn("the session's first tree has no place in its state directory", "session", s.id, "err", err)
		}
	}
	go func() {
		defer close(bg.ready)
		select {
		case <-bg.start:
		case <-s.ctx.Done():
			b.err = context.Cause(s.ctx)
			return
		}
		r := readBaseline(s.ctx, s.inst.FS, s.baselineDir(), bg.pace)
		b.tree, b.store, b.err = r.tree, r.store, r.err
		if b.err != nil && s.ctx.Err() == nil {
			m.o.logger.Warn("the session's first tree was not read: it has no diff since its start", "session", s.id, "err", b.err)
		}
	}()
	return b
}

// readBaseline reads the tree of fsys into a store: one kept in dir, with
// the tree once read (delivery.KeepTree), or, with dir "", a temporary
// one. A kept baseline whose read fails is removed: the run that resumes
// the session finds none, and says so.
func readBaseline(ctx context.Context, fsys workspace.FileSystem, dir string, pace func(context.Context) error) *baseline {
	var st *delivery.Store
	var err error
	if dir != "" {
		st, err = delivery.OpenStore(filepath.Join(dir, objectsDir))
	} else {
		st, err = delivery.NewStore()
	}
	if err != nil {
		return &baseline{err: err}
	}
	if baselineHook != nil {
		baselineHook(ctx)
	}
	t, err := delivery.Snapshot(ctx, fsys, st, delivery.WithReaders(baselineReaders), delivery.WithPace(pace))
	if err == nil && dir != "" {
		err = delivery.KeepTree(dir, t)
	}
	if err != nil {
		st.Close()
		if dir != "" && ctx.Err() == nil {
			// Cut short as the session ended (or left), the read is left
			// for the run that resumes it to do again: nothing changed
			// the workspace meanwhile.
			os.RemoveAll(dir)
		}
		return &baseline{err: err}
	}
	return &baseline{tree: t, store: st}
}

// complete reports whether the baseline is complete (wait would not wait).
func (b *baseline) complete() bool {
	if b == nil || b.bg == nil {
		return true
	}
	select {
	case <-b.bg.ready:
		return true
	default:
		return false
	}
}

// wait returns once the baseline is complete (read, or failed: err says
// why), or with ctx's cause when ctx ends first. While it waits, the read
// gives way to nothing.
func (b *baseline) wait(ctx context.Context) error {
	if b.complete() {
		return nil
	}
	if baselineWaitHook != nil {
		baselineWaitHook()
	}
	bg := b.bg
	bg.kick()
	bg.count(&bg.waiting, 1)
	defer bg.count(&bg.waiting, -1)
	select {
	case <-bg.ready:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// answer marks a call that only reads as answered until done is called:
// the read gives way to it meanwhile, and starts, if it has not yet, once
// it is done.
func (b *baseline) answer() (done func()) {
	if b.complete() {
		return func() {}
	}
	bg := b.bg
	bg.count(&bg.answering, 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			bg.count(&bg.answering, -1)
			bg.kick()
		})
	}
}

// kick lets the read begin; it may be called any number of times.
func (bg *backgroundRead) kick() { bg.startOnce.Do(func() { close(bg.start) }) }

// count adds d to *n and wakes the read.
func (bg *backgroundRead) count(n *int, d int) {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	*n += d
	close(bg.changed)
	bg.changed = make(chan struct{})
}

// pace returns when the read may read its next file: when no call that
// only reads is being answered, or some call waits for the read.
func (bg *backgroundRead) pace(ctx context.Context) error {
	for {
		bg.mu.Lock()
		free, changed := bg.answering == 0 || bg.waiting > 0, bg.changed
		bg.mu.Unlock()
		if free {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// gate is tools.Env.Gate: a call that may change the workspace waits for
// the baseline, one that only reads is answered at once, the read giving
// way to it.
func (b *baseline) gate(ctx context.Context, readOnly bool) (func(), error) {
	if readOnly {
		return b.answer(), nil
	}
	return func() {}, b.wait(ctx)
}

// BeforeChange waits until the session's first tree is read (the baseline
// Diff compares with, read in the background from the session's start),
// and while a new baseline is taken (Rebaseline), or until ctx ends. Every
// way into the session that may change its workspace waits for it: Call,
// Detach and Do of a tool that is not read-only (and Do of any other op
// but a download's or a snapshot's), Exec, the tools' own calls
// (tools.Env.Gate); those also hold a new baseline back while they run. A
// change made through FS outside those must call it first, or Diff could
// count the change as the baseline's; such a change is not waited for by
// a new baseline.
func (s *Session) BeforeChange(ctx context.Context) error {
	if err := s.currentBase().wait(ctx); err != nil {
		return err
	}
	if s.changes.held(ctx) {
		return nil
	}
	return s.changes.await(ctx, nil)
}

// readOnlyOps are the ops of Do, besides read-only tools, that change
// nothing in the workspace: they need not wait for the baseline.
var readOnlyOps = map[string]bool{"download": true, "snapshot": true}

// settle is the gate of a call named op: one that only reads (a read-only
// tool, a readOnlyOps op) does not wait, and has the first tree's read
// give way to it until done; any other waits for the first tree and holds
// a place in the session's changeGate until done, which ctx, the call's
// context from then on, marks. A new baseline's call (opBaseline) waits
// for the first tree only: Rebaseline holds the gate itself.
func (s *Session) settle(ctx context.Context, op string) (context.Context, func(), error) {
	readOnly := readOnlyOps[op] || s.readOnlyTool(op)
	if readOnly || op == opBaseline {
		done, err := s.currentBase().gate(ctx, readOnly)
		return ctx, done, err
	}
	return s.change(ctx)
}

// change is the gate of a call that may change the workspace: it waits
// for the first tree, then takes a place in the session's changeGate.
func (s *Session) change(ctx context.Context) (context.Context, func(), error) {
	if err := s.currentBase().wait(ctx); err != nil {
		return ctx, nil, err
	}
	return s.changes.enter(ctx)
}

// gate is tools.Env.Gate: settle's, for a tool's call made on the
// session's tool set (directly, as /mcp does, or within a call that
// already holds its place).
func (s *Session) gate(ctx context.Context, readOnly bool) (func(), error) {
	if readOnly {
		return s.currentBase().answer(), nil
	}
	_, done, err := s.change(ctx)
	return done, err
}

// readOnlyTool reports whether name is a tool of the session's set that
// changes nothing in the workspace.
func (s *Session) readOnlyTool(name string) bool {
	for _, t := range s.set.List() {
		if t.Name == name {
			return t.ReadOnly
		}
	}
	return false
}
