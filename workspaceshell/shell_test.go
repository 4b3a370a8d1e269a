package workspaceshell_test

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"path"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// tree is a workspace's contents: file name → contents; a name ending in "/"
// is an empty directory, "name -> target" a link.
type tree map[string]string

var sample = tree{
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

// backend is a workspace a test runs on.
type backend struct {
	name string
	new  func(t testing.TB) (workspace.FileSystem, string)
}

var backends = []backend{
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

// setup builds tr on a new workspace of backend b.
func setup(t testing.TB, b backend, tr tree) workspaceshell.Env {
	t.Helper()
	ctx := context.Background()
	fsys, root := b.new(t)
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
	return workspaceshell.Env{FS: fsys, Session: workspace.Session{Root: root}}
}

// snapshot reads a whole workspace back as a tree.
func snapshot(t testing.TB, env workspaceshell.Env) tree {
	t.Helper()
	ctx := context.Background()
	walk, err := workspace.WalkGeneric(ctx, env.FS, workspace.WalkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := tree{}
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

// normalize makes a tree comparable with a snapshot: parents are listed.
func normalize(tr tree) tree {
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

func sameTree(t *testing.T, got, want tree) {
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

func run(t *testing.T, env workspaceshell.Env, line string, mode workspaceshell.Mode) (workspaceshell.Result, error) {
	t.Helper()
	return workspaceshell.Run(context.Background(), env, line, mode)
}

// refusedCases are lines read mode refuses, with what the error must say.
var refusedCases = []struct {
	line string
	want []string // every one must appear in the error
}{
	{"rm x", []string{`rm (at 1:1)`, "read mode changes no file"}},
	{"curl https://example.com/x", []string{"curl", "network"}},
	{"sh -c 'ls'", []string{"sh (at 1:1)", "another shell"}},
	{"bash -c ls", []string{"bash", "another shell"}},
	{"ls $(rm x)", []string{"rm (at 1:6)"}},
	{"ls `rm x`", []string{"rm (at 1:5)"}},
	{"echo x > f", []string{"echo (at 1:1)", "> f (at 1:8)"}},
	{"cat a.txt > f", []string{"> f", "read mode changes no file"}},
	{"cat a.txt >> f", []string{">> f"}},
	{"cat a.txt &> f", []string{"&> f"}},
	{"cat a.txt >| f", []string{">| f"}},
	{"cat a.txt 2> err.log", []string{"2> err.log"}},
	{"cat a.txt > $(echo /dev/null)", []string{"> $(echo /dev/null)"}},
	{"find . -delete", []string{"find -delete", "deletes files"}},
	{`find . -exec rm {} \;`, []string{"find -exec", "runs commands"}},
	{"find . -execdir ls ;", []string{"find -execdir"}},
	{"find . -ok rm {} ;", []string{"find -ok"}},
	{"find . -fprint out", []string{"find -fprint", "writes a file"}},
	{"rg --pre cat x", []string{"rg --pre"}},
	{"rg --pre=cat x", []string{"rg --pre=cat"}},
	{"rg -z x", []string{"rg -z"}},
	{"eval ls", []string{"eval", "runs a string"}},
	{"exec ls", []string{"exec"}},
	{"source x", []string{"source"}},
	{". x", []string{". (at 1:1)"}},
	{"$X", []string{"$X", "literal word"}},
	{"$(echo ls)", []string{"$(echo ls)", "literal word"}},
	{"'r'm x", []string{"rm (at 1:1)"}},
	{`r\m x`, []string{"rm (at 1:1)"}},
	{"PATH=/tmp ls", []string{"PATH=…", "assignments"}},
	{"X=1", []string{"X=…"}},
	{"ls() { cat a.txt; }", []string{"function definition"}},
	{"function f { ls; }", []string{"function definition"}},
	{"ls &", []string{"background"}},
	{"cat <(rm x)", []string{"process substitution", "rm (at 1:7)"}},
	{"ls | xargs rm", []string{"xargs"}},
	{"(rm x)", []string{"rm (at 1:2)"}},
	{"{ rm x; }", []string{"rm (at 1:3)"}},
	{"ls && rm x", []string{"rm (at 1:7)"}},
	{"ls || mv a b", []string{"mv"}},
	{"while rm x; do ls; done", []string{"rm"}},
	{"if ls; then cp a b; fi", []string{"cp"}},
	{"for f in a; do touch $f; done", []string{"touch"}},
	{"cat <<EOF\n$(rm x)\nEOF", []string{"rm (at 2:3)"}},
	{"for PATH in a; do ls; done", []string{"for PATH"}},
	{"ls ${X:=y}", []string{"assigning variables"}},
	{"ls $((x=1))", []string{"assigning"}},
	{"ls 3> f", []string{"3>"}},
	{"ls >&f", []string{">& f", "writes a file"}},
	{"ls <> f", []string{"<>"}},
	{"declare -x A=1", []string{"declaration"}},
	{"[[ -f a ]]", []string{"[[ … ]]"}},
	{"case x in x) rm y;; esac", []string{"case", "rm"}},
	{"mkdir d", []string{"mkdir", "read mode"}},
	{"/bin/ls", []string{"/bin/ls"}},
	{"cd / && ls", []string{"cd"}},
	{"ls | sh", []string{"sh (at 1:6)"}},
	{"ls |& tee f", []string{"tee"}},
}

func TestReadModeRefuses(t *testing.T) {
	cases := refusedCases
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range cases {
				env := setup(t, b, sample)
				before := snapshot(t, env)
				res, err := run(t, env, tc.line, workspaceshell.Read)
				if err == nil {
					t.Errorf("%q ran (%+v); want it refused", tc.line, res)
					continue
				}
				if !errors.Is(err, workspace.ErrForbidden) {
					t.Errorf("%q: error %v is not Forbidden", tc.line, err)
				}
				var re *workspaceshell.RefusedError
				if !errors.As(err, &re) {
					t.Errorf("%q: error %T is not a *RefusedError", tc.line, err)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%q: error %q does not say %q", tc.line, err, w)
					}
				}
				if res != (workspaceshell.Result{}) {
					t.Errorf("%q: a refused line produced %+v", tc.line, res)
				}
				sameTree(t, snapshot(t, env), before)
			}
		})
	}
}

// TestRefusedWhileRunning: arguments that are refused only once expanded
// stop the line before the command runs.
func TestRefusedWhileRunning(t *testing.T) {
	for _, line := range []string{
		"find . $(echo -delete)",
		"find . -{delete,print}",
		"rg --{pre,x}=cat TODO",
	} {
		env := setup(t, backends[0], sample)
		before := snapshot(t, env)
		_, err := run(t, env, line, workspaceshell.Write)
		if !errors.Is(err, workspace.ErrForbidden) {
			t.Errorf("%q: err = %v, want Forbidden", line, err)
		}
		sameTree(t, snapshot(t, env), before)
	}
}

func TestSyntaxError(t *testing.T) {
	env := setup(t, backends[0], nil)
	_, err := run(t, env, "ls (", workspaceshell.Read)
	if !errors.Is(err, workspace.ErrInvalidArgument) || !strings.Contains(err.Error(), "syntax error") {
		t.Fatalf("err = %v, want a syntax error", err)
	}
}
