package sources

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/workspace"
)

// Limits bound one source. A source over any of them is refused whole.
type Limits struct {
	// MaxFiles is the most entries (files, directories, links).
	MaxFiles int
	// MaxBytes is the most bytes of all files together.
	MaxBytes int64
	// MaxFileBytes is the largest single file.
	MaxFileBytes int64
}

// DefaultLimits are the limits of a zero Request.
var DefaultLimits = Limits{MaxFiles: 100_000, MaxBytes: 256 << 20, MaxFileBytes: 32 << 20}

func (l Limits) orDefault() Limits {
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultLimits.MaxFiles
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = DefaultLimits.MaxFileBytes
	}
	return l
}

// entry is one entry of a snapshot, named relative to the snapshot's root.
type entry struct {
	typ    fs.FileMode // 0 (regular), fs.ModeDir or fs.ModeSymlink
	exec   bool        // a regular file with an execute bit
	data   []byte
	target string // a link's target
}

// tree is a whole snapshot in memory, checked before anything is written.
type tree struct {
	src     string // the source's name, for errors
	lim     Limits
	entries map[string]*entry
	bytes   int64
	files   int
}

func newTree(src string, lim Limits) *tree {
	return &tree{src: src, lim: lim, entries: map[string]*entry{}}
}

// refused is the error of a hostile or oversized source.
func (t *tree) refused(kind *workspace.Kind, name, format string, args ...any) error {
	return &fs.PathError{Op: "source " + t.src, Path: name, Err: fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))}
}

// add records name (a cleaned relative name), creating missing parent
// directories. A parent that is not a directory, a duplicate, or a limit
// passed is refused.
func (t *tree) add(name string, e *entry) error {
	if name == "." || !fs.ValidPath(name) {
		return t.refused(workspace.ErrInvalidArgument, name, "not a valid relative name")
	}
	if _, dup := t.entries[name]; dup {
		if e.typ.IsDir() && t.entries[name].typ.IsDir() {
			return nil // a directory named twice (or implied first) is fine
		}
		return t.refused(workspace.ErrInvalidArgument, name, "appears twice")
	}
	if dir := path.Dir(name); dir != "." {
		p, ok := t.entries[dir]
		if !ok {
			if err := t.add(dir, &entry{typ: fs.ModeDir}); err != nil {
				return err
			}
		} else if !p.typ.IsDir() {
			return t.refused(workspace.ErrOutsideWorkspace, name, "its parent is not a directory (an entry under a link is refused)")
		}
	}
	if len(t.entries) >= t.lim.MaxFiles {
		return t.refused(workspace.ErrFileTooLarge, name, "more than %d entries", t.lim.MaxFiles)
	}
	if e.typ == 0 {
		if int64(len(e.data)) > t.lim.MaxFileBytes {
			return t.refused(workspace.ErrFileTooLarge, name, "%d bytes, over the limit of %d per file", len(e.data), t.lim.MaxFileBytes)
		}
		if t.bytes += int64(len(e.data)); t.bytes > t.lim.MaxBytes {
			return t.refused(workspace.ErrFileTooLarge, name, "the source passes %d bytes in all", t.lim.MaxBytes)
		}
		t.files++
	}
	t.entries[name] = e
	return nil
}

// checkSize refuses a file before it is read.
func (t *tree) checkSize(name string, size int64) error {
	if size > t.lim.MaxFileBytes {
		return t.refused(workspace.ErrFileTooLarge, name, "%d bytes, over the limit of %d per file", size, t.lim.MaxFileBytes)
	}
	if t.bytes+size > t.lim.MaxBytes {
		return t.refused(workspace.ErrFileTooLarge, name, "the source passes %d bytes in all", t.lim.MaxBytes)
	}
	return nil
}

// checkLinks refuses any link that, followed as the kernel would (links
// in its target included), leads out of the snapshot, or is absolute.
func (t *tree) checkLinks() error {
	for name, e := range t.entries {
		if e.typ != fs.ModeSymlink {
			continue
		}
		if e.target == "" || path.IsAbs(e.target) || strings.IndexByte(e.target, 0) >= 0 {
			return t.refused(workspace.ErrOutsideWorkspace, name, "link to %q: absolute links are refused", e.target)
		}
		if !t.inside(path.Dir(name), e.target) {
			return t.refused(workspace.ErrOutsideWorkspace, name, "link to %q leads out of the snapshot", e.target)
		}
	}
	return nil
}

// inside resolves target from dir (a real directory of the tree) component
// by component, following the tree's links, and reports whether it stays
// within the snapshot. A missing component is kept as written.
func (t *tree) inside(dir, target string) bool {
	var done []string
	if dir != "." {
		done = strings.Split(dir, "/")
	}
	todo := strings.Split(target, "/")
	for hops := 0; len(todo) > 0; {
		elem := todo[0]
		todo = todo[1:]
		switch elem {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return false
			}
			done = done[:len(done)-1]
			continue
		}
		next := path.Join(append(slices.Clone(done), elem)...)
		e := t.entries[next]
		if e == nil || e.typ != fs.ModeSymlink {
			done = append(done, elem)
			continue
		}
		if hops++; hops > 40 || path.IsAbs(e.target) {
			return false
		}
		todo = append(strings.Split(e.target, "/"), todo...)
	}
	return true
}

// digest is the snapshot's identity: sha256 over each entry, in name order,
// its type, name, execute bit and contents (or link target).
func (t *tree) digest() string {
	names := make([]string, 0, len(t.entries))
	for n := range t.entries {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		e := t.entries[n]
		switch {
		case e.typ.IsDir():
			fmt.Fprintf(h, "d %q\n", n)
		case e.typ == fs.ModeSymlink:
			fmt.Fprintf(h, "l %q %q\n", n, e.target)
		default:
			sum := sha256.Sum256(e.data)
			fmt.Fprintf(h, "f %q %t %d %x\n", n, e.exec, len(e.data), sum)
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Check says whether the source can be materialized now, without reading
// it whole: the directory, the tar file or the repository is there and
// readable (and a git source's commit is in it), an http source's
// credential can be read. It does not look for hostile entries or sizes
// over the limits: Materialize does, and refuses them then. Errors never
// hold a credential.
func (d Decl) Check(ctx context.Context) error {
	if err := (Decls{d}).Validate(); err != nil {
		return err
	}
	notThere := func(what string, err error) error {
		return fmt.Errorf("%w: source %s: %s %s: %v", workspace.ErrUnavailable, d.Name, what, d.Path, err)
	}
	switch d.Kind {
	case KindDir:
		f, err := os.Open(d.Path)
		if err != nil {
			return notThere("directory", err)
		}
		defer f.Close()
		if _, err := f.Readdirnames(1); err != nil && err != io.EOF {
			return notThere("directory", err)
		}
	case KindTar:
		f, err := os.Open(d.Path)
		if err != nil {
			return notThere("tar file", err)
		}
		defer f.Close()
		r, err := decompressed(f)
		if err != nil {
			return notThere("tar file", err)
		}
		if _, err := tar.NewReader(r).Next(); err != nil && err != io.EOF {
			return notThere("tar file", err)
		}
	case KindGit:
		if _, err := git(ctx, d.Path, nil, "cat-file", "-e", d.Commit+"^{commit}"); err != nil {
			return notThere("repository (commit "+d.Commit[:12]+")", err)
		}
	case KindHTTP:
		_, err := NewGateway(Decls{d}, WithAudit(func(AuditRecord) {}))
		return err
	}
	return nil
}

// load reads a declared source into memory and checks it.
func load(ctx context.Context, d Decl, lim Limits) (*tree, error) {
	t := newTree(d.Name, lim)
	var err error
	switch d.Kind {
	case KindDir:
		err = t.loadDir(ctx, d.Path)
	case KindTar:
		var f *os.File
		if f, err = os.Open(d.Path); err == nil {
			err = t.loadTar(ctx, f)
			f.Close()
		}
	case KindGit:
		err = t.loadGit(ctx, d.Path, d.Commit)
	case KindHTTP:
		err = t.loadHTTP(d)
	default:
		err = &DeclError{Field: "kind", Reason: fmt.Sprintf("unknown kind %q", d.Kind)}
	}
	if err == nil {
		err = t.checkLinks()
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// loadDir copies a host directory through os.Root, so no name or link in
// it reaches outside it. Devices, FIFOs and sockets are refused; a file is
// opened without following a link and without blocking, and checked again
// once open, so a concurrent swap cannot slip one in.
func (t *tree) loadDir(ctx context.Context, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		switch typ := d.Type(); {
		case typ.IsDir():
			return t.add(name, &entry{typ: fs.ModeDir})
		case typ == fs.ModeSymlink:
			target, err := root.Readlink(name)
			if err != nil {
				return err
			}
			return t.add(name, &entry{typ: fs.ModeSymlink, target: target})
		case typ.IsRegular():
			data, exec, err := t.readHostFile(root, name)
			if err != nil {
				return err
			}
			return t.add(name, &entry{data: data, exec: exec})
		default:
			return t.refused(workspace.ErrNotAFile, name, "a %v is not copied (devices, FIFOs and sockets are refused)", typ)
		}
	})
}

func (t *tree) readHostFile(root *os.Root, name string) ([]byte, bool, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if !info.Mode().IsRegular() {
		return nil, false, t.refused(workspace.ErrNotAFile, name, "not a regular file")
	}
	if err := t.checkSize(name, info.Size()); err != nil {
		return nil, false, err
	}
	data, err := io.ReadAll(io.LimitReader(f, t.lim.MaxFileBytes+1))
	if err == nil {
		err = t.checkSize(name, int64(len(data)))
	}
	return data, info.Mode()&0o111 != 0, err
}

// decompressed is r, or what it holds when it is gzip-compressed.
func decompressed(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		return gzip.NewReader(br)
	}
	return br, nil
}

// loadTar reads a tar archive, gzip-compressed or not. Names are taken as
// relative to the snapshot: an absolute name or one with a ".." component
// is refused, not cleaned. Only files, directories, symbolic links and hard
// links to earlier files are accepted.
func (t *tree) loadTar(ctx context.Context, r io.Reader) error {
	r, err := decompressed(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return t.refused(workspace.ErrInvalidArgument, "", "not a readable tar archive: %v", err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader { // git archive's commit id
			continue
		}
		name, err := t.tarName(h.Name)
		if err != nil {
			return err
		}
		if name == "." {
			if h.Typeflag == tar.TypeDir {
				continue
			}
			return t.refused(workspace.ErrInvalidArgument, h.Name, "names the snapshot's root")
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = t.add(name, &entry{typ: fs.ModeDir})
		case tar.TypeSymlink:
			err = t.add(name, &entry{typ: fs.ModeSymlink, target: h.Linkname})
		case tar.TypeLink:
			target, terr := t.tarName(h.Linkname)
			if terr != nil {
				return terr
			}
			e := t.entries[target]
			if e == nil || e.typ != 0 {
				return t.refused(workspace.ErrInvalidArgument, h.Name, "hard link to %q, which is not an earlier file of the archive", h.Linkname)
			}
			err = t.add(name, &entry{data: e.data, exec: e.exec})
		case tar.TypeReg: // archive/tar reports the old TypeRegA as TypeReg
			if err := t.checkSize(h.Name, h.Size); err != nil {
				return err
			}
			data, rerr := io.ReadAll(io.LimitReader(tr, h.Size))
			if rerr != nil {
				return rerr
			}
			err = t.add(name, &entry{data: data, exec: h.Mode&0o111 != 0})
		default:
			err = t.refused(workspace.ErrNotAFile, h.Name, "tar entry of type %q is refused (devices, FIFOs and other special entries are not copied)", h.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

func (t *tree) tarName(raw string) (string, error) {
	if raw == "" || strings.HasPrefix(raw, "/") || strings.IndexByte(raw, 0) >= 0 || strings.Contains(raw, "\\") {
		return "", t.refused(workspace.ErrOutsideWorkspace, raw, "absolute or malformed name in the archive")
	}
	for _, elem := range strings.Split(raw, "/") {
		if elem == ".." {
			return "", t.refused(workspace.ErrOutsideWorkspace, raw, "a '..' name in the archive is refused")
		}
	}
	return path.Clean(raw), nil
}

// gitEnv is the whole environment git runs with: no system or global
// configuration, no replace objects, no prompts, no network.
var gitEnv = []string{
	"PATH=/usr/local/bin:/usr/bin:/bin",
	"HOME=/nonexistent",
	"GIT_CONFIG_NOSYSTEM=1",
	"GIT_CONFIG_GLOBAL=/dev/null",
	"GIT_NO_REPLACE_OBJECTS=1",
	"GIT_TERMINAL_PROMPT=0",
	"GIT_OPTIONAL_LOCKS=0",
	"GIT_ALLOW_PROTOCOL=",
	"GIT_NO_LAZY_FETCH=1",
	"LC_ALL=C",
}

// git runs the host's git on repo with stdin and returns its output.
// Hooks, fsmonitor and protocols are switched off on the command line; the
// repository's own configuration is still read by git (it cannot be
// skipped), which is why only plumbing that runs no filters is used.
func git(ctx context.Context, repo string, stdin io.Reader, args ...string) ([]byte, error) {
	base := []string{"-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "protocol.allow=never",
		"-c", "core.sshCommand=false", "-c", "uploadpack.packObjectsHook=", "-C", repo}
	cmd := exec.CommandContext(ctx, "git", append(base, args...)...)
	cmd.Env = gitEnv
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// loadGit exports the tree of commit with plumbing only (ls-tree and
// cat-file --batch): blobs as stored, with no filters, attributes or
// export-subst applied and no program of the repository run. A submodule
// becomes an empty directory, as git archive makes it.
func (t *tree) loadGit(ctx context.Context, repo, commit string) error {
	out, err := git(ctx, repo, nil, "rev-parse", "--verify", "--end-of-options", commit+"^{commit}")
	if err != nil {
		return t.refused(workspace.ErrNotFound, commit, "no such commit in %s: %v", repo, err)
	}
	if got := strings.TrimSpace(string(out)); got != commit {
		return t.refused(workspace.ErrInvalidArgument, commit, "resolves to %s", got)
	}
	out, err = git(ctx, repo, nil, "ls-tree", "-r", "-z", "--full-tree", "-l", commit)
	if err != nil {
		return err
	}
	type blob struct {
		name string
		mode string
	}
	var blobs []blob
	var ids bytes.Buffer
	var total int64
	for _, rec := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if rec == "" {
			continue
		}
		meta, name, ok := strings.Cut(rec, "\t")
		f := strings.Fields(meta) // mode type object size
		if !ok || len(f) != 4 {
			return fmt.Errorf("git ls-tree: unexpected record %q", rec)
		}
		name, err := t.tarName(name)
		if err != nil {
			return err
		}
		switch f[0] {
		case "160000":
			if err := t.add(name, &entry{typ: fs.ModeDir}); err != nil {
				return err
			}
			continue
		case "100644", "100755", "120000":
		default:
			return t.refused(workspace.ErrNotAFile, name, "git entry of mode %s is refused", f[0])
		}
		size, _ := strconv.ParseInt(f[3], 10, 64)
		if err := t.checkSize(name, size); err != nil {
			return err
		}
		if total += size; total > t.lim.MaxBytes { // before cat-file reads it all
			return t.refused(workspace.ErrFileTooLarge, name, "the source passes %d bytes in all", t.lim.MaxBytes)
		}
		blobs = append(blobs, blob{name, f[0]})
		ids.WriteString(f[2] + "\n")
	}
	if len(blobs) == 0 {
		return nil
	}
	out, err = git(ctx, repo, &ids, "cat-file", "--batch")
	if err != nil {
		return err
	}
	for _, b := range blobs {
		header, rest, ok := bytes.Cut(out, []byte("\n"))
		f := strings.Fields(string(header)) // object type size
		if !ok || len(f) != 3 || f[1] != "blob" {
			return fmt.Errorf("git cat-file: unexpected header %q", header)
		}
		size, err := strconv.Atoi(f[2])
		if err != nil || size+1 > len(rest) {
			return errors.New("git cat-file: short output")
		}
		data := rest[:size:size]
		out = rest[size+1:]
		e := &entry{data: data, exec: b.mode == "100755"}
		if b.mode == "120000" {
			e = &entry{typ: fs.ModeSymlink, target: string(data)}
		}
		if err := t.add(b.name, e); err != nil {
			return err
		}
	}
	return nil
}
