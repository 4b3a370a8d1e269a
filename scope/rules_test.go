package scope_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestRulesDecide(t *testing.T) {
	r := scope.Rules{
		Visible: []string{"src/**", "docs/*.md", "**/*.go", "README"},
		Commit:  []string{"src/*.go", "src/sub/**", "docs/*"},
	}
	tests := []struct {
		name               string
		visible, committed bool
	}{
		{".", true, false},
		{"src", true, false}, // "src/**" covers the directory itself
		{"src/b.txt", true, false},
		{"src/a.go", true, true},
		{"src/sub", true, true},
		{"src/sub/deep/x.txt", true, true}, // an ancestor matches
		{"src/gen/d.go", true, false},
		{"docs", false, false},
		{"docs/x.md", true, true},
		{"docs/y.txt", false, false}, // committable by Commit, but invisible
		{"docs/sub/x.md", false, false},
		{"secret/k.go", true, false},
		{"README", true, false},
		{"README/x", true, false},
		{"readme", false, false}, // case-sensitive: an allow list
		{"SRC/a.go", true, false},
		{"SRC/b.txt", false, false},
		{"src/./a.go", true, true}, // cleaned
	}
	for _, tt := range tests {
		if got := r.IsVisible(tt.name); got != tt.visible {
			t.Errorf("IsVisible(%q) = %v, want %v", tt.name, got, tt.visible)
		}
		if got := r.IsCommittable(tt.name); got != tt.committed {
			t.Errorf("IsCommittable(%q) = %v, want %v", tt.name, got, tt.committed)
		}
	}

	var all scope.Rules
	for _, name := range []string{".", "a", "a/b/c"} {
		if !all.IsVisible(name) || !all.IsCommittable(name) {
			t.Errorf("zero Rules refuse %q", name)
		}
	}
	if !(scope.Rules{Commit: []string{"**"}}).IsCommittable(".") {
		t.Error(`Commit ["**"] does not cover the root`)
	}
}

func TestRulesValidate(t *testing.T) {
	tests := []struct {
		rules scope.Rules
		bad   string // what the error names; "" for none
	}{
		{scope.Rules{}, ""},
		{scope.Rules{Visible: []string{"src/**", "{a,b}/*.go", "[ab]c"}}, ""},
		{scope.Rules{Visible: []string{"src/**", "a/[b"}}, `"a/[b"`},
		{scope.Rules{Commit: []string{"{a,b"}}, `commit glob "{a,b"`},
		{scope.Rules{Commit: []string{""}}, `commit glob ""`},
		{scope.Rules{Visible: []string{"/src/**"}}, `visible glob "/src/**" can never match`},
		{scope.Rules{Visible: []string{"./src/**"}}, `"./src/**"`},
		{scope.Rules{Commit: []string{"src/"}}, `"src/"`},
		{scope.Rules{Visible: []string{}}, "visible is an empty list"},
		{scope.Rules{Visible: []string{"**"}, Commit: []string{}}, "commit is an empty list"},
	}
	for _, tt := range tests {
		err := tt.rules.Validate()
		switch {
		case tt.bad == "" && err != nil:
			t.Errorf("Validate(%+v) = %v", tt.rules, err)
		case tt.bad != "" && (!errors.Is(err, workspace.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), tt.bad)):
			t.Errorf("Validate(%+v) = %v, want InvalidArgument naming %s", tt.rules, err, tt.bad)
		}
		if _, nerr := scope.New(memfs.New(), "/workspace", tt.rules); (nerr == nil) != (err == nil) {
			t.Errorf("New(%+v) = %v, Validate = %v", tt.rules, nerr, err)
		}
	}
}

// noLinks is a FileSystem without the SymlinkFS extension.
type noLinks struct{ workspace.FileSystem }

func TestNew(t *testing.T) {
	inner := memfs.New()
	if got, err := scope.New(inner, "", scope.Rules{}); err != nil || got != workspace.FileSystem(inner) {
		t.Errorf("New with zero Rules = %v, %v; want the FileSystem itself", got, err)
	}
	if _, err := scope.New(inner, "workspace", everything); !errors.Is(err, workspace.ErrInvalidArgument) {
		t.Errorf("New with a relative root: %v, want InvalidArgument", err)
	}
	fsys, err := scope.New(inner, inner.Root(), everything)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fsys.(workspace.SymlinkFS); !ok {
		t.Error("over a SymlinkFS the decorator is no SymlinkFS")
	}
	for name, ok := range map[string]bool{
		"MkdirAllFS":  is[workspace.MkdirAllFS](fsys),
		"RemoveAllFS": is[workspace.RemoveAllFS](fsys),
		"LockFS":      is[workspace.LockFS](fsys),
		"WalkFS":      is[workspace.WalkFS](fsys),
		"GrepFS":      is[workspace.GrepFS](fsys),
	} {
		if !ok {
			t.Errorf("the decorator is no %s", name)
		}
	}
	fsys, err = scope.New(noLinks{inner}, inner.Root(), everything)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fsys.(workspace.SymlinkFS); ok {
		t.Error("over a FileSystem without links the decorator is a SymlinkFS")
	}

	// The rules are copied: changing the caller's slice later changes nothing.
	visible := []string{"a/**"}
	fsys, err = scope.New(inner, inner.Root(), scope.Rules{Visible: visible})
	if err != nil {
		t.Fatal(err)
	}
	visible[0] = "**"
	conformance.Build(t, inner, "b: x")
	if _, err := fsys.Stat(context.Background(), "b"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Stat(b) after the caller changed its slice: %v", err)
	}
}

func is[T any](v any) bool { _, ok := v.(T); return ok }

// Without SymlinkFS the decorator cannot tell where a link leads: it treats
// the link as leading nowhere.
func TestLinksWithoutReadlink(t *testing.T) {
	inner := memfs.New()
	conformance.Build(t, inner, "src/a: x", "src/l => a")
	fsys, err := scope.New(noLinks{inner}, inner.Root(), scope.Rules{Visible: []string{"src/**"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := fsys.ReadFile(ctx, "src/l", 10); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("ReadFile through a link without Readlink: %v, want NotFound", err)
	}
	if _, err := fsys.ReadFile(ctx, "src/a", 10); err != nil {
		t.Errorf("ReadFile(src/a): %v", err)
	}
}

func TestProtectedMessage(t *testing.T) {
	inner := memfs.New()
	conformance.Build(t, inner, "src/a.go: x", "src/d/f: y", "docs/x.md: z")
	fsys, err := scope.New(inner, inner.Root(), scope.Rules{Commit: []string{"src/*.go", "docs/**"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = fsys.WriteFile(ctx, "src/b.txt", nil, 0o644)
	if !errors.Is(err, workspace.ErrProtected) || workspace.KindOf(err) != workspace.ErrProtected {
		t.Fatalf("WriteFile outside Commit: %v", err)
	}
	if want := "src/b.txt: outside this session's commit scope (src/*.go, docs/**)"; !strings.HasSuffix(err.Error(), want) {
		t.Errorf("error %q, want it to end with %q", err, want)
	}
	err = workspace.RemoveAll(ctx, fsys, "src/d")
	if !errors.Is(err, workspace.ErrProtected) || !strings.Contains(err.Error(), "only when it is itself in this session's commit scope") {
		t.Errorf("RemoveAll of an uncommittable directory: %v", err)
	}
}

// TestWalkEqualsGeneric checks the filtered fast paths against the generic
// helpers over the decorator, for many rules and requests.
func TestWalkEqualsGeneric(t *testing.T) {
	ctx := context.Background()
	inner := memfs.New()
	conformance.Build(t, inner, tree...)
	var hidden []string // a hidden subtree that comes first in walk order
	for i := range 30 {
		hidden = append(hidden, fmt.Sprintf("a/%02d.txt: package hidden", i))
	}
	conformance.Build(t, inner, hidden...)
	ruleSets := []scope.Rules{
		rules["A"], rules["B"], rules["C"],
		{Visible: []string{"*.go"}},
		{Visible: []string{"src/sub/**", "secret/dir/*"}},
		{Visible: []string{"{src,docs}/*"}},
		{Visible: []string{"s?c/**"}},
	}
	var reqs []workspace.WalkRequest
	for _, dir := range []string{"", "src", "src/up", "src/toSecret", "src/a.go", "secret", "nothere"} {
		for _, limit := range []int{0, 1, 2, 3, 5, 8, 13} {
			reqs = append(reqs,
				workspace.WalkRequest{Dir: dir, Limit: limit},
				workspace.WalkRequest{Dir: dir, Limit: limit, FilesOnly: true},
				workspace.WalkRequest{Dir: dir, Limit: limit, Pattern: "**/*.go", Exclude: workspace.Exclude{"gen"}})
		}
	}
	reqs = append(reqs, workspace.WalkRequest{Pattern: "a/[b"})
	for _, r := range ruleSets {
		fsys, err := scope.New(walkingFS{inner}, inner.Root(), r)
		if err != nil {
			t.Fatal(err)
		}
		for _, req := range reqs {
			fast, ferr := workspace.Walk(ctx, fsys, req)
			generic, gerr := workspace.WalkGeneric(ctx, fsys, req)
			if workspace.KindOf(ferr) != workspace.KindOf(gerr) || !reflect.DeepEqual(fast, generic) {
				t.Errorf("%+v: Walk(%+v) = %v, %v; generic %v, %v", r, req, fast, ferr, generic, gerr)
			}
			greq := workspace.GrepRequest{Pattern: "package", Dir: req.Dir, Limit: req.Limit, Context: 1}
			fastG, ferr := workspace.Grep(ctx, fsys, greq)
			genericG, gerr := workspace.GrepGeneric(ctx, fsys, greq)
			if workspace.KindOf(ferr) != workspace.KindOf(gerr) || !reflect.DeepEqual(fastG, genericG) {
				t.Errorf("%+v: Grep(%+v) = %v, %v; generic %v, %v", r, greq, fastG, ferr, genericG, gerr)
			}
		}
	}
}
