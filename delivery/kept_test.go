package delivery_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/memfs"
)

// TestKeptTree: a tree kept in a directory is read back as it was, its
// contents in a store kept beside it; a tree file cut short or altered is
// refused (ErrDamaged), none kept is fs.ErrNotExist, and a content that no
// longer matches its name is refused as it is read.
func TestKeptTree(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	if err := fsys.WriteFile(ctx, "a.txt", []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		spoil func(t *testing.T, dir string) // nil: nothing
		want  error
	}{
		{"whole", nil, nil},
		{"none kept", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "tree.json")) }, fs.ErrNotExist},
		{"cut short", func(t *testing.T, dir string) {
			spoil(t, filepath.Join(dir, "tree.json"), func(b []byte) []byte { return b[:len(b)-5] })
		}, delivery.ErrDamaged},
		{"altered", func(t *testing.T, dir string) {
			spoil(t, filepath.Join(dir, "tree.json"), func(b []byte) []byte {
				i := len(b) - 20
				b[i] ^= 1
				return b
			})
		}, delivery.ErrDamaged},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "kept")
			st, err := delivery.OpenStore(filepath.Join(dir, "objects"))
			if err != nil {
				t.Fatal(err)
			}
			tree, err := delivery.Snapshot(ctx, fsys, st)
			if err != nil {
				t.Fatal(err)
			}
			if err := delivery.KeepTree(dir, tree); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("the kept tree's directory: %v, %v", fi, err)
			}
			if c.spoil != nil {
				c.spoil(t, dir)
			}
			got, err := delivery.ReadKeptTree(dir)
			if !errors.Is(err, c.want) || c.want == nil && !reflect.DeepEqual(got, tree) {
				t.Fatalf("read back: %+v, %v; want %+v, %v", got, err, tree, c.want)
			}
		})
	}
	dir := t.TempDir()
	st, err := delivery.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	oid, err := st.Put([]byte("kept\n"))
	if err != nil {
		t.Fatal(err)
	}
	if data, err := st.CheckedGet(oid); err != nil || string(data) != "kept\n" {
		t.Fatalf("CheckedGet: %q, %v", data, err)
	}
	if err := os.WriteFile(filepath.Join(dir, oid), []byte("altered\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CheckedGet(oid); !errors.Is(err, delivery.ErrDamaged) {
		t.Fatalf("CheckedGet of an altered content: %v", err)
	}
	if _, err := st.CheckedGet(delivery.BlobOID([]byte("never kept"))); !errors.Is(err, delivery.ErrDamaged) {
		t.Fatalf("CheckedGet of a missing content: %v", err)
	}
}

// spoil rewrites the file name with what f makes of its bytes.
func spoil(t *testing.T, name string, f func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, f(data), 0o600); err != nil {
		t.Fatal(err)
	}
}
