package snapshot

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// maxManifestBytes bounds the manifest a restore reads.
const maxManifestBytes = 256 << 20

// restore writes rec's pack to w, checked as Restore says.
func (s *Store) restore(ctx context.Context, sp *space, rec *record, w io.Writer) error {
	return s.open(sp, rec, func(man Manifest, pack *os.File, corrupt func(string) error) error {
		defer pack.Close()
		return verify(ctx, man, pack, w, corrupt)
	})
}

// open checks rec's manifest against its digest and its pack's size, and
// passes them to use, with the error of a snapshot found damaged. use owns
// the pack.
func (s *Store) open(sp *space, rec *record, use func(man Manifest, pack *os.File, corrupt func(string) error) error) error {
	corrupt := func(what string) error {
		fix := fmt.Sprintf("delete it (sandboxd snapshot rm %s) and take another", rec.ID)
		name := "snapshot " + rec.ID
		if sp.tenant == "" {
			name, fix = "template "+rec.ID, "the daemon makes it again from its declaration when it starts"
		}
		return fmt.Errorf("%w: %s: %s; it is not restored: %s", ErrCorrupt, name, what, fix)
	}
	dir := filepath.Join(s.dir, sp.dir, rec.ID)
	data, err := readBounded(filepath.Join(dir, manifestFile), maxManifestBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return corrupt("its manifest is missing")
	}
	if err != nil {
		return corrupt("its manifest is unreadable: " + err.Error())
	}
	var man Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&man); err != nil {
		return corrupt(fmt.Sprintf("its manifest is unreadable (%v)", err))
	}
	if got := man.Digest(); got != rec.Manifest {
		return corrupt(fmt.Sprintf("its manifest was changed (%s, made as %s)", got, rec.Manifest))
	}
	if man.Version != manifestVersion {
		return corrupt(fmt.Sprintf("its manifest is of version %d, which this daemon does not read", man.Version))
	}
	pack, err := os.Open(filepath.Join(dir, packFile))
	if errors.Is(err, fs.ErrNotExist) {
		return corrupt("its pack is missing")
	}
	if err != nil {
		return corrupt("its pack is unreadable: " + err.Error())
	}
	st, err := pack.Stat()
	if err == nil && st.Size() != rec.StoredBytes {
		err = corrupt(fmt.Sprintf("its pack is %d bytes, and was made with %d: cut short or changed", st.Size(), rec.StoredBytes))
	} else if err != nil {
		err = corrupt("its pack is unreadable: " + err.Error())
	}
	if err != nil {
		pack.Close()
		return err
	}
	return use(man, pack, corrupt)
}

func readBounded(name string, max int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(data)) > max {
		err = fmt.Errorf("over %d bytes", max)
	}
	return data, err
}

// verify reads the pack r, passing its bytes on to w as they are read, and
// checks every entry against man: names, types, modes, sizes, link targets
// and contents, none missing and none more. A difference is corrupt's
// error; w's failure is returned as it is.
func verify(ctx context.Context, man Manifest, r io.Reader, w io.Writer, corrupt func(what string) error) error {
	ew := &errWriter{w: w}
	tr := tar.NewReader(io.TeeReader(r, ew))
	h := sha256.New()
	buf := make([]byte, 256<<10)
	for i, e := range man.Entries {
		if i%256 == 0 && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		hd, err := tr.Next()
		if ew.err != nil {
			return ew.err
		}
		if err == io.EOF {
			return corrupt(fmt.Sprintf("its pack ends before %s (entry %d of %d): cut short, or entries removed", e.Path, i+1, len(man.Entries)))
		}
		if err != nil {
			return corrupt(fmt.Sprintf("its pack is unreadable where %s should be: %v", e.Path, err))
		}
		if got := describe(hd); got != e.header() {
			return corrupt(fmt.Sprintf("the pack has %s where the manifest has %s", got, e.header()))
		}
		if e.Type != TypeFile {
			continue
		}
		h.Reset()
		n, err := io.CopyBuffer(h, tr, buf)
		if ew.err != nil {
			return ew.err
		}
		if err != nil || n != e.Size {
			return corrupt(fmt.Sprintf("the contents of %s are cut short (%d of %d bytes; %v)", e.Path, n, e.Size, err))
		}
		if got := hexSum(h); got != e.SHA256 {
			return corrupt(fmt.Sprintf("the contents of %s differ from the manifest (sha256 %s, want %s)", e.Path, got, e.SHA256))
		}
	}
	hd, err := tr.Next()
	if ew.err != nil {
		return ew.err
	}
	switch {
	case err == nil:
		return corrupt(fmt.Sprintf("its pack holds %s, which the manifest does not list", describe(hd)))
	case err != io.EOF:
		return corrupt(fmt.Sprintf("its pack is unreadable after its last entry: %v", err))
	}
	return nil
}

// header is how verify describes e, for comparison with a pack's header.
func (e Entry) header() string {
	switch e.Type {
	case TypeFile:
		return fmt.Sprintf("file %q (mode %v, %d bytes)", e.Path, e.Mode, e.Size)
	case TypeLink:
		return fmt.Sprintf("link %q (to %q)", e.Path, e.Target)
	}
	return fmt.Sprintf("%s %q (mode %v)", e.Type, e.Path, e.Mode)
}

// describe is a pack's header as Entry.header describes entries.
func describe(h *tar.Header) string {
	e := Entry{Path: strings.TrimSuffix(h.Name, "/"), Mode: fs.FileMode(h.Mode) & fs.ModePerm}
	switch h.Typeflag {
	case tar.TypeDir:
		e.Type = TypeDir
	case tar.TypeReg:
		e.Type, e.Size = TypeFile, h.Size
	case tar.TypeSymlink:
		e.Type, e.Target = TypeLink, h.Linkname
	default:
		return fmt.Sprintf("an entry %q of tar type %q", h.Name, h.Typeflag)
	}
	return e.header()
}

// errWriter keeps the first error of its writer.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

// Reader reads a snapshot's files by name, from its pack, which it holds
// open: it reads on after the snapshot is deleted (the pack's space is
// freed once the Reader is closed). Each file is checked against the
// manifest as it is read. It is what a session started from the snapshot
// held, for a later diff. It is safe for concurrent use.
type Reader struct {
	f       *os.File
	entries []Entry
	at      map[string]span
	corrupt func(what string) error
}

type span struct {
	off int64
	e   *Entry
}

// Reader opens the tenant's snapshot id for reading its files, after the
// checks Restore makes before its stream (the manifest's digest, the
// pack's size); it fails with ErrCorrupt or ErrNotFound as Restore does.
func (s *Store) Reader(tenant, id string) (*Reader, error) {
	sp := s.tenant(tenant)
	rec, err := s.lookup(sp, id)
	if err != nil {
		return nil, err
	}
	return s.reader(sp, rec)
}

// TemplateReader is Reader of the template name.
func (s *Store) TemplateReader(name string) (*Reader, error) {
	sp := s.templates()
	rec, err := s.lookup(sp, name)
	if err != nil {
		return nil, err
	}
	return s.reader(sp, rec)
}

func (s *Store) reader(sp *space, rec *record) (*Reader, error) {
	var r *Reader
	// restore's checks, with a writer that indexes instead of copying.
	err := s.open(sp, rec, func(man Manifest, pack *os.File, corrupt func(string) error) error {
		r = &Reader{f: pack, entries: man.Entries, at: map[string]span{}, corrupt: corrupt}
		cr := &countReader{r: pack}
		tr := tar.NewReader(cr)
		for i := range r.entries {
			e := &r.entries[i]
			h, err := tr.Next()
			if err != nil {
				return corrupt(fmt.Sprintf("its pack is unreadable where %s should be: %v", e.Path, err))
			}
			if got := describe(h); got != e.header() {
				return corrupt(fmt.Sprintf("the pack has %s where the manifest has %s", got, e.header()))
			}
			if e.Type == TypeFile {
				r.at[e.Path] = span{off: cr.n, e: e}
			}
		}
		return nil
	})
	if err != nil {
		if r != nil {
			r.f.Close()
		}
		return nil, err
	}
	return r, nil
}

// Entries lists the snapshot's entries, in the pack's order.
func (r *Reader) Entries() []Entry { return r.entries }

// ReadFile returns the contents of the snapshot's file name, or fails with
// ErrNotFound for a name that is no file of it and ErrCorrupt when they
// are not what the manifest says.
func (r *Reader) ReadFile(name string) ([]byte, error) {
	sp, ok := r.at[name]
	if !ok {
		return nil, fmt.Errorf("%w: no file %s in the snapshot", ErrNotFound, name)
	}
	data := make([]byte, sp.e.Size)
	if _, err := r.f.ReadAt(data, sp.off); err != nil {
		return nil, r.corrupt(fmt.Sprintf("the contents of %s are unreadable: %v", name, err))
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != sp.e.SHA256 {
		return nil, r.corrupt(fmt.Sprintf("the contents of %s differ from the manifest (sha256 %s, want %s)", name, got, sp.e.SHA256))
	}
	return data, nil
}

// Close releases the pack.
func (r *Reader) Close() error { return r.f.Close() }

// countReader counts what it reads of a pack: its position in it. It
// seeks, so that a tar.Reader skips contents it is not asked for.
type countReader struct {
	r io.ReadSeeker
	n int64
}

func (c *countReader) Seek(off int64, whence int) (int64, error) {
	pos, err := c.r.Seek(off, whence)
	if err == nil {
		c.n = pos
	}
	return pos, err
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
