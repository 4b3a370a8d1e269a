package delivery

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
)

// Conflict is a path a delivery left alone, and why.
type Conflict struct {
	Path, Why string
}

// Applied is what SyncBack did.
type Applied struct {
	// Written and Removed name the paths changed in the directory.
	Written, Removed []string
	// Same names paths already as the session left them.
	Same []string
	// Conflicts name the paths left alone: changed in the directory since
	// the copy, or that could not be written.
	Conflicts []Conflict
}

// SyncBack writes changes into dir, the directory the baseline was read from,
// through an os.Root, so nothing outside dir is reached. A path is changed
// only when dir still holds what the baseline did there (checked just
// before it is written): otherwise it is a conflict, reported and left
// alone; a path that already holds the session's version is left as it is.
// Files are written to a temporary name beside their place and renamed in,
// with the session's permission bits exactly (not less the umask); links
// are made the same way; directories are made as needed (0755 less the
// umask), and a directory left empty by a deletion that the session's tree
// does not hold is removed. SyncBack does not lock dir against other writers:
// a change made in the instant between a path's check and its rename is
// lost.
func SyncBack(dir string, changes []Change, final *Tree, st *Store) (*Applied, error) {
	keep := map[string]bool{}
	for p := range final.Files {
		for _, d := range parents(p) {
			keep[d] = true
		}
	}
	return syncBack(dir, changes, keep, st, strings.ToLower(rand.Text()[:10]))
}

// syncBack is SyncBack keeping the directories keep names, its temporary
// files named with tag (".sandboxd-TAG-NAME"). It may run again over what
// a killed run of it did with the same tag: each path first loses the
// temporary file that run may have left beside it, and a path already
// written holds the session's version (Same).
func syncBack(dir string, changes []Change, keep map[string]bool, st *Store, tag string) (*Applied, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	defer root.Close()
	res := &Applied{}
	for _, c := range changes {
		root.Remove(tempName(c.Path, tag))
		cur, err := hostEntry(root, c.Path)
		switch {
		case err != nil:
			res.Conflicts = append(res.Conflicts, Conflict{c.Path, err.Error()})
			continue
		case sameEntry(cur, c.New):
			res.Same = append(res.Same, c.Path)
			continue
		case !sameEntry(cur, c.Old):
			res.Conflicts = append(res.Conflicts, Conflict{c.Path, "changed in the directory since the session began"})
			continue
		}
		if c.New == nil {
			err = root.Remove(c.Path)
			if err == nil {
				res.Removed = append(res.Removed, c.Path)
				for _, d := range parents(c.Path) {
					if keep[d] || root.Remove(d) != nil {
						break // kept, or not empty
					}
				}
			}
		} else if err = place(root, c.Path, *c.New, st, tag); err == nil {
			res.Written = append(res.Written, c.Path)
		}

		if err != nil {
			res.Conflicts = append(res.Conflicts, Conflict{c.Path, err.Error()})
		}
	}
	return res, nil
}

func sameEntry(a, b *Entry) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// hostEntry reads name in root as Snapshot would: nil when absent; an
// error for a directory or special file there, which no change replaces.
func hostEntry(root *os.Root, name string) (*Entry, error) {
	info, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var data []byte
	switch {
	case info.Mode()&fs.ModeSymlink != 0:
		target, err := root.Readlink(name)
		if err != nil {
			return nil, err
		}
		data = []byte(target)
	case info.Mode().IsRegular():
		if data, err = root.ReadFile(name); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("a %s is there in the directory", describe(info.Mode()))
	}
	return &Entry{Mode: info.Mode() & (fs.ModeSymlink | fs.ModePerm), OID: BlobOID(data)}, nil
}

func describe(m fs.FileMode) string {
	if m.IsDir() {
		return "directory"
	}
	return "special file"
}

// place puts e at name: written beside it under a temporary name, then
// renamed over it.
func place(root *os.Root, name string, e Entry, st *Store, tag string) error {
	data, err := st.Get(e.OID)
	if err != nil {
		return err
	}
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	tmp := tempName(name, tag)
	if e.isLink() {
		err = root.Symlink(string(data), tmp)
	} else {
		err = writeNew(root, tmp, data, e.Mode.Perm())
	}
	if err == nil && testHookPlacing != nil {
		testHookPlacing(tmp)
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		root.Remove(tmp)
	}
	return err
}

// tempName is the temporary name beside name that place writes, for tag.
func tempName(name, tag string) string {
	return path.Join(path.Dir(name), ".sandboxd-"+tag+"-"+path.Base(name))
}

// testHookPlacing, when set (by tests), is called with the temporary name
// of each file place wrote, before it is renamed into place.
var testHookPlacing func(tmp string)

// writeNew creates name (which must not exist) with data and exactly perm,
// synced to disk.
func writeNew(root *os.Root, name string, data []byte, perm fs.FileMode) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	for _, step := range []func() error{func() error { return f.Chmod(perm) }, f.Sync} {
		if err == nil {
			err = step()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
