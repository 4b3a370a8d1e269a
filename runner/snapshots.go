package runner

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/workspace"
)

// ErrNoSnapshots: the daemon keeps no snapshots (no WithSnapshots).
var ErrNoSnapshots = errors.New("this daemon keeps no snapshots (snapshots.dir in its configuration)")

// MaxForks is the most sessions one Fork makes.
const MaxForks = 32

// WithSnapshots gives the manager a snapshot store (package snapshot):
// sessions may then be snapshotted (Session.Snapshot), started from a
// snapshot or a template (Settings.Snapshot, Settings.Template) and forked
// (Manager.Fork).
func WithSnapshots(st *snapshot.Store) Option { return func(o *options) { o.snapshots = st } }

// Template is a prepared tree the operator declares, for sessions to start
// from (Settings.Template, PoolConfig.Template): one a Source writes (a host
// directory, say, read through localfs and snapshot.WriteTree by the
// program that wires the daemon), or a directory of an image.
type Template struct {
	// Name is how sessions ask for it.
	Name string
	// Source writes its tree.
	Source snapshot.Source
	// Image, in place of Source, is an image whose directory Path (default
	// /workspace) the template is, read from a container made of it and
	// never started; it needs a backend that reads images
	// (backend.ImageReader: docker).
	Image, Path string
}

// WithTemplates declares templates. New makes each in the snapshot store
// (WithSnapshots) before it returns, from its directory or image as it is
// then, and fails naming the one that cannot be made; one whose tree has
// not changed since the daemon's last start is kept as it was.
func WithTemplates(ts ...Template) Option {
	return func(o *options) { o.templates = append(o.templates, ts...) }
}

// makeTemplates makes the declared templates in the store.
func (m *Manager) makeTemplates(ctx context.Context) error {
	if len(m.o.templates) > 0 && m.o.snapshots == nil {
		return fmt.Errorf("runner: templates: %w", ErrNoSnapshots)
	}
	seen := map[string]bool{}
	for _, t := range m.o.templates {
		if seen[t.Name] {
			return fmt.Errorf("runner: template %q is declared twice", t.Name)
		}
		seen[t.Name] = true
		src, err := m.templateSource(t)
		if err != nil {
			return fmt.Errorf("runner: template %q: %w", t.Name, err)
		}
		info, err := m.o.snapshots.PutTemplate(ctx, t.Name, src)
		if err != nil {
			return fmt.Errorf("runner: template %q: %w", t.Name, err)
		}
		m.o.logger.Info("template ready", "template", t.Name, "files", info.Files, "bytes", info.Bytes, "manifest", info.Manifest)
	}
	return nil
}

func (m *Manager) templateSource(t Template) (snapshot.Source, error) {
	switch {
	case (t.Source == nil) == (t.Image == ""):
		return nil, fmt.Errorf("%w: give it a source or an image, one of them", snapshot.ErrInvalid)
	case t.Source != nil:
		return t.Source, nil
	}
	ir, ok := m.backend.(backend.ImageReader)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend reads no images; declare it from a dir", snapshot.ErrInvalid, m.backend.Name())
	}
	dir := t.Path
	if dir == "" {
		dir = "/workspace"
	}
	prof, err := m.o.policy.Apply(Settings{Image: t.Image}.request("", ""))
	if err != nil {
		return nil, err
	}
	spec := m.spec(prof, m.o.tools)
	return func(ctx context.Context, w io.Writer) error { return ir.ReadImage(ctx, spec, dir, w) }, nil
}

// Snapshots returns the tenant's snapshots, oldest first.
func (m *Manager) Snapshots(tenant string) ([]snapshot.Info, error) {
	if m.o.snapshots == nil {
		return nil, ErrNoSnapshots
	}
	return m.o.snapshots.List(tenant), nil
}

// Snapshot returns the tenant's snapshot id; another tenant's is
// snapshot.ErrNotFound, as one that never was.
func (m *Manager) Snapshot(tenant, id string) (snapshot.Info, error) {
	if m.o.snapshots == nil {
		return snapshot.Info{}, ErrNoSnapshots
	}
	return m.o.snapshots.Get(tenant, id)
}

// DeleteSnapshot removes the tenant's snapshot id. Sessions started from it
// keep their files.
func (m *Manager) DeleteSnapshot(tenant, id string) error {
	if m.o.snapshots == nil {
		return ErrNoSnapshots
	}
	err := m.o.snapshots.Delete(tenant, id)
	m.snapOp("delete", err)
	return err
}

// SnapshotUsage returns what the tenant's snapshots hold, and the caps.
func (m *Manager) SnapshotUsage(tenant string) (snapshot.Usage, snapshot.Limits, error) {
	if m.o.snapshots == nil {
		return snapshot.Usage{}, snapshot.Limits{}, ErrNoSnapshots
	}
	u, l := m.o.snapshots.Usage(tenant)
	return u, l, nil
}

// Templates returns the templates sessions may start from.
func (m *Manager) Templates() ([]snapshot.Info, error) {
	if m.o.snapshots == nil {
		return nil, ErrNoSnapshots
	}
	return m.o.snapshots.Templates(), nil
}

// Snapshot saves the session's workspace tree in the daemon's store as
// the tenant's (package snapshot says what a snapshot holds and what it
// does not: running processes, /tmp, owners, special files, .sandboxd/).
// On Docker the container is frozen while its tree is copied, so a
// snapshot taken while commands write is one moment's; backends without a
// way of their own (Kubernetes) read the tree file by file through the
// workspace, not frozen. It runs as one call of the session, named
// "snapshot" (a slot of its calls in flight; the session counts as used).
// It fails with ErrNoSnapshots, with snapshot.ErrLimit at the tenant's
// cap, with snapshot.ErrNoSpace on a full disk, and as Do does; a failed
// snapshot leaves nothing.
func (s *Session) Snapshot(ctx context.Context) (snapshot.Info, error) {
	return s.snapshot(ctx, snapshot.CreateRequest{Session: s.id})
}

func (s *Session) snapshot(ctx context.Context, req snapshot.CreateRequest) (snapshot.Info, error) {
	st := s.m.o.snapshots
	if st == nil {
		return snapshot.Info{}, ErrNoSnapshots
	}
	var info snapshot.Info
	err := s.Do(ctx, "snapshot", func(ctx context.Context) (bool, error) {
		var err error
		info, err = st.Create(ctx, s.tenant, exportOf(s.inst), req)
		return false, err
	})
	if !req.Transient {
		s.m.snapOp("snapshot", err)
	}
	return info, err
}

// exportOf is the Source of inst's tree: its own export, or its files read
// through the port.
func exportOf(inst *backend.Instance) snapshot.Source {
	if inst.Export != nil {
		return inst.Export
	}
	return func(ctx context.Context, w io.Writer) error { return snapshot.WriteTree(ctx, inst.FS, w) }
}

// origin is where a new session's tree comes from: a snapshot of its
// tenant's or a template, or a fork's snapshot as it is made (fan).
type origin struct {
	tenant, snapshot, template string
	fan                        *fanout
}

func (o origin) set() bool { return o != origin{} }

// origin is where the tree of the session req asks for comes from: a
// fork's snapshot, the settings' snapshot or template, or none. It fails
// when there is no such snapshot or template, before a workspace is
// started.
func (m *Manager) origin(req CreateRequest, st Settings) (origin, error) {
	o := req.from
	switch {
	case o.set():
		return o, nil // a fork's, made for it
	case st.Snapshot != "" && st.Template != "":
		return origin{}, &SettingError{"snapshot", "a session starts from a snapshot or a template, not both"}
	case st.Snapshot != "":
		o = origin{tenant: req.Tenant, snapshot: st.Snapshot}
	case st.Template != "":
		o = origin{template: st.Template}
	default:
		return origin{}, nil
	}
	if req.Source != "" {
		return origin{}, &SettingError{"snapshot", "a session with a source directory cannot start from a snapshot"}
	}
	return o, m.check(o)
}

func (o origin) String() string {
	switch {
	case o.template != "":
		return "template " + o.template
	case o.fan != nil && o.snapshot == "":
		return "the fork's snapshot"
	}
	return "snapshot " + o.snapshot
}

// made is o once its tree is in the workspace: a fork's names the
// snapshot its fanout made.
func (o origin) made() origin {
	if o.fan != nil {
		o.snapshot = o.fan.info.ID
	}
	return o
}

// check fails, as a restore would, when the store has no such snapshot or
// template: before a workspace is started for it.
func (m *Manager) check(o origin) error {
	st := m.o.snapshots
	if st == nil {
		return ErrNoSnapshots
	}
	var err error
	if o.template != "" {
		_, err = st.Template(o.template)
	} else {
		_, err = st.Get(o.tenant, o.snapshot)
	}
	return err
}

// fill writes o's tree into inst, a workspace no session has used yet,
// after emptying it: checked against its manifest as it goes (the store's
// Restore), or, for a fork, the snapshot's pack as the store writes it,
// the fill then done only once the snapshot is whole (fanout). It fails
// with snapshot.ErrCorrupt, or the snapshot's error, the workspace then
// half written: the caller discards it.
func (m *Manager) fill(ctx context.Context, inst *backend.Instance, o origin) error {
	if err := empty(ctx, inst); err != nil {
		return fmt.Errorf("runner: emptying the workspace for %s: %w", o, err)
	}
	var pr *io.PipeReader
	restored := make(chan error, 1)
	if o.fan != nil {
		var pw *io.PipeWriter
		pr, pw = io.Pipe()
		r := o.fan.join()
		go func() {
			_, err := io.Copy(pw, r)
			pw.CloseWithError(err)
			restored <- cmp.Or(err, o.fan.wait(ctx))
		}()
	} else {
		st := m.o.snapshots
		var pw *io.PipeWriter
		pr, pw = io.Pipe()
		go func() {
			var err error
			if o.template != "" {
				err = st.RestoreTemplate(ctx, o.template, pw)
			} else {
				err = st.Restore(ctx, o.tenant, o.snapshot, pw)
			}
			pw.CloseWithError(err)
			restored <- err
		}()
	}
	var err error
	if inst.Import != nil {
		err = inst.Import(ctx, pr)
	} else {
		err = snapshot.ReadTree(ctx, inst.FS, pr)
	}
	if err == nil {
		io.Copy(io.Discard, pr) // the stream's end, for Restore to finish
	}
	pr.CloseWithError(errFilled)
	rerr := <-restored
	switch {
	case rerr != nil && !errors.Is(rerr, errFilled) && !errors.Is(rerr, io.ErrClosedPipe):
		return rerr
	case err != nil:
		return fmt.Errorf("runner: writing %s into the workspace: %w", o, err)
	}
	return nil
}

var errFilled = errors.New("the workspace took what it takes of the snapshot")

// empty removes whatever a fresh workspace holds (an image's /workspace).
func empty(ctx context.Context, inst *backend.Instance) error {
	entries, err := inst.FS.ReadDir(ctx, ".")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := workspace.RemoveAll(ctx, inst.FS, e.Name()); err != nil {
			return err
		}
	}
	return nil
}

// ForkRequest asks for copies of a session.
type ForkRequest struct {
	// Count is how many (1 to MaxForks).
	Count int
	// Settings, when set, is a JSON object of settings that replace the
	// source's, key by key (the forks get the source's settings
	// otherwise), each judged as at creation.
	Settings json.RawMessage
	// MaxSessions, when positive, is the tenant's cap of sessions instead
	// of the manager's, and MaxSecrets the tenant's allowance of secrets
	// of its own (as CreateRequest's).
	MaxSessions, MaxSecrets int
}

// Fork makes req.Count new sessions of the tenant's session id, each with
// the tree the session's workspace has now (a snapshot of it, taken as
// Session.Snapshot takes one, and removed once the forks have it) and its
// settings, narrowed or replaced by req.Settings. They are independent of
// the session and of each other from then on. Forks claim warm workspaces
// from a matching pool as any session does, so a fork's first call does
// not wait for a container to start. The snapshot is taken once every
// fork's workspace is ready, and written into all of them as it is read
// (fanout). It is all or nothing:
// when one fork cannot be made, those made are ended and the error says
// why. The snapshot counts against no cap of the tenant's.
func (m *Manager) Fork(ctx context.Context, tenant, id string, req ForkRequest) (_ []*Session, err error) {
	defer func() { m.snapOp("fork", err) }()
	if req.Count < 1 || req.Count > MaxForks {
		return nil, &SettingError{"count", fmt.Sprintf("%d: a fork makes 1 to %d sessions", req.Count, MaxForks)}
	}
	src, err := m.Get(tenant, id)
	if err != nil {
		return nil, err
	}
	st, err := forkSettings(src.settingsNow(), req.Settings)
	if err != nil {
		return nil, err
	}
	if m.o.snapshots == nil {
		return nil, ErrNoSnapshots
	}
	fan, err := newFanout(req.Count, m.o.snapshots.Dir())
	if err != nil {
		return nil, fmt.Errorf("runner: forking %s: %w", id, err)
	}
	defer fan.close()
	from := origin{tenant: tenant, fan: fan}
	if forkStoredFirst.Load() {
		info, err := src.snapshot(ctx, snapshot.CreateRequest{Session: id, Transient: true})
		if err != nil {
			return nil, err
		}
		defer m.o.snapshots.Delete(tenant, info.ID)
		from = origin{tenant: tenant, snapshot: info.ID}
	}
	forks := make([]*Session, req.Count)
	g, gctx := errgroup.WithContext(ctx)
	for i := range forks {
		g.Go(func() error {
			s, err := m.Create(gctx, CreateRequest{Tenant: tenant, Settings: st, MaxSessions: req.MaxSessions, MaxSecrets: req.MaxSecrets,
				Egress: src.tenantEgress, from: from, forkOf: id})
			forks[i] = s
			return err
		})
	}
	if fan := from.fan; fan != nil {
		g.Go(func() error {
			// Once every fork's workspace is ready for it: the source is
			// frozen only while they copy.
			select {
			case <-fan.ready:
			case <-gctx.Done():
				fan.finish(snapshot.Info{}, context.Cause(gctx))
				return context.Cause(gctx)
			}
			info, err := src.snapshot(gctx, snapshot.CreateRequest{Session: id, Transient: true, Tee: fan})
			fan.finish(info, err)
			return err
		})
	}
	err = g.Wait()
	if from.fan != nil && from.fan.info.ID != "" {
		defer m.o.snapshots.Delete(tenant, from.fan.info.ID)
	}
	if err != nil {
		var wg sync.WaitGroup
		for _, s := range forks {
			if s != nil {
				wg.Go(func() { m.Delete(context.WithoutCancel(ctx), tenant, s.id) })
			}
		}
		wg.Wait()
		return nil, fmt.Errorf("runner: forking %s: %w", id, err)
	}
	return forks, nil
}

// forkStoredFirst makes Fork as it was before fanout: the snapshot made
// whole, then restored into each fork. For the benchmark's comparison
// only (ForkStoredFirst).
var forkStoredFirst atomic.Bool

// fanout is a fork's snapshot as the store writes it
// (snapshot.CreateRequest.Tee), handed to the workspaces of all its forks
// at once: the source's tree is read once, and every fork's copy follows
// the store as it writes, instead of waiting for the snapshot to be whole
// and then reading it back for each fork. The pack's bytes are spooled
// to a file of their own (unlinked, in the store's directory), so the
// source is frozen only as long as the snapshot takes, not as long as
// the slowest fork's copy. Each fork gets the pack's bytes, the stream
// its manifest was made of (which a restore checks the stored pack
// against), and checks what it read of the spool against the SHA-256 of
// what the store wrote into it, so a spool changed or cut short on its
// disk is snapshot.ErrCorrupt, never a fork's tree; a fork is made only
// once the snapshot is whole, so one that fails — refused, cut short,
// damaged — fails every fork.
type fanout struct {
	n int
	// ready is closed once n forks have joined: the snapshot starts then.
	ready chan struct{}
	// spool holds the pack as the store writes it, for the forks to read
	// behind it; size is how much of it is written.
	spool *os.File
	sum   hash.Hash // of what Write wrote, the one writer's
	mu    sync.Mutex
	grown *sync.Cond
	size  int64
	// digest is sum's, once finished.
	digest []byte
	// joined counts the forks that took their stream; finished is set
	// once the snapshot is made (info) or has failed (err), and done
	// closed.
	joined   int
	finished bool
	done     chan struct{}
	info     snapshot.Info
	err      error
}

// newFanout makes the fanout of n forks, its spool in dir (the snapshot
// store's: the same disk, and what a crash leaves there is removed when
// the store is opened again).
func newFanout(n int, dir string) (*fanout, error) {
	spool, err := os.CreateTemp(dir, ".tmp-fork-")
	if err != nil {
		return nil, err
	}
	os.Remove(spool.Name()) // read and written through spool alone
	f := &fanout{n: n, ready: make(chan struct{}), done: make(chan struct{}), spool: spool, sum: sha256.New()}
	f.grown = sync.NewCond(&f.mu)
	return f, nil
}

// join returns a fork's stream of the snapshot: the pack as it is
// written, to its end once the snapshot is whole (or its failure).
func (f *fanout) join() io.Reader {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.joined++; f.joined == f.n {
		close(f.ready)
	}
	return &follower{f: f, sum: sha256.New()}
}

// Write appends p to the spool, for the forks to read.
func (f *fanout) Write(p []byte) (int, error) {
	n, err := f.spool.WriteAt(p, f.size)
	f.sum.Write(p[:n])
	if spoolWritten != nil {
		spoolWritten(f.spool, f.size, n)
	}
	f.mu.Lock()
	f.size += int64(n)
	f.grown.Broadcast()
	f.mu.Unlock()
	return n, err
}

// finish ends every fork's stream with the snapshot's outcome, once each
// has read what was written before, and lets the spool go.
func (f *fanout) finish(info snapshot.Info, err error) {
	f.mu.Lock()
	f.info, f.err, f.finished, f.digest = info, err, true, f.sum.Sum(nil)
	f.grown.Broadcast()
	f.mu.Unlock()
	close(f.done)
}

// close removes the spool, once no fork reads it.
func (f *fanout) close() { f.spool.Close() }

// spoolWritten, when set (a test's), is called after each write of a
// fanout's spool with what was written where, before any fork reads it.
var spoolWritten func(spool *os.File, off int64, n int)

// follower reads the spool behind the store, and at its end checks what
// it read against what the store wrote.
type follower struct {
	f   *fanout
	off int64
	sum hash.Hash // of what it read
}

func (r *follower) Read(p []byte) (int, error) {
	f := r.f
	f.mu.Lock()
	for r.off == f.size && !f.finished {
		f.grown.Wait()
	}
	size, finished, err, digest := f.size, f.finished, f.err, f.digest
	f.mu.Unlock()
	if r.off == size && finished {
		if err == nil && !bytes.Equal(r.sum.Sum(nil), digest) {
			err = fmt.Errorf("%w: a fork's copy of it differs from what the store wrote (its spool, on the store's disk, was changed or cut short)", snapshot.ErrCorrupt)
		}
		return 0, cmp.Or(err, io.EOF)
	}
	n, rerr := f.spool.ReadAt(p[:min(int64(len(p)), size-r.off)], r.off)
	r.sum.Write(p[:n])
	r.off += int64(n)
	switch {
	case rerr == io.EOF && n > 0:
		rerr = nil
	case rerr == io.EOF: // the spool holds less than was written to it
		rerr = fmt.Errorf("%w: its spool ends at %d of %d bytes written", snapshot.ErrCorrupt, r.off, size)
	}
	return n, rerr
}

// wait is the snapshot's outcome, once it has one, or ctx's end.
func (f *fanout) wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// forkSettings are a fork's settings: the source's, with over's keys in
// their place.
func forkSettings(src Settings, over json.RawMessage) (Settings, error) {
	src.Snapshot, src.Template = "", ""
	if len(over) == 0 || string(over) == "null" {
		return src, nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(over, &keys); err != nil {
		return Settings{}, &SettingError{"settings", "want a JSON object of settings"}
	}
	for _, k := range []string{"snapshot", "template"} {
		if _, ok := keys[k]; ok {
			return Settings{}, &SettingError{"settings." + k, "a fork's tree is its source's"}
		}
	}
	base, err := json.Marshal(src)
	if err != nil {
		return Settings{}, err
	}
	var merged map[string]json.RawMessage
	if err := json.Unmarshal(base, &merged); err != nil {
		return Settings{}, err
	}
	for k, v := range keys {
		merged[k] = v
	}
	data, err := json.Marshal(merged)
	if err != nil {
		return Settings{}, err
	}
	var out Settings
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return Settings{}, &SettingError{"settings", err.Error()}
	}
	if _, ok := keys["secretValues"]; !ok {
		out.SecretValues = src.SecretValues // with their values, which JSON leaves out, which JSON leaves out
	}
	return out, nil
}

// SnapshotStats describes the snapshot store, for metrics.
type SnapshotStats struct {
	snapshot.Stats
	// Ops counts snapshot operations by [op, outcome]: ops are snapshot,
	// restore, fork, delete, pause, resume; outcomes ok, limit, nospace,
	// corrupt, notfound, timeout, failed.
	Ops map[[2]string]uint64
}

// snapOp counts one snapshot operation's outcome.
func (m *Manager) snapOp(op string, err error) {
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, snapshot.ErrLimit):
		outcome = "limit"
	case errors.Is(err, snapshot.ErrNoSpace):
		outcome = "nospace"
	case errors.Is(err, snapshot.ErrCorrupt):
		outcome = "corrupt"
	case errors.Is(err, snapshot.ErrNotFound), errors.Is(err, ErrNotFound):
		outcome = "notfound"
	case workspace.KindOf(err) == workspace.ErrTimeout:
		outcome = "timeout"
	default:
		outcome = "failed"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.snapOps == nil {
		m.snapOps = map[[2]string]uint64{}
	}
	m.snapOps[[2]string{op, outcome}]++
}

// snapshotStats is nil without a store, unless sessions were paused or
// resumed: their counts are kept beside an empty store's.
func (m *Manager) snapshotStats() *SnapshotStats {
	st := &SnapshotStats{Ops: map[[2]string]uint64{}}
	if m.o.snapshots != nil {
		st.Stats = m.o.snapshots.Stats()
	}
	m.mu.Lock()
	if m.o.snapshots == nil && len(m.snapOps) == 0 {
		m.mu.Unlock()
		return nil
	}
	for k, v := range m.snapOps {
		st.Ops[k] = v
	}
	m.mu.Unlock()
	return st
}
