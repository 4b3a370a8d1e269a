package scope

import (
	"path"
	"testing"
)

func TestMayHold(t *testing.T) {
	tests := []struct {
		glob, dir string
		want      bool
	}{
		{"src/**", ".", true},
		{"src/**", "src", true},
		{"src/**", "docs", false},
		{"src/*.go", "src", true},
		{"src/*.go", "src/sub", false},
		{"*.go", "src", false},
		{"**/*.go", "a/b/c", true},
		{"a/*/c/*.go", "a/x", true},
		{"a/*/c/*.go", "a/x/c", true},
		{"a/*/c/*.go", "a/x/d", false},
		{"a/*/c/**", "a/x/c/d/e", true},
		{"{a,b/c}/*.go", "b", true}, // braces may span a slash: "may"
		{"a[/]b/*", "a", true},      // so may classes
		{`a\*/x`, "a*", true},       // and escapes
		{"README", "README", false}, // nothing strictly below can match
	}
	for _, tt := range tests {
		if got := mayHold([]string{tt.glob}, tt.dir); got != tt.want {
			t.Errorf("mayHold(%q, %q) = %v, want %v", tt.glob, tt.dir, got, tt.want)
		}
	}
}

// TestMayHoldSound checks the property walks rely on: every ancestor of a
// covered name is covered or may hold something covered.
func TestMayHoldSound(t *testing.T) {
	globs := []string{
		"src/**", "docs/*.md", "**/*.go", "*.go", "a/*/c", "a/*/c/**", "a/b?/*",
		"{a,b/c}/*.go", "a[/]b/x", "a[!x]b/*", "x/**/y/*", "x/{y,z}/**", `a\*/b`, "[ab]/c",
	}
	names := []string{
		"src/a/b.go", "docs/x.md", "docs/sub/x.md", "a/b/c", "a/b/c/d/e", "a/bb/x", "b/c/d.go",
		"a/b/x", "a/ab/x", "x/q/r/y/z", "x/z/k", "a*/b", "b/c", "q/r/s.go", "top.go",
	}
	for _, g := range globs {
		for _, name := range names {
			if !covers([]string{g}, name) {
				continue
			}
			for a := path.Dir(name); a != "."; a = path.Dir(a) {
				if !covers([]string{g}, a) && !mayHold([]string{g}, a) {
					t.Errorf("%q covers %q, but its ancestor %q is neither covered nor may hold it", g, name, a)
				}
			}
		}
	}
}
