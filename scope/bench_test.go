package scope_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/workspace"
)

// benchTree is 40 directories of 50 files, half of them .go.
func benchTree(b *testing.B) workspace.FileSystem {
	ctx := context.Background()
	fsys := memfs.New()
	for d := range 40 {
		dir := fmt.Sprintf("pkg%02d", d)
		if err := fsys.Mkdir(ctx, dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 50 {
			ext := ".go"
			if f%2 == 1 {
				ext = ".txt"
			}
			data := fmt.Appendf(nil, "package p\n// line %d\nfunc F%d() {}\n", f, f)
			if err := fsys.WriteFile(ctx, fmt.Sprintf("%s/f%02d%s", dir, f, ext), data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	return fsys
}

// BenchmarkScope measures what the decorator costs a walk, a grep and a
// single read, against the bare memory workspace.
func BenchmarkScope(b *testing.B) {
	ctx := context.Background()
	inner := benchTree(b)
	for _, rc := range []struct {
		name  string
		rules scope.Rules
	}{
		{"bare", scope.Rules{}},
		{"commit-only", scope.Rules{Commit: []string{"pkg0*/**"}}},
		{"visible-half", scope.Rules{Visible: []string{"**/*.go"}}},
	} {
		fsys, err := scope.New(inner, "/workspace", rc.rules)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(rc.name+"/walk", func(b *testing.B) {
			for b.Loop() {
				if _, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(rc.name+"/grep", func(b *testing.B) {
			for b.Loop() {
				if _, err := workspace.Grep(ctx, fsys, workspace.GrepRequest{Pattern: "F4[0-9]"}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(rc.name+"/read", func(b *testing.B) {
			for b.Loop() {
				if _, err := fsys.ReadFile(ctx, "pkg07/f10.go", 1<<20); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
