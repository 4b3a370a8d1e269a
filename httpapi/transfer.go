package httpapi

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/workspace"
)

// maxTarEntries caps the entries of one upload.
const maxTarEntries = 100_000

// daemonDir is the workspace directory of sandboxd itself (spilled output,
// the journal); uploads may not write into it, under any case of its name,
// since a case-insensitive file system makes .SANDBOXD the same directory.
const daemonDir = ".sandboxd"

// TransferResult is the answer to an upload.
type TransferResult struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Links int   `json:"links"`
	Bytes int64 `json:"bytes"`
	// Baseline, for an upload with ?baseline=true, is the new baseline
	// taken just after it (runner.BaselineInfo).
	Baseline *runner.BaselineInfo `json:"baseline,omitempty"`
}

// upload extracts a tar stream into a directory of the workspace (created
// when missing). The whole stream is read and judged before anything is
// written: an absolute name, a ".." component, a link leading out of the
// workspace, an entry written through a link of the archive or an existing
// link that leads out, a device or FIFO, a hard link, or more than the
// transfer cap, refuses the upload with nothing written.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	sess, dir, ok := s.sessionPath(w, r)
	if !ok {
		return
	}
	rebase := false
	if v := r.URL.Query().Get("baseline"); v != "" || r.URL.Query().Has("baseline") {
		var err error
		if rebase, err = strconv.ParseBool(v); err != nil {
			writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), "baseline: want true or false, not "+strconv.Quote(v))
			return
		}
	}
	body := http.MaxBytesReader(w, r.Body, s.o.maxTransfer)
	var res TransferResult
	var spool *spoolFile
	defer func() {
		if spool != nil {
			spool.Close()
		}
	}()
	// read reads and judges the stream, and returns the writing of what
	// it holds.
	read := func(ctx context.Context) (func(context.Context) error, error) {
		var err error
		if spool, err = newSpool(); err != nil {
			return nil, err
		}
		entries, err := readTar(body, dir, sess.Root(), s.o.maxTransfer, spool)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			if err := checkTargets(ctx, sess.FS(), sess.Root(), dir, entries); err != nil {
				return err
			}
			res, err = extract(ctx, leaseOf(r.Context()), sess.FS(), dir, entries, spool)
			return err
		}, nil
	}
	var err error
	if rebase {
		// The baseline is the tree just after the upload: no other call
		// that may change the workspace runs between the two.
		var info runner.BaselineInfo
		if info, err = s.rebaseline(r, sess, read); err == nil {
			res.Baseline = &info
		}
	} else {
		err = sess.Do(r.Context(), "upload", func(ctx context.Context) (bool, error) {
			write, err := read(ctx)
			if err == nil {
				err = write(ctx)
			}
			return false, err
		})
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// sessionPath finds the request's session and the workspace name its path
// names, or answers the error.
func (s *Server) sessionPath(w http.ResponseWriter, r *http.Request) (*runner.Session, string, bool) {
	sess, ok := s.session(w, r)
	if !ok {
		return nil, "", false
	}
	name, err := cleanName(r.PathValue("path"))
	if err != nil {
		s.fail(w, r, err)
		return nil, "", false
	}
	return sess, name, true
}

// cleanName turns the path of a files URL into a workspace name: "" is the
// root; absolute paths and ".." are refused.
func cleanName(p string) (string, error) {
	if p == "" {
		return ".", nil
	}
	if strings.HasPrefix(p, "/") {
		return "", workspace.PathError("upload", p, workspace.ErrOutsideWorkspace)
	}
	for part := range strings.SplitSeq(p, "/") {
		if part == ".." {
			return "", workspace.PathError("upload", p, workspace.ErrOutsideWorkspace)
		}
	}
	c := path.Clean(p)
	if !fs.ValidPath(c) || strings.IndexByte(c, 0) >= 0 {
		return "", workspace.PathError("upload", p, workspace.ErrInvalidArgument)
	}
	return c, nil
}

// tarEntry is one accepted entry of an upload, named in the workspace.
type tarEntry struct {
	name string
	typ  byte // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	mode fs.FileMode
	// off and size place a file's contents in the upload's spool.
	off, size int64
	link      string
}

// newSpool is where an upload's file contents wait while the whole stream
// is judged: a temporary file (in $TMPDIR), unlinked at once, so that an
// upload holds one file's bytes in memory at a time, not the whole archive,
// and nothing of it outlives the request. On a system that cannot unlink an
// open file the name stays until Close removes it.
func newSpool() (*spoolFile, error) {
	f, err := os.CreateTemp("", "sandboxd-upload-*")
	if err != nil {
		return nil, fmt.Errorf("upload: spool: %w", err)
	}
	unlinked := os.Remove(f.Name()) == nil
	return &spoolFile{File: f, unlinked: unlinked}, nil
}

type spoolFile struct {
	*os.File
	unlinked bool
}

// fill writes what r holds at the spool's end and returns its length;
// blocks of zeros are skipped, not written, so that a sparse entry's holes
// stay holes on disk too.
func (s *spoolFile) fill(r io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var n int64
	for {
		m, err := io.ReadFull(r, buf)
		if m > 0 {
			var werr error
			if p := buf[:m]; m == len(buf) && !slices.ContainsFunc(p, func(b byte) bool { return b != 0 }) {
				_, werr = s.Seek(int64(m), io.SeekCurrent)
			} else {
				_, werr = s.Write(p)
			}
			if werr != nil {
				return n, fmt.Errorf("upload: spool: %w", werr)
			}
			n += int64(m)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// A hole at the end: give the file its length.
			end, err := s.Seek(0, io.SeekCurrent)
			if err == nil {
				err = s.Truncate(end)
			}
			return n, err
		}
		if err != nil {
			return n, err
		}
	}
}

func (s *spoolFile) Close() error {
	err := s.File.Close()
	if !s.unlinked {
		os.Remove(s.Name())
	}
	return err
}

func refuse(name string, kind *workspace.Kind, why string) error {
	return &fs.PathError{Op: "upload", Path: name, Err: fmt.Errorf("%w: %s", kind, why)}
}

// readTar reads and judges a whole tar stream destined for dir.
// File contents go to spool, whose size is bounded by max: a sparse entry
// counts its whole size.
func readTar(r io.Reader, dir, root string, max int64, spool *spoolFile) ([]tarEntry, error) {
	tr := tar.NewReader(r)
	var entries []tarEntry
	var total int64
	links := map[string]bool{} // the archive's links, by workspace name
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, err
			}
			return nil, refuse("", workspace.ErrInvalidArgument, "not a tar stream: "+err.Error())
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if len(entries) >= maxTarEntries {
			return nil, tooLarge("the archive has more than %d entries", maxTarEntries)
		}
		rel, err := cleanName(hdr.Name)
		if err != nil {
			return nil, refuse(hdr.Name, workspace.KindOf(err), "names must be relative and stay below the upload directory")
		}
		name := path.Join(dir, rel)
		if first, _, _ := strings.Cut(name, "/"); strings.EqualFold(first, daemonDir) {
			return nil, refuse(hdr.Name, workspace.ErrProtected, daemonDir+"/ belongs to sandboxd")
		}
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if links[p] {
				return nil, refuse(hdr.Name, workspace.ErrOutsideWorkspace, "written through the archive's link "+p)
			}
		}
		e := tarEntry{name: name, typ: hdr.Typeflag, mode: fs.FileMode(hdr.Mode).Perm()}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if rel == "." {
				continue
			}
		case tar.TypeReg: // the reader reports the old TypeRegA as TypeReg
			e.typ = tar.TypeReg
			if rel == "." {
				return nil, refuse(hdr.Name, workspace.ErrInvalidArgument, "a file cannot replace the upload directory")
			}
			if hdr.Size > max-total {
				return nil, tooLarge("the archive's files hold more than %d bytes", max)
			}
			e.off = total
			if e.size, err = spool.fill(io.LimitReader(tr, max-total+1)); err != nil {
				return nil, err
			}
			if total += e.size; total > max {
				return nil, tooLarge("the archive's files hold more than %d bytes", max)
			}
		case tar.TypeSymlink:
			if rel == "." {
				return nil, refuse(hdr.Name, workspace.ErrInvalidArgument, "a link cannot replace the upload directory")
			}
			if leadsOut(root, name, hdr.Linkname) {
				return nil, refuse(hdr.Name, workspace.ErrOutsideWorkspace, "the link's target "+hdr.Linkname+" is outside the workspace")
			}
			e.link = hdr.Linkname
			links[name] = true
		case tar.TypeLink:
			return nil, refuse(hdr.Name, workspace.ErrInvalidArgument, "hard links are not accepted")
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			return nil, refuse(hdr.Name, workspace.ErrNotAFile, "devices and FIFOs are not accepted")
		default:
			return nil, refuse(hdr.Name, workspace.ErrInvalidArgument, fmt.Sprintf("entries of type %q are not accepted", hdr.Typeflag))
		}
		entries = append(entries, e)
	}
}

// leadsOut reports whether a link at name (a workspace name) with target
// would lead outside the workspace, lexically.
func leadsOut(root, name, target string) bool {
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		return true
	}
	if path.IsAbs(target) {
		_, err := workspace.Resolve(root, target)
		return err != nil
	}
	j := path.Join(path.Dir(name), target)
	return j == ".." || strings.HasPrefix(j, "../")
}

// checkTargets judges the entries, bound for dir, against the workspace as
// it is: every directory an entry goes into must be one (or not exist
// yet), reached without leaving the workspace, no entry may replace an
// entry of another kind, and none may land in sandboxd's own directory
// through the workspace's links, whatever its name says.
func checkTargets(ctx context.Context, fsys workspace.FileSystem, root, dir string, entries []tarEntry) error {
	if err := intoDaemonDir(ctx, fsys, root, dir, dir); err != nil {
		return err
	}
	for _, e := range entries {
		// A link entry is made where its name is, not followed.
		at := e.name
		if e.typ == tar.TypeSymlink {
			at = path.Dir(e.name)
		}
		if err := intoDaemonDir(ctx, fsys, root, e.name, at); err != nil {
			return err
		}
	}
	inArchive := map[string]byte{}
	for _, e := range entries {
		if typ, ok := inArchive[e.name]; ok && typ != e.typ {
			// Judged by its last kind, extracted as each in turn: refuse.
			return refuse(e.name, workspace.ErrInvalidArgument, "the archive names it twice, as different kinds")
		}
		inArchive[e.name] = e.typ
	}
	dirOK := map[string]error{}
	isDir := func(p string) error {
		if err, ok := dirOK[p]; ok {
			return err
		}
		var err error
		if typ, ok := inArchive[p]; ok && typ != tar.TypeDir {
			err = refuse(p, workspace.ErrNotADirectory, "the archive makes it a file or link, and puts entries in it")
		} else if !ok {
			info, serr := fsys.Stat(ctx, p)
			switch {
			case errors.Is(serr, workspace.ErrNotFound):
			case serr != nil:
				err = serr
			case !info.IsDir():
				err = refuse(p, workspace.ErrNotADirectory, "the workspace has a file there")
			}
		}
		dirOK[p] = err
		return err
	}
	if _, ok := fsys.(workspace.SymlinkFS); !ok {
		for _, e := range entries {
			if e.typ == tar.TypeSymlink {
				return refuse(e.name, workspace.ErrInvalidArgument, "this workspace cannot hold symbolic links")
			}
		}
	}
	for _, e := range entries {
		for p := path.Dir(e.name); ; p = path.Dir(p) {
			if err := isDir(p); err != nil {
				return err
			}
			if p == "." {
				break
			}
		}
		info, err := fsys.Lstat(ctx, e.name)
		if errors.Is(err, workspace.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSymlink != 0 && e.typ != tar.TypeSymlink {
			// A file or directory goes through the existing link: it must
			// stay inside and be of the same kind.
			if info, err = fsys.Stat(ctx, e.name); errors.Is(err, workspace.ErrNotFound) {
				return refuse(e.name, workspace.ErrInvalidArgument, "the workspace has a dangling link there")
			} else if err != nil {
				return err
			}
		}
		switch {
		case e.typ == tar.TypeDir && !info.IsDir():
			return refuse(e.name, workspace.ErrNotADirectory, "the workspace has a file there")
		case e.typ != tar.TypeDir && info.IsDir():
			return refuse(e.name, workspace.ErrNotAFile, "the workspace has a directory there")
		}
	}
	return nil
}

// intoDaemonDir refuses an upload of name when at, resolved through the
// workspace's links, is in sandboxd's own directory.
func intoDaemonDir(ctx context.Context, fsys workspace.FileSystem, root, name, at string) error {
	real, err := workspace.RealPath(ctx, fsys, root, at)
	if err != nil {
		return err
	}
	if first, _, _ := strings.Cut(real, "/"); strings.EqualFold(first, daemonDir) {
		return refuse(name, workspace.ErrProtected, fmt.Sprintf("it leads to %s, and %s/ belongs to sandboxd", real, daemonDir))
	}
	return nil
}

// extract writes judged entries. Each file's contents are in memory while
// it is written, drawn from the request's lease of the memory budget: an
// archive's size counts, not its size on the wire (a sparse entry of 3 KB
// that holds 256 MB costs 256 MB).
func extract(ctx context.Context, l *lease, fsys workspace.FileSystem, dir string, entries []tarEntry, spool io.ReaderAt) (TransferResult, error) {
	var res TransferResult
	if err := workspace.MkdirAll(ctx, fsys, dir, 0o755); err != nil {
		return res, err
	}
	for _, e := range entries {
		if err := workspace.MkdirAll(ctx, fsys, path.Dir(e.name), 0o755); err != nil {
			return res, err
		}
		switch e.typ {
		case tar.TypeDir:
			if err := workspace.MkdirAll(ctx, fsys, e.name, e.mode|0o700); err != nil {
				return res, err
			}
			res.Dirs++
		case tar.TypeReg:
			if err := l.take(e.size); err != nil {
				return res, err
			}
			data := make([]byte, e.size)
			_, err := spool.ReadAt(data, e.off)
			if err != nil && !(errors.Is(err, io.EOF) && e.size == 0) {
				l.put(e.size)
				return res, fmt.Errorf("upload: spool: %w", err)
			}
			err = fsys.WriteFile(ctx, e.name, data, e.mode|0o600)
			l.put(e.size)
			if err != nil {
				return res, err
			}
			res.Files++
			res.Bytes += e.size
		case tar.TypeSymlink:
			if err := fsys.Remove(ctx, e.name); err != nil && !errors.Is(err, workspace.ErrNotFound) {
				return res, err
			}
			if err := fsys.(workspace.SymlinkFS).Symlink(ctx, e.link, e.name); err != nil {
				return res, err
			}
			res.Links++
		}
	}
	return res, nil
}

// download answers a tar stream of a file or a directory of the workspace:
// a directory's entries are named relative to it, a file by its base name.
// A download of the root leaves sandboxd's bookkeeping (.sandboxd/) out;
// naming it downloads it.
// Links are kept as links, except those that lead outside the workspace
// (an upload would refuse them); pipes, sockets and devices are left out.
// Over the transfer cap is 413, and no room in the memory budget for its
// largest file is 503, before anything is sent.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	sess, name, ok := s.sessionPath(w, r)
	if !ok {
		return
	}
	started := false
	err := sess.Do(r.Context(), "download", func(ctx context.Context) (bool, error) {
		plan, largest, err := planDownload(ctx, sess.FS(), name, s.o.maxTransfer)
		if err != nil {
			return false, err
		}
		if err := leaseOf(r.Context()).take(largest); err != nil {
			return false, err
		}
		base := path.Base(name)
		if name == "." {
			base = "workspace"
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", base+".tar"))
		w.WriteHeader(http.StatusOK)
		started = true
		return false, writeTar(ctx, w, sess.FS(), sess.Root(), plan, largest, s.o.maxTransfer)
	})
	if err != nil {
		if started {
			// The status is sent: cut the stream so the client sees a broken
			// archive, never a short one that looks whole. A client that
			// stopped taking it is logged as calls' are, so that it is told
			// from a download that broke.
			if werr := writeFailure(w); werr != nil {
				s.o.logger.Warn("call cut: its client stopped reading", "tenant", tenantOf(r).Name, "session", sess.ID(), "tool", "download", "error", werr)
			} else {
				s.o.logger.Warn("download cut short", "tenant", tenantOf(r).Name, "session", sess.ID(), "error", err)
			}
			panic(http.ErrAbortHandler)
		}
		s.fail(w, r, err)
	}
}

// planned is one entry of a download.
type planned struct {
	name    string // in the workspace
	tarName string
	mode    fs.FileMode
	modTime time.Time
}

// planDownload lists what a download of name holds and the size of its
// largest file, and refuses one whose files hold more than max bytes.
func planDownload(ctx context.Context, fsys workspace.FileSystem, name string, limit int64) ([]planned, int64, error) {
	info, err := fsys.Stat(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	if !info.IsDir() {
		if !info.Mode().IsRegular() {
			return nil, 0, workspace.PathError("download", name, workspace.ErrNotAFile)
		}
		if info.Size() > limit {
			return nil, 0, tooLarge("%s holds %d bytes, over the transfer cap of %d", name, info.Size(), limit)
		}
		return []planned{{name: name, tarName: path.Base(name), mode: info.Mode(), modTime: info.ModTime()}}, info.Size(), nil
	}
	var plan []planned
	var total, largest int64
	w, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{Dir: name, Info: true, Errors: true})
	if err != nil {
		return nil, 0, err
	}
	prefix := name + "/"
	if name == "." {
		prefix = ""
	}
	for _, e := range w.Entries {
		if name == "." && (e.Path == daemonDir || strings.HasPrefix(e.Path, daemonDir+"/")) {
			continue // sandboxd's bookkeeping: downloaded only when named
		}
		if e.Err != nil {
			return nil, 0, e.Err
		}
		if _, ok := e.FileInfo(); !ok {
			continue // gone since the listing
		}
		p := planned{name: e.Path, tarName: strings.TrimPrefix(e.Path, prefix), mode: e.Mode, modTime: e.ModTime}
		switch {
		case e.Mode.IsDir():
			p.tarName += "/"
			plan = append(plan, p)
		case e.Mode&fs.ModeSymlink != 0:
			if _, ok := fsys.(workspace.SymlinkFS); ok {
				plan = append(plan, p)
			}
		case e.Mode.IsRegular():
			if total += e.Size; total > limit {
				return plan, largest, tooLarge("%s holds more than the transfer cap of %d bytes", name, limit)
			}
			largest = max(largest, e.Size)
			plan = append(plan, p)
		}
	}
	return plan, largest, nil
}

// writeTar writes the planned entries, reading each file as it goes: each
// of at most perFile bytes, all of at most total (a file grown past either
// since the plan fails the download). A file removed since the plan is
// left out, and so is a link that leads outside the workspace (root).
func writeTar(ctx context.Context, w io.Writer, fsys workspace.FileSystem, root string, plan []planned, perFile, total int64) error {
	tw := tar.NewWriter(w)
	for _, p := range plan {
		hdr := &tar.Header{Name: p.tarName, Mode: int64(p.mode.Perm()), ModTime: p.modTime, Format: tar.FormatPAX}
		var data []byte
		switch {
		case p.mode.IsDir():
			hdr.Typeflag = tar.TypeDir
		case p.mode&fs.ModeSymlink != 0:
			target, err := fsys.(workspace.SymlinkFS).Readlink(ctx, p.name)
			if errors.Is(err, workspace.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if leadsOut(root, p.name, target) {
				continue
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			var err error
			data, err = fsys.ReadFile(ctx, p.name, min(perFile, total))
			if errors.Is(err, workspace.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			total -= int64(len(data))
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}
