package workspace_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"path"
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// unreadable is a FileSystem whose ReadDir of one name fails as a
// directory the walker may not read does.
type unreadable struct {
	workspace.FileSystem
	name string
}

func (u unreadable) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	if name == u.name {
		return nil, workspace.PathError("readdir", name, workspace.ErrForbidden)
	}
	return u.FileSystem.ReadDir(ctx, name)
}

// TestWalkErrors: a directory below the start that cannot be read is
// skipped, or, asked for, reported by a second entry with Err, as
// fs.WalkDir reports it; the entry crosses JSON with its kind.
func TestWalkErrors(t *testing.T) {
	ctx := context.Background()
	inner := memfs.New()
	for _, f := range []string{"a/x", "b/sub/y", "c"} {
		if err := workspace.MkdirAll(ctx, inner, path.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := inner.WriteFile(ctx, f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fsys := unreadable{inner, "b/sub"}
	paths := func(r workspace.WalkResult) (out []string) {
		for _, e := range r.Entries {
			if e.Err != nil {
				out = append(out, e.Path+" !")
				continue
			}
			out = append(out, e.Path)
		}
		return out
	}
	quiet, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{})
	if want := []string{"a", "a/x", "b", "b/sub", "c"}; err != nil || !reflect.DeepEqual(paths(quiet), want) {
		t.Errorf("Walk = %v, %v; want %v", paths(quiet), err, want)
	}
	loud, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{Errors: true, FilesOnly: true, Limit: 2})
	if want := []string{"a/x", "b/sub !", "c"}; err != nil || !reflect.DeepEqual(paths(loud), want) || loud.Truncated {
		t.Fatalf("Walk with Errors = %v, truncated %v, %v; want %v", paths(loud), loud.Truncated, err, want)
	}
	bad := loud.Entries[1]
	var pe *fs.PathError
	if !errors.As(bad.Err, &pe) || pe.Path != "b/sub" || !errors.Is(bad.Err, workspace.ErrForbidden) || bad.Type != fs.ModeDir {
		t.Errorf("the error entry is %+v", bad)
	}
	data, err := json.Marshal(loud)
	if err != nil {
		t.Fatal(err)
	}
	var back workspace.WalkResult
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(paths(back), paths(loud)) || !errors.Is(back.Entries[1].Err, workspace.ErrForbidden) ||
		!errors.As(back.Entries[1].Err, &pe) || pe.Path != "b/sub" || back.Entries[0].Err != nil {
		t.Errorf("through JSON: %+v (%s)", back, data)
	}
}

// TestWalkEntryFileInfo: an entry described by Info is the FileInfo Lstat
// gives (name, mode, size, time); one not described is not.
func TestWalkEntryFileInfo(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	if err := workspace.MkdirAll(ctx, fsys, "d", 0o750); err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile(ctx, "d/f", []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Symlink(ctx, "f", "d/l"); err != nil {
		t.Fatal(err)
	}
	w, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{Info: true})
	if err != nil || len(w.Entries) != 3 {
		t.Fatalf("Walk: %v, %v", w, err)
	}
	for _, e := range w.Entries {
		got, ok := e.FileInfo()
		want, err := fsys.Lstat(ctx, e.Path)
		if !ok || err != nil || got.Name() != want.Name() || got.Mode() != want.Mode() || got.Size() != want.Size() ||
			!got.ModTime().Equal(want.ModTime()) || got.IsDir() != want.IsDir() {
			t.Errorf("%s: FileInfo %v, %v; Lstat %v, %v", e.Path, got, ok, want, err)
		}
	}
	bare, _ := workspace.Walk(ctx, fsys, workspace.WalkRequest{})
	for _, e := range bare.Entries {
		if _, ok := e.FileInfo(); ok {
			t.Errorf("%s: described without Info", e.Path)
		}
	}
}
