package localfs_test

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// BenchmarkSwap compares localfs's own Swap of a small file with
// workspace.SwapGeneric's over its methods, locked, as the agent serves a
// journaled write.
func BenchmarkSwap(b *testing.B) {
	ctx := context.Background()
	f, err := localfs.New(b.TempDir(), localfs.WithSync(false), localfs.WithProcessLocks())
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.WriteFile(ctx, "small.txt", []byte("package small\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	req := workspace.SwapRequest{Name: "small.txt", Data: []byte("package small\n\n// swapped\n"), Perm: 0o644, Root: "/workspace", Max: 1 << 20, Real: "small.txt", Lock: true}
	for _, s := range []struct {
		name string
		swap func(context.Context, workspace.FileSystem, workspace.SwapRequest) (workspace.SwapResult, error)
	}{{"own", workspace.Swap}, {"generic", workspace.SwapGeneric}} {
		b.Run(s.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := s.swap(ctx, f, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
