// Package delivery computes what a session changed in a copied workspace
// and delivers it: applied back to the directory it was copied from, as a
// git-format patch, or as a commit on a branch of that directory's git
// repository, made without touching its work tree or index.
//
// Three trees are compared: the baseline (the directory as it was copied
// in, read by [Snapshot] before the copy), the session's final tree, and
// the directory as it is at delivery. sandboxd's own bookkeeping
// (".sandboxd/" at the root) and git's (every ".git") are never part of a
// tree, so they are never delivered.
package delivery

import (
	"archive/tar"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/workspace"
	"golang.org/x/sync/errgroup"
)

// MaxFileBytes is the largest file a tree holds; a larger one is listed in
// Tree.Skipped and never delivered.
const MaxFileBytes = 1 << 30

// Entry is one file or symbolic link of a tree.
type Entry struct {
	// Mode is the type (0 or fs.ModeSymlink) and permission bits.
	Mode fs.FileMode
	// OID is git's object name of the content (of the link's target for a
	// link): sha1("blob <size>\x00" + content), in hex.
	OID string
}

func (e Entry) isLink() bool { return e.Mode&fs.ModeSymlink != 0 }

// gitMode is the mode git records for the entry.
func (e Entry) gitMode() string {
	switch {
	case e.isLink():
		return "120000"
	case e.Mode&0o111 != 0:
		return "100755"
	default:
		return "100644"
	}
}

// Tree is a workspace's regular files and symbolic links at one moment, by
// slash-separated name relative to its root, with their contents in a
// Store. Directories are implied by the names.
type Tree struct {
	Files map[string]Entry
	// Skipped names what the tree leaves out that a delivery would
	// otherwise carry (a file over MaxFileBytes, one unreadable), with why.
	Skipped map[string]string
}

// Excluded reports whether name (slash-separated, relative to the root) is
// bookkeeping that never leaves a session: ".sandboxd" at the root, and any
// ".git" (a repository's own files are git's to change, and the session's
// .git is the copy's).
func Excluded(name string) bool {
	if name == ".sandboxd" || strings.HasPrefix(name, ".sandboxd/") {
		return true
	}
	return slices.Contains(strings.Split(name, "/"), ".git")
}

// Store keeps the contents of trees' files, content-addressed, in a private
// directory, so a delivery holds one file in memory at a time.
type Store struct {
	dir  string
	lock *os.File // a temporary store's: held (flock) while it is open
}

// storePrefix names the temporary directories of stores (NewStore).
const storePrefix = "sandboxd-delivery-"

// NewStore makes a store in a new temporary directory; Close removes it.
// The store holds a lock (flock) on a file in it while it is open, which
// ends with the process: a store whose lock is free was left by a process
// that died before its Close, and RemoveStale removes it.
func NewStore() (*Store, error) {
	dir, err := os.MkdirTemp("", storePrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	lock, err := lockFile(filepath.Join(dir, storeLock))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("delivery: %w", err)
	}
	return &Store{dir: dir, lock: lock}, nil
}

// storeLock is the file a temporary store locks.
const storeLock = ".lock"

// openStore opens the store kept in dir, making dir (private) when it is
// missing. It holds no lock: whoever keeps dir says who uses it.
func openStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Close removes a temporary store's files; a kept one's (Keep) stay.
func (s *Store) Close() error {
	if s.lock == nil {
		return nil
	}
	err := os.RemoveAll(s.dir)
	s.lock.Close()
	return err
}

// Put keeps data and returns its object name (BlobOID).
func (s *Store) Put(data []byte) (string, error) {
	oid := BlobOID(data)
	p := s.path(oid)
	if _, err := os.Stat(p); err == nil {
		return oid, nil
	}
	tmp, err := os.CreateTemp(s.dir, "put-*")
	if err != nil {
		return "", err
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("delivery: storing content: %w", err)
	}
	return oid, nil
}

// Get returns the content named oid.
func (s *Store) Get(oid string) ([]byte, error) { return os.ReadFile(s.path(oid)) }

// Size returns the length of the content named oid.
func (s *Store) Size(oid string) (int64, error) {
	info, err := os.Stat(s.path(oid))
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

func (s *Store) path(oid string) string { return filepath.Join(s.dir, oid) }

// BlobOID is git's object name for a blob of data.
func BlobOID(data []byte) string {
	h := sha1.New()
	h.Write([]byte("blob " + strconv.Itoa(len(data)) + "\x00"))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// SnapshotOption bounds what Snapshot holds.
type SnapshotOption func(*snapshotOptions)

type snapshotOptions struct {
	maxFile int64
	hold    Hold
	readers int
	pace    func(ctx context.Context) error
}

// Hold takes n bytes of a memory budget before they are read, or fails
// (and Snapshot with it); release gives them back.
type Hold func(ctx context.Context, n int64) (release func(), err error)

// WithMaxFileBytes skips files over n bytes (listed in Tree.Skipped),
// instead of MaxFileBytes.
func WithMaxFileBytes(n int64) SnapshotOption {
	return func(o *snapshotOptions) { o.maxFile = min(n, MaxFileBytes) }
}

// WithReaders makes Snapshot read n files at a time (at least one)
// instead of SnapshotReaders: fewer for a read that should leave the
// machine to others, as a session's first tree read in the background.
func WithReaders(n int) SnapshotOption {
	return func(o *snapshotOptions) { o.readers = max(n, 1) }
}

// WithPace makes Snapshot call pace before it reads each file, and wait
// for it: a read in the background can give way to others. An error from
// pace fails Snapshot.
func WithPace(pace func(ctx context.Context) error) SnapshotOption {
	return func(o *snapshotOptions) { o.pace = pace }
}

// WithHold makes each file's read hold its size from hold until its
// contents are in the store.
func WithHold(hold Hold) SnapshotOption { return func(o *snapshotOptions) { o.hold = hold } }

// Snapshot reads the tree of fsys (its regular files and symbolic links,
// leaving out what Excluded names and other special files) and keeps the
// contents in st. It reads through the FileSystem port, so a workspace in a
// container, in memory or on disk is read the same way, several files at a
// time (a container's agent serves calls concurrently); it does not stop
// writers meanwhile. It holds at most SnapshotReaders files in memory (or
// WithReaders's).
func Snapshot(ctx context.Context, fsys workspace.FileSystem, st *Store, opts ...SnapshotOption) (*Tree, error) {
	o := snapshotOptions{maxFile: MaxFileBytes, readers: SnapshotReaders}
	for _, opt := range opts {
		opt(&o)
	}
	walk, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{FilesOnly: true, Exclude: bookkeeping})
	if err != nil {
		return nil, fmt.Errorf("delivery: listing the workspace: %w", err)
	}
	t := &Tree{Files: map[string]Entry{}, Skipped: map[string]string{}}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.readers)
	for _, e := range walk.Entries {
		if Excluded(e.Path) {
			continue
		}
		if o.pace != nil {
			if err := o.pace(gctx); err != nil {
				g.Wait()
				return nil, err
			}
		}
		g.Go(func() error {
			entry, why, err := o.readEntry(gctx, fsys, st, e.Path)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				return fmt.Errorf("delivery: reading %s: %w", e.Path, err)
			case why != "":
				t.Skipped[e.Path] = why
			case entry != nil:
				t.Files[e.Path] = *entry
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return t, nil
}

// SnapshotReaders is how many files Snapshot reads, and holds, at a time.
const SnapshotReaders = 8

// readEntry reads one entry of a walk: nil for a special file, why for one
// that cannot be delivered, an error when the workspace failed.
func (o snapshotOptions) readEntry(ctx context.Context, fsys workspace.FileSystem, st *Store, name string) (_ *Entry, why string, _ error) {
	info, err := fsys.Lstat(ctx, name)
	if errors.Is(err, workspace.ErrNotFound) {
		return nil, "", nil // gone since the listing
	}
	if err != nil {
		return nil, "", err
	}
	tooLarge := fmt.Sprintf("over %d bytes", o.maxFile)
	if info.Mode().IsRegular() && info.Size() > o.maxFile {
		return nil, tooLarge, nil
	}
	if o.hold != nil {
		release, err := o.hold(ctx, min(info.Size(), o.maxFile))
		if err != nil {
			return nil, "", err
		}
		defer release()
	}
	var data []byte
	switch {
	case info.Mode()&fs.ModeSymlink != 0:
		sl, ok := fsys.(workspace.SymlinkFS)
		if !ok {
			return nil, "the workspace cannot read links", nil
		}
		target, err := sl.Readlink(ctx, name)
		if err != nil {
			return nil, "", err
		}
		data = []byte(target)
	case info.Mode().IsRegular():
		data, err = fsys.ReadFile(ctx, name, o.maxFile)
		switch {
		case errors.Is(err, workspace.ErrFileTooLarge):
			return nil, tooLarge, nil
		case errors.Is(err, workspace.ErrNotFound):
			return nil, "", nil
		case errors.Is(err, workspace.ErrForbidden):
			return nil, "unreadable", nil
		case err != nil:
			return nil, "", err
		}
	default:
		return nil, "", nil
	}
	oid, err := st.Put(data)
	if err != nil {
		return nil, "", err
	}
	return &Entry{Mode: info.Mode() & (fs.ModeSymlink | fs.ModePerm), OID: oid}, "", nil
}

// snapshotArchive reads a tree from the tar stream r (names relative to
// the root) as Snapshot reads one from a workspace, its contents into st;
// it returns the content of the reflog (gitLog) too, if r has it.
func snapshotArchive(r io.Reader, st *Store) (*Tree, []byte, error) {
	t := &Tree{Files: map[string]Entry{}, Skipped: map[string]string{}}
	var log []byte
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return t, log, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("delivery: the workspace's archive: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." || name == ".." || strings.HasPrefix(name, "../") || path.IsAbs(name) {
			continue
		}
		var data []byte
		mode := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeReg:
			if h.Size > MaxFileBytes {
				t.Skipped[name] = fmt.Sprintf("over %d bytes", MaxFileBytes)
				continue
			}
			if data, err = io.ReadAll(io.LimitReader(tr, h.Size)); err != nil {
				return nil, nil, fmt.Errorf("delivery: the workspace's archive: %w", err)
			}
			if name == gitLog {
				log = data
			}
		case tar.TypeSymlink:
			data, mode = []byte(h.Linkname), fs.ModeSymlink|mode
		default:
			continue
		}
		if Excluded(name) {
			continue
		}
		oid, err := st.Put(data)
		if err != nil {
			return nil, nil, err
		}
		t.Files[name] = Entry{Mode: mode, OID: oid}
	}
}

// bookkeeping is what Excluded names, for a walk not to enter.
var bookkeeping = workspace.Exclude{".git", ".sandboxd/"}

// Change is one path a session changed: Old is the baseline's entry and New
// the final tree's (nil when absent: added, or deleted).
type Change struct {
	Path     string
	Old, New *Entry
}

// gitInvisible reports whether git cannot express the change: both sides
// there, same content, permission bits that differ but not in git's one
// bit (executable or not). A patch and a commit leave it out; SyncBack
// applies it.
func (c Change) gitInvisible() bool {
	return c.Old != nil && c.New != nil && c.Old.OID == c.New.OID && c.Old.gitMode() == c.New.gitMode()
}

// Changes lists what differs from base to final, sorted by path. A path
// either tree skipped is not listed: what it holds there is not known, so
// its absence is no deletion.
func Changes(base, final *Tree) []Change {
	var out []Change
	for p, o := range base.Files {
		if _, skipped := final.Skipped[p]; skipped {
			continue
		}
		if n, ok := final.Files[p]; !ok {
			out = append(out, Change{Path: p, Old: &o})
		} else if n != o {
			out = append(out, Change{Path: p, Old: &o, New: &n})
		}
	}
	for p, n := range final.Files {
		_, skipped := base.Skipped[p]
		if _, ok := base.Files[p]; !ok && !skipped {
			out = append(out, Change{Path: p, New: &n})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// parents returns the directories above name, nearest first.
func parents(name string) []string {
	var out []string
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		out = append(out, d)
	}
	return out
}
