package tools_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// FuzzToolPaths feeds arbitrary paths to the path-taking tools over a
// workspace with links in and out: nothing panics, every failure has a kind
// of the contract, and nothing is created outside the workspace's files or
// under a protected path.
func FuzzToolPaths(f *testing.F) {
	for _, p := range []string{"a.txt", "", ".", "/", "/workspace", "/workspace/../etc", "../x", "a/../../x", "in/a.txt",
		"out/passwd", "gitlink/config", ".git/x", ".GIT/x", "a\x00b", "//a.txt", "in/../.sandboxd/x", "dir/", "\xff", "C:\\x"} {
		f.Add(p)
	}
	known := map[string]bool{tools.KindToolUnavailable: true}
	for _, k := range workspace.Kinds {
		known[k.Name()] = true
	}
	f.Fuzz(func(t *testing.T, p string) {
		fx := newFixture(t, []string{"a.txt: a\n", "in => dir", "dir/a.txt: x", "out => /etc", "gitlink => .git", ".git/HEAD: ref"})
		for _, c := range []struct {
			tool string
			args map[string]any
		}{
			{"read", map[string]any{"path": p}},
			{"ls", map[string]any{"path": p}},
			{"find", map[string]any{"pattern": "**", "path": p}},
			{"grep", map[string]any{"pattern": "a", "path": p}},
			{"write", map[string]any{"path": p, "content": "w"}},
			{"edit", map[string]any{"path": p, "edits": []tools.Replacement{{OldText: "a", NewText: "b"}}}},
		} {
			raw, _ := json.Marshal(c.args)
			r := fx.set.Call(context.Background(), c.tool, raw, tools.CallOptions{})
			if r.IsError && !known[errKind(r)] {
				t.Fatalf("%s %q: kind %q: %s", c.tool, p, errKind(r), r.Text)
			}
		}
		err := fs.WalkDir(walkFS{fx}, ".", func(name string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && d.Type()&fs.ModeSymlink == 0 && workspace.DefaultProtect.Match(name) && name != ".git/HEAD" && !strings.HasPrefix(name, journal.Dir+"/") {
				t.Fatalf("%q created protected %s", p, name)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if fx.file(".git/HEAD") != "ref" {
			t.Fatalf("%q changed .git/HEAD", p)
		}
	})
}

// walkFS lets fs.WalkDir list a fixture's workspace.
type walkFS struct{ fx *fixture }

func (w walkFS) Open(string) (fs.File, error) { return nil, fs.ErrInvalid }
func (w walkFS) ReadDir(name string) ([]fs.DirEntry, error) {
	return w.fx.fs.ReadDir(context.Background(), name)
}
func (w walkFS) Stat(name string) (fs.FileInfo, error) {
	return w.fx.fs.Lstat(context.Background(), name)
}
