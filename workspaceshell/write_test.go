package workspaceshell_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// with returns sample changed: "name": content sets, "name": "\x00" deletes.
func with(changes tree) tree {
	out := maps.Clone(sample)
	for k, v := range changes {
		if v == "\x00" {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

const protectedMsg = "is protected: changes to paths matching .git/**, .sandboxd/** are refused"

var writeCases = []struct {
	line, stdout, stderr string
	exit                 int
	after                tree
}{
	{"mkdir -p x/y && touch x/y/z", "", "", 0, with(tree{"x/y/z": ""})},
	{"mkdir -v new", "mkdir: created directory 'new'\n", "", 0, with(tree{"new/": ""})},
	{"mkdir src", "", "mkdir: cannot create directory 'src': File exists\n", 1, sample},
	{"mkdir a/b", "", "mkdir: cannot create directory 'a/b': No such file or directory\n", 1, sample},
	{"touch a.txt", "", "", 0, sample},
	{"touch nodir/f", "", "touch: cannot touch 'nodir/f': No such file or directory\n", 1, sample},
	{"cat a.txt > b.txt", "", "", 0, with(tree{"b.txt": "hello\nworld\n"})},
	{"cat a.txt > a.txt", "", "", 0, sample},
	{"cat a.txt >> src/util.go", "", "", 0, with(tree{"src/util.go": "package main\n// TODO fix\nhello\nworld\n"})},
	{"grep TODO src/util.go > out.txt 2>&1; ls nothere 2>> out.txt", "", "", 2,
		with(tree{"out.txt": "// TODO fix\nls: cannot access 'nothere': No such file or directory\n"})},
	{"ls nothere &> out.txt", "", "", 2, with(tree{"out.txt": "ls: cannot access 'nothere': No such file or directory\n"})},
	{"grep -c x a.txt > n.txt", "", "", 1, with(tree{"n.txt": "0\n"})},
	{"cat a.txt > src", "", "shell: src: Is a directory\n", 1, sample},
	{"cat a.txt > nodir/f", "", "shell: nodir/f: No such file or directory\n", 1, sample},
	{"cat a.txt > .git/x", "", "shell: .git/x " + protectedMsg + "\n", 1, sample},
	{"cat a.txt > .GIT/x", "", "shell: .GIT/x " + protectedMsg + "\n", 1, sample},
	{"cat a.txt > esc", "", "shell: esc: Path leads outside the workspace\n", 1, sample},
	{"cp a.txt b.txt", "", "", 0, with(tree{"b.txt": "hello\nworld\n"})},
	{"cp a.txt src", "", "", 0, with(tree{"src/a.txt": "hello\nworld\n"})},
	{"cp link.txt l2", "", "", 0, with(tree{"l2": "hello\nworld\n"})},
	{"cp -r src lib", "", "", 0, with(tree{"lib/main.go": sample["src/main.go"], "lib/util.go": sample["src/util.go"]})},
	{"cp -r src docs", "", "", 0, with(tree{"docs/src/main.go": sample["src/main.go"], "docs/src/util.go": sample["src/util.go"]})},
	{"cp src lib", "", "cp: -r not specified; omitting directory 'src'\n", 1, sample},
	{"cp -r src src/in", "", "cp: cannot copy 'src' into itself, 'src/in'\n", 1, sample},
	{"cp a.txt .git/hooks", "", "cp: cannot create '.git/hooks': .git/hooks " + protectedMsg + "\n", 1, sample},
	{"cp a.txt docs/readme.md src", "", "", 0, with(tree{"src/a.txt": "hello\nworld\n", "src/readme.md": "# Title\nTODO: write\n"})},
	{"cp a.txt docs/readme.md nothere", "", "cp: target 'nothere' is not a directory\n", 1, sample},
	{"mv a.txt b.txt", "", "", 0, with(tree{"a.txt": "\x00", "b.txt": "hello\nworld\n"})},
	{"mv a.txt src/", "", "", 0, with(tree{"a.txt": "\x00", "src/a.txt": "hello\nworld\n"})},
	{"mv src docs", "", "", 0, with(tree{"src/main.go": "\x00", "src/util.go": "\x00",
		"docs/src/main.go": sample["src/main.go"], "docs/src/util.go": sample["src/util.go"]})},
	{"mv .git g", "", "mv: cannot move '.git': .git " + protectedMsg + "\n", 1, sample},
	{"mv a.txt .git/", "", "mv: cannot move 'a.txt' to '.git/a.txt': .git/a.txt " + protectedMsg + "\n", 1, sample},
	{"rm a.txt", "", "", 0, with(tree{"a.txt": "\x00"})},
	{"rm link.txt", "", "", 0, with(tree{"link.txt -> a.txt": "\x00"})},
	{"rm -rv src", "removed directory 'src'\n", "", 0, with(tree{"src/main.go": "\x00", "src/util.go": "\x00"})},
	{"rm src", "", "rm: cannot remove 'src': Is a directory\n", 1, sample},
	{"rm -d empty", "", "", 0, with(tree{"empty/": "\x00"})},
	{"rm -f nothere", "", "", 0, sample},
	{"rm nothere", "", "rm: cannot remove 'nothere': No such file or directory\n", 1, sample},
	{"rm -rf .", "", "rm: refusing to remove '.' or '..' directory: skipping '.'\n", 1, sample},
	{"rm -rf $HOME", "", "rm: cannot remove '$ROOT': $ROOT is the workspace root, which cannot be replaced, moved or deleted\n", 1, sample},
	{"rm -rf /", "", "rm: cannot remove '/': Path leads outside the workspace\n", 1, sample},
	{"rm .git/config", "", "rm: cannot remove '.git/config': .git/config " + protectedMsg + "\n", 1, sample},
	{"rm -rf src .git", "", "rm: cannot remove '.git': .git " + protectedMsg + "\n", 1,
		with(tree{"src/main.go": "\x00", "src/util.go": "\x00"})},
	{"rm -i a.txt", "", "rm: invalid option -- 'i'\n", 2, sample},
	{"find . -name '*.go' > list.txt; wc -l < list.txt", "2\n", "", 0, with(tree{"list.txt": "./src/main.go\n./src/util.go\n"})},
	{"for f in src/*.go; do cp $f $f.bak; done", "", "", 0,
		with(tree{"src/main.go.bak": sample["src/main.go"], "src/util.go.bak": sample["src/util.go"]})},
}

func TestWriteLines(t *testing.T) {
	tr := maps.Clone(sample)
	tr["esc -> /etc/passwd"] = ""
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range writeCases {
				env := setup(t, b, tr)
				root := env.Session.Root
				res, err := run(t, env, tc.line, workspaceshell.Write)
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
				got := snapshot(t, env)
				want := normalize(after)
				if !maps.Equal(got, want) {
					t.Errorf("%q: the workspace is not as expected", tc.line)
					sameTree(t, got, want)
				}
			}
		})
	}
}

// TestProtectedTree: a tree with a protected path anywhere below it is not
// deleted, moved or copied at all.
func TestProtectedTree(t *testing.T) {
	tr := tree{"d/x": "x", "d/sub/secret": "s", "keep": "k"}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, line := range []string{"rm -r d", "mv d e", "cp -r keep d/sub/secret"} {
				env := setup(t, b, tr)
				env.Protect = workspace.Protect{"**/secret"}
				res, err := run(t, env, line, workspaceshell.Write)
				if err != nil || res.ExitCode != 1 || !strings.Contains(res.Stderr, "secret is protected") {
					t.Errorf("%q: %+v, %v; want a protected refusal", line, res, err)
				}
				sameTree(t, snapshot(t, env), normalize(tr))
			}
			env := setup(t, b, tr)
			env.Protect = workspace.Protect{"**/secret"}
			if _, err := workspaceshell.DeletePath(context.Background(), env, workspaceshell.DeletePathRequest{Path: "d", Recursive: true}); !errors.Is(err, workspace.ErrProtected) {
				t.Errorf("DeletePath of a tree holding a protected file: %v", err)
			}
			sameTree(t, snapshot(t, env), normalize(tr))
		})
	}
}

func TestStructured(t *testing.T) {
	ctx := context.Background()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			env := setup(t, b, with(tree{"esc -> /etc/passwd": ""}))
			w, err := workspaceshell.WriteFile(ctx, env, workspaceshell.WriteFileRequest{Path: "new/deep/f.txt", Content: "one\n"})
			if err != nil || w != (workspaceshell.WriteFileResult{Path: "new/deep/f.txt", Bytes: 4, Created: true}) {
				t.Fatalf("WriteFile: %+v, %v", w, err)
			}
			w, err = workspaceshell.WriteFile(ctx, env, workspaceshell.WriteFileRequest{Path: env.Session.Root + "/new/deep/f.txt", Content: "two\n"})
			if err != nil || w.Created {
				t.Fatalf("WriteFile again: %+v, %v", w, err)
			}
			a, err := workspaceshell.AppendFile(ctx, env, workspaceshell.AppendFileRequest{Path: "new/deep/f.txt", Content: "three\n"})
			if err != nil || a.Size != 10 || a.Bytes != 6 || a.Created {
				t.Fatalf("AppendFile: %+v, %v", a, err)
			}
			d, err := workspaceshell.MakeDir(ctx, env, workspaceshell.MakeDirRequest{Path: "m/n"})
			if err != nil || !d.Created {
				t.Fatalf("MakeDir: %+v, %v", d, err)
			}
			if d, err = workspaceshell.MakeDir(ctx, env, workspaceshell.MakeDirRequest{Path: "m/n"}); err != nil || d.Created {
				t.Fatalf("MakeDir again: %+v, %v", d, err)
			}
			c, err := workspaceshell.CopyPath(ctx, env, workspaceshell.CopyPathRequest{From: "src", To: "copy/src"})
			if err != nil || c.Entries != 3 {
				t.Fatalf("CopyPath: %+v, %v", c, err)
			}
			if _, err := workspaceshell.CopyPath(ctx, env, workspaceshell.CopyPathRequest{From: "a.txt", To: "docs/readme.md"}); !errors.Is(err, workspace.ErrExists) {
				t.Fatalf("CopyPath onto a file: %v, want Exists", err)
			}
			if _, err := workspaceshell.CopyPath(ctx, env, workspaceshell.CopyPathRequest{From: "a.txt", To: "docs/readme.md", Overwrite: true}); err != nil {
				t.Fatalf("CopyPath overwrite: %v", err)
			}
			if _, err := workspaceshell.MovePath(ctx, env, workspaceshell.MovePathRequest{From: "copy/src", To: "moved"}); err != nil {
				t.Fatalf("MovePath: %v", err)
			}
			if _, err := workspaceshell.MovePath(ctx, env, workspaceshell.MovePathRequest{From: "moved", To: "docs"}); !errors.Is(err, workspace.ErrExists) {
				t.Fatalf("MovePath onto a directory: %v, want Exists", err)
			}
			if _, err := workspaceshell.DeletePath(ctx, env, workspaceshell.DeletePathRequest{Path: "moved"}); !errors.Is(err, workspace.ErrNotEmpty) {
				t.Fatalf("DeletePath of a directory: %v, want NotEmpty", err)
			}
			if r, err := workspaceshell.DeletePath(ctx, env, workspaceshell.DeletePathRequest{Path: "moved", Recursive: true}); err != nil || r.Removed != 3 {
				t.Fatalf("DeletePath recursive: %+v, %v", r, err)
			}
			want := with(tree{"esc -> /etc/passwd": "", "new/deep/f.txt": "two\nthree\n", "m/n/": "", "copy/": "", "docs/readme.md": "hello\nworld\n"})
			sameTree(t, snapshot(t, env), normalize(want))

			for _, tc := range []struct {
				name string
				err  error
				kind *workspace.Kind
			}{
				{"write outside", ignore(workspaceshell.WriteFile(ctx, env, workspaceshell.WriteFileRequest{Path: "../x", Content: "x"})), workspace.ErrOutsideWorkspace},
				{"write through an escaping link", ignore(workspaceshell.WriteFile(ctx, env, workspaceshell.WriteFileRequest{Path: "esc/x", Content: "x"})), workspace.ErrOutsideWorkspace},
				{"write protected", ignore(workspaceshell.WriteFile(ctx, env, workspaceshell.WriteFileRequest{Path: ".git/config", Content: "x"})), workspace.ErrProtected},
				{"append protected", ignore(workspaceshell.AppendFile(ctx, env, workspaceshell.AppendFileRequest{Path: ".sandboxd/x", Content: "x"})), workspace.ErrProtected},
				{"write a directory", ignore(workspaceshell.WriteFile(ctx, env, workspaceshell.WriteFileRequest{Path: "src", Content: "x"})), workspace.ErrNotAFile},
				{"mkdir protected", ignore(workspaceshell.MakeDir(ctx, env, workspaceshell.MakeDirRequest{Path: ".git/x"})), workspace.ErrProtected},
				{"mkdir over a file", ignore(workspaceshell.MakeDir(ctx, env, workspaceshell.MakeDirRequest{Path: "a.txt/x"})), workspace.ErrNotADirectory},
				{"copy into itself", ignore(workspaceshell.CopyPath(ctx, env, workspaceshell.CopyPathRequest{From: "src", To: "src/x"})), workspace.ErrInvalidArgument},
				{"copy from outside", ignore(workspaceshell.CopyPath(ctx, env, workspaceshell.CopyPathRequest{From: "/etc/passwd", To: "p"})), workspace.ErrOutsideWorkspace},
				{"move protected", ignore(workspaceshell.MovePath(ctx, env, workspaceshell.MovePathRequest{From: ".git", To: "g"})), workspace.ErrProtected},
				{"move the root", ignore(workspaceshell.MovePath(ctx, env, workspaceshell.MovePathRequest{From: ".", To: "g"})), workspace.ErrInvalidArgument},
				{"delete the root", ignore(workspaceshell.DeletePath(ctx, env, workspaceshell.DeletePathRequest{Path: env.Session.Root, Recursive: true})), workspace.ErrInvalidArgument},
				{"delete missing", ignore(workspaceshell.DeletePath(ctx, env, workspaceshell.DeletePathRequest{Path: "nothere"})), workspace.ErrNotFound},
			} {
				if !errors.Is(tc.err, tc.kind) {
					t.Errorf("%s: %v, want %s", tc.name, tc.err, tc.kind.Name())
				}
			}
			sameTree(t, snapshot(t, env), normalize(want))
		})
	}
}

func ignore[T any](_ T, err error) error { return err }

// TestAppendConcurrent: appends through the lock lose nothing.
func TestAppendConcurrent(t *testing.T) {
	ctx := context.Background()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			env := setup(t, b, nil)
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := workspaceshell.AppendFile(ctx, env, workspaceshell.AppendFileRequest{Path: "log", Content: fmt.Sprintf("%02d\n", i)}); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			data, err := env.FS.ReadFile(ctx, "log", 1<<20)
			if err != nil || len(data) != 60 {
				t.Fatalf("log = %q, %v; want 20 lines", data, err)
			}
		})
	}
}
