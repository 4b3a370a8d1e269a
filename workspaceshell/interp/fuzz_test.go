package interp_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspaceshell/internal/shelltest"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"

	"github.com/sandboxd/sandboxd/workspace"
)

// FuzzCheck checks the allowlist checker against an oracle of its own: in
// whatever line Check accepts, every command name, expanded by the expand
// package with no variables and no command substitution, is one of the
// mode's commands, and in read mode every output redirection goes to
// /dev/null. An accepted line then runs on a small memory workspace in read
// mode without a panic and without changing it.
func FuzzCheck(f *testing.F) {
	for _, c := range refusedCases {
		f.Add(c.line, false)
	}
	for _, c := range readCases {
		f.Add(c.line, false)
	}
	for _, c := range writeCases {
		f.Add(c.line, true)
	}
	for _, s := range []string{
		"ls $(ls $(rm x))", "l''s", `l"s"`, "l\\\ns", "ls;rm x", "ls\nrm x", "ls#\nrm", "ls | { cat; rm x; }",
		"${X:-rm} x", "$'ls'", "ls <(ls) >(rm x)", "cat <<E\n`rm x`\nE", "ls ${x[$(rm y)]}", "ls $((1 + $(rm x)))",
		"while ls; do ls; done", "for i in 1 2; do ls $i; done", "ls >/dev/null 2>&1", "ls 2>/dev/null >&2",
		"ls {,r}m", "[ -f x ]", "true", "coproc ls", "time ls", "ls &>/dev/null", "! ! ls", "ls |& cat",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, line string, write bool) {
		mode := interp.Read
		if write {
			mode = interp.Write
		}
		err := interp.Check(line, mode)
		if err != nil {
			if !errors.Is(err, workspace.ErrForbidden) && !errors.Is(err, workspace.ErrInvalidArgument) {
				t.Fatalf("%q: error %v is neither Forbidden nor InvalidArgument", line, err)
			}
			return
		}
		file, perr := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(line), "")
		if perr != nil {
			t.Fatalf("%q: accepted, but it does not parse: %v", line, perr)
		}
		allowed := interp.ShellCommands(mode)
		cfg := &expand.Config{Env: expand.ListEnviron()}
		syntax.Walk(file, func(n syntax.Node) bool {
			switch n := n.(type) {
			case *syntax.CallExpr:
				if len(n.Args) == 0 {
					if len(n.Assigns) > 0 {
						t.Fatalf("%q: accepted an assignment", line)
					}
					return true
				}
				names, err := expand.Fields(cfg, n.Args[0])
				if err != nil || len(names) != 1 || !slices.Contains(allowed, names[0]) {
					t.Fatalf("%q: accepted the command %q (%v) in %s mode", line, names, err, mode)
				}
			case *syntax.FuncDecl:
				t.Fatalf("%q: accepted a function definition", line)
			case *syntax.Redirect:
				switch n.Op {
				case syntax.RdrOut, syntax.AppOut, syntax.RdrClob, syntax.RdrAll, syntax.AppAll:
					if target, err := expand.Fields(cfg, n.Word); mode == interp.Read && (err != nil || len(target) != 1 || target[0] != "/dev/null") {
						t.Fatalf("%q: accepted a redirection to %q in read mode", line, target)
					}
				}
			}
			return true
		})
		if mode != interp.Read {
			return
		}
		env := interp.Env{FS: fuzzTree(t), MaxOutput: 64 << 10, Timeout: 200 * time.Millisecond}
		before := shelltest.Snapshot(t, env)
		start := time.Now()
		if _, err := interp.Run(context.Background(), env, line, mode); err != nil && !errors.Is(err, workspace.ErrForbidden) {
			t.Fatalf("%q: Run: %v", line, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%q: ran %v past its 200ms timeout", line, d)
		}
		shelltest.SameTree(t, shelltest.Snapshot(t, env), before)
	})
}

func fuzzTree(t *testing.T) workspace.FileSystem {
	env := shelltest.Setup(t, shelltest.Backends[0], shelltest.Tree{"a.txt": "hello\nworld\n", "src/x.go": "package x\n", "x -> a.txt": ""})
	return env.FS
}
