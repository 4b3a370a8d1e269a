package snapshot

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// MaxTreeFileBytes is the largest file WriteTree reads and ReadTree
// writes: each is held in memory whole, as the FileSystem port reads and
// writes files.
const MaxTreeFileBytes = 1 << 30

// WriteTree writes fsys's tree to w as a Source does, through the
// FileSystem port: a walk, then each file read whole. It is the Source of
// a backend that has no way of its own (Kubernetes, local, memory). It does
// not stop writers meanwhile: each file is read whole as it is at its
// turn, so a command writing as the tree is read may be caught in the
// middle of its work across files. A file that vanishes before its turn is
// left out.
func WriteTree(ctx context.Context, fsys workspace.FileSystem, w io.Writer) error {
	walk, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{Info: true, Exclude: workspace.Exclude{".sandboxd/"}})
	if err != nil {
		return fmt.Errorf("listing the workspace: %w", err)
	}
	tw := tar.NewWriter(w)
	for _, e := range walk.Entries {
		h := &tar.Header{Name: e.Path, Mode: int64(e.Mode & fs.ModePerm), ModTime: e.ModTime, Format: tar.FormatPAX}
		switch {
		case e.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, e.Path+"/"
		case e.Mode&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		case e.Mode.IsRegular():
			data, err := fsys.ReadFile(ctx, e.Path, MaxTreeFileBytes)
			if errors.Is(err, workspace.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
			continue
		case e.Mode&fs.ModeNamedPipe != 0:
			h.Typeflag = tar.TypeFifo
		case e.Mode&fs.ModeDevice != 0 && e.Mode&fs.ModeCharDevice != 0:
			h.Typeflag = tar.TypeChar
		case e.Mode&fs.ModeDevice != 0:
			h.Typeflag = tar.TypeBlock
		default:
			continue // a socket, or an entry that vanished
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	return tw.Close()
}

// ReadTree writes the tar stream r (as Restore writes it) into fsys,
// through the FileSystem port: directories made, files written whole,
// links made (which needs a workspace.SymlinkFS). Permission bits are
// asked for as the stream has them; a workspace that applies a umask
// (a disk's, an agent's) narrows them. Names that leave the root are
// refused. It is the import of a backend that has no way of its own.
func ReadTree(ctx context.Context, fsys workspace.FileSystem, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name, ok := cleanName(h.Name)
		if !ok {
			if name == "." {
				continue
			}
			return fmt.Errorf("%w: an entry named %q leaves the workspace", ErrInvalid, h.Name)
		}
		perm := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			// Writable by its owner while the tree is written.
			err = workspace.MkdirAll(ctx, fsys, name, perm|0o700)
		case tar.TypeReg:
			if h.Size > MaxTreeFileBytes {
				return fmt.Errorf("%s: %d bytes, over the %d this backend can restore", name, h.Size, MaxTreeFileBytes)
			}
			data := make([]byte, h.Size)
			if _, err = io.ReadFull(tr, data); err != nil {
				return err
			}
			if dir := path.Dir(name); dir != "." {
				if err = workspace.MkdirAll(ctx, fsys, dir, 0o755); err != nil {
					return err
				}
			}
			err = fsys.WriteFile(ctx, name, data, perm)
		case tar.TypeSymlink:
			sl, ok := fsys.(workspace.SymlinkFS)
			if !ok {
				return fmt.Errorf("%s is a link, and this workspace cannot make links", name)
			}
			err = sl.Symlink(ctx, h.Linkname, name)
		default:
			continue
		}
		if err != nil {
			return err
		}
	}
}

// Describe returns the manifest of fsys's tree as a snapshot of it would
// have it (read as WriteTree reads it): two trees are the same, byte for
// byte, mode for mode, link for link, when their manifests' Digests are.
func Describe(ctx context.Context, fsys workspace.FileSystem) (Manifest, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(WriteTree(ctx, fsys, pw)) }()
	c := &capture{s: &Store{}, rec: &record{}}
	m, err := c.run(ctx, pr)
	pr.CloseWithError(errStopped)
	return m, err
}

// Digest is the SHA-256 of the manifest's JSON with its entries sorted by
// path ("sha256:…"), as Info.Manifest has it: the same tree has the same
// digest in whichever order it was read.
func (m Manifest) Digest() string {
	m.Entries = slices.Clone(m.Entries)
	slices.SortFunc(m.Entries, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	data, err := json.Marshal(m)
	if err != nil {
		panic(err) // a Manifest is plain data
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
