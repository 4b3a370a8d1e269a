// Package shelltest holds the fixtures of the workspace shell's tests: a
// workspace tree written as a map, the backends the tests run on, and the
// helpers that build a tree and read it back. Only tests import it.
package shelltest

import (
	"context"
	"io/fs"
	"maps"
	"path"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// Tree is a workspace's contents: file name → contents; a name ending in "/"
// is an empty directory, "name -> target" a link.
type Tree map[string]string

// Sample is the tree most tests start from.
var Sample = Tree{
	"a.txt":                    "hello\nworld\n",
	"src/main.go":              "package main\n\nfunc main() {}\n",
	"src/util.go":              "package main\n// TODO fix\n",
	"docs/readme.md":           "# Title\nTODO: write\n",
	".hidden":                  "secret TODO\n",
	"node_modules/x/index.js":  "TODO\n",
	".git/config":              "[core]\n",
	"empty/":                   "",
	"link.txt -> a.txt":        "",
	"data.bin":                 "bin\x00TODO\n",
	"dir with space/file name": "spaced\n",
}

// Backend is a workspace a test runs on.
type Backend struct {
	Name string
	New  func(t testing.TB) (workspace.FileSystem, string)
}

// Backends are the workspaces every test runs on: memory and local disk.
var Backends = []Backend{
	{"memfs", func(t testing.TB) (workspace.FileSystem, string) { return memfs.New(), memfs.DefaultRoot }},
	{"localfs", func(t testing.TB) (workspace.FileSystem, string) {
		dir := t.TempDir()
		f, err := localfs.New(dir, localfs.WithSync(false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f, dir
	}},
}

// Setup builds tr on a new workspace of backend b.
func Setup(t testing.TB, b Backend, tr Tree) interp.Env {
	t.Helper()
	ctx := context.Background()
	fsys, root := b.New(t)
	for name, content := range tr {
		var err error
		switch {
		case strings.HasSuffix(name, "/"):
			err = workspace.MkdirAll(ctx, fsys, strings.TrimSuffix(name, "/"), 0o755)
		case strings.Contains(name, " -> "):
			link, target, _ := strings.Cut(name, " -> ")
			if err = workspace.MkdirAll(ctx, fsys, path.Dir(link), 0o755); err == nil {
				err = fsys.(workspace.SymlinkFS).Symlink(ctx, target, link)
			}
		default:
			if err = workspace.MkdirAll(ctx, fsys, path.Dir(name), 0o755); err == nil {
				err = fsys.WriteFile(ctx, name, []byte(content), 0o644)
			}
		}
		if err != nil {
			t.Fatalf("setup %s: %v", name, err)
		}
	}
	return interp.Env{FS: fsys, Session: workspace.Session{Root: root}}
}

// Snapshot reads a whole workspace back as a tree.
func Snapshot(t testing.TB, env interp.Env) Tree {
	t.Helper()
	ctx := context.Background()
	walk, err := workspace.WalkGeneric(ctx, env.FS, workspace.WalkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := Tree{}
	for _, e := range walk.Entries {
		switch {
		case e.Type == fs.ModeDir:
			out[e.Path+"/"] = ""
		case e.Type == fs.ModeSymlink:
			target, err := env.FS.(workspace.SymlinkFS).Readlink(ctx, e.Path)
			if err != nil {
				t.Fatal(err)
			}
			out[e.Path+" -> "+target] = ""
		default:
			data, err := env.FS.ReadFile(ctx, e.Path, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			out[e.Path] = string(data)
		}
	}
	return out
}

// Normalize makes a tree comparable with a snapshot: parents are listed.
func Normalize(tr Tree) Tree {
	out := maps.Clone(tr)
	for name := range tr {
		name, _, _ = strings.Cut(name, " -> ")
		for d := path.Dir(strings.TrimSuffix(name, "/")); d != "."; d = path.Dir(d) {
			out[d+"/"] = ""
		}
		if strings.HasSuffix(name, "/") {
			out[name] = ""
		}
	}
	return out
}

// SameTree reports each name where got and want differ.
func SameTree(t *testing.T, got, want Tree) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("missing %q", k)
		} else if g != v {
			t.Errorf("%s = %q, want %q", k, g, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %q", k)
		}
	}
}

// With returns Sample changed: "name": content sets, "name": "\x00" deletes.
func With(changes Tree) Tree {
	out := maps.Clone(Sample)
	for k, v := range changes {
		if v == "\x00" {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}
