package sources

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// Request says which sources to materialize.
type Request struct {
	// Path selects the sources whose snapshot lies under it, or that hold
	// it (".sandboxd/sources/docs/api" selects docs); a workspace name, ""
	// or "." for all.
	Path string
	// Names selects sources by name; empty means all. A name that is not
	// declared fails the request with ErrNotFound.
	Names []string
	// Limits bound each source; zero fields take DefaultLimits.
	Limits Limits
}

// Result is what Materialize did, one Snapshot per selected source, in
// declaration order.
type Result struct {
	Sources []Snapshot `json:"sources"`
}

// Snapshot describes one materialized source.
type Snapshot struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Path is the snapshot's workspace name: .sandboxd/sources/<name>.
	Path string `json:"path"`
	// Files and Bytes count its regular files and their bytes.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// Digest identifies the contents: "sha256:…" over every entry's name,
	// type, execute bit and contents or link target. The same source gives
	// the same digest on every backend.
	Digest string `json:"digest"`
	// Changed says the snapshot was written; false means the workspace
	// already held exactly this snapshot and nothing was touched.
	Changed bool `json:"changed"`
}

// Select returns the declarations a request names, in declaration order.
// An undeclared name, or a Path that selects nothing, fails with
// ErrNotFound.
func (ds Decls) Select(req Request) (Decls, error) {
	for _, n := range req.Names {
		if !slices.ContainsFunc(ds, func(d Decl) bool { return d.Name == n }) {
			return nil, workspace.PathError("materialize", n, workspace.ErrNotFound)
		}
	}
	prefix := path.Clean("/" + req.Path)[1:]
	var out Decls
	for _, d := range ds {
		if len(req.Names) > 0 && !slices.Contains(req.Names, d.Name) {
			continue
		}
		snap := SnapshotPath(d.Name)
		if prefix != "" && prefix != snap && !strings.HasPrefix(snap, prefix+"/") && !strings.HasPrefix(prefix, snap+"/") {
			continue
		}
		out = append(out, d)
	}
	if len(out) == 0 && len(ds) > 0 {
		return nil, workspace.PathError("materialize", req.Path, workspace.ErrNotFound)
	}
	return out, nil
}

// Materialize writes complete snapshots of the selected sources under
// .sandboxd/sources/<name>/ through fsys and reports what it did.
//
// Every selected source is read and checked in memory first; when any is
// refused (see the package documentation) or unreadable, Materialize fails
// and writes nothing. Then each snapshot is compared with what the
// workspace holds, read back through fsys: an identical one is left alone
// (Changed false), so materializing twice is idempotent; a different or
// missing one is built under a temporary name and renamed into place, so
// at its path a snapshot is whole or absent — never half written. An
// earlier snapshot is replaced whole, including anything added to it.
//
// It does not guarantee all-or-nothing across sources when the workspace
// fails mid-way (a full disk, say): snapshots written before the failure
// stay. Snapshots with links need a workspace.SymlinkFS. Writers are
// serialised per source with workspace.Lock.
func Materialize(ctx context.Context, fsys workspace.FileSystem, decls Decls, req Request) (Result, error) {
	if err := decls.Validate(); err != nil {
		return Result{}, err
	}
	sel, err := decls.Select(req)
	if err != nil {
		return Result{}, err
	}
	lim := req.Limits.orDefault()
	trees := make([]*tree, len(sel))
	for i, d := range sel {
		if trees[i], err = load(ctx, d, lim); err != nil {
			return Result{}, err
		}
	}
	res := Result{Sources: make([]Snapshot, 0, len(sel))}
	if len(sel) > 0 {
		if err := workspace.MkdirAll(ctx, fsys, SnapshotDir, 0o755); err != nil {
			return res, err
		}
	}
	for i, d := range sel {
		t := trees[i]
		snap := Snapshot{Name: d.Name, Kind: d.Kind, Path: SnapshotPath(d.Name), Files: t.files, Bytes: t.bytes, Digest: t.digest()}
		changed, err := place(ctx, fsys, d.Name, t, snap.Digest)
		if err != nil {
			return res, err
		}
		snap.Changed = changed
		res.Sources = append(res.Sources, snap)
	}
	return res, nil
}

// place puts t at the source's snapshot path unless the workspace holds
// the same snapshot already.
func place(ctx context.Context, fsys workspace.FileSystem, name string, t *tree, digest string) (bool, error) {
	final := SnapshotPath(name)
	unlock, err := workspace.Lock(ctx, fsys, final)
	if err != nil {
		return false, err
	}
	defer unlock()
	if err := removeLeftovers(ctx, fsys, name); err != nil {
		return false, err
	}
	have, err := readSnapshot(ctx, fsys, final, t.lim)
	if err != nil {
		return false, err
	}
	if have != nil && have.digest() == digest {
		return false, nil
	}
	tmp := SnapshotDir + "/.tmp~" + name + "~" + randomSuffix()
	if err := writeTree(ctx, fsys, tmp, t); err != nil {
		_ = workspace.RemoveAll(context.WithoutCancel(ctx), fsys, tmp)
		return false, err
	}
	if _, err := fsys.Lstat(ctx, final); err == nil {
		old := SnapshotDir + "/.old~" + name + "~" + randomSuffix()
		if err := fsys.Rename(ctx, final, old); err != nil {
			_ = workspace.RemoveAll(context.WithoutCancel(ctx), fsys, tmp)
			return false, err
		}
		defer workspace.RemoveAll(context.WithoutCancel(ctx), fsys, old)
	}
	if err := fsys.Rename(ctx, tmp, final); err != nil {
		_ = workspace.RemoveAll(context.WithoutCancel(ctx), fsys, tmp)
		return false, err
	}
	return true, nil
}

// removeLeftovers removes the temporary trees of an interrupted earlier
// run for this source ('~' cannot appear in a source name, so another
// source's leftovers never match).
func removeLeftovers(ctx context.Context, fsys workspace.FileSystem, name string) error {
	entries, err := fsys.ReadDir(ctx, SnapshotDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp~"+name+"~") || strings.HasPrefix(e.Name(), ".old~"+name+"~") {
			if err := workspace.RemoveAll(ctx, fsys, SnapshotDir+"/"+e.Name()); err != nil {
				return err
			}
		}
	}
	return nil
}

func randomSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeTree writes t as a new directory dir.
func writeTree(ctx context.Context, fsys workspace.FileSystem, dir string, t *tree) error {
	if err := fsys.Mkdir(ctx, dir, 0o755); err != nil {
		return err
	}
	names := make([]string, 0, len(t.entries))
	for n := range t.entries {
		names = append(names, n)
	}
	slices.Sort(names) // a parent sorts before its entries
	for _, n := range names {
		e, full := t.entries[n], dir+"/"+n
		var err error
		switch {
		case e.typ.IsDir():
			err = fsys.Mkdir(ctx, full, 0o755)
		case e.typ == fs.ModeSymlink:
			sl, ok := fsys.(workspace.SymlinkFS)
			if !ok {
				return &fs.PathError{Op: "source " + t.src, Path: n, Err: fmt.Errorf("%w: the workspace cannot hold symbolic links", workspace.ErrForbidden)}
			}
			err = sl.Symlink(ctx, e.target, full)
		default:
			perm := fs.FileMode(0o644)
			if e.exec {
				perm = 0o755
			}
			err = fsys.WriteFile(ctx, full, e.data, perm)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readSnapshot reads back what the workspace holds at dir as a tree, nil
// when there is nothing there. Anything a source could not hold (a special
// file, an unreadable entry, a tree over the limits) gives a tree whose
// digest matches no source, so the snapshot is rewritten.
func readSnapshot(ctx context.Context, fsys workspace.FileSystem, dir string, lim Limits) (*tree, error) {
	info, err := fsys.Lstat(ctx, dir)
	if errors.Is(err, workspace.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	t := newTree("", lim)
	if !info.IsDir() {
		t.entries["\x00not a directory"] = &entry{}
		return t, nil
	}
	walk := func() error {
		w, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{Dir: dir, Info: true, Errors: true})
		if err != nil {
			return err
		}
		for _, we := range w.Entries {
			if we.Err != nil {
				return we.Err
			}
			name := strings.TrimPrefix(we.Path, dir+"/")
			if _, ok := we.FileInfo(); !ok { // changed since it was listed
				return errUnlike
			}
			var e *entry
			switch typ := we.Type; {
			case typ.IsDir():
				e = &entry{typ: fs.ModeDir}
			case typ == fs.ModeSymlink:
				if _, ok := fsys.(workspace.SymlinkFS); !ok || we.Link == "" {
					return errUnlike
				}
				e = &entry{typ: fs.ModeSymlink, target: we.Link}
			case typ.IsRegular():
				data, err := fsys.ReadFile(ctx, we.Path, lim.MaxFileBytes)
				if err != nil {
					return errUnlike
				}
				e = &entry{data: data, exec: we.Mode&0o111 != 0}
			default:
				return errUnlike
			}
			if err := t.add(name, e); err != nil {
				return errUnlike
			}
		}
		return nil
	}
	switch err := walk(); {
	case errors.Is(err, errUnlike):
		t.entries["\x00unlike any source"] = &entry{}
	case err != nil:
		return nil, err
	}
	return t, nil
}

// errUnlike stops reading back a snapshot that no source could have made.
var errUnlike = errors.New("snapshot differs from any source")
