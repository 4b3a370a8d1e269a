package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/delivery"
)

// What a session keeps beside its record, so that the run of the daemon
// that resumes it gets it back: in its state directory
// (backend.Instance.StateDir, on Docker STATEDIR/docker/daemon-NAME/
// SESSION.state, mode 0700), removed with the session:
//
//	journal/            its journal's store (JournalStoreRequest.Dir)
//	baseline/tree.json  its first tree, for Diff (delivery.KeepTree)
//	baseline/objects/   that tree's contents
//
// and in its record (publish): its settings, and the skills load_skill
// activated, kept before load_skill answers. A run that resumes the
// session reads each back and checks it (the journal's records, the first
// tree's checksum, each content against its name as it is read): what is
// missing or damaged is refused, never used, and the session says what it
// lost (Info.Lost).

// The entries of a session's state directory.
const (
	journalDir  = "journal"
	baselineDir = "baseline"
	objectsDir  = "objects"
)

// baselineDir is where s keeps its first tree, "" without a state
// directory.
func (s *Session) baselineDir() string {
	if s.state == "" {
		return ""
	}
	return filepath.Join(s.state, baselineDir)
}

// keepPack keeps the first tree b holds as a snapshot's pack in dir, as
// readBaseline keeps one read from the workspace, so that the session's
// diff since its start outlives the pack (a fork's snapshot goes once the
// forks have it; a tenant may delete its own) and the daemon. The copy is
// made in a directory beside dir and renamed to dir once whole: the
// workspace may change while it is made (nothing waits for a pack), so a
// copy cut short must leave no dir at all, which a resuming run reports
// as lost rather than reading the changed workspace as the first tree.
func keepPack(ctx context.Context, dir string, b *baseline) error {
	t, c, err := b.get()
	if err != nil {
		return err
	}
	part := dir + ".part"
	if err := os.RemoveAll(part); err != nil {
		return err
	}
	err = func() error {
		st, err := delivery.OpenStore(filepath.Join(part, objectsDir))
		if err != nil {
			return err
		}
		for name, e := range t.Files {
			if err := ctx.Err(); err != nil {
				return err
			}
			data, err := c.Get(e.OID)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if oid, err := st.Put(data); err != nil {
				return err
			} else if oid != e.OID {
				return fmt.Errorf("%s: the snapshot's content is not the one its tree names", name)
			}
		}
		if err := delivery.KeepTree(part, t); err != nil {
			return err
		}
		return os.Rename(part, dir)
	}()
	if err != nil {
		os.RemoveAll(part)
	}
	return err
}

// keptContents are a kept first tree's contents, each checked against its
// object name as it is read.
type keptContents struct{ st *delivery.Store }

func (k keptContents) Get(oid string) ([]byte, error) {
	data, err := k.st.CheckedGet(oid)
	if errors.Is(err, delivery.ErrDamaged) {
		return nil, fmt.Errorf("the first tree the daemon kept is damaged (%w): it is refused; diff since a journal commit works", err)
	}
	return data, err
}

func (k keptContents) Size(oid string) (int64, error) { return k.st.Size(oid) }

// keptBaseline is the first tree of s, resumed by a later run of the
// daemon, as its earlier run kept it; lost says why there is none. A tree
// whose read had not ended when that run stopped is read again: nothing
// changed the workspace before it was read.
// from names the run that held s before ("another replica").
func (m *Manager) keptBaseline(s *Session, from string) (b *baseline, lost string) {
	dir := s.baselineDir()
	if dir == "" {
		why := "the session's first tree stayed with " + from
		return &baseline{err: errors.New(why)}, why
	}
	if _, err := os.Stat(dir); err != nil {
		why := "the daemon kept no first tree of the session (one whose read failed keeps none; one that starts from a snapshot, a template or a fork keeps it once it is copied from the snapshot, in the background)"
		return &baseline{err: errors.New(why)}, why
	}
	t, err := delivery.ReadKeptTree(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return m.takeBaseline(s), ""
	case err != nil:
		why := fmt.Sprintf("the first tree the daemon kept is refused: %v", err)
		m.o.logger.Warn("the session's first tree is damaged: it has no diff since its start", "session", s.id, "err", err)
		return &baseline{err: errors.New(why)}, why
	}
	st, err := delivery.OpenStore(filepath.Join(dir, objectsDir))
	if err != nil {
		return &baseline{err: err}, err.Error()
	}
	return &baseline{tree: t, store: keptContents{st}}, ""
}

// keptJournal opens the journal s kept in its state directory, checking
// its records: one that cannot be read is set aside (what its store holds
// moved to a directory beside it, for the operator to look at, removed
// with the session) and the session's journal starts anew; lost says so.
// from names the run that held s before ("another replica").
func (m *Manager) keptJournal(ctx context.Context, s *Session, from string) (lost string) {
	if s.state == "" || m.o.journalStores == nil {
		return "the journal's history: it stayed with " + from
	}
	_, err := s.set.Journal(ctx)
	if err == nil {
		return ""
	}
	dir := filepath.Join(s.state, journalDir)
	aside := filepath.Join(s.state, fmt.Sprintf("%s.damaged-%d", journalDir, time.Now().UnixNano()))
	m.o.logger.Warn("the session's journal is damaged: it starts anew", "session", s.id, "err", err, "kept", aside)
	if merr := setAside(dir, aside); merr != nil {
		return fmt.Sprintf("the journal's history: it is damaged (%v), and could not be set aside (%v)", err, merr)
	}
	if _, jerr := s.set.Journal(ctx); jerr != nil {
		return fmt.Sprintf("the journal's history: it is damaged (%v), and a new journal could not be opened (%v)", err, jerr)
	}
	return fmt.Sprintf("the journal's history: it is damaged (%s), so it is refused and the journal starts anew from the workspace as it is; the damaged journal is kept in %s", strings.TrimPrefix(err.Error(), "journal: "), aside)
}

// setAside moves dir's entries into aside (made private), leaving dir
// empty and in place: a store open on it sees nothing of them.
func setAside(dir, aside string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if err := os.Mkdir(aside, 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(aside, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// keptSkills makes active again the skills s had active (record.Skills);
// lost names those it cannot.
func keptSkills(s *Session, skills []string) (lost []string) {
	for _, sk := range skills {
		if err := s.set.Activate(sk); err != nil {
			lost = append(lost, fmt.Sprintf("the skill %s: %v", sk, err))
		}
	}
	return lost
}
