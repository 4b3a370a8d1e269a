package delivery_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

// BenchmarkSnapshot reads a tree of 1000 files of 1 KiB in 50 directories,
// as the end of a session does, from memory and from a container.
func BenchmarkSnapshot(b *testing.B) {
	dir := b.TempDir()
	for i := range 1000 {
		p := filepath.Join(dir, fmt.Sprintf("d%02d/f%04d.txt", i%50, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(strings.Repeat(fmt.Sprintf("%d\n", i), 1024)[:1024]), 0o644)
	}
	for _, backend := range []string{"memory", "docker"} {
		b.Run(backend, func(b *testing.B) {
			var fsys workspace.FileSystem
			if backend == "docker" {
				fsys = dockertest.Start(b, docker.Spec{WorkspaceDir: dir}).Agent()
			} else {
				m, err := memfs.FromDir(b.Context(), dir)
				if err != nil {
					b.Fatal(err)
				}
				fsys = m
			}
			st, err := delivery.NewStore()
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			for b.Loop() {
				if _, err := delivery.Snapshot(b.Context(), fsys, st); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
