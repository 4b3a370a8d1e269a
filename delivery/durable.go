package delivery

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// A baseline is durable when it is kept in a directory of its own (Keep):
// its tree, its contents and, once a delivery begins, the delivery's
// journal live there, so that a process killed at any moment — serving the
// session, or halfway through delivering its work — leaves what the next
// one needs to deliver the work, or to finish the delivery begun:
//
//	dir/lock           held (flock) while a process has the baseline open
//	dir/baseline.json  the directory read, its tree and git log
//	dir/objects/       the contents of the baseline's files and the final tree's
//	dir/delivery.json  the delivery begun: its request and changes
//	dir/work.patch     the whole work, written before Apply touches the directory
//
// Each file is written to a temporary name and renamed into place, so each
// is wholly there or not at all.

// BeginOption configures Begin.
type BeginOption func(*beginOptions)

type beginOptions struct{ keep string }

// Keep keeps the baseline in dir (made private if missing) rather than in a
// temporary directory: it outlives the process, Open reads it back, and
// Close leaves it; Discard removes it. While it is open a lock (flock) on a
// file in dir says so, and ends with the process: Begin and Open fail with
// ErrInUse while another holds it.
func Keep(dir string) BeginOption { return func(o *beginOptions) { o.keep = dir } }

// ErrInUse is what Begin and Open of a kept baseline fail with while
// another process has it open; match it with errors.Is.
var ErrInUse = errors.New("delivery: the kept baseline is open in another process")

// lockKept takes the lock of the baseline kept in dir.
func lockKept(dir string) (*os.File, error) {
	lock, err := lockFile(filepath.Join(dir, keptLock))
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("%w (%s)", ErrInUse, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("delivery: the kept baseline: %w", err)
	}
	return lock, nil
}

// baselineFile is the record of a kept baseline.
type baselineFile struct {
	Dir  string `json:"dir"`
	Tree *Tree  `json:"tree"`
	Log  []byte `json:"gitLog,omitempty"`
}

const (
	keptLock     = "lock"
	baselineName = "baseline.json"
	journalName  = "delivery.json"
	workPatch    = "work.patch"
	objectsDir   = "objects"
)

// Open reads back the baseline Begin kept in dir (Keep) and holds its
// lock until Close. It fails wrapping fs.ErrNotExist when dir holds none
// (Begin did not finish, say), and ErrInUse while another process has it
// open.
func Open(dir string) (*Baseline, error) {
	lock, err := lockKept(dir)
	if err != nil {
		return nil, err
	}
	b, err := open(dir)
	if err != nil {
		lock.Close()
		return nil, err
	}
	b.lock = lock
	return b, nil
}

func open(dir string) (*Baseline, error) {
	data, err := os.ReadFile(filepath.Join(dir, baselineName))
	if err != nil {
		return nil, fmt.Errorf("delivery: the kept baseline: %w", err)
	}
	var bf baselineFile
	if err := json.Unmarshal(data, &bf); err != nil || bf.Tree == nil || !filepath.IsAbs(bf.Dir) {
		return nil, fmt.Errorf("delivery: the kept baseline %s is unreadable (%v)", filepath.Join(dir, baselineName), err)
	}
	st, err := openStore(filepath.Join(dir, objectsDir))
	if err != nil {
		return nil, err
	}
	return &Baseline{dir: bf.Dir, tree: bf.Tree, store: st, log: bf.Log, keep: dir}, nil
}

// Nothing is the baseline of an empty tree, for work whose first tree is
// not known (a container a killed run left with no record of it): a patch
// of the work against it adds every file. Its Dir is "".
func Nothing() (*Baseline, error) {
	st, err := NewStore()
	if err != nil {
		return nil, err
	}
	return &Baseline{tree: &Tree{Files: map[string]Entry{}, Skipped: map[string]string{}}, store: st}, nil
}

// Dir is the directory the baseline was read from.
func (b *Baseline) Dir() string { return b.dir }

// Discard removes a kept baseline (Keep) and everything its delivery kept
// with it; for one in a temporary directory it is Close.
func (b *Baseline) Discard() error {
	if b.keep == "" {
		return b.Close()
	}
	err := os.RemoveAll(b.keep)
	b.Close()
	return err
}

// save writes the baseline's record into its directory.
func (b *Baseline) save() error {
	data, err := json.Marshal(baselineFile{Dir: b.dir, Tree: b.tree, Log: b.log})
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(b.keep, baselineName), data)
}

// journal is a delivery begun: written before it changes anything outside
// the baseline's directory, so that Deliver called again after a crash
// carries out the same delivery rather than measuring the work again.
type journal struct {
	Request Request  `json:"request"`
	Report  *Report  `json:"report"`
	Message string   `json:"message"`
	Keep    []string `json:"keep,omitempty"` // directories the final tree holds
	// Tag marks the temporary names Apply makes in the directory
	// (".sandboxd-TAG-NAME"), so that a later run removes what a killed
	// one left.
	Tag string `json:"tag"`
}

func (b *Baseline) readJournal() (*journal, error) {
	if b.keep == "" {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(b.keep, journalName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("delivery: the journal of the delivery begun: %w", err)
	}
	var j journal
	if err := json.Unmarshal(data, &j); err != nil || j.Report == nil {
		return nil, fmt.Errorf("delivery: the journal %s of the delivery begun is unreadable (%v)", filepath.Join(b.keep, journalName), err)
	}
	return &j, nil
}

func (b *Baseline) writeJournal(j *journal) error {
	if b.keep == "" {
		return nil
	}
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(b.keep, journalName), data)
}

// Interrupted reports whether a delivery of this baseline began and did not
// finish (a process killed while delivering): Deliver finishes it.
func (b *Baseline) Interrupted() bool { return b.keep != "" && Interrupted(b.keep) }

// Interrupted reports whether the baseline kept in dir (Keep) is
// Interrupted, without reading it.
func Interrupted(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, journalName))
	return err == nil
}

// writeFileAtomic writes data to name through a temporary file beside it,
// synced, then renamed over it.
func writeFileAtomic(name string, data []byte) error {
	tmp := name + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("delivery: %w", err)
	}
	return nil
}

// placeNew puts data at name, which must not exist, wholly or not at all:
// written to a temporary name beside it and linked in (a link, unlike a
// rename, never replaces a file). A file already at name with exactly
// data counts as placed — a delivery carried out again after a crash
// writes the same patch — while any other is left alone and an error.
func placeNew(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(name), "."+filepath.Base(name)+".sandboxd-partial")
	if err := writeFileAtomic(tmp, data); err != nil {
		return err
	}
	defer os.Remove(tmp)
	err := os.Link(tmp, name)
	if errors.Is(err, fs.ErrExist) {
		if have, rerr := os.ReadFile(name); rerr == nil && bytes.Equal(have, data) {
			return nil
		}
	}
	return err
}

// lockFile opens name (made if missing) and takes its lock (flock), or
// fails wrapping syscall.EWOULDBLOCK when a process holds it.
func lockFile(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// StaleAge is how old a temporary store without a lock — made by a version
// of sandboxd before stores held one — must be before RemoveStale takes it
// for a dead process's.
const StaleAge = 24 * time.Hour

// RemoveStale removes the temporary stores (NewStore, "sandboxd-delivery-*"
// in the temporary directory, this user's) of processes that died before
// closing them: those whose lock no process holds, and those without a lock
// older than StaleAge. A store made in the last minute is left alone (its
// process may not have taken its lock yet). It reports how many it removed
// and how many bytes of files they held.
func RemoveStale() (n int, size int64, err error) {
	matches, err := filepath.Glob(filepath.Join(os.TempDir(), storePrefix+"*"))
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	for _, dir := range matches {
		info, err := os.Lstat(dir)
		if err != nil || !info.IsDir() || !ownedByMe(info) || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		var lock *os.File
		if _, err := os.Lstat(filepath.Join(dir, storeLock)); err == nil {
			if lock, err = lockFile(filepath.Join(dir, storeLock)); err != nil {
				continue // its process lives (or the lock cannot be judged)
			}
		} else if time.Since(info.ModTime()) < StaleAge {
			continue
		}
		held := dirSize(dir)
		if rerr := os.RemoveAll(dir); rerr != nil {
			errs = append(errs, rerr)
		} else {
			n++
			size += held
		}
		if lock != nil {
			lock.Close()
		}
	}
	return n, size, errors.Join(errs...)
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

func ownedByMe(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}
