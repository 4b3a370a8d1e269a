package interp_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/workspaceshell/internal/shelltest"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"

	"github.com/sandboxd/sandboxd/workspace"
)

func run(t *testing.T, env interp.Env, line string, mode interp.Mode) (interp.Result, error) {
	t.Helper()
	return interp.Run(context.Background(), env, line, mode)
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
	for _, b := range shelltest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			for _, tc := range cases {
				env := shelltest.Setup(t, b, shelltest.Sample)
				before := shelltest.Snapshot(t, env)
				res, err := run(t, env, tc.line, interp.Read)
				if err == nil {
					t.Errorf("%q ran (%+v); want it refused", tc.line, res)
					continue
				}
				if !errors.Is(err, workspace.ErrForbidden) {
					t.Errorf("%q: error %v is not Forbidden", tc.line, err)
				}
				var re *interp.RefusedError
				if !errors.As(err, &re) {
					t.Errorf("%q: error %T is not a *RefusedError", tc.line, err)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%q: error %q does not say %q", tc.line, err, w)
					}
				}
				if res != (interp.Result{}) {
					t.Errorf("%q: a refused line produced %+v", tc.line, res)
				}
				shelltest.SameTree(t, shelltest.Snapshot(t, env), before)
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
		env := shelltest.Setup(t, shelltest.Backends[0], shelltest.Sample)
		before := shelltest.Snapshot(t, env)
		_, err := run(t, env, line, interp.Write)
		if !errors.Is(err, workspace.ErrForbidden) {
			t.Errorf("%q: err = %v, want Forbidden", line, err)
		}
		shelltest.SameTree(t, shelltest.Snapshot(t, env), before)
	}
}

func TestSyntaxError(t *testing.T) {
	env := shelltest.Setup(t, shelltest.Backends[0], nil)
	_, err := run(t, env, "ls (", interp.Read)
	if !errors.Is(err, workspace.ErrInvalidArgument) || !strings.Contains(err.Error(), "syntax error") {
		t.Fatalf("err = %v, want a syntax error", err)
	}
}

// unreadable is a FileSystem whose ReadDir of one directory fails, as a
// directory the daemon may not read does.
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

// TestUnreadableDirectory: the recursive commands name a directory below
// their start that they cannot read, and fail, as they did when each walked
// with ReadDir itself: grep -r and rg with status 2, find and ls -R with 1
// and 2, the rest of the tree listed.
func TestUnreadableDirectory(t *testing.T) {
	cases := []struct {
		line, stdout, stderr string
		exit                 int
	}{
		{"grep -rn TODO .", "./a.txt:1:TODO a\n./docs/x.md:1:TODO x\n./src/main.go:1:TODO\n", "grep: ./docs/sub: Operation not permitted\n", 2},
		{"rg -n TODO", "a.txt:1:TODO a\ndocs/x.md:1:TODO x\nsrc/main.go:1:TODO\n", "rg: docs/sub: Operation not permitted\n", 2},
		{"grep -rn --exclude-dir=sub TODO docs", "docs/x.md:1:TODO x\n", "", 0},
		{"find . -name '*.go'", "./src/main.go\n", "find: './docs/sub': Operation not permitted\n", 1},
		{"find docs -maxdepth 1", "docs\ndocs/sub\ndocs/x.md\n", "", 0},
		{"find src", "src\nsrc/main.go\n", "", 0},
		{"find . -depth", "./.hid\n./a.txt\n./docs/sub\n./docs/x.md\n./docs\n./src/main.go\n./src\n.\n", "find: './docs/sub': Operation not permitted\n", 1},
		{"find docs -name sub -prune -o -print", "docs\ndocs/x.md\n", "", 0},
		{"find . -path ./docs -prune -o -type f -print", "./.hid\n./a.txt\n./src/main.go\n", "", 0},
		{"find . -depth -maxdepth 2 -type d", "./docs/sub\n./docs\n./src\n.\n", "", 0},
		{"find . -mindepth 2 -maxdepth 2", "./docs/sub\n./docs/x.md\n./src/main.go\n", "", 0},
		{"ls -R docs", "docs:\nsub\nx.md\n\ndocs/sub:\n", "ls: cannot open directory 'docs/sub': Operation not permitted\n", 2},
		{"ls -R", ".:\na.txt\ndocs\nnode_modules\nsrc\n\n./docs:\nsub\nx.md\n\n./docs/sub:\n\n./src:\nmain.go\n", "ls: cannot open directory './docs/sub': Operation not permitted\n", 2},
		{"ls -AR src node_modules", "node_modules:\nm\n\nnode_modules/m:\nx.js\n\nsrc:\nmain.go\n", "", 0},
		{"ls -aFr docs", "x.md\nsub/\n../\n./\n", "", 0},
		{"ls -1p . src", ".:\na.txt\ndocs/\nnode_modules/\nsrc/\n\nsrc:\nmain.go\n", "", 0},
	}
	for _, b := range shelltest.Backends {
		env := shelltest.Setup(t, b, shelltest.Tree{"a.txt": "TODO a\n", ".hid": "h", "node_modules/m/x.js": "x", "src/main.go": "TODO\n", "docs/x.md": "TODO x\n", "docs/sub/y.md": "TODO y\n", "docs/sub/deep/z.md": "z\n"})
		env.FS = unreadable{env.FS, "docs/sub"}
		for _, tc := range cases {
			res, err := run(t, env, tc.line, interp.Read)
			if err != nil || res.Stdout != tc.stdout || res.Stderr != tc.stderr || res.ExitCode != tc.exit {
				t.Errorf("%q: stdout %q stderr %q exit %d, %v\nwant stdout %q stderr %q exit %d", tc.line, res.Stdout, res.Stderr, res.ExitCode, err, tc.stdout, tc.stderr, tc.exit)
			}
		}
	}
}
