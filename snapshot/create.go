package snapshot

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// build reads src into a new directory under a temporary name in the
// store and returns it: the pack flushed, read back and checked against
// its manifest, the manifest's digest and the rest of rec filled in. On
// failure nothing is left.
// A tee that is not nil is given the pack as it is written.
func (s *Store) build(ctx context.Context, rec *record, src Source, res *reservation, tee io.Writer) (_ string, err error) {
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix)
	if err != nil {
		return "", s.diskErr("making a snapshot", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	pack, err := os.OpenFile(filepath.Join(tmp, packFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", s.diskErr("making a snapshot", err)
	}
	defer pack.Close()

	pr, pw := io.Pipe()
	srcDone := make(chan error, 1)
	go func() {
		err := src(ctx, pw)
		pw.CloseWithError(err) // nil: the end of the stream
		srcDone <- err
	}()
	c := &capture{s: s, rec: rec, res: res, pack: pack, tee: tee}
	man, cerr := c.run(ctx, pr)
	if cerr == nil {
		// What a source writes past the archive's end is read and dropped,
		// up to a bound, so that it can return.
		if n, _ := io.Copy(io.Discard, io.LimitReader(pr, 1<<20)); n == 1<<20 {
			cerr = fmt.Errorf("%w: the workspace's archive goes on past its end", ErrInvalid)
		}
	}
	pr.CloseWithError(errStopped)
	srcErr := <-srcDone
	var se sourceError
	switch {
	case errors.As(cerr, &se) || cerr == nil && srcErr != nil:
		return "", fmt.Errorf("snapshot: reading the workspace: %w", cmpErr(srcErr, se.err))
	case cerr != nil:
		return "", cerr
	}

	data, err := json.Marshal(man)
	if err != nil {
		return "", err
	}
	rec.Manifest = man.Digest()
	rec.Created = now()
	if err := s.writeFile(filepath.Join(tmp, manifestFile), data); err != nil {
		return "", err
	}
	info, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	if err := s.writeFile(filepath.Join(tmp, infoFile), info); err != nil {
		return "", err
	}
	if rec.Transient {
		// A fork's: read once, by the forks' restores, each checked as it
		// goes; nothing is kept past a crash.
		return tmp, nil
	}
	// Checked when made: the pack as stored is read back against the
	// manifest made from the stream, while it is flushed to the disk.
	synced := make(chan error, 1)
	go func() { synced <- s.sync(pack) }()
	verr := verify(ctx, man, io.NewSectionReader(pack, 0, rec.StoredBytes), io.Discard, func(what string) error {
		return fmt.Errorf("snapshot: the pack was not stored as it was read (%s): %w", what, ErrCorrupt)
	})
	if err := cmpErr(verr, <-synced); err != nil {
		return "", err
	}
	if err := s.syncDir(tmp); err != nil {
		return "", s.diskErr("making a snapshot", err)
	}
	return tmp, nil
}

// sync flushes a pack to the disk, when the store syncs.
func (s *Store) sync(f *os.File) error {
	if !s.o.sync {
		return nil
	}
	if err := f.Sync(); err != nil {
		return s.diskErr("writing a snapshot", err)
	}
	return nil
}

// cmpErr is the first of its errors that is not nil.
func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// commit renames the snapshot built in tmp into sp's directory, in place of
// one of its ID (a template made again), and indexes it.
func (s *Store) commit(sp *space, rec *record, tmp string, res *reservation) error {
	parent := filepath.Join(s.dir, sp.dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		os.RemoveAll(tmp)
		return s.diskErr("making a snapshot", err)
	}
	final := filepath.Join(parent, rec.ID)
	var trash string
	if _, err := os.Lstat(final); err == nil {
		trash = filepath.Join(s.dir, trashPrefix+randomHex())
		if err := os.Rename(final, trash); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("snapshot store: replacing %s: %w", rec.ID, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		if trash != "" {
			os.Rename(trash, final)
		}
		os.RemoveAll(tmp)
		return fmt.Errorf("snapshot store: %w", err)
	}
	if err := s.syncDir(parent); err != nil {
		s.o.logger.Warn("snapshot store: flushing a directory failed", "dir", parent, "err", err)
	}
	res.settle(rec)
	if trash != "" {
		return os.RemoveAll(trash)
	}
	return nil
}

// writeFile writes a small file of a snapshot, flushed when the store
// syncs.
func (s *Store) writeFile(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return s.diskErr("making a snapshot", err)
	}
	_, err = f.Write(data)
	if err == nil && s.o.sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return s.diskErr("making a snapshot", err)
	}
	return nil
}

func (s *Store) syncDir(dir string) error {
	if !s.o.sync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return cmpErr(err, d.Close())
}

// diskErr is err of the store's disk, as ErrNoSpace when the disk or a
// quota is full.
func (s *Store) diskErr(doing string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w (%s, while %s): free space there, or lower the tenants' caps of snapshots (snapshots.maxBytes): %v", ErrNoSpace, s.dir, doing, err)
	}
	return fmt.Errorf("snapshot store: %s: %w", doing, err)
}

// errStopped is what a Source's writes fail with once the store stops
// reading.
var errStopped = errors.New("the snapshot store stopped reading the tree")

// sourceError is a failure to read the source's stream.
type sourceError struct{ err error }

func (e sourceError) Error() string { return e.err.Error() }
func (e sourceError) Unwrap() error { return e.err }

// capture turns a source's tar stream into a pack and its manifest; with
// no pack (Describe), into the manifest alone.
type capture struct {
	s    *Store
	rec  *record
	res  *reservation // nil: no cap
	pack *os.File
	tee  io.Writer // given the pack as it is written; nil for none
	cw   countWriter
	bw   *bufio.Writer
	tw   *tar.Writer
	man  Manifest
	// kinds is the type of every entry so far; files where each file's
	// contents lie in the pack (for the hard links to it).
	kinds map[string]string
	files map[string]fileAt
	buf   []byte
}

type fileAt struct {
	off, size int64
	sum       string
}

// countWriter counts what it writes to the pack; with a file, it has the
// kernel start writing each writebackChunk out as it is passed.
type countWriter struct {
	w    io.Writer
	n    int64
	file *os.File
	done int64 // what writeback was started for
}

// writebackChunk is how much of a pack is written before the kernel is
// asked to start writing it out.
const writebackChunk = 16 << 20

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if c.file != nil && c.n-c.done >= writebackChunk {
		startWriteback(c.file, c.done, c.n-c.done)
		c.done = c.n
	}
	return n, err
}

// pos is the pack's length so far, buffered bytes included.
func (c *capture) pos() int64 { return c.cw.n + int64(c.bw.Buffered()) }

func (c *capture) run(ctx context.Context, r io.Reader) (Manifest, error) {
	c.kinds, c.files = map[string]string{}, map[string]fileAt{}
	c.cw.w = io.Discard
	if c.pack != nil {
		c.cw.w = c.pack
		if c.s.o.sync && !c.rec.Transient {
			c.cw.file = c.pack
		}
		if c.tee != nil {
			c.cw.w = io.MultiWriter(c.pack, c.tee)
		}
	}
	c.bw = bufio.NewWriterSize(&c.cw, 1<<20)
	c.tw = tar.NewWriter(c.bw)
	c.buf = make([]byte, 256<<10)
	c.man = Manifest{Version: manifestVersion, Entries: []Entry{}}
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if n%256 == 0 && ctx.Err() != nil {
			return Manifest{}, context.Cause(ctx)
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Manifest{}, sourceError{err}
		}
		if err := c.entry(h, tr); err != nil {
			return Manifest{}, err
		}
	}
	// The trailer's two blocks.
	if err := c.res.take(1024); err != nil {
		return Manifest{}, err
	}
	if err := c.tw.Close(); err != nil {
		return Manifest{}, c.s.diskErr("writing a snapshot", err)
	}
	if err := c.bw.Flush(); err != nil {
		return Manifest{}, c.s.diskErr("writing a snapshot", err)
	}
	if c.res != nil {
		c.res.take(c.cw.n - c.res.bytes) // the estimates made exact
	}
	c.rec.StoredBytes = c.cw.n
	return c.man, nil
}

// entry takes one entry of the source's stream.
func (c *capture) entry(h *tar.Header, tr *tar.Reader) error {
	name, ok := cleanName(h.Name)
	if !ok {
		if name == "." {
			return nil // the root itself
		}
		return fmt.Errorf("%w: an entry named %q leaves the workspace", ErrInvalid, h.Name)
	}
	if name == ".sandboxd" || strings.HasPrefix(name, ".sandboxd/") {
		return nil
	}
	if _, dup := c.kinds[name]; dup {
		return fmt.Errorf("%w: %s is in the workspace's archive twice", ErrInvalid, name)
	}
	if err := c.parents(name); err != nil {
		return err
	}
	e := Entry{Path: name, Mode: fs.FileMode(h.Mode) & fs.ModePerm}
	var from *fileAt // a hard link's target
	switch h.Typeflag {
	case tar.TypeDir:
		e.Type = TypeDir
		c.rec.Dirs++
	case tar.TypeReg, tar.TypeGNUSparse:
		e.Type, e.Size = TypeFile, h.Size
	case tar.TypeLink:
		target, ok := cleanName(h.Linkname)
		f, found := c.files[target]
		if !ok || !found {
			return fmt.Errorf("%w: %s is a hard link to %q, which is no file before it", ErrInvalid, name, h.Linkname)
		}
		from = &f
		e.Type, e.Size = TypeFile, f.size
	case tar.TypeSymlink:
		e.Type, e.Target = TypeLink, h.Linkname
		c.rec.Links++
	default:
		if len(c.rec.Skipped) < maxSkipped {
			c.rec.Skipped = append(c.rec.Skipped, name+" ("+kindOf(h.Typeflag)+")")
		}
		return nil
	}
	c.kinds[name] = e.Type
	if e.Type == TypeFile {
		c.rec.Files++
		c.rec.Bytes += e.Size
	}
	before := c.pos()
	// Held before it is written, so a cap stops a large file at its
	// header; made exact once it is.
	est := 1536 + (e.Size+511)&^511
	if err := c.res.take(est); err != nil {
		return err
	}
	out := &tar.Header{Name: name, Mode: int64(e.Mode), Size: e.Size, Linkname: e.Target, ModTime: h.ModTime.Truncate(time.Second)}
	switch e.Type {
	case TypeDir:
		out.Typeflag, out.Name = tar.TypeDir, name+"/"
	case TypeFile:
		out.Typeflag = tar.TypeReg
	case TypeLink:
		out.Typeflag = tar.TypeSymlink
	}
	if err := c.tw.WriteHeader(out); err != nil {
		return c.s.diskErr("writing a snapshot", err)
	}
	if e.Type == TypeFile {
		off := c.pos()
		var src io.Reader = tr
		switch {
		case from != nil && c.pack == nil:
			src = io.LimitReader(zeros{}, from.size) // only the sum matters
		case from != nil:
			if err := c.bw.Flush(); err != nil {
				return c.s.diskErr("writing a snapshot", err)
			}
			src = io.NewSectionReader(c.pack, from.off, from.size)
		}
		sum, err := c.copy(name, e.Size, src, from != nil)
		if err != nil {
			return err
		}
		if from != nil {
			sum = from.sum
		}
		e.SHA256 = sum
		c.files[name] = fileAt{off: off, size: e.Size, sum: sum}
	}
	c.man.Entries = append(c.man.Entries, e)
	return c.res.take(c.pos() - before - est)
}

// copy copies size bytes of a file's contents from src to the pack and
// returns their SHA-256. A short source is the source's failure
// (fromPack: the pack's own).
func (c *capture) copy(name string, size int64, src io.Reader, fromPack bool) (string, error) {
	h := sha256.New()
	var done int64
	for done < size {
		n, rerr := src.Read(c.buf[:min(int64(len(c.buf)), size-done)])
		if n > 0 {
			h.Write(c.buf[:n])
			if _, err := c.tw.Write(c.buf[:n]); err != nil {
				return "", c.s.diskErr("writing a snapshot", err)
			}
			done += int64(n)
		}
		if rerr == io.EOF && done < size {
			rerr = io.ErrUnexpectedEOF
		}
		if rerr != nil && done < size {
			if fromPack {
				return "", c.s.diskErr("copying a hard link's contents", rerr)
			}
			return "", sourceError{fmt.Errorf("%s: %w", name, rerr)}
		}
	}
	return hexSum(h), nil
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// zeros reads as zero bytes without end.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// parents makes sure name's parents are directories of the tree, adding
// those the stream did not name (as a tar extractor would make them), and
// refuses an entry under a link or a file.
func (c *capture) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	switch k := c.kinds[dir]; k {
	case TypeDir:
		return nil
	case "":
		if err := c.parents(dir); err != nil {
			return err
		}
		return c.entry(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}, nil)
	default:
		return fmt.Errorf("%w: %s is under %s, which is a %s", ErrInvalid, name, dir, k)
	}
}

// cleanName returns a tar name cleaned and relative, or false with "." for
// the root and with the name for one that leaves it.
func cleanName(name string) (string, bool) {
	c := path.Clean("/" + name)[1:]
	if c == "" {
		return ".", false
	}
	if strings.HasPrefix(name, "/") || strings.HasPrefix(path.Clean(name), "../") || path.Clean(name) == ".." || strings.ContainsRune(name, 0) {
		return name, false
	}
	return c, true
}

func kindOf(t byte) string {
	switch t {
	case tar.TypeFifo:
		return "FIFO"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	}
	return fmt.Sprintf("tar type %q", t)
}
