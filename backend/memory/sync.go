package memory

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// entry is what the cache knows of one workspace entry: the FileSystem's
// state and the host's when the two last held the same thing.
type entry struct {
	mem  memState
	host hostState
	sum  [sha256.Size]byte // a regular file's contents
	seen time.Time         // when host was taken
}

// racyWindow is how close to the time it was recorded a file's modification
// time must be for a rewrite of the same size to keep it: such files are
// hashed rather than trusted (as git does with "racily clean" entries).
const racyWindow = 2 * time.Second

// racy reports whether a rewrite of the host file could hide behind an
// unchanged size and modification time.
func (e *entry) racy() bool {
	return e.host.mode.IsRegular() && !e.host.mtime.Before(e.seen.Add(-racyWindow))
}

// keepBits are the mode bits compared and copied: the type and the
// permission bits, setuid, setgid and sticky included.
const keepBits = fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// memState is an entry as the FileSystem describes it.
type memState struct {
	mode  fs.FileMode
	size  int64
	mtime time.Time
}

func memStateOf(fi fs.FileInfo) memState {
	return memState{mode: fi.Mode() & keepBits, size: fi.Size(), mtime: fi.ModTime()}
}

// same reports whether m and o describe the same entry. A directory's size
// and time change with its entries, which are compared one by one.
func (m memState) same(o memState) bool {
	return m.mode == o.mode && (m.mode.IsDir() || m.size == o.size && m.mtime.Equal(o.mtime))
}

// hostState is an entry of the host directory.
type hostState struct {
	mode   fs.FileMode
	size   int64
	mtime  time.Time
	ino    uint64
	ctime  int64  // nanoseconds where the system reports it, else 0
	links  uint64 // hard links: not compared
	target string // a link's
}

func hostStateOf(fi fs.FileInfo) hostState {
	h := hostState{mode: fi.Mode() & keepBits, size: fi.Size(), mtime: fi.ModTime()}
	h.ino, h.ctime, h.links = sysStat(fi)
	return h
}

// same reports whether h and o describe the same entry: a file whose size,
// times and inode are unchanged is taken to hold the same bytes (unless it
// is racy).
func (h hostState) same(o hostState) bool {
	if h.mode != o.mode {
		return false
	}
	switch h.mode.Type() {
	case fs.ModeDir:
		return true
	case fs.ModeSymlink:
		return h.target == o.target
	}
	return h.size == o.size && h.mtime.Equal(o.mtime) && h.ino == o.ino && h.ctime == o.ctime
}

// copied reports whether an entry of type mode is copied between the
// FileSystem and the host: directories, regular files and links are;
// special files are not.
func copied(mode fs.FileMode) bool {
	switch mode.Type() {
	case 0, fs.ModeDir, fs.ModeSymlink:
		return true
	}
	return false
}

// scanMem lists the FileSystem's tree: the state of every entry that is
// copied, and their names in walk order (parents first), the root "." first.
// Links are not followed. A directory that vanishes during the scan is
// skipped. With roots (see topmost), it lists only the entries at and under
// them; a root that does not exist, or is not copied, is left out.
func (b *Mirror) scanMem(ctx context.Context, roots []string) (map[string]memState, []string, error) {
	mem := map[string]memState{}
	var order []string
	walk := func(dir string) error {
		w, err := workspace.Walk(ctx, b.fsys, workspace.WalkRequest{Dir: dir, Info: true, Errors: true})
		if err != nil {
			if dir != "." && (errors.Is(err, workspace.ErrNotFound) || errors.Is(err, workspace.ErrNotADirectory)) {
				return nil // removed or replaced meanwhile
			}
			return err
		}
		for _, e := range w.Entries {
			switch {
			case e.Err != nil: // a directory below that could not be listed
				if !errors.Is(e.Err, workspace.ErrNotFound) && !errors.Is(e.Err, workspace.ErrNotADirectory) {
					return e.Err
				} // else removed or replaced meanwhile
			default:
				fi, ok := e.FileInfo() // not ok: vanished since the listing
				if ok && copied(fi.Mode()) {
					mem[e.Path] = memStateOf(fi)
					order = append(order, e.Path)
				}
			}
		}
		return nil
	}
	if roots == nil {
		fi, err := b.fsys.Stat(ctx, ".")
		if err != nil {
			return nil, nil, err
		}
		mem["."], order = memStateOf(fi), []string{"."}
		return mem, order, walk(".")
	}
	for _, root := range roots {
		fi, err := b.fsys.Lstat(ctx, root)
		if err != nil {
			if skipVanished(err) != nil {
				return nil, nil, err
			}
			continue
		}
		if !copied(fi.Mode()) {
			continue
		}
		mem[root] = memStateOf(fi)
		order = append(order, root)
		if fi.IsDir() {
			if err := walk(root); err != nil {
				return nil, nil, err
			}
		}
	}
	return mem, order, nil
}

// topmost returns names sorted, without repeats and without the names that
// lie under another of them: the roots of the subtrees they name. It
// returns nil (everything) when one of them is the root ".".
func topmost(names []string) []string {
	slices.Sort(names) // parents before children
	out := []string{}
	kept := map[string]bool{}
	for _, n := range names {
		if n == "." {
			return nil
		}
		covered := kept[n]
		for d := path.Dir(n); d != "." && !covered; d = path.Dir(d) {
			covered = kept[d]
		}
		if !covered {
			kept[n] = true
			out = append(out, n)
		}
	}
	return out
}

// under reports whether name is root or lies under it.
func under(name, root string) bool {
	return name == root || strings.HasPrefix(name, root+"/")
}

// underAny reports whether name is at or under one of roots (nil: all).
func underAny(name string, roots []string) bool {
	if roots == nil {
		return true
	}
	for _, r := range roots {
		if under(name, r) {
			return true
		}
	}
	return false
}

// hostTree is a listing of the host directory.
type hostTree struct {
	entries map[string]hostState
	order   []string // walk order, parents first, "." first
	opaque  []string // directories that could not be listed
	at      time.Time
}

// hidden reports whether name lies under a directory that could not be
// listed, so that its absence from the listing means nothing.
func (t *hostTree) hidden(name string) bool {
	for _, d := range t.opaque {
		if d == "." || strings.HasPrefix(name, d+"/") {
			return true
		}
	}
	return false
}

// scanHost lists the host directory without following links. A directory
// its owner may not list and enter is given those rights back first (its
// bits are recorded as they were); one that still cannot be listed is
// opaque. With roots (see topmost), it lists only the entries at and under
// them.
func (b *Mirror) scanHost(roots []string) (*hostTree, error) {
	t := &hostTree{entries: map[string]hostState{}, at: time.Now()}
	visit := func(p string, d fs.DirEntry, err error) error {
		rel, rerr := filepath.Rel(b.root, p)
		if rerr != nil {
			return rerr
		}
		name := filepath.ToSlash(rel)
		if err != nil {
			if d == nil && name == "." {
				return err
			}
			if d != nil && d.IsDir() { // listing it failed
				t.opaque = append(t.opaque, name)
			}
			return nil // gone meanwhile, or listed no further
		}
		fi, err := d.Info()
		if err != nil || !copied(fi.Mode()) {
			return nil
		}
		h := hostStateOf(fi)
		switch {
		case fi.IsDir() && fi.Mode().Perm()&0o700 != 0o700:
			_ = os.Chmod(p, fi.Mode().Perm()|0o700)
		case fi.Mode()&fs.ModeSymlink != 0:
			if h.target, err = os.Readlink(p); err != nil {
				return nil
			}
		}
		t.entries[name] = h
		t.order = append(t.order, name)
		return nil
	}
	if roots == nil {
		if err := filepath.WalkDir(b.root, visit); err != nil {
			return nil, unavailable("scan", b.root, err)
		}
		return t, nil
	}
	for _, root := range roots {
		if err := filepath.WalkDir(b.hostPath(root), visit); err != nil {
			return nil, unavailable("scan", root, err)
		}
	}
	return t, nil
}

func (b *Mirror) hostPath(name string) string { return filepath.Join(b.root, filepath.FromSlash(name)) }

// prepare makes the host directory hold what the FileSystem holds, rewriting
// only the entries that changed on either side since they were last the
// same. When the FileSystem says where it changed (changeLog) since the last
// prepare, it looks only there and at the names collect left pending: the
// host directory changes only under commands, and collect looked at all of
// it after the last one.
func (b *Mirror) prepare(ctx context.Context) error {
	var roots []string // nil: everything
	var gen uint64
	if b.log != nil {
		// Asked first: what changes from here on is in the next answer.
		var names []string
		var ok bool
		names, gen, ok = b.log.Changes(b.synced)
		if ok && b.fresh {
			roots = topmost(append(names, slices.Collect(maps.Keys(b.pending))...))
		}
	}
	if err := b.mirror(ctx, roots); err != nil {
		return err
	}
	b.synced, b.fresh, b.pending = gen, b.log != nil, nil
	return nil
}

// mirror is prepare's work at and under roots (nil: everywhere).
func (b *Mirror) mirror(ctx context.Context, roots []string) error {
	if roots != nil && len(roots) == 0 {
		return nil
	}
	mem, order, err := b.scanMem(ctx, roots)
	if err != nil {
		return err
	}
	host, err := b.scanHost(roots)
	if err != nil {
		return err
	}
	// Clear what the workspace no longer has, or has as another type;
	// children before their parents.
	for _, name := range slices.Backward(host.order) {
		h := host.entries[name]
		if m, ok := mem[name]; ok && m.mode.Type() == h.mode.Type() {
			continue
		}
		if err := os.RemoveAll(b.hostPath(name)); err != nil {
			return unavailable("prepare", name, err)
		}
		delete(host.entries, name)
	}
	for name := range b.snap {
		if _, ok := mem[name]; !ok && underAny(name, roots) {
			delete(b.snap, name)
		}
	}
	var dirs []string
	for _, name := range order {
		if err := ctx.Err(); err != nil {
			return err
		}
		m := mem[name]
		if m.mode.IsDir() {
			dirs = append(dirs, name)
		}
		h, onHost := host.entries[name]
		if e := b.snap[name]; e != nil && onHost && e.mem.same(m) && e.host.same(h) {
			continue
		}
		delete(b.snap, name)
		if err := b.materialise(ctx, name, m, onHost); err != nil {
			return err
		}
	}
	// Directories get their bits last, so that a read-only one could be
	// filled first.
	for _, name := range slices.Backward(dirs) {
		p, m := b.hostPath(name), mem[name]
		fi, err := os.Lstat(p)
		if err == nil && fi.Mode()&keepBits != m.mode {
			err = os.Chmod(p, m.mode&^fs.ModeType)
			if err == nil {
				fi, err = os.Lstat(p)
			}
		}
		if err != nil {
			return unavailable("prepare", name, err)
		}
		b.snap[name] = &entry{mem: m, host: hostStateOf(fi), seen: time.Now()}
	}
	return nil
}

// materialise writes the FileSystem's entry name, in state m, to the host
// directory and records it. A directory is only made (its bits come later).
// An entry that changed type or vanished since the scan is left for the next
// Run.
func (b *Mirror) materialise(ctx context.Context, name string, m memState, onHost bool) error {
	p := b.hostPath(name)
	e := &entry{mem: m}
	var err error
	switch m.mode.Type() {
	case fs.ModeDir:
		if !onHost {
			err = os.Mkdir(p, 0o700)
		}
		if err != nil {
			return unavailable("prepare", name, err)
		}
		return nil
	case 0:
		data, rerr := b.fsys.ReadFile(ctx, name, math.MaxInt64)
		if rerr != nil {
			return skipVanished(rerr)
		}
		e.sum = sha256.Sum256(data)
		err = writeHostFile(p, data, m.mode.Perm()|m.mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), m.mtime)
	case fs.ModeSymlink:
		if b.links == nil {
			return nil
		}
		target, rerr := b.links.Readlink(ctx, name)
		if rerr != nil {
			return skipVanished(rerr)
		}
		if onHost {
			_ = os.Remove(p)
		}
		err = os.Symlink(b.toHost(target), p)
	}
	if err != nil {
		return unavailable("prepare", name, err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return unavailable("prepare", name, err)
	}
	e.host = hostStateOf(fi)
	if fi.Mode()&fs.ModeSymlink != 0 {
		e.host.target, _ = os.Readlink(p)
	}
	e.seen = time.Now()
	b.snap[name] = e
	return nil
}

// skipVanished passes over an entry that changed under the scan — removed,
// or replaced by another type — and fails on anything else.
func skipVanished(err error) error {
	if errors.Is(err, workspace.ErrNotFound) || errors.Is(err, workspace.ErrNotAFile) ||
		errors.Is(err, workspace.ErrInvalidArgument) || errors.Is(err, workspace.ErrNotADirectory) {
		return nil
	}
	return err
}

// writeHostFile replaces the host file p with data, mode and mtime, through
// a temporary file beside it.
func writeHostFile(p string, data []byte, mode fs.FileMode, mtime time.Time) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".memexec-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chtimes(tmp, mtime, mtime)
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// notes gathers what collect has to tell the command's reader, up to a cap.
type notes struct {
	lines []string
	more  int
}

const maxNotes = 20

func (n *notes) add(format string, args ...any) {
	if len(n.lines) == maxNotes {
		n.more++
		return
	}
	n.lines = append(n.lines, fmt.Sprintf(format, args...))
}

func (n *notes) list() []string {
	if n.more > 0 {
		return append(n.lines, fmt.Sprintf("%d more entries were not copied back", n.more))
	}
	return n.lines
}

const kept = "%s changed in the workspace while the command ran: the workspace's version is kept, the command's change is not copied back"

// collect copies what the command changed in the host directory back into
// the FileSystem, and returns what it could not copy. It fails only when the
// host directory cannot be listed.
//
// With w, the watch kept while the command ran, it looks only where the
// events say something changed, and at the files that have other hard
// links (a write through a name outside the directory raises no event);
// without it, or when the events do not tell it all, everywhere.
//
// Every name it finds changed, and every directory it cannot list, is left
// pending for the next prepare to look at, whatever became of the copy: one
// that failed or lost to the workspace is undone there.
func (b *Mirror) collect(ctx context.Context, w *watcher) ([]string, error) {
	var roots []string // nil: everything
	if w != nil {
		if names, ok := w.changes(); ok {
			roots = topmost(append(names, slices.Collect(maps.Keys(b.shared))...))
		}
	}
	if roots != nil && len(roots) == 0 {
		return nil, nil
	}
	host, err := b.scanHost(roots)
	if err != nil {
		return nil, err
	}
	if b.pending == nil {
		b.pending = map[string]bool{}
	}
	for _, d := range host.opaque {
		b.pending[d] = true
	}
	for _, name := range host.order {
		if h := host.entries[name]; h.mode.IsRegular() && h.links > 1 {
			b.shared[name] = true
		} else {
			delete(b.shared, name)
		}
	}
	var n notes
	var known []string
	for name := range b.snap {
		if roots == nil || underAny(name, roots) {
			known = append(known, name)
		}
	}
	slices.Sort(known)
	// Removals (and entries that changed type), children first.
	for _, name := range slices.Backward(known) {
		e := b.snap[name]
		if h, ok := host.entries[name]; name == "." || ok && h.mode.Type() == e.host.mode.Type() || host.hidden(name) {
			continue
		}
		b.pending[name] = true
		if b.changedMeanwhile(ctx, name, e) {
			n.add(kept, name)
			continue
		}
		if err := b.fsys.Remove(ctx, name); err != nil && !errors.Is(err, workspace.ErrNotFound) {
			if errors.Is(err, workspace.ErrNotEmpty) {
				n.add(kept, name)
			} else {
				n.add("%s: the command removed it, but removing it from the workspace failed: %v", name, err)
			}
			continue
		}
		delete(b.snap, name)
	}
	// Creations and changes, parents first.
	for _, name := range host.order {
		h := host.entries[name]
		e := b.snap[name]
		switch {
		case name == ".": // the root is made and removed by no one
			if e != nil && !e.host.same(h) {
				b.pending[name] = true // its bits: restored as for any directory
			}
		case e == nil || e.host.mode.Type() != h.mode.Type():
			b.pending[name] = true
			b.create(ctx, &n, name, h, host.at)
		case !e.host.same(h) || e.racy():
			b.pending[name] = true
			b.update(ctx, &n, name, e, h, host.at)
		}
	}
	return n.list(), nil
}

// changedMeanwhile reports whether the FileSystem's entry name is no longer
// what e recorded: changed, removed or replaced through the FileSystem while
// the command ran.
func (b *Mirror) changedMeanwhile(ctx context.Context, name string, e *entry) bool {
	fi, err := b.fsys.Lstat(ctx, name)
	return err != nil || !e.mem.same(memStateOf(fi))
}

// create copies an entry the command made into the FileSystem.
func (b *Mirror) create(ctx context.Context, n *notes, name string, h hostState, at time.Time) {
	if _, err := b.fsys.Lstat(ctx, name); !errors.Is(err, workspace.ErrNotFound) {
		if err == nil {
			n.add(kept, name)
		} else {
			n.add("%s: not copied back: %v", name, err)
		}
		return
	}
	e := &entry{host: h, seen: at}
	var err error
	switch h.mode.Type() {
	case fs.ModeDir:
		err = b.fsys.Mkdir(ctx, name, h.mode.Perm())
	case fs.ModeSymlink:
		err = b.symlink(ctx, h.target, name)
	default:
		var data []byte
		if data, err = readHostFile(b.hostPath(name)); err == nil {
			e.sum = sha256.Sum256(data)
			err = b.fsys.WriteFile(ctx, name, data, h.mode&^fs.ModeType)
		}
	}
	b.record(ctx, n, name, e, err)
}

// update copies a change the command made to an entry the cache knows.
func (b *Mirror) update(ctx context.Context, n *notes, name string, e *entry, h hostState, at time.Time) {
	next := &entry{host: h, sum: e.sum, seen: at}
	var err error
	switch h.mode.Type() {
	case fs.ModeDir:
		return // the port cannot change a directory's bits: the next Run restores them
	case fs.ModeSymlink:
		if b.changedMeanwhile(ctx, name, e) {
			n.add(kept, name)
			return
		}
		err = b.replace(ctx, name, func(tmp string) error { return b.symlink(ctx, h.target, tmp) })
	default:
		data, rerr := readHostFile(b.hostPath(name))
		if rerr != nil {
			n.add("%s: not copied back: %v", name, rerr)
			return
		}
		next.sum = sha256.Sum256(data)
		newMode := h.mode != e.host.mode
		if next.sum == e.sum && !newMode { // touched, or rewritten with the same bytes
			next.mem = e.mem
			b.snap[name] = next
			return
		}
		if b.changedMeanwhile(ctx, name, e) {
			n.add(kept, name)
			return
		}
		if newMode { // only a new file takes the bits
			err = b.replace(ctx, name, func(tmp string) error { return b.fsys.WriteFile(ctx, tmp, data, h.mode&^fs.ModeType) })
		} else {
			err = b.fsys.WriteFile(ctx, name, data, 0)
		}
	}
	b.record(ctx, n, name, next, err)
}

// record ends a copy into the FileSystem: on success the entry is cached
// with the FileSystem's new state; on failure the failure is noted and the
// cache keeps the old record, so the next Run gives the command the
// FileSystem's version.
func (b *Mirror) record(ctx context.Context, n *notes, name string, e *entry, err error) {
	if err == nil {
		var fi fs.FileInfo
		if fi, err = b.fsys.Lstat(ctx, name); err == nil {
			e.mem = memStateOf(fi)
			b.snap[name] = e
			return
		}
	}
	n.add("%s: not copied back: %v", name, err)
}

// replace makes name anew through a temporary name beside it, which make
// creates, and a rename over name.
func (b *Mirror) replace(ctx context.Context, name string, make func(tmp string) error) error {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(path.Dir(name), ".memexec-"+hex.EncodeToString(rnd[:])+"-"+path.Base(name))
	err := make(tmp)
	if err == nil {
		err = b.fsys.Rename(ctx, tmp, name)
	}
	if err != nil {
		_ = b.fsys.Remove(ctx, tmp)
	}
	return err
}

// symlink makes name a link in the FileSystem to the host target, turned
// into the workspace's terms.
func (b *Mirror) symlink(ctx context.Context, target, name string) error {
	if b.links == nil {
		return workspace.PathError("symlink", name, workspace.ErrForbidden)
	}
	return b.links.Symlink(ctx, b.toMem(target), name)
}

// readHostFile reads a regular host file, refusing (without blocking) one
// that was replaced by a pipe or device since it was listed.
func readHostFile(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, workspace.PathError("read", p, workspace.ErrNotAFile)
	}
	return io.ReadAll(f)
}

// toHost turns a link target of the FileSystem into one for the host
// directory: an absolute target under the workspace root moves under Root.
func (b *Mirror) toHost(target string) string {
	if rest, ok := cutRoot(target, b.memRoot); ok {
		return b.root + rest
	}
	return target
}

// toMem is toHost's inverse, for links the command made.
func (b *Mirror) toMem(target string) string {
	for _, a := range b.aliases {
		if rest, ok := cutRoot(filepath.ToSlash(target), filepath.ToSlash(a)); ok {
			if t := strings.TrimSuffix(b.memRoot, "/") + rest; t != "" {
				return t
			}
			return "/"
		}
	}
	return target
}

// cutRoot returns what follows root in target ("" or "/…") when target is
// root or lies under it.
func cutRoot(target, root string) (string, bool) {
	if !path.IsAbs(target) {
		return "", false
	}
	if target == root {
		return "", true
	}
	rest, ok := strings.CutPrefix(target, strings.TrimSuffix(root, "/")+"/")
	return "/" + rest, ok
}
