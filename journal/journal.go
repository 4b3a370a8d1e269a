// Package journal keeps a workspace's journal: a numbered list of commits,
// each the changes one tool call (or one provider session) made, kept
// through the FileSystem port so it works the same on the memory, local and
// Docker backends: in a store of its own (WithStore) that the workspace's
// processes cannot write, or else inside the workspace under
// .sandboxd/journal/.
//
// The journal does not trust its store. Every kept content is checked
// against its SHA-256 when it is read back: content that does not match is
// never restored, reverted to or shown (the path is reported, and the call
// fails with workspace.ErrUnavailable). The commits in use are those the
// Journal value made or loaded at Open; records written into the store
// later are not read. What a store inside the workspace cannot guard
// against is a record forged there before Open: keep the store out of the
// session's reach (the daemon does) when its processes are not trusted.
//
// Three ways to change a workspace under the journal:
//
//   - Record runs an in-process mutation (write, edit, writeFile, the shell
//     in write mode, …) against a recording FileSystem. Before the first
//     change to a path the recorder keeps that path's before-image — only the
//     touched paths are read, never the tree — and when the call ends the
//     changes become one commit. A call that fails is rolled back.
//   - Exec runs a process (workspace_exec) in a workspace session of its own:
//     a manifest of the tree (type, size, mode, mtime, and inode and ctime
//     where the adapter reports them) is compared before and after, so only
//     the files that changed are read. A run that succeeds is committed; any
//     other outcome restores the workspace exactly — contents, modes,
//     deletions, new entries removed — and commits nothing. Since a process
//     changes files behind the port's back, their old bytes must be kept
//     beforehand: the journal keeps a baseline, a content-addressed copy of
//     every file up to MaxBlobBytes (built on the first Exec, updated
//     incrementally from then on).
//   - Begin opens a provider session: until End, calls run in it without
//     commits of their own, and End commits (or rolls back) everything the
//     session changed as one commit, which is the session's result.
//
// .sandboxd/ is sandboxd's own and never committed. A workspace session
// lists it too and, at its end, puts back whatever changed there, however
// the run ended (Outcome.Protected), but for what sandboxd itself wrote
// there meanwhile and said so with Own.
//
// Commits can be listed (List), shown as a unified diff (Show) and reverted
// to (Revert), which is itself a commit and can be reverted in turn.
//
// The store holds the commits' records (commits/, appended to segments of
// up to 64 records, one a line) and kept contents under their hash
// (objects/); the before- and after-images of a small file (up to 4 KiB)
// that Record's writes report are kept in the commit's record instead, so a
// small write costs the store one append (one write on a store that is a
// workspace.AppendFS). A Record whose commit cannot be stored is rolled
// back like one that fails; a record cut short (a crash during its append)
// is no commit.
//
// Limits. Files over MaxBlobBytes have no before-image: a change to one is
// recorded (by size) but cannot be restored or reverted, and Exec reports it
// in Outcome.Unrestored. Modification times, owners, hard links and
// extended attributes are not restored. Permission bits are restored with
// the adapter's Chmod (ChmodFS) or the WithChmod hook; without either a file
// is recreated with its mode, which the adapter's umask may narrow (the
// outcome says so). One Journal value serialises the mutations it runs; two
// processes writing one workspace's journal at once are not supported.
package journal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// Dir is where a workspace's journal lives when it has no store of its own
// (protected and excluded by the default globs, as all of .sandboxd/ is).
const Dir = ".sandboxd/journal"

// Defaults of the options.
const (
	DefaultMaxBlobBytes = 16 << 20
	DefaultMaxCommits   = 500
)

// ChmodFS is a FileSystem that can set a file's permission bits. The journal
// uses it, when an adapter has it, to restore modes exactly.
type ChmodFS interface {
	workspace.FileSystem
	Chmod(ctx context.Context, name string, mode fs.FileMode) error
}

// Entry is the state of one path. The zero Entry is "absent".
type Entry struct {
	// Type is "file", "dir", "symlink" or "other"; "" when the path does not
	// exist.
	Type string `json:"type,omitempty"`
	// Mode is the permission bits (with setuid, setgid and sticky).
	Mode fs.FileMode `json:"mode,omitempty"`
	// Size is a file's size.
	Size int64 `json:"size,omitempty"`
	// Hash is the SHA-256 of a file's contents, whose bytes the journal keeps;
	// "" for a file over MaxBlobBytes (not kept, so not restorable).
	Hash string `json:"hash,omitempty"`
	// Target is a link's target.
	Target string `json:"target,omitempty"`
}

// Exists reports whether the entry is a present path.
func (e Entry) Exists() bool { return e.Type != "" }

// same reports whether two states are the same for the journal: type, mode,
// contents (by hash, or by size when unhashed) and link target.
func (e Entry) same(o Entry) bool {
	if e.Type != o.Type || e.Mode != o.Mode || e.Target != o.Target {
		return false
	}
	if e.Type != "file" {
		return true
	}
	if e.Hash == "" || o.Hash == "" {
		return e.Hash == o.Hash && e.Size == o.Size
	}
	return e.Hash == o.Hash
}

// restorable reports whether the journal can recreate the state.
func (e Entry) restorable() bool { return e.Type != "file" || e.Hash != "" || e.Size == 0 }

// Change is one path's state before and after a commit.
type Change struct {
	Path   string `json:"path"`
	Before Entry  `json:"before"`
	After  Entry  `json:"after"`
}

// Kind says what the change did: "added", "deleted" or "modified".
func (c Change) Kind() string {
	switch {
	case !c.Before.Exists():
		return "added"
	case !c.After.Exists():
		return "deleted"
	}
	return "modified"
}

// Commit is one entry of the journal.
type Commit struct {
	ID      int       `json:"id"`
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
	Changes []Change  `json:"changes"`

	inline []string // the hashes of the contents its record holds
	// Where its record is: in the segment whose first commit is seg, at
	// offset at, n bytes; seg 0 for a record in a file of its own.
	seg   int
	at, n int
}

// record is a commit as the store keeps it: with, inline, the contents of
// small files its changes name (inlineMax), which then need no file of
// their own.
type record struct {
	*Commit
	Inline map[string][]byte `json:"inline,omitempty"`
}

// inlineMax bounds the contents a commit's record holds itself. A write's
// before- and after-images of a small file so cost the store one file (the
// record), not three: a file created is most of what the store costs.
const inlineMax = 4 << 10

// Summary describes a commit without its changes, for lists.
type Summary struct {
	ID       int       `json:"id"`
	Time     time.Time `json:"time"`
	Message  string    `json:"message"`
	Added    int       `json:"added"`
	Modified int       `json:"modified"`
	Deleted  int       `json:"deleted"`
	Paths    []string  `json:"paths"`
}

// Summary returns the commit's summary.
func (c *Commit) Summary() Summary {
	s := Summary{ID: c.ID, Time: c.Time, Message: c.Message, Paths: []string{}}
	for _, ch := range c.Changes {
		switch ch.Kind() {
		case "added":
			s.Added++
		case "deleted":
			s.Deleted++
		default:
			s.Modified++
		}
		s.Paths = append(s.Paths, ch.Path)
	}
	return s
}

// Option configures Open.
type Option func(*Journal)

// WithStore keeps the journal — its commits and the contents it keeps — at
// the root of store rather than under Dir in the workspace. A store the
// workspace's processes cannot write (a directory of the daemon's, outside
// a session's container) is what makes the journal safe from the session it
// protects; Open loads the commits already there.
func WithStore(store workspace.FileSystem) Option {
	return func(j *Journal) { j.store, j.dir, j.inside = store, ".", false }
}

// InMemory keeps the journal in memory, in a store of its own that no
// process can reach and that lives as long as the Journal: WithStore over
// an empty in-memory file system. It is what a host that gives the journal
// no store of its own gets (tools.Env.JournalStore nil).
func InMemory() Option { return WithStore(memfs.New()) }

// WithRoot sets the workspace root as commands see it, used to resolve links
// with absolute targets (default "/workspace").
func WithRoot(root string) Option { return func(j *Journal) { j.root = root } }

// WithMaxBlobBytes sets the largest file whose bytes the journal keeps.
func WithMaxBlobBytes(n int64) Option { return func(j *Journal) { j.maxBlob = n } }

// WithMaxCommits sets how many commits the journal keeps; older ones are
// dropped, with the contents only they referenced.
func WithMaxCommits(n int) Option { return func(j *Journal) { j.maxCommits = n } }

// WithChmod gives the journal a way to set permission bits on an adapter
// that is not a ChmodFS (the tool layer runs chmod through the Bash port).
func WithChmod(f func(ctx context.Context, name string, mode fs.FileMode) error) Option {
	return func(j *Journal) { j.chmod = f }
}

// WithCommitScope limits what a workspace session (Exec, a provider
// session's End) keeps: a change to a path committable rejects — and that
// holds for no path below it — is restored as a failed run's changes are,
// and listed in Outcome.OutOfScope; the rest is committed. A directory is
// kept when it or anything kept below it is committable. Changes made
// through Record are not filtered: the caller's FileSystem decides those.
func WithCommitScope(committable func(name string) bool) Option {
	return func(j *Journal) { j.committable = committable }
}

// WithClock sets the clock commits are stamped with (for tests).
func WithClock(now func() time.Time) Option { return func(j *Journal) { j.now = now } }

// Journal is one workspace's journal. It is safe for concurrent use; the
// mutations it runs (Record, Exec, Revert, provider sessions) run one at a
// time.
type Journal struct {
	fs         workspace.FileSystem
	store      workspace.FileSystem // where commits and objects are kept
	dir        string               // their directory in store
	inside     bool                 // the store is the workspace, which its processes can write
	root       string
	maxBlob    int64
	maxCommits int
	chmod      func(ctx context.Context, name string, mode fs.FileMode) error
	now        func() time.Time
	// committable, when set, is the commit scope of workspace sessions.
	committable func(name string) bool

	// ownMu guards owned: what sandboxd wrote in .sandboxd/ during the
	// workspace session open now, as it left it (Own); nil when none is.
	ownMu sync.Mutex
	owned map[string]*manEntry

	mu      sync.Mutex // held by each mutation
	commits []*Commit  // oldest first
	nextID  int
	shards  map[string]bool // object directories known to exist
	// pending are the small contents (inlineMax) the recorder's writes
	// reported, by hash, until Record's commit keeps them in its record or
	// Record ends; inlined names, for contents kept that way, a commit whose
	// record holds them.
	pending  map[string][]byte
	inlined  map[string]int
	base     map[string]manEntry // the baseline manifest; nil until the first Exec
	baseTime time.Time           // when the baseline's listing began
	active   *Session
	tail     segment   // the segment commits are appended to
	dropped  []*Commit // pruned, their contents not yet removed (pruneBatch)
}

// Open opens the journal of the workspace fsys, loading the commits already
// in its store (under Dir, or WithStore's). It creates nothing until the
// first commit. A record that is not well formed — a path that is not a
// clean workspace name, a hash that is not a SHA-256 — fails it.
func Open(ctx context.Context, fsys workspace.FileSystem, opts ...Option) (*Journal, error) {
	j := &Journal{fs: fsys, store: fsys, dir: Dir, inside: true, root: "/workspace", maxBlob: DefaultMaxBlobBytes, maxCommits: DefaultMaxCommits,
		now: time.Now, nextID: 1, shards: map[string]bool{}, pending: map[string][]byte{}, inlined: map[string]int{}}
	for _, o := range opts {
		o(j)
	}
	if c, ok := fsys.(ChmodFS); ok && j.chmod == nil {
		j.chmod = c.Chmod
	}
	if err := j.load(ctx); err != nil {
		return nil, err
	}
	return j, nil
}

// wellFormed reports whether a loaded commit names only clean workspace
// paths and SHA-256 hashes, so that no record can lead the journal's reads
// and writes elsewhere.
func (c *Commit) wellFormed() bool {
	for _, ch := range c.Changes {
		if !fs.ValidPath(ch.Path) || ch.Path == "." || ignored(ch.Path) {
			return false
		}
		for _, h := range []string{ch.Before.Hash, ch.After.Hash} {
			if _, err := hex.DecodeString(h); err != nil || h != "" && (len(h) != 2*sha256.Size || strings.ToLower(h) != h) {
				return false
			}
		}
	}
	return true
}

func (j *Journal) commitsDir() string { return path.Join(j.dir, "commits") }

func (j *Journal) commitName(id int) string {
	return path.Join(j.commitsDir(), fmt.Sprintf("%08d.json", id))
}

func (j *Journal) objectName(hash string) string {
	return path.Join(j.dir, "objects", hash[:2], hash[2:])
}

// ignored reports whether a workspace name is the journal's own business:
// everything under .sandboxd/ (the journal, spilled output, sources).
func ignored(name string) bool {
	return name == ".sandboxd" || strings.HasPrefix(name, ".sandboxd/")
}

// List returns the summaries of the commits kept, newest first.
func (j *Journal) List() []Summary {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]Summary, 0, len(j.commits))
	for i := len(j.commits) - 1; i >= 0; i-- {
		out = append(out, j.commits[i].Summary())
	}
	return out
}

// Get returns commit id, or an error carrying workspace.ErrNotFound.
func (j *Journal) Get(id int) (*Commit, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.get(id)
}

func (j *Journal) get(id int) (*Commit, error) {
	for _, c := range j.commits {
		if c.ID == id {
			return c, nil
		}
	}
	return nil, workspace.PathError("journal", fmt.Sprintf("commit %d", id), workspace.ErrNotFound)
}

// errAltered marks kept contents that no longer match their hash; it
// matches workspace.ErrUnavailable.
var errAltered = workspace.Errorf(workspace.ErrUnavailable, "the journal's copy was altered (its SHA-256 no longer matches): it is not used")

// readBlob returns the contents kept under hash, checked against it: a copy
// that does not match (the store was written by something else) fails with
// workspace.ErrUnavailable and errAltered, never returning its bytes.
func (j *Journal) readBlob(ctx context.Context, hash string) ([]byte, error) {
	if p, ok := j.pending[hash]; ok {
		return p, nil
	}
	id, ok := j.inlined[hash]
	if !ok { // its record was pruned: a later one may hold it too
		for _, c := range slices.Backward(j.commits) {
			if slices.Contains(c.inline, hash) {
				id, ok = c.ID, true
				j.inlined[hash] = id
				break
			}
		}
	}
	if ok {
		data, err := j.readInline(ctx, id, hash)
		if err != nil {
			return nil, err
		}
		return checked(data, hash)
	}
	return j.readObject(ctx, hash)
}

// readObject is readBlob of the file of its own that kept contents have
// when they are not a record's.
func (j *Journal) readObject(ctx context.Context, hash string) ([]byte, error) {
	data, err := j.store.ReadFile(ctx, j.objectName(hash), j.maxBlob)
	if err != nil {
		return nil, err
	}
	return checked(data, hash)
}

// checked returns data when its SHA-256 is hash, else errAltered.
func checked(data []byte, hash string) ([]byte, error) {
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hash {
		return nil, errAltered
	}
	return data, nil
}

// readInline reads the contents of hash from the record of commit id.
func (j *Journal) readInline(ctx context.Context, id int, hash string) ([]byte, error) {
	c, err := j.get(id)
	if err != nil {
		return nil, errAltered
	}
	rec, err := j.readRecord(ctx, c)
	if err != nil {
		return nil, err
	}
	data, ok := rec.Inline[hash]
	if !ok {
		return nil, errAltered
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// heldState is fileState for the recorder's writes: small contents are
// held (pending) for the commit's record, not written on their own.
func (j *Journal) heldState(ctx context.Context, mode fs.FileMode, data []byte) (Entry, error) {
	if len(data) > inlineMax || int64(len(data)) > j.maxBlob {
		return j.fileState(ctx, mode, data)
	}
	sum := sha256.Sum256(data)
	e := Entry{Type: "file", Mode: mode, Size: int64(len(data)), Hash: hex.EncodeToString(sum[:])}
	j.pending[e.Hash] = data
	return e, nil
}

// putBlob keeps data under its hash (once) and returns the hash.
func (j *Journal) putBlob(ctx context.Context, data []byte) (string, error) {
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	name := j.objectName(hash)
	if j.shards[hash[:2]] {
		// A copy is kept once. In a store of its own, an object that exists
		// is the one written; inside the workspace, a process may have
		// planted it, so it is checked (and replaced when it does not match).
		if j.inside {
			if _, err := j.readObject(ctx, hash); err == nil {
				return hash, nil
			}
		} else if _, err := j.store.Lstat(ctx, name); err == nil {
			return hash, nil
		}
	} else {
		if err := workspace.MkdirAll(ctx, j.store, path.Dir(name), 0o700); err != nil {
			return "", fmt.Errorf("journal: %w", err)
		}
		j.shards[hash[:2]] = true
	}
	if err := j.store.WriteFile(ctx, name, data, 0o600); err != nil {
		return "", fmt.Errorf("journal: %w", err)
	}
	return hash, nil
}

// state reads the state of name, keeping a file's bytes (up to the cap).
func (j *Journal) state(ctx context.Context, name string) (Entry, error) {
	info, err := j.fs.Lstat(ctx, name)
	if errors.Is(err, workspace.ErrNotFound) {
		return Entry{}, nil
	}
	if err != nil {
		return Entry{}, err
	}
	return j.stateOf(ctx, name, info.Mode(), info.Size(), j.target(ctx, name))
}

// target reads the target of the link name, for stateOf.
func (j *Journal) target(ctx context.Context, name string) func() (string, error) {
	return func() (string, error) {
		sl, ok := j.fs.(workspace.SymlinkFS)
		if !ok {
			return "", errNoLinks
		}
		return sl.Readlink(ctx, name)
	}
}

// errNoLinks: the workspace cannot read links; a link's state is kept
// without its target.
var errNoLinks = errors.New("no links")

// stateOf is the state of the entry name, of the mode and size given; the
// contents of a file are read and kept, and target gives a link's.
func (j *Journal) stateOf(ctx context.Context, name string, mode fs.FileMode, size int64, target func() (string, error)) (Entry, error) {
	e := Entry{Type: typeOf(mode), Mode: mode & modeBits}
	switch e.Type {
	case "file":
		e.Size = size
		if e.Size > j.maxBlob {
			return e, nil
		}
		data, err := j.fs.ReadFile(ctx, name, j.maxBlob)
		if errors.Is(err, workspace.ErrFileTooLarge) {
			return e, nil
		}
		if err != nil {
			return Entry{}, err
		}
		return j.fileState(ctx, e.Mode, data)
	case "symlink":
		t, err := target()
		if err == errNoLinks {
			return e, nil
		}
		if err != nil {
			return Entry{}, err
		}
		e.Target = t
	}
	return e, nil
}

// fileState is the state of a regular file with permission bits mode and
// contents data, which it keeps (when within MaxBlobBytes).
func (j *Journal) fileState(ctx context.Context, mode fs.FileMode, data []byte) (Entry, error) {
	e := Entry{Type: "file", Mode: mode, Size: int64(len(data))}
	if e.Size > j.maxBlob {
		return e, nil
	}
	var err error
	if e.Hash, err = j.putBlob(ctx, data); err != nil {
		return Entry{}, err
	}
	return e, nil
}

const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

func typeOf(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "file"
	case fs.ModeDir:
		return "dir"
	case fs.ModeSymlink:
		return "symlink"
	}
	return "other"
}

// commit stores a new commit of changes (those whose states differ), prunes
// old commits and returns it; nil when nothing changed.
func (j *Journal) commit(ctx context.Context, message string, changes []Change) (*Commit, error) {
	changes = slices.DeleteFunc(changes, func(c Change) bool { return c.Before.same(c.After) })
	if len(changes) == 0 {
		return nil, nil
	}
	slices.SortFunc(changes, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	c := &Commit{ID: j.nextID, Time: j.now().UTC(), Message: message, Changes: changes}
	rec := record{Commit: c}
	for _, ch := range changes {
		for _, h := range []string{ch.Before.Hash, ch.After.Hash} {
			if data, ok := j.pending[h]; ok && rec.Inline[h] == nil {
				if rec.Inline == nil {
					rec.Inline = map[string][]byte{}
				}
				rec.Inline[h] = data
				c.inline = append(c.inline, h)
			}
		}
	}
	if err := j.appendRecord(ctx, rec); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	j.nextID++
	j.commits = append(j.commits, c)
	for _, h := range c.inline {
		j.inlined[h] = c.ID
	}
	j.prune(ctx)
	return c, nil
}

// prune drops the commits past maxCommits and, every pruneBatch commits
// dropped, the kept contents nothing else refers to. Failures leave garbage
// behind, never a damaged journal.
func (j *Journal) prune(ctx context.Context) {
	if j.maxCommits <= 0 || len(j.commits) <= j.maxCommits {
		return
	}
	drop := j.commits[:len(j.commits)-j.maxCommits]
	j.commits = slices.Clone(j.commits[len(drop):])
	for i, c := range drop {
		for _, h := range c.inline { // held by a later record (readBlob finds it), or by no one
			if j.inlined[h] == c.ID {
				delete(j.inlined, h)
			}
		}
		lastOfSegment := i == len(drop)-1 || drop[i+1].seg != c.seg
		switch {
		case c.seg == 0:
			_ = j.store.Remove(ctx, j.commitName(c.ID))
		case lastOfSegment && j.commits[0].seg != c.seg: // no commit kept is in it
			_ = j.store.Remove(ctx, j.segmentName(c.seg))
		}
	}
	// Which contents are still referred to is a look at every commit kept:
	// done once for a batch of dropped commits, not for each.
	j.dropped = append(j.dropped, drop...)
	if len(j.dropped) < pruneBatch {
		return
	}
	live := map[string]bool{}
	for _, c := range j.commits {
		for _, ch := range c.Changes {
			live[ch.Before.Hash], live[ch.After.Hash] = true, true
		}
	}
	for _, m := range j.base {
		live[m.state.Hash] = true
	}
	for _, c := range j.dropped {
		for _, ch := range c.Changes {
			for _, h := range []string{ch.Before.Hash, ch.After.Hash} {
				if h != "" && !live[h] {
					live[h] = true // removed once
					_ = j.store.Remove(ctx, j.objectName(h))
				}
			}
		}
	}
	j.dropped = nil
}

// pruneBatch is how many dropped commits wait for their contents' removal.
const pruneBatch = 32
