package workspaceshell_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/workspaceshell/internal/shelltest"

	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// TestProtectedTreeStructured: DeletePath of a tree with a protected path
// anywhere below it deletes nothing.
func TestProtectedTreeStructured(t *testing.T) {
	tr := shelltest.Tree{"d/x": "x", "d/sub/secret": "s", "keep": "k"}
	for _, b := range shelltest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			env := shelltest.Setup(t, b, tr)
			env.Protect = workspace.Protect{"**/secret"}
			if _, err := workspaceshell.DeletePath(context.Background(), env, workspaceshell.DeletePathRequest{Path: "d", Recursive: true}); !errors.Is(err, workspace.ErrProtected) {
				t.Errorf("DeletePath of a tree holding a protected file: %v", err)
			}
			shelltest.SameTree(t, shelltest.Snapshot(t, env), shelltest.Normalize(tr))
		})
	}
}

func TestStructured(t *testing.T) {
	ctx := context.Background()
	for _, b := range shelltest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			env := shelltest.Setup(t, b, shelltest.With(shelltest.Tree{"esc -> /etc/passwd": ""}))
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
			want := shelltest.With(shelltest.Tree{"esc -> /etc/passwd": "", "new/deep/f.txt": "two\nthree\n", "m/n/": "", "copy/": "", "docs/readme.md": "hello\nworld\n"})
			shelltest.SameTree(t, shelltest.Snapshot(t, env), shelltest.Normalize(want))

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
			shelltest.SameTree(t, shelltest.Snapshot(t, env), shelltest.Normalize(want))
		})
	}
}

func ignore[T any](_ T, err error) error { return err }

// TestAppendConcurrent: appends through the lock lose nothing.
func TestAppendConcurrent(t *testing.T) {
	ctx := context.Background()
	for _, b := range shelltest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			env := shelltest.Setup(t, b, nil)
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
