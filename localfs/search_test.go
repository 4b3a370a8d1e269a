package localfs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/workspace"
)

// Walk and Grep give what WalkGeneric and GrepGeneric give, on trees beyond
// the conformance kit's: deep, with siblings after deep subtrees (the open
// directory chain), many files of varying sizes read into reused buffers,
// starts through relative and absolute links (which openat2 refuses and
// ReadFile resolves).
func TestSearchEqualsGeneric(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var many []string
	for i := range 150 {
		var b strings.Builder
		for n := range rng.IntN(300) {
			fmt.Fprintf(&b, "line %d of %d%s\n", n, i, strings.Repeat("x", rng.IntN(60)))
		}
		many = append(many, fmt.Sprintf("many/%03d.txt: %s", i, b.String()))
	}
	big := "big/huge.txt: " + strings.Repeat("filler line\n", 100_000) + "line 7 at the end\n"
	deep := []string{
		"a/b/c/d/e/f/g/h/i/j/k.go: line 7 deep\n", "a/b/c/d/e/z.go: line 7\n", "a/b/y.go: line 77\n", "a/z.go: no\n",
		"a/b/c/d/e/f/g/h2/x.go: line 7 again\n", "a/b/c0/w.go: line 70\n", "top.go: line 7\n",
		"ld => a/b", "abs => $ROOT/a/b", "lo => ../out", "out.go => ../out/secret", "p|",
	}
	layout := append(append(append([]string{"../out/secret: line 7 outside\n", big}, deep...), many...), "empty.txt:")
	fsys, _ := newFS(t, layout...)
	ctx := context.Background()

	walks := []workspace.WalkRequest{
		{},
		{FilesOnly: true},
		{Dir: "a/b"},
		{Dir: "ld"},
		{Dir: "abs", FilesOnly: true},
		{Dir: "lo"},
		{Dir: "a/z.go"},
		{Pattern: "**/*.go"},
		{Exclude: workspace.Exclude{"many", "e"}},
		{Limit: 20},
		{Info: true},
		{Dir: "abs", Info: true},
	}
	for _, req := range walks {
		got, gerr := fsys.Walk(ctx, req)
		want, werr := workspace.WalkGeneric(ctx, fsys, req)
		if !reflect.DeepEqual(got, want) || workspace.KindOf(gerr) != workspace.KindOf(werr) {
			t.Errorf("Walk(%+v) = %v, %v\nWalkGeneric gives %v, %v", req, got, gerr, want, werr)
		}
	}

	greps := []workspace.GrepRequest{
		{Pattern: "line 7"},
		{Pattern: `of 1\d\dx`, Context: 2},
		{Pattern: "LINE 3 OF", IgnoreCase: true, Context: 1, Limit: 50},
		{Pattern: "line 7", Dir: "ld"},
		{Pattern: "line 7", Dir: "abs"},
		{Pattern: "line 7", Dir: "big"},
		{Pattern: "line 7", MaxFileBytes: 1 << 20},
		{Pattern: "x{5}$", MaxLineChars: 20, Glob: "many/0*"},
		{Pattern: "line 7", Dir: "a/b/y.go"},
	}
	for _, req := range greps {
		got, gerr := fsys.Grep(ctx, req)
		want, werr := workspace.GrepGeneric(ctx, fsys, req)
		if !reflect.DeepEqual(got, want) || workspace.KindOf(gerr) != workspace.KindOf(werr) {
			t.Errorf("Grep(%+v) = %d lines, %v\nGrepGeneric gives %d lines, %v", req, len(got.Lines), gerr, len(want.Lines), werr)
		}
		if gerr == nil && got.Matches == 0 {
			t.Errorf("Grep(%+v) found nothing: the case tests nothing", req)
		}
	}
}

// The walk describes each entry with fstatat(2) on the directory it holds:
// what that gives equals os.Lstat, modes, times and Sys included.
func TestWalkEntryInfo(t *testing.T) {
	fsys, top := newFS(t, []string{"d/f: abc", "d/l => f", "d/sub/g:", "d/p|"}...)
	ws := filepath.Join(top, "ws")
	if err := os.Chmod(filepath.Join(ws, "d/f"), 0o4751); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "d/sub"), 0o1777); err != nil {
		t.Fatal(err)
	}
	ds := &dirStack{FS: fsys}
	defer ds.close()
	entries, err := ds.ReadDir(context.Background(), "d")
	if err != nil || len(entries) != 4 {
		t.Fatalf("ReadDir: %v, %v", entries, err)
	}
	for _, e := range entries {
		got, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got.(*statInfo); !ok {
			t.Fatalf("%s: Info is a %T, not fstatat's", e.Name(), got)
		}
		want, err := os.Lstat(filepath.Join(ws, "d", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got.Name() != want.Name() || got.Mode() != want.Mode() || got.Size() != want.Size() ||
			!got.ModTime().Equal(want.ModTime()) || got.IsDir() != want.IsDir() || !reflect.DeepEqual(got.Sys(), want.Sys()) {
			t.Errorf("%s: Info %v %v %d %v, os.Lstat %v %v %d %v", e.Name(),
				got.Name(), got.Mode(), got.Size(), got.ModTime(), want.Name(), want.Mode(), want.Size(), want.ModTime())
		}
	}
}

// A directory swapped for a link to the outside while Walk and Grep run
// never lets them list or read what is outside.
func TestSearchSwapRace(t *testing.T) {
	ctx := context.Background()
	fsys, top := newFS(t, []string{"d/f: needle inside\n", "d/sub/g: needle inside\n", "../out/f: needle outside\n", "../out/sub/g: needle outside\n", "../out/secret: needle outside\n"}...)
	stop := swapLoop(t, filepath.Join(top, "ws"))
	defer stop()
	var found, listed int
	for i := range 1000 {
		dir := []string{"", "d", "d/sub"}[i%3]
		g, err := fsys.Grep(ctx, workspace.GrepRequest{Pattern: "needle", Dir: dir})
		for _, l := range g.Lines {
			if strings.Contains(l.Text, "outside") {
				t.Fatalf("Grep(%q) read outside: %+v", dir, l)
			}
			found++
		}
		if err != nil && !isKindOf(err, workspace.ErrNotFound, workspace.ErrOutsideWorkspace, workspace.ErrInvalidArgument, workspace.ErrNotADirectory) {
			t.Fatalf("Grep(%q): %v", dir, err)
		}
		w, _ := fsys.Walk(ctx, workspace.WalkRequest{Dir: dir})
		for _, e := range w.Entries {
			if strings.HasSuffix(e.Path, "secret") {
				t.Fatalf("Walk(%q) listed outside: %+v", dir, e)
			}
			listed++
		}
	}
	swaps := stop()
	t.Logf("%d swaps, %d lines found, %d entries listed", swaps, found, listed)
	if swaps == 0 || found == 0 {
		t.Errorf("the race did not happen: %d swaps, %d lines found", swaps, found)
	}
}

func isKindOf(err error, kinds ...*workspace.Kind) bool {
	for _, k := range kinds {
		if workspace.KindOf(err) == k {
			return true
		}
	}
	return false
}
