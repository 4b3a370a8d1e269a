package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/workspace"
)

// baseline is the workspace's tree as the session began, kept so that Diff
// can say what the session changed.
type baseline struct {
	tree  *delivery.Tree
	store contents
	err   error // why there is none
	// pack, for a session that started from a snapshot or a template, is
	// that snapshot's pack, held open: tree and store are made from it at
	// the first Diff, so a restore reads no file twice and writes none to
	// the host.
	pack *snapshot.Reader
	once sync.Once
	// bg is the read of the tree from the workspace that takeBaseline
	// started in the background; nil when tree, store and err were set as
	// the baseline was made.
	bg *backgroundRead
	// keeping is the copy of pack into the session's state directory
	// (keepPack), which close waits for.
	keeping sync.WaitGroup
}

// contents are a baseline's files, by object name: a delivery.Store, or a
// snapshot's pack.
type contents interface {
	Get(oid string) ([]byte, error)
	Size(oid string) (int64, error)
}

// baselineOf is the first tree of s, which started from o: o's pack when
// it can be opened, else the tree read as takeBaseline reads it.
func (m *Manager) baselineOf(s *Session, o origin) *baseline {
	if !o.set() {
		return m.takeBaseline(s)
	}
	var r *snapshot.Reader
	var err error
	if o.template != "" {
		r, err = m.o.snapshots.TemplateReader(o.template)
	} else {
		r, err = m.o.snapshots.Reader(o.tenant, o.snapshot)
	}
	if err != nil {
		m.o.logger.Warn("the snapshot the session started from cannot be read again: its first tree is read from the workspace", "session", s.id, "err", err)
		return m.takeBaseline(s)
	}
	b := &baseline{pack: r}
	if dir := s.baselineDir(); dir != "" {
		b.keeping.Go(func() {
			if err := keepPack(s.ctx, dir, b); err != nil && s.ctx.Err() == nil {
				m.o.logger.Warn("the session's first tree, its snapshot's, was not kept: after a restart of the daemon it has no diff since its start", "session", s.id, "err", err)
			}
		})
	}
	return b
}

// get returns the tree and its contents, made from the pack on first use.
func (b *baseline) get() (*delivery.Tree, contents, error) {
	b.once.Do(func() {
		if b.pack == nil {
			return
		}
		pc := &packContents{r: b.pack, paths: map[string]string{}, links: map[string]string{}, sizes: map[string]int64{}}
		t := &delivery.Tree{Files: map[string]delivery.Entry{}, Skipped: map[string]string{}}
		for _, e := range b.pack.Entries() {
			if delivery.Excluded(e.Path) {
				continue
			}
			switch e.Type {
			case snapshot.TypeFile:
				if e.Size > delivery.MaxFileBytes {
					t.Skipped[e.Path] = fmt.Sprintf("over %d bytes", delivery.MaxFileBytes)
					continue
				}
				data, err := b.pack.ReadFile(e.Path)
				if err != nil {
					b.err = err
					return
				}
				oid := delivery.BlobOID(data)
				pc.paths[oid], pc.sizes[oid] = e.Path, e.Size
				t.Files[e.Path] = delivery.Entry{Mode: e.Mode, OID: oid}
			case snapshot.TypeLink:
				oid := delivery.BlobOID([]byte(e.Target))
				pc.links[oid] = e.Target
				t.Files[e.Path] = delivery.Entry{Mode: e.Mode | fs.ModeSymlink, OID: oid}
			}
		}
		b.tree, b.store = t, pc
	})
	return b.tree, b.store, b.err
}

// packContents are a baseline's contents read from a snapshot's pack.
type packContents struct {
	r     *snapshot.Reader
	paths map[string]string // a file's object name → its path
	sizes map[string]int64
	links map[string]string // a link's object name → its target
}

func (p *packContents) Get(oid string) ([]byte, error) {
	if t, ok := p.links[oid]; ok {
		return []byte(t), nil
	}
	if name, ok := p.paths[oid]; ok {
		return p.r.ReadFile(name)
	}
	return nil, fmt.Errorf("no object %s in the first tree", oid)
}

func (p *packContents) Size(oid string) (int64, error) {
	if t, ok := p.links[oid]; ok {
		return int64(len(t)), nil
	}
	if n, ok := p.sizes[oid]; ok {
		return n, nil
	}
	return 0, fmt.Errorf("no object %s in the first tree", oid)
}

// close lets go of the baseline: it waits for a read still running, which
// the end of the session's context ends, and removes its store.
func (b *baseline) close() error {
	if b == nil {
		return nil
	}
	if b.bg != nil {
		<-b.bg.ready
	}
	b.keeping.Wait()
	switch {
	case b.pack != nil:
		return b.pack.Close()
	}
	if st, ok := b.store.(*delivery.Store); ok {
		return st.Close()
	}
	return nil
}

// DiffReaders is how many files a Diff reads at once (and holds, with
// DiffRequest.Hold).
const DiffReaders = delivery.SnapshotReaders

// DiffRequest says what a Diff compares.
type DiffRequest struct {
	// Since, when set, is a journal commit (0: the journal's start): the
	// diff is then of the paths the journal's commits after it touched,
	// from their state just after it to their state now. Without it the
	// diff is of the whole tree, from the session's baseline (its start, or
	// the last new baseline, Session.Rebaseline) to now.
	Since *int
	// MaxFileBytes leaves files over it out of the diff (named in Skipped);
	// 0 is delivery.MaxFileBytes.
	MaxFileBytes int64
	// Hold, when set, is the memory budget the diff draws on: each file
	// while it is read, and, while the patch is written, three times the
	// largest change's two sides (their bytes, their lines, the hunks).
	Hold delivery.Hold
}

// Diff is what a session changed, as Session.Diff found it. Close releases
// it.
type Diff struct {
	// Changes are the paths changed, sorted.
	Changes []delivery.Change
	// Skipped names paths that cannot be shown, with why (a file over
	// delivery.MaxFileBytes, contents the journal did not keep).
	Skipped map[string]string
	// Ignored are the files added that the project's .gitignore files
	// ignore, sorted: left out of the diff, as a delivery leaves them out.
	Ignored []string
	store   *delivery.Store
	hold    delivery.Hold
}

// WritePatch writes the diff as a git-format patch (delivery.WritePatch)
// that `git apply` applies to the tree it was taken from. Skipped paths are
// named in its header, which git ignores.
func (d *Diff) WritePatch(ctx context.Context, w io.Writer) error {
	var largest int64
	for _, c := range d.Changes {
		var n int64
		for _, e := range []*delivery.Entry{c.Old, c.New} {
			if e != nil {
				size, err := d.store.Size(e.OID)
				if err != nil {
					return err
				}
				n += size
			}
		}
		largest = max(largest, n)
	}
	var header strings.Builder
	for _, p := range slices.Sorted(maps.Keys(d.Skipped)) {
		fmt.Fprintf(&header, "sandboxd: not in this diff: %s (%s)\n", p, d.Skipped[p])
	}
	if len(d.Ignored) > 0 {
		fmt.Fprintf(&header, "sandboxd: not in this diff, added and ignored by the project's .gitignore: %s\n", delivery.Some(d.Ignored))
	}
	return d.holding(ctx, 3*largest, func() error {
		return delivery.WritePatch(w, header.String(), d.Changes, d.store)
	})
}

// holding runs fn holding n bytes of the diff's budget, if it has one.
func (d *Diff) holding(ctx context.Context, n int64, fn func() error) error {
	if d.hold != nil {
		release, err := d.hold(ctx, n)
		if err != nil {
			return err
		}
		defer release()
	}
	return fn()
}

// Close removes the contents the diff holds.
func (d *Diff) Close() error { return d.store.Close() }

// Diff returns what changed in the session's workspace since its baseline
// (its first tree, or the last new one Rebaseline took): its files and
// symbolic links, added, modified (contents, modes), deleted. sandboxd's
// bookkeeping (.sandboxd/) and git's (every .git) are left out, as in a
// delivery. Every file of the workspace is read once; a call that changes
// files while Diff reads them may be seen in part. Call it within Do. It
// waits, as the calls that change the workspace do, until the session's
// first tree is read.
//
// With req.Since the journal says which paths changed: a command's
// changes (bash) are not journaled, so they appear only where a journaled
// call touched the same path; the whole-tree diff shows them all.
func (s *Session) Diff(ctx context.Context, req DiffRequest) (*Diff, error) {
	if err := s.currentBase().wait(ctx); err != nil {
		return nil, err
	}
	// The baseline is held while it is read: a new one (Rebaseline)
	// replaces it once the diff is done with it.
	s.baseMu.RLock()
	defer s.baseMu.RUnlock()
	if req.Since == nil && s.base.err != nil {
		return nil, fmt.Errorf("runner: the session has no first tree to compare with (a diff since a journal commit works, and so does one after a new baseline): %w", s.base.err)
	}
	st, err := delivery.NewStore()
	if err != nil {
		return nil, err
	}
	d := &Diff{store: st, Skipped: map[string]string{}, hold: req.Hold}
	if err := d.compute(ctx, s, s.base, req); err != nil {
		st.Close()
		return nil, err
	}
	return d, nil
}

func (d *Diff) compute(ctx context.Context, s *Session, b *baseline, req DiffRequest) error {
	opts := []delivery.SnapshotOption{delivery.WithMaxFileBytes(cmp.Or(req.MaxFileBytes, delivery.MaxFileBytes))}
	if req.Hold != nil {
		opts = append(opts, delivery.WithHold(req.Hold))
	}
	now, err := delivery.Snapshot(ctx, s.inst.FS, d.store, opts...)
	if err != nil {
		return err
	}
	var base *delivery.Tree
	var from contents = d.store
	if req.Since != nil {
		if base, err = d.journalBase(ctx, s, *req.Since, now); err != nil {
			return err
		}
	} else if base, from, err = b.get(); err != nil {
		return fmt.Errorf("runner: the session's first tree: %w", err)
	}
	d.Changes = delivery.Changes(base, now)
	maps.Copy(d.Skipped, base.Skipped)
	maps.Copy(d.Skipped, now.Skipped)
	// What the project's .gitignore files ignore among the files added is
	// left out, as a delivery leaves it out: build output, caches. When
	// git cannot say (no git on the daemon's host), everything is shown.
	if ignored, err := delivery.IgnoredAdds(ctx, now, d.store, d.Changes); err == nil && len(ignored) > 0 {
		d.Changes, d.Ignored = delivery.LeaveOut(d.Changes, ignored)
	}
	if from == contents(d.store) {
		return nil
	}
	// The diff holds its contents in one store: the old sides come over.
	for _, c := range d.Changes {
		if c.Old == nil {
			continue
		}
		size, err := from.Size(c.Old.OID)
		if err != nil {
			return fmt.Errorf("runner: the session's first tree: %w", err)
		}
		err = d.holding(ctx, size, func() error {
			data, err := from.Get(c.Old.OID)
			if err == nil {
				_, err = d.store.Put(data)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// journalBase is the tree as it was just after journal commit since, as
// far as the journal knows: now, with each path a later commit touched put
// back to its state before the first of them.
func (d *Diff) journalBase(ctx context.Context, s *Session, since int, now *delivery.Tree) (*delivery.Tree, error) {
	j, err := s.set.Journal(ctx)
	if err != nil {
		return nil, err
	}
	list := j.List() // newest first
	last, oldest := 0, 1
	if len(list) > 0 {
		last, oldest = list[0].ID, list[len(list)-1].ID
	}
	switch {
	case since < 0:
		return nil, workspace.PathError("diff", fmt.Sprintf("since %d", since), workspace.ErrInvalidArgument)
	case since > last:
		return nil, &fs.PathError{Op: "diff", Path: fmt.Sprintf("commit %d", since),
			Err: fmt.Errorf("%w: the journal's last commit is %d", workspace.ErrNotFound, last)}
	case since < last && since+1 < oldest:
		return nil, &fs.PathError{Op: "diff", Path: fmt.Sprintf("commit %d", since),
			Err: fmt.Errorf("%w: the commits after it are no longer kept (the oldest kept is %d)", workspace.ErrNotFound, oldest)}
	}
	base := &delivery.Tree{Files: maps.Clone(now.Files), Skipped: map[string]string{}}
	seen := map[string]bool{}
	for id := since + 1; id <= last; id++ {
		c, err := j.Get(id)
		if err != nil {
			return nil, err
		}
		for _, ch := range c.Changes {
			if seen[ch.Path] || delivery.Excluded(ch.Path) {
				continue
			}
			seen[ch.Path] = true
			entry, err := d.entryOf(ctx, j, ch.Before)
			switch {
			case errors.Is(err, workspace.ErrFileTooLarge):
				base.Skipped[ch.Path] = "the journal did not keep its contents"
			case err != nil:
				return nil, err
			case entry == nil:
				delete(base.Files, ch.Path)
			default:
				base.Files[ch.Path] = *entry
			}
		}
	}
	return base, nil
}

// entryOf is a journal state as a tree's entry, its contents put in the
// diff's store: nil for a state that is no file or link.
func (d *Diff) entryOf(ctx context.Context, j *journal.Journal, e journal.Entry) (*delivery.Entry, error) {
	var oid string
	var err error
	mode := e.Mode & fs.ModePerm
	switch e.Type {
	case "file":
		err = d.holding(ctx, e.Size, func() error {
			data, err := j.Contents(ctx, e)
			if err == nil {
				oid, err = d.store.Put(data)
			}
			return err
		})
	case "symlink":
		mode |= fs.ModeSymlink
		oid, err = d.store.Put([]byte(e.Target))
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &delivery.Entry{Mode: mode, OID: oid}, nil
}
