package workspace_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// tree is a small workspace in memory for the examples, with a link that
// leads out of it.
func tree(ctx context.Context) workspace.FileSystem {
	fsys := memfs.New()
	if err := fsys.Symlink(ctx, "/etc/passwd", "passwd"); err != nil {
		panic(err)
	}
	for name, content := range map[string]string{
		"go.mod":          "module example.com/app\n",
		"cmd/app/main.go": "package main\n\n// TODO: flags\nfunc main() {}\n",
		"internal/x/x.go": "package x\n\n// TODO: tests\n",
		"vendor/v/v.go":   "package v // TODO: not ours\n",
	} {
		if err := workspace.MkdirAll(ctx, fsys, path.Dir(name), 0o755); err != nil {
			panic(err)
		}
		if err := fsys.WriteFile(ctx, name, []byte(content), 0o644); err != nil {
			panic(err)
		}
	}
	return fsys
}

// Walk lists a tree in fs.WalkDir's order through whatever adapter holds it
// (an adapter's own WalkFS, or the core methods), leaving out what Exclude
// names.
func ExampleWalk() {
	ctx := context.Background()
	res, err := workspace.Walk(ctx, tree(ctx), workspace.WalkRequest{Pattern: "**/*.go", Exclude: workspace.Exclude{"vendor"}})
	if err != nil {
		panic(err)
	}
	for _, e := range res.Entries {
		fmt.Println(e.Path, e.Type.IsDir())
	}
	// Output:
	// cmd/app/main.go false
	// internal/x/x.go false
}

// Grep searches file contents with a linear-time regular expression, in
// walk order and then line order.
func ExampleGrep() {
	ctx := context.Background()
	res, err := workspace.Grep(ctx, tree(ctx), workspace.GrepRequest{Pattern: `TODO: \w+`, Glob: "**/*.go", Exclude: workspace.Exclude{"vendor"}})
	if err != nil {
		panic(err)
	}
	for _, l := range res.Lines {
		fmt.Printf("%s:%d: %s\n", l.Path, l.Line, l.Text)
	}
	fmt.Println(res.Matches, "matches")
	// Output:
	// cmd/app/main.go:3: // TODO: flags
	// internal/x/x.go:3: // TODO: tests
	// 2 matches
}

// Every adapter fails with the same error kinds, carried in an
// *fs.PathError; they match with errors.Is, their io/fs counterparts too.
func ExampleKind() {
	ctx := context.Background()
	_, err := tree(ctx).ReadFile(ctx, "missing.txt", 1<<20)
	var pe *fs.PathError
	fmt.Println(errors.Is(err, workspace.ErrNotFound), errors.Is(err, fs.ErrNotExist), errors.As(err, &pe))
	_, err = tree(ctx).ReadFile(ctx, "passwd", 1<<20) // a link out is never followed
	fmt.Println(errors.Is(err, workspace.ErrOutsideWorkspace))
	// Output:
	// true true true
	// true
}
