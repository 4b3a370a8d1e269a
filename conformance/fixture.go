package conformance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// fixture is one subtest's fresh workspace.
type fixture struct {
	t   *testing.T
	ctx context.Context
	Instance
	vars map[string]string // layout variables: $ROOT, $OUTSIDE, $OUT
}

// outsideLayout is what the kit puts outside the workspace before every
// subtest when the harness has an Outside.
var outsideLayout = []string{"secret: s3cret", "sd/", "sd/f: outside"}

func (h FileSystemHarness) fixture(t *testing.T, needs []Capability) *fixture {
	t.Helper()
	inst := h.New(t)
	if inst.FS == nil || !path.IsAbs(inst.Root) {
		t.Fatalf("conformance: New returned an Instance without FS or with a root %q that is not absolute", inst.Root)
	}
	require(t, h.Skip, inst.has, needs...)
	outside := path.Join(path.Dir(inst.Root), "conformance-outside")
	if inst.Outside != nil {
		outside = inst.Outside.Root()
		if err := inst.Outside.Build(outsideLayout...); err != nil {
			t.Fatalf("conformance: building the outside: %v", err)
		}
	}
	return &fixture{t: t, ctx: t.Context(), Instance: inst, vars: map[string]string{
		"$ROOT":    inst.Root,
		"$OUTSIDE": outside,
		"$OUT":     relPath(inst.Root, outside),
	}}
}

// has reports whether the instance can do what c names.
func (inst Instance) has(c Capability) bool {
	switch c {
	case CapSymlinks:
		_, ok := inst.FS.(workspace.SymlinkFS)
		return ok
	case CapFIFOs, CapSockets:
		return inst.MakeSpecial != nil
	case CapOutside:
		return inst.Outside != nil
	case CapHardlinks:
		return inst.Outside != nil && inst.Hardlink != nil
	case CapPermissions:
		return true
	}
	return false
}

// expand replaces the layout variables in s.
func (x *fixture) expand(s string) string {
	e, err := parseLayout([]string{"l => " + s}, x.vars)
	if err != nil {
		return s
	}
	return e[0].data
}

func (x *fixture) parse(layout []string) []entry {
	x.t.Helper()
	entries, err := parseLayout(layout, x.vars)
	if err != nil {
		x.t.Fatal(err)
	}
	return entries
}

// build creates a layout in the workspace.
func (x *fixture) build(layout ...string) {
	x.t.Helper()
	buildLayout(x.t, x.ctx, x.FS, x.MakeSpecial, x.vars, layout)
}

// Build creates the entries of a layout (see the package doc) in fsys, in
// order, failing t at the first line it cannot parse or create. It is the
// one way tests across the module write a tree: "d/", "f", "f: text",
// "x*: text" (mode 0o755), "l => target", "p|", "s=". Parents are implied
// and made 0o755; files are 0o644. No variables are expanded: a link's
// target is written as given. Named pipes and sockets need a FileSystem with
// a method Mknod(name string, mode fs.FileMode) error, as memfs has (it is
// given the type and 0o644); without one such a line fails the test.
func Build(t testing.TB, fsys workspace.FileSystem, layout ...string) {
	t.Helper()
	var special func(string, fs.FileMode) error
	if m, ok := fsys.(interface {
		Mknod(name string, mode fs.FileMode) error
	}); ok {
		special = func(name string, typ fs.FileMode) error { return m.Mknod(name, typ|0o644) }
	}
	buildLayout(t, t.Context(), fsys, special, nil, layout)
}

// buildLayout creates a layout in a workspace or fails the test.
func buildLayout(t testing.TB, ctx context.Context, fsys workspace.FileSystem, special func(string, fs.FileMode) error, vars map[string]string, layout []string) {
	t.Helper()
	entries, err := parseLayout(layout, vars)
	if err == nil {
		err = buildTree(ctx, fsys, special, entries)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// dump describes the workspace as a layout, leaving out sandboxd's
// bookkeeping (workspace.BookkeepingDir), which a backend may keep there
// (a container session's home, made before its first command) and no case
// of the kit names.
func (x *fixture) dump() []string {
	x.t.Helper()
	lines := within(x.t, hangTimeout, "dumping the workspace", func() result[[]string] {
		lines, err := dumpTree(wsTree{x.ctx, x.FS})
		return result[[]string]{lines, err}
	})
	if lines.err != nil {
		x.t.Fatalf("conformance: dumping the workspace: %v", lines.err)
	}
	return slices.DeleteFunc(lines.v, func(l string) bool {
		return l == workspace.BookkeepingDir+"/" || strings.HasPrefix(l, workspace.BookkeepingDir+"/")
	})
}

// expectTree fails the test unless the workspace holds exactly layout.
func (x *fixture) expectTree(what string, layout ...string) {
	x.t.Helper()
	want := canonical(x.parse(layout))
	if got := x.dump(); !slices.Equal(got, want) {
		x.t.Errorf("%s: the workspace holds\n\t%s\nwant\n\t%s", what, lines(got), lines(want))
	}
}

// expectOutside fails the test unless the outside holds what the kit put
// there; it does nothing without an Outside.
func (x *fixture) expectOutside(what string) {
	x.t.Helper()
	if x.Outside == nil {
		return
	}
	got, err := x.Outside.Dump()
	if err != nil {
		x.t.Fatalf("conformance: dumping the outside: %v", err)
	}
	if want := canonical(x.parse(outsideLayout)); !slices.Equal(got, want) {
		x.t.Errorf("%s: something changed OUTSIDE the workspace: it holds\n\t%s\nwant\n\t%s", what, lines(got), lines(want))
	}
}

func lines(l []string) string {
	if len(l) == 0 {
		return "(nothing)"
	}
	return strings.Join(l, "\n\t")
}

type result[T any] struct {
	v   T
	err error
}

// The kit waits for events, never for time: these bounds only turn a hang
// into a failure, and are generous so that a loaded machine (a load average
// of 16 on 2 cores) does not trip them. hangTimeout bounds any call that
// should end (a Run included); eventTimeout bounds the wait for something
// that should happen at once — a call the contract says must not block
// (special files, a free lock), a line reaching Output, a killed process
// disappearing — since what does not happen within it never will.
const (
	hangTimeout  = 60 * time.Second
	eventTimeout = 20 * time.Second
)

// within runs f on its own goroutine and waits at most d for it. When f does
// not return in time the test fails at once and f is abandoned, so f must
// not use t.
func within[T any](t *testing.T, d time.Duration, what string, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s did not return within %v", what, d)
		panic("unreachable")
	}
}

// errs is the outcome a case expects: nil for success, anyError for a
// failure of any kind, or one of the listed kinds.
type errs []*workspace.Kind

var anyError = errs{}

func is(kinds ...*workspace.Kind) errs { return kinds }

// check reports how err differs from the expectation, or "".
func (e errs) check(err error) string {
	switch {
	case e == nil && err != nil:
		return fmt.Sprintf("unexpected error %v", err)
	case e == nil:
		return ""
	case err == nil:
		return fmt.Sprintf("succeeded, want %s", e)
	}
	if len(e) == 0 {
		return ""
	}
	for _, k := range e {
		if errors.Is(err, k) {
			return ""
		}
	}
	return fmt.Sprintf("error %v is %s, want %s", err, kindName(err), e)
}

// notPathError reports an error that is not an *fs.PathError, as every
// FileSystem method's error must be.
func notPathError(err error) string {
	var pe *fs.PathError
	if err != nil && !errors.As(err, &pe) {
		return fmt.Sprintf("error %v (%T) is no *fs.PathError", err, err)
	}
	return ""
}

func (e errs) String() string {
	if len(e) == 0 {
		return "an error"
	}
	names := make([]string, len(e))
	for i, k := range e {
		names[i] = k.Name()
	}
	return strings.Join(names, " or ")
}

func kindName(err error) string {
	if k := workspace.KindOf(err); k != nil {
		return k.Name()
	}
	return "of no kind"
}

// typeSuffix marks an entry's type as ls -F does.
func typeSuffix(typ fs.FileMode) string {
	switch {
	case typ&fs.ModeDir != 0:
		return "/"
	case typ&fs.ModeSymlink != 0:
		return "@"
	case typ&fs.ModeNamedPipe != 0:
		return "|"
	case typ&fs.ModeSocket != 0:
		return "="
	case typ != 0:
		return "?"
	}
	return ""
}
