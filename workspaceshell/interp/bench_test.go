package interp_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sandboxd/sandboxd/workspaceshell/internal/shelltest"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// BenchmarkShell runs typical inspection lines over a memory workspace of
// 1,000 files in 50 directories.
func BenchmarkShell(b *testing.B) {
	tr := shelltest.Tree{}
	for i := range 1000 {
		tr[fmt.Sprintf("pkg%02d/file%03d.go", i%50, i)] = fmt.Sprintf("package p\n\n// line %d\nfunc F%d() {}\n", i, i)
	}
	env := shelltest.Setup(b, shelltest.Backends[0], tr)
	for _, line := range []string{
		"grep -rn 'func F99' .",
		"rg -l 'line 5'",
		"find . -name '*.go' | wc -l",
		"ls -R | wc -l",
		"cat pkg01/file001.go | head -n 2",
	} {
		b.Run(line, func(b *testing.B) {
			for b.Loop() {
				res, err := interp.Run(context.Background(), env, line, interp.Read)
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("%+v, %v", res, err)
				}
			}
		})
	}
}
