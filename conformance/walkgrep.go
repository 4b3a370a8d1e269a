package conformance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/workspace"
)

// walkCase is one workspace.Walk on a tree. When the adapter is a
// workspace.WalkFS, its answer must also equal workspace.WalkGeneric's.
type walkCase struct {
	name      string
	layout    []string
	req       workspace.WalkRequest
	want      []string // entries with ls -F suffixes
	truncated bool
	err       errs
}

var walkTree = l("a.go: package a", "b/c.go: package b", "b/d.txt: hello", "b/e/f.go", "node_modules/m.go", "z.txt")

var walkCases = []walkCase{
	{name: "Walk/All", layout: walkTree,
		want: l("a.go", "b/", "b/c.go", "b/d.txt", "b/e/", "b/e/f.go", "node_modules/", "node_modules/m.go", "z.txt")},
	{name: "Walk/Exclude", layout: walkTree, req: workspace.WalkRequest{Exclude: workspace.DefaultExclude},
		want: l("a.go", "b/", "b/c.go", "b/d.txt", "b/e/", "b/e/f.go", "z.txt")},
	{name: "Walk/ExcludeGlob", layout: walkTree, req: workspace.WalkRequest{Exclude: workspace.Exclude{"*.txt", "e"}},
		want: l("a.go", "b/", "b/c.go", "node_modules/", "node_modules/m.go")},
	{name: "Walk/ExcludePath", layout: walkTree, req: workspace.WalkRequest{Exclude: workspace.Exclude{"b/e"}},
		want: l("a.go", "b/", "b/c.go", "b/d.txt", "node_modules/", "node_modules/m.go", "z.txt")},
	{name: "Walk/Pattern", layout: walkTree, req: workspace.WalkRequest{Pattern: "*.go"},
		want: l("a.go", "b/c.go", "b/e/f.go", "node_modules/m.go")},
	{name: "Walk/PatternPath", layout: walkTree, req: workspace.WalkRequest{Pattern: "b/*"},
		want: l("b/c.go", "b/d.txt", "b/e/")},
	{name: "Walk/PatternDoubleStar", layout: walkTree, req: workspace.WalkRequest{Pattern: "b/**/*.go"},
		want: l("b/c.go", "b/e/f.go")},
	{name: "Walk/FilesOnly", layout: walkTree, req: workspace.WalkRequest{FilesOnly: true},
		want: l("a.go", "b/c.go", "b/d.txt", "b/e/f.go", "node_modules/m.go", "z.txt")},
	{name: "Walk/Limit", layout: walkTree, req: workspace.WalkRequest{Limit: 3},
		want: l("a.go", "b/", "b/c.go"), truncated: true},
	{name: "Walk/LimitExact", layout: walkTree, req: workspace.WalkRequest{Limit: 9},
		want: l("a.go", "b/", "b/c.go", "b/d.txt", "b/e/", "b/e/f.go", "node_modules/", "node_modules/m.go", "z.txt")},
	// Errors asks for directories that could not be read; a readable tree
	// gives the plain list, on the fast path as in the generic walk.
	{name: "Walk/Errors", layout: walkTree, req: workspace.WalkRequest{Errors: true, Limit: 9},
		want: l("a.go", "b/", "b/c.go", "b/d.txt", "b/e/", "b/e/f.go", "node_modules/", "node_modules/m.go", "z.txt")},
	{name: "Walk/MaxDepth", layout: walkTree, req: workspace.WalkRequest{MaxDepth: 1},
		want: l("a.go", "b/", "node_modules/", "z.txt")},
	{name: "Walk/MaxDepthDir", layout: walkTree, req: workspace.WalkRequest{Dir: "b", MaxDepth: 2, FilesOnly: true},
		want: l("b/c.go", "b/d.txt", "b/e/f.go")},
	{name: "Walk/ListExcluded", layout: walkTree, req: workspace.WalkRequest{Exclude: workspace.Exclude{"node_modules", "e"}, ListExcluded: true},
		want: l("a.go", "b/", "b/c.go", "b/d.txt", "b/e/", "node_modules/", "z.txt")},
	{name: "Walk/Dir", layout: walkTree, req: workspace.WalkRequest{Dir: "b"},
		want: l("b/c.go", "b/d.txt", "b/e/", "b/e/f.go")},
	{name: "Walk/StartFile", layout: walkTree, req: workspace.WalkRequest{Dir: "b/d.txt"}, want: l("b/d.txt")},
	{name: "Walk/StartExcludedName", layout: walkTree, req: workspace.WalkRequest{Dir: "node_modules", Exclude: workspace.DefaultExclude},
		want: l("node_modules/m.go")},
	{name: "Walk/Empty", want: empty},
	{name: "Walk/NotFound", layout: walkTree, req: workspace.WalkRequest{Dir: "nothere"}, err: notFound},
	{name: "Walk/InvalidPattern", layout: walkTree, req: workspace.WalkRequest{Pattern: "a/[b"}, err: invalid},
	{name: "Walk/LinksNotEntered", layout: l("d/f", "ld => d", "lf => d/f", "lo => $OUTSIDE/sd", "loop => loop"),
		want: l("d/", "d/f", "ld@", "lf@", "lo@", "loop@")},
	{name: "Walk/StartLinkFollowedOnce", layout: l("d/f", "d/ld => ../d", "ld => d"), req: workspace.WalkRequest{Dir: "ld"},
		want: l("ld/f", "ld/ld@")},
	{name: "Walk/StartLinkOut", layout: l("lo => $OUTSIDE/sd"), req: workspace.WalkRequest{Dir: "lo"}, want: l("lo@")},
	{name: "Walk/FIFO", layout: l("a", "d/p|", "z"), want: l("a", "d/", "d/p|", "z")},
	{name: "Walk/FIFOFilesOnly", layout: l("a", "p|"), req: workspace.WalkRequest{FilesOnly: true}, want: l("a", "p|")},
	// With Info, files show their size and links their target.
	{name: "Walk/Info", layout: l("a: "+quote("12345"), "d/e: "+quote(""), "d/l => ../a", "lo => /nowhere/x", "p|"),
		req: workspace.WalkRequest{Info: true}, want: l("a 5", "d/", "d/e 0", "d/l@ ../a", "lo@ /nowhere/x", "p|")},
	{name: "Walk/InfoStartFile", layout: l("d/f: " + quote("abc")), req: workspace.WalkRequest{Dir: "d/f", Info: true}, want: l("d/f 3")},
}

func (h FileSystemHarness) runWalk(t *testing.T, c walkCase) {
	runQuery(t, h, query[workspace.WalkResult]{
		name: c.name, layout: c.layout, err: c.err,
		desc: fmt.Sprintf("workspace.Walk(%+v)", c.req),
		run: func(ctx context.Context, fsys workspace.FileSystem) (workspace.WalkResult, error) {
			return workspace.Walk(ctx, fsys, c.req)
		},
		generic: func(ctx context.Context, fsys workspace.FileSystem) (workspace.WalkResult, error) {
			return workspace.WalkGeneric(ctx, fsys, c.req)
		},
		fast: func(fsys workspace.FileSystem) bool { _, ok := fsys.(workspace.WalkFS); return ok },
		check: func(r workspace.WalkResult) string {
			var entries []string
			for _, e := range r.Entries {
				entry := e.Path + typeSuffix(e.Type)
				switch {
				case !c.req.Info:
				case e.Mode.Type() != e.Type || (e.Type != fs.ModeSymlink && e.Mode.Perm() == 0):
					entry += fmt.Sprintf(" mode %v", e.Mode)
				case e.Type == 0:
					entry += fmt.Sprintf(" %d", e.Size)
				case e.Type == fs.ModeSymlink:
					entry += " " + e.Link
				}
				entries = append(entries, entry)
			}
			if !slices.Equal(entries, c.want) || r.Truncated != c.truncated {
				return fmt.Sprintf("%q, truncated %v; want %q, truncated %v", entries, r.Truncated, c.want, c.truncated)
			}
			return ""
		},
	})
}

// query is a call of a helper with a fast path (Walk, Grep) on a tree: its
// answer must be right and, when the adapter has the fast path, equal to
// the generic helper's.
type query[R any] struct {
	name, desc   string
	layout       []string
	err          errs
	run, generic func(context.Context, workspace.FileSystem) (R, error)
	fast         func(workspace.FileSystem) bool // whether the adapter has the fast path
	check        func(R) string                  // what is wrong with a result, or ""
	checkErr     func(error) string              // what is wrong with an error, or ""; may be nil
}

func runQuery[R any](t *testing.T, h FileSystemHarness, q query[R]) {
	t.Run(q.name, func(t *testing.T) {
		t.Parallel()
		needs := layoutNeeds(q.layout)
		x := h.fixture(t, needs)
		x.build(q.layout...)
		got := within(t, timeoutFor(needs), q.desc, func() result[R] {
			r, err := q.run(x.ctx, x.FS)
			return result[R]{r, err}
		})
		if msg := q.err.check(got.err); msg != "" {
			t.Errorf("%s: %s", q.desc, msg)
		} else if got.err != nil && q.checkErr != nil {
			if msg := q.checkErr(got.err); msg != "" {
				t.Errorf("%s: %s", q.desc, msg)
			}
		} else if got.err == nil {
			if msg := q.check(got.v); msg != "" {
				t.Errorf("%s = %s", q.desc, msg)
			}
		}
		if q.fast(x.FS) {
			generic, err := q.generic(x.ctx, x.FS)
			sameResult(t, q.desc, got.v, got.err, generic, err)
		}
	})
}

// sameResult fails t unless a fast path's answer equals the generic one.
func sameResult(t *testing.T, what string, fast any, fastErr error, generic any, genericErr error) {
	t.Helper()
	if workspace.KindOf(fastErr) != workspace.KindOf(genericErr) || (fastErr == nil) != (genericErr == nil) {
		t.Errorf("the adapter's fast path of %s fails with %v, the generic helper with %v", what, fastErr, genericErr)
		return
	}
	if fastErr == nil && !reflect.DeepEqual(fast, generic) {
		t.Errorf("the adapter's fast path of %s differs from the generic helper:\n\tfast:    %+v\n\tgeneric: %+v", what, fast, generic)
	}
}

// grepCase is one workspace.Grep on a tree, compared with GrepGeneric too
// when the adapter is a workspace.GrepFS.
type grepCase struct {
	name      string
	layout    []string
	req       workspace.GrepRequest
	want      []string // "path:line:text" for a match, "path-line-text" for context
	truncated bool
	err       errs
	// pattern says the error must be a *workspace.PatternError (errors.As),
	// which carries what is wrong with the expression to the caller.
	pattern bool
}

var grepTree = l(
	"a.go: "+quote("package a\n\nfunc A() {}\n"),
	"b/c.go: "+quote("package b\nfunc B() {}\nfunc C() {}\n"),
	"b/d.txt: "+quote("Hello\nhello\nHELLO\nbye\n"),
	"bin: "+quote("func\x00binary\n"),
	"crlf.txt: "+quote("one\r\ntwo\r\n"),
	"node_modules/m.go: "+quote("func M() {}\n"),
)

var grepCases = []grepCase{
	{name: "Grep/Regexp", layout: grepTree, req: workspace.GrepRequest{Pattern: "^func"},
		want: l("a.go:3:func A() {}", "b/c.go:2:func B() {}", "b/c.go:3:func C() {}", "node_modules/m.go:1:func M() {}")},
	{name: "Grep/Exclude", layout: grepTree, req: workspace.GrepRequest{Pattern: "^func", Exclude: workspace.DefaultExclude},
		want: l("a.go:3:func A() {}", "b/c.go:2:func B() {}", "b/c.go:3:func C() {}")},
	{name: "Grep/Literal", layout: grepTree, req: workspace.GrepRequest{Pattern: "B() {", Literal: true},
		want: l("b/c.go:2:func B() {}")},
	{name: "Grep/CaseSensitive", layout: grepTree, req: workspace.GrepRequest{Pattern: "hello"},
		want: l("b/d.txt:2:hello")},
	{name: "Grep/IgnoreCase", layout: grepTree, req: workspace.GrepRequest{Pattern: "hello", IgnoreCase: true},
		want: l("b/d.txt:1:Hello", "b/d.txt:2:hello", "b/d.txt:3:HELLO")},
	{name: "Grep/Glob", layout: grepTree, req: workspace.GrepRequest{Pattern: "e", Glob: "*.txt"},
		want: l("b/d.txt:1:Hello", "b/d.txt:2:hello", "b/d.txt:4:bye", "crlf.txt:1:one")},
	{name: "Grep/Context", layout: grepTree, req: workspace.GrepRequest{Pattern: "func B", Context: 1},
		want: l("b/c.go-1-package b", "b/c.go:2:func B() {}", "b/c.go-3-func C() {}")},
	{name: "Grep/Limit", layout: grepTree, req: workspace.GrepRequest{Pattern: "^func", Limit: 2},
		want: l("a.go:3:func A() {}", "b/c.go:2:func B() {}"), truncated: true},
	{name: "Grep/LimitContext", layout: grepTree, req: workspace.GrepRequest{Pattern: "^func", Limit: 2, Context: 1},
		want: l("a.go-2-", "a.go:3:func A() {}", "b/c.go-1-package b", "b/c.go:2:func B() {}"), truncated: true},
	{name: "Grep/Dir", layout: grepTree, req: workspace.GrepRequest{Pattern: "func", Dir: "b"},
		want: l("b/c.go:2:func B() {}", "b/c.go:3:func C() {}")},
	{name: "Grep/FileIgnoresGlob", layout: grepTree, req: workspace.GrepRequest{Pattern: "hello", Dir: "b/d.txt", Glob: "*.go"},
		want: l("b/d.txt:2:hello")},
	{name: "Grep/BinarySkipped", layout: grepTree, req: workspace.GrepRequest{Pattern: "binary"}, want: empty},
	{name: "Grep/CRLF", layout: grepTree, req: workspace.GrepRequest{Pattern: "tw"}, want: l("crlf.txt:2:two")},
	{name: "Grep/MaxLineChars", layout: grepTree, req: workspace.GrepRequest{Pattern: "C$", MaxLineChars: 6},
		want: l("b/c.go:3:func C")},
	{name: "Grep/MaxFileBytes", layout: grepTree, req: workspace.GrepRequest{Pattern: "func", MaxFileBytes: 15},
		want: l("node_modules/m.go:1:func M() {}")},
	// grep(1)'s way: the "\r" of a line kept, binary files reported.
	{name: "Grep/KeepCR", layout: grepTree, req: workspace.GrepRequest{Pattern: "o\r$", KeepCR: true}, want: l("crlf.txt:2:two\r")},
	{name: "Grep/Binary", layout: grepTree, req: workspace.GrepRequest{Pattern: "binary|^func", Binary: true, Context: 1},
		want: l("a.go-2-", "a.go:3:func A() {}", "b/c.go-1-package b", "b/c.go:2:func B() {}", "b/c.go:3:func C() {}", "bin:1:(binary)", "node_modules/m.go:1:func M() {}")},
	{name: "Grep/BinaryLimit", layout: grepTree, req: workspace.GrepRequest{Pattern: "binary|^func", Binary: true, Limit: 4},
		want: l("a.go:3:func A() {}", "b/c.go:2:func B() {}", "b/c.go:3:func C() {}", "bin:1:(binary)"), truncated: true},
	{name: "Grep/InvalidPattern", layout: grepTree, req: workspace.GrepRequest{Pattern: "("}, err: invalid, pattern: true},
	{name: "Grep/NotFound", layout: grepTree, req: workspace.GrepRequest{Pattern: "x", Dir: "nothere"}, err: notFound},
	{name: "Grep/LinksNotFollowed", layout: l("d/f: needle", "ld => d", "lf => d/f", "lo => $OUTSIDE/sd", "ls => $OUTSIDE/secret"),
		req: workspace.GrepRequest{Pattern: "needle|s3cret|outside"}, want: l("d/f:1:needle")},
	{name: "Grep/FIFO", layout: l("a: needle", "p|", "z: needle"), req: workspace.GrepRequest{Pattern: "needle"},
		want: l("a:1:needle", "z:1:needle")},
}

func (h FileSystemHarness) runGrep(t *testing.T, c grepCase) {
	runQuery(t, h, query[workspace.GrepResult]{
		name: c.name, layout: c.layout, err: c.err,
		desc: fmt.Sprintf("workspace.Grep(%+v)", c.req),
		run: func(ctx context.Context, fsys workspace.FileSystem) (workspace.GrepResult, error) {
			return workspace.Grep(ctx, fsys, c.req)
		},
		generic: func(ctx context.Context, fsys workspace.FileSystem) (workspace.GrepResult, error) {
			return workspace.GrepGeneric(ctx, fsys, c.req)
		},
		fast: func(fsys workspace.FileSystem) bool { _, ok := fsys.(workspace.GrepFS); return ok },
		checkErr: func(err error) string {
			var pe *workspace.PatternError
			if c.pattern && !errors.As(err, &pe) {
				return fmt.Sprintf("%v (%T) is not a *workspace.PatternError, so the caller cannot say what is wrong with the expression", err, err)
			}
			return ""
		},
		check: func(r workspace.GrepResult) string {
			var lines []string
			matches := 0
			for _, gl := range r.Lines {
				sep := "-"
				if gl.Match {
					sep = ":"
					matches++
				}
				text := gl.Text
				if gl.Binary {
					text = "(binary)" + text
				}
				lines = append(lines, fmt.Sprintf("%s%s%d%s%s", gl.Path, sep, gl.Line, sep, text))
			}
			if !slices.Equal(lines, c.want) || r.Truncated != c.truncated || r.Matches != matches {
				return fmt.Sprintf("%q, %d matches, truncated %v; want %q, truncated %v", lines, r.Matches, r.Truncated, c.want, c.truncated)
			}
			return ""
		},
	})
}
