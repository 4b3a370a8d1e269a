package interp_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/workspaceshell/internal/shelltest"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"

	"github.com/sandboxd/sandboxd/workspace"
)

const protectedMsg = "is protected: changes to paths matching .git/**, .sandboxd/** are refused"

var writeCases = []struct {
	line, stdout, stderr string
	exit                 int
	after                shelltest.Tree
}{
	{"mkdir -p x/y && touch x/y/z", "", "", 0, shelltest.With(shelltest.Tree{"x/y/z": ""})},
	{"mkdir -v new", "mkdir: created directory 'new'\n", "", 0, shelltest.With(shelltest.Tree{"new/": ""})},
	{"mkdir src", "", "mkdir: cannot create directory 'src': File exists\n", 1, shelltest.Sample},
	{"mkdir a/b", "", "mkdir: cannot create directory 'a/b': No such file or directory\n", 1, shelltest.Sample},
	{"touch a.txt", "", "", 0, shelltest.Sample},
	{"touch nodir/f", "", "touch: cannot touch 'nodir/f': No such file or directory\n", 1, shelltest.Sample},
	{"cat a.txt > b.txt", "", "", 0, shelltest.With(shelltest.Tree{"b.txt": "hello\nworld\n"})},
	{"cat a.txt > a.txt", "", "", 0, shelltest.Sample},
	{"cat a.txt >> src/util.go", "", "", 0, shelltest.With(shelltest.Tree{"src/util.go": "package main\n// TODO fix\nhello\nworld\n"})},
	{"grep TODO src/util.go > out.txt 2>&1; ls nothere 2>> out.txt", "", "", 2,
		shelltest.With(shelltest.Tree{"out.txt": "// TODO fix\nls: cannot access 'nothere': No such file or directory\n"})},
	{"ls nothere &> out.txt", "", "", 2, shelltest.With(shelltest.Tree{"out.txt": "ls: cannot access 'nothere': No such file or directory\n"})},
	{"grep -c x a.txt > n.txt", "", "", 1, shelltest.With(shelltest.Tree{"n.txt": "0\n"})},
	{"cat a.txt > src", "", "shell: src: Is a directory\n", 1, shelltest.Sample},
	{"cat a.txt > nodir/f", "", "shell: nodir/f: No such file or directory\n", 1, shelltest.Sample},
	{"cat a.txt > .git/x", "", "shell: .git/x " + protectedMsg + "\n", 1, shelltest.Sample},
	{"cat a.txt > .GIT/x", "", "shell: .GIT/x " + protectedMsg + "\n", 1, shelltest.Sample},
	{"cat a.txt > esc", "", "shell: esc: Path leads outside the workspace\n", 1, shelltest.Sample},
	{"cp a.txt b.txt", "", "", 0, shelltest.With(shelltest.Tree{"b.txt": "hello\nworld\n"})},
	{"cp a.txt src", "", "", 0, shelltest.With(shelltest.Tree{"src/a.txt": "hello\nworld\n"})},
	{"cp link.txt l2", "", "", 0, shelltest.With(shelltest.Tree{"l2": "hello\nworld\n"})},
	{"cp -r src lib", "", "", 0, shelltest.With(shelltest.Tree{"lib/main.go": shelltest.Sample["src/main.go"], "lib/util.go": shelltest.Sample["src/util.go"]})},
	{"cp -r src docs", "", "", 0, shelltest.With(shelltest.Tree{"docs/src/main.go": shelltest.Sample["src/main.go"], "docs/src/util.go": shelltest.Sample["src/util.go"]})},
	{"cp src lib", "", "cp: -r not specified; omitting directory 'src'\n", 1, shelltest.Sample},
	{"cp -r src src/in", "", "cp: cannot copy 'src' into itself, 'src/in'\n", 1, shelltest.Sample},
	{"cp a.txt .git/hooks", "", "cp: cannot create '.git/hooks': .git/hooks " + protectedMsg + "\n", 1, shelltest.Sample},
	{"cp a.txt docs/readme.md src", "", "", 0, shelltest.With(shelltest.Tree{"src/a.txt": "hello\nworld\n", "src/readme.md": "# Title\nTODO: write\n"})},
	{"cp a.txt docs/readme.md nothere", "", "cp: target 'nothere' is not a directory\n", 1, shelltest.Sample},
	{"mv a.txt b.txt", "", "", 0, shelltest.With(shelltest.Tree{"a.txt": "\x00", "b.txt": "hello\nworld\n"})},
	{"mv a.txt src/", "", "", 0, shelltest.With(shelltest.Tree{"a.txt": "\x00", "src/a.txt": "hello\nworld\n"})},
	{"mv src docs", "", "", 0, shelltest.With(shelltest.Tree{"src/main.go": "\x00", "src/util.go": "\x00",
		"docs/src/main.go": shelltest.Sample["src/main.go"], "docs/src/util.go": shelltest.Sample["src/util.go"]})},
	{"mv .git g", "", "mv: cannot move '.git': .git " + protectedMsg + "\n", 1, shelltest.Sample},
	{"mv a.txt .git/", "", "mv: cannot move 'a.txt' to '.git/a.txt': .git/a.txt " + protectedMsg + "\n", 1, shelltest.Sample},
	{"rm a.txt", "", "", 0, shelltest.With(shelltest.Tree{"a.txt": "\x00"})},
	{"rm link.txt", "", "", 0, shelltest.With(shelltest.Tree{"link.txt -> a.txt": "\x00"})},
	{"rm -rv src", "removed directory 'src'\n", "", 0, shelltest.With(shelltest.Tree{"src/main.go": "\x00", "src/util.go": "\x00"})},
	{"rm src", "", "rm: cannot remove 'src': Is a directory\n", 1, shelltest.Sample},
	{"rm -d empty", "", "", 0, shelltest.With(shelltest.Tree{"empty/": "\x00"})},
	{"rm -f nothere", "", "", 0, shelltest.Sample},
	{"rm nothere", "", "rm: cannot remove 'nothere': No such file or directory\n", 1, shelltest.Sample},
	{"rm -rf .", "", "rm: refusing to remove '.' or '..' directory: skipping '.'\n", 1, shelltest.Sample},
	{"rm -rf $HOME", "", "rm: cannot remove '$ROOT': $ROOT is the workspace root, which cannot be replaced, moved or deleted\n", 1, shelltest.Sample},
	{"rm -rf /", "", "rm: cannot remove '/': Path leads outside the workspace\n", 1, shelltest.Sample},
	{"rm .git/config", "", "rm: cannot remove '.git/config': .git/config " + protectedMsg + "\n", 1, shelltest.Sample},
	{"rm -rf src .git", "", "rm: cannot remove '.git': .git " + protectedMsg + "\n", 1,
		shelltest.With(shelltest.Tree{"src/main.go": "\x00", "src/util.go": "\x00"})},
	{"rm -i a.txt", "", "rm: invalid option -- 'i'\n", 2, shelltest.Sample},
	{"find . -name '*.go' > list.txt; wc -l < list.txt", "2\n", "", 0, shelltest.With(shelltest.Tree{"list.txt": "./src/main.go\n./src/util.go\n"})},
	{"for f in src/*.go; do cp $f $f.bak; done", "", "", 0,
		shelltest.With(shelltest.Tree{"src/main.go.bak": shelltest.Sample["src/main.go"], "src/util.go.bak": shelltest.Sample["src/util.go"]})},
}

func TestWriteLines(t *testing.T) {
	tr := maps.Clone(shelltest.Sample)
	tr["esc -> /etc/passwd"] = ""
	for _, b := range shelltest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			for _, tc := range writeCases {
				env := shelltest.Setup(t, b, tr)
				root := env.Session.Root
				res, err := run(t, env, tc.line, interp.Write)
				if err != nil {
					t.Errorf("%q: %v", tc.line, err)
					continue
				}
				wantErr := strings.ReplaceAll(tc.stderr, "$ROOT", root)
				if res.Stdout != tc.stdout || res.Stderr != wantErr || res.ExitCode != tc.exit {
					t.Errorf("%q:\n got stdout %q stderr %q exit %d\nwant stdout %q stderr %q exit %d",
						tc.line, res.Stdout, res.Stderr, res.ExitCode, tc.stdout, wantErr, tc.exit)
				}
				after := maps.Clone(tc.after)
				after["esc -> /etc/passwd"] = ""
				got := shelltest.Snapshot(t, env)
				want := shelltest.Normalize(after)
				if !maps.Equal(got, want) {
					t.Errorf("%q: the workspace is not as expected", tc.line)
					shelltest.SameTree(t, got, want)
				}
			}
		})
	}
}

// TestProtectedTree: a tree with a protected path anywhere below it is not
// deleted, moved or copied at all.
func TestProtectedTree(t *testing.T) {
	tr := shelltest.Tree{"d/x": "x", "d/sub/secret": "s", "keep": "k"}
	for _, b := range shelltest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			for _, line := range []string{"rm -r d", "mv d e", "cp -r keep d/sub/secret"} {
				env := shelltest.Setup(t, b, tr)
				env.Protect = workspace.Protect{"**/secret"}
				res, err := run(t, env, line, interp.Write)
				if err != nil || res.ExitCode != 1 || !strings.Contains(res.Stderr, "secret is protected") {
					t.Errorf("%q: %+v, %v; want a protected refusal", line, res, err)
				}
				shelltest.SameTree(t, shelltest.Snapshot(t, env), shelltest.Normalize(tr))
			}
		})
	}
}
