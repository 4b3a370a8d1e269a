package snapshot

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Store is the daemon's snapshot store, a directory of its own. It is safe
// for concurrent use; one daemon opens a directory at a time.
type Store struct {
	dir  string
	o    options
	lock *os.File // held (flock) while the store is open

	mu     sync.Mutex
	spaces map[string]*space // by directory, relative to dir
}

// space is one tenant's snapshots, or the templates.
type space struct {
	dir    string // relative to the store's: "tenants/t-…", "templates"
	tenant string // "" for the templates
	snaps  map[string]*record
	// pending is what snapshots being made hold of the caps so far.
	pendingCount int
	pendingBytes int64
}

// record is a snapshot's info.json: its Info and whose it is.
type record struct {
	Info
	Tenant string `json:"tenant,omitempty"`
	// Transient snapshots (a fork's) are not listed, count against no
	// cap, and are removed when the store is opened again.
	Transient bool `json:"transient,omitempty"`
}

// Files of a snapshot's directory.
const (
	packFile     = "data.tar"
	manifestFile = "manifest.json"
	infoFile     = "info.json"
)

// Option configures Open.
type Option func(*options)

type options struct {
	limits Limits
	logger *slog.Logger
	sync   bool
}

// WithLimits caps each tenant's snapshots (default: no cap).
func WithLimits(l Limits) Option { return func(o *options) { o.limits = l } }

// WithLogger logs what Open finds amiss (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithSync(false) leaves a snapshot's files to the kernel to write out
// rather than flushing them before the snapshot is reported (default true:
// a snapshot outlives a crash of the host, not only of the daemon). For
// tests and benchmarks.
func WithSync(on bool) Option { return func(o *options) { o.sync = on } }

// Open opens the store in dir, creating it (mode 0700) when missing, and
// holds it (an flock of dir/.lock) until Close: a second Open of the same
// directory, in this process or another, fails while it is held. It
// removes what a snapshot being made or removed when the daemon stopped
// left, and the transient snapshots of forks, and reads the index of the
// rest. A snapshot whose info.json cannot be read is logged and left alone
// on disk, not listed.
func Open(dir string, opts ...Option) (*Store, error) {
	o := options{logger: slog.New(slog.DiscardHandler), sync: true}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(lock, 64))
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("snapshot store: %s is in use by another daemon (%s): stop it, or give this daemon another name (\"daemon\" in the configuration; its store is then its own) or another snapshots.dir",
				dir, cmp.Or(strings.TrimSpace(string(holder)), "its pid unknown"))
		}
		return nil, fmt.Errorf("snapshot store: locking %s: %w", dir, err)
	}
	// Who holds it, for the error of another that tries.
	if err := lock.Truncate(0); err == nil {
		lock.WriteAt([]byte(fmt.Sprintf("pid %d\n", os.Getpid())), 0)
	}
	s := &Store{dir: dir, o: o, lock: lock, spaces: map[string]*space{}}
	top, err := os.ReadDir(dir)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	if err := s.index(top); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close lets the store go: another Open of its directory may then hold
// it. Snapshots are not touched.
func (s *Store) Close() error {
	if s.lock == nil {
		return nil
	}
	return s.lock.Close() // the flock goes with the descriptor
}

// index removes the leftovers among the store's entries top and reads the
// index of its snapshots.
func (s *Store) index(top []os.DirEntry) error {
	for _, e := range top {
		if strings.HasPrefix(e.Name(), tmpPrefix) || strings.HasPrefix(e.Name(), trashPrefix) {
			if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
				return fmt.Errorf("snapshot store: removing a leftover: %w", err)
			}
		}
	}
	tenants, err := os.ReadDir(filepath.Join(s.dir, tenantsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("snapshot store: %w", err)
	}
	for _, t := range tenants {
		if err := s.load(filepath.Join(tenantsDir, t.Name())); err != nil {
			return err
		}
	}
	return s.load(templatesDir)
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

const (
	tenantsDir   = "tenants"
	templatesDir = "templates"
	tmpPrefix    = ".tmp-"
	trashPrefix  = ".trash-"
)

// load reads the index of one space's directory.
func (s *Store) load(rel string) error {
	entries, err := os.ReadDir(filepath.Join(s.dir, rel))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(s.dir, rel, e.Name())
		rec, err := readRecord(filepath.Join(p, infoFile))
		if err != nil {
			s.o.logger.Warn("snapshot store: a snapshot's record is unreadable; it is not listed (remove its directory once it is no longer wanted)", "dir", p, "err", err)
			continue
		}
		if rec.Transient {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("snapshot store: removing a fork's snapshot: %w", err)
			}
			continue
		}
		if rec.ID != e.Name() {
			s.o.logger.Warn("snapshot store: a snapshot's record names another directory; it is not listed", "dir", p, "id", rec.ID)
			continue
		}
		sp := s.spaceAt(rel, rec.Tenant)
		sp.snaps[rec.ID] = rec
	}
	return nil
}

func readRecord(name string) (*record, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// spaceAt returns the space of directory rel, made on first use; s.mu is
// held or the store is not yet shared.
func (s *Store) spaceAt(rel, tenant string) *space {
	sp := s.spaces[rel]
	if sp == nil {
		sp = &space{dir: rel, tenant: tenant, snaps: map[string]*record{}}
		s.spaces[rel] = sp
	}
	return sp
}

// tenantSpace returns tenant's space; s.mu is held.
func (s *Store) tenantSpace(tenant string) *space {
	sum := sha256.Sum256([]byte(tenant))
	return s.spaceAt(filepath.Join(tenantsDir, "t-"+hex.EncodeToString(sum[:12])), tenant)
}

// lookup returns the record of id in sp, or ErrNotFound.
func (s *Store) lookup(sp *space, id string) (*record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := sp.snaps[id]
	if rec == nil {
		if sp.tenant == "" {
			return nil, fmt.Errorf("%w: no template named %q", ErrNotFound, id)
		}
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return rec, nil
}

// Get returns the tenant's snapshot id, or fails with ErrNotFound.
func (s *Store) Get(tenant, id string) (Info, error) {
	rec, err := s.lookup(s.tenant(tenant), id)
	if err != nil || rec.Transient {
		return Info{}, cmp.Or(err, fmt.Errorf("%w: %s", ErrNotFound, id))
	}
	return rec.Info, nil
}

func (s *Store) tenant(tenant string) *space {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tenantSpace(tenant)
}

func (s *Store) templates() *space {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spaceAt(templatesDir, "")
}

// List returns the tenant's snapshots, oldest first.
func (s *Store) List(tenant string) []Info {
	return s.list(s.tenant(tenant))
}

func (s *Store) list(sp *space) []Info {
	s.mu.Lock()
	var out []Info
	for _, rec := range sp.snaps {
		if !rec.Transient {
			out = append(out, rec.Info)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Info) int { return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID)) })
	return out
}

// Delete removes the tenant's snapshot id, or fails with ErrNotFound.
// Restores under way read on to their end.
func (s *Store) Delete(tenant, id string) error {
	return s.remove(s.tenant(tenant), id)
}

func (s *Store) remove(sp *space, id string) error {
	s.mu.Lock()
	rec := sp.snaps[id]
	if rec == nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	delete(sp.snaps, id)
	s.mu.Unlock()
	// Out of sight at once (a rename), then removed.
	trash := filepath.Join(s.dir, trashPrefix+randomHex())
	if err := os.Rename(filepath.Join(s.dir, sp.dir, id), trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // its files were gone already
		}
		s.mu.Lock()
		sp.snaps[id] = rec
		s.mu.Unlock()
		return fmt.Errorf("snapshot store: removing %s: %w", id, err)
	}
	return os.RemoveAll(trash)
}

// Usage is what a tenant's snapshots hold.
type Usage struct {
	Count       int   `json:"count"`
	StoredBytes int64 `json:"storedBytes"`
}

// Usage returns what the tenant's snapshots hold, and its limits.
func (s *Store) Usage(tenant string) (Usage, Limits) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tenantSpace(tenant).usage(), s.o.limits
}

// usage counts sp's lasting snapshots; s.mu is held.
func (sp *space) usage() Usage {
	var u Usage
	for _, rec := range sp.snaps {
		if !rec.Transient {
			u.Count++
			u.StoredBytes += rec.StoredBytes
		}
	}
	return u
}

// Stats is what the whole store holds, for metrics.
type Stats struct {
	// Snapshots and StoredBytes count the tenants' snapshots, forks'
	// transient ones included; Templates and TemplateBytes the templates.
	Snapshots, Templates       int
	StoredBytes, TemplateBytes int64
}

// Stats returns what the store holds.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st Stats
	for _, sp := range s.spaces {
		for _, rec := range sp.snaps {
			if sp.tenant == "" {
				st.Templates++
				st.TemplateBytes += rec.StoredBytes
			} else {
				st.Snapshots++
				st.StoredBytes += rec.StoredBytes
			}
		}
	}
	return st
}

// CreateRequest says what a snapshot is of.
type CreateRequest struct {
	// Session names the session the tree is of (Info.Session).
	Session string
	// Transient makes a snapshot for a moment (a fork's): not listed,
	// counted against no cap, removed by Delete or when the store is
	// opened again.
	Transient bool
	// Tee, when not nil, is given the snapshot's pack as it is written,
	// byte for byte: the stream Restore writes of the snapshot once it is
	// made, passed on before the snapshot is whole — whether it is, and
	// its manifest, Create says when it returns. A Tee that fails fails the
	// snapshot.
	Tee io.Writer
}

// A Source writes a tree to w as a tar stream whose names are relative to
// the tree's root, parents before their children (as a walk gives them).
// Directories, regular files and symbolic links are kept; a hard link
// becomes a file with its target's contents; other entries are skipped
// (Info.Skipped), and so is ".sandboxd" at the root. A Source's error
// fails the snapshot; when the store stops reading (a cap reached), w's
// writes fail and the Source must return.
type Source func(ctx context.Context, w io.Writer) error

// Create makes a snapshot of the tenant's from src. It fails with
// ErrLimit when the tenant is at its cap of snapshots, or src's tree would
// take it past its cap of bytes; with ErrNoSpace when the disk fills; with
// ErrInvalid when the tree cannot be saved; and with src's error. On
// failure nothing is left in the store.
func (s *Store) Create(ctx context.Context, tenant string, src Source, req CreateRequest) (Info, error) {
	if tenant == "" {
		return Info{}, errors.New("snapshot store: a snapshot needs a tenant")
	}
	s.mu.Lock()
	sp := s.tenantSpace(tenant)
	res, err := s.reserve(sp, !req.Transient)
	s.mu.Unlock()
	if err != nil {
		return Info{}, err
	}
	defer res.release()
	rec := &record{Info: Info{ID: newID(), Session: req.Session}, Tenant: tenant, Transient: req.Transient}
	tmp, err := s.build(ctx, rec, src, res, req.Tee)
	if err != nil {
		return Info{}, err
	}
	if err := s.commit(sp, rec, tmp, res); err != nil {
		return Info{}, err
	}
	return rec.Info, nil
}

// Restore writes the tenant's snapshot id to w as a tar stream (names
// relative to the root, directories before what they hold), checking it
// against its manifest as it goes: it fails with ErrCorrupt, naming what
// differs, at the first entry that is not what the manifest says (w may
// then have taken part of the tree: the caller discards what it made of
// it), and with ErrNotFound when the tenant has no such snapshot.
func (s *Store) Restore(ctx context.Context, tenant, id string, w io.Writer) error {
	sp := s.tenant(tenant)
	rec, err := s.lookup(sp, id)
	if err != nil {
		return err
	}
	return s.restore(ctx, sp, rec, w)
}

// Verify reads the tenant's snapshot id through as Restore does, writing
// nothing: nil when it is whole.
func (s *Store) Verify(ctx context.Context, tenant, id string) error {
	return s.Restore(ctx, tenant, id, io.Discard)
}

// PutTemplate makes the template name from src, in place of the one of
// that name (which restores under way read on to their end). A template
// whose tree has not changed is kept as it was (the same Created). Names
// are letters, digits, '.', '_' and '-'.
func (s *Store) PutTemplate(ctx context.Context, name string, src Source) (Info, error) {
	if !templateName.MatchString(name) {
		return Info{}, fmt.Errorf("%w: template name %q: use letters, digits, '.', '_' and '-' (at most 64, not starting with '.')", ErrInvalid, name)
	}
	sp := s.templates()
	s.mu.Lock()
	res, _ := s.reserve(sp, false)
	old := sp.snaps[name]
	s.mu.Unlock()
	defer res.release()
	rec := &record{Info: Info{ID: name}}
	tmp, err := s.build(ctx, rec, src, res, nil)
	if err != nil {
		return Info{}, err
	}
	if old != nil && old.Manifest == rec.Manifest {
		return old.Info, os.RemoveAll(tmp)
	}
	if err := s.commit(sp, rec, tmp, res); err != nil {
		return Info{}, err
	}
	return rec.Info, nil
}

var templateName = regexp.MustCompile(`^[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,63}$`)

// Template returns the template name, or fails with ErrNotFound.
func (s *Store) Template(name string) (Info, error) {
	rec, err := s.lookup(s.templates(), name)
	if err != nil {
		return Info{}, err
	}
	return rec.Info, nil
}

// Templates lists the templates, oldest first.
func (s *Store) Templates() []Info { return s.list(s.templates()) }

// RestoreTemplate is Restore of the template name.
func (s *Store) RestoreTemplate(ctx context.Context, name string, w io.Writer) error {
	sp := s.templates()
	rec, err := s.lookup(sp, name)
	if err != nil {
		return err
	}
	return s.restore(ctx, sp, rec, w)
}

// DeleteTemplate removes the template name, or fails with ErrNotFound.
func (s *Store) DeleteTemplate(name string) error { return s.remove(s.templates(), name) }

// reservation is what a snapshot being made holds of its tenant's caps.
type reservation struct {
	s       *Store
	sp      *space
	counted bool  // it holds one of the count, and its bytes are capped
	bytes   int64 // held of the bytes cap
}

// reserve takes one of sp's count (when counted) for a snapshot to be
// made; s.mu is held.
func (s *Store) reserve(sp *space, counted bool) (*reservation, error) {
	r := &reservation{s: s, sp: sp, counted: counted && sp.tenant != ""}
	if !r.counted {
		return r, nil
	}
	lim := s.o.limits
	u := sp.usage()
	if lim.Count > 0 && u.Count+sp.pendingCount >= lim.Count {
		return nil, fmt.Errorf("%w: it keeps %d snapshots, its cap (snapshots.maxCount; %d more being made): delete one (sandboxd snapshot rm ID) or ask the operator for more",
			ErrLimit, u.Count, sp.pendingCount)
	}
	sp.pendingCount++
	return r, nil
}

// take holds n more bytes, or fails with ErrLimit when they would take the
// tenant past its cap.
// A negative n gives bytes back.
func (r *reservation) take(n int64) error {
	if r == nil {
		return nil
	}
	if !r.counted {
		r.bytes += n
		return nil
	}
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	lim := r.s.o.limits.Bytes
	used := r.sp.usage().StoredBytes
	if n > 0 && lim > 0 && used+r.sp.pendingBytes+n > lim {
		return fmt.Errorf("%w: this snapshot would take its snapshots past %d bytes, its cap (snapshots.maxBytes; they hold %d, and this one %d so far): delete some (sandboxd snapshot rm ID), or leave large files out of the workspace",
			ErrLimit, lim, used, r.bytes+n)
	}
	r.sp.pendingBytes += n
	r.bytes += n
	return nil
}

// settle turns the reservation into the snapshot rec, kept in sp.
func (r *reservation) settle(rec *record) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.sp.snaps[rec.ID] = rec
	r.releaseLocked()
}

func (r *reservation) release() {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.releaseLocked()
}

func (r *reservation) releaseLocked() {
	if r.counted {
		r.sp.pendingCount--
		r.sp.pendingBytes -= r.bytes
		r.counted = false
	}
	r.bytes = 0
}

// newID names a new snapshot.
func newID() string { return "snap-" + strings.ToLower(rand.Text()[:16]) }

func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// now is the clock of Created, in UTC to the microsecond.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
