package dockerfs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/dockerfs"
	"github.com/sandboxd/sandboxd/internal/dockertest"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// BenchmarkJournaledTools measures the read, write and edit tools on a
// small file of a Docker workspace with the journal on, as a session of the
// daemon has it (its store a private directory on the host, written without
// fsync as runner's is), in one run:
//
//	go test ./dockerfs -run '^$' -bench JournaledTools -benchtime 200x
//
// Each line reports the median (p50-µs), the 90th percentile and the agent
// round trips one call makes (rt/op), counted by a wrapper around the
// workspace's FileSystem; the ratio of write and edit to read is what issue
// 16 targets (within 2×). WriteFile and Swap are the port's own calls on
// the same file: the floor of any write.
func BenchmarkJournaledTools(b *testing.B) {
	ctx := context.Background()
	counted := &countingFS{fsys: dockerfs.New(dockertest.Start(b, dockerexec.Spec{}))}
	store, err := localfs.New(b.TempDir(), localfs.WithSync(false))
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite}
	cfg.Always = []string{"read", "edit"}
	cfg.MaxCallsPerRun = 0
	set, err := tools.New(tools.Env{FS: counted, Session: workspace.Session{Root: "/workspace"}, JournalStore: store}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := counted.WriteFile(ctx, "small.txt", []byte("package small\n\n// a small file\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	call := func(tool string, args any) error {
		raw, _ := json.Marshal(args)
		if res := set.Call(ctx, tool, raw, tools.CallOptions{}); res.IsError {
			return fmt.Errorf("%s: %s", tool, res.Text)
		}
		return nil
	}
	i := 0
	ops := []struct {
		name string
		do   func() error
	}{
		{"read", func() error { return call("read", map[string]any{"path": "small.txt"}) }},
		{"write", func() error {
			i++
			return call("write", map[string]any{"path": "small.txt", "content": fmt.Sprintf("package small\n\n// written %d\n", i)})
		}},
		{"edit", func() error {
			i++
			old := "package small"
			if i%2 == 0 {
				old = "package smaller"
			}
			new := map[string]string{"package small": "package smaller", "package smaller": "package small"}[old]
			return call("edit", map[string]any{"path": "small.txt", "edits": []tools.Replacement{{OldText: old + "\n", NewText: new + "\n"}}})
		}},
		// The floors of a write, in the same run: the port's WriteFile and
		// Swap of the same file, without the tool or the journal.
		{"WriteFile", func() error {
			return counted.WriteFile(ctx, "small.txt", []byte("package small\n\n// the floor\n"), 0o644)
		}},
		{"Swap", func() error {
			_, err := counted.Swap(ctx, workspace.SwapRequest{Name: "small.txt", Data: []byte("package small\n\n// the floor\n"), Perm: 0o644, Root: "/workspace", Max: cfg.MaxFileBytes})
			return err
		}},
	}
	for _, o := range ops {
		b.Run(o.name, func(b *testing.B) {
			if o.name == "edit" { // start from a file the first edit applies to
				if err := counted.WriteFile(ctx, "small.txt", []byte("package small\n"), 0o644); err != nil {
					b.Fatal(err)
				}
				i = 0
			}
			var durs []time.Duration
			counted.calls.Store(0)
			for b.Loop() {
				start := time.Now()
				if err := o.do(); err != nil {
					b.Fatal(err)
				}
				durs = append(durs, time.Since(start))
			}
			slices.Sort(durs)
			pct := func(p float64) float64 { return float64(durs[int(p*float64(len(durs)-1))].Nanoseconds()) / 1e3 }
			b.ReportMetric(pct(0.5), "p50-µs")
			b.ReportMetric(pct(0.9), "p90-µs")
			b.ReportMetric(float64(counted.calls.Load())/float64(len(durs)), "rt/op")
		})
	}
}

// countingFS counts the calls made to a FileSystem with every extension
// (each a round trip to the agent on dockerfs), passing them on.
type countingFS struct {
	fsys  *dockerfs.FS
	calls atomic.Int64
}

func (c *countingFS) count() { c.calls.Add(1) }

func (c *countingFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	c.count()
	return c.fsys.Stat(ctx, name)
}

func (c *countingFS) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	c.count()
	return c.fsys.Lstat(ctx, name)
}

func (c *countingFS) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	c.count()
	return c.fsys.ReadDir(ctx, name)
}

func (c *countingFS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	c.count()
	return c.fsys.ReadFile(ctx, name, max)
}

func (c *countingFS) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	c.count()
	return c.fsys.WriteFile(ctx, name, data, perm)
}

func (c *countingFS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	c.count()
	return c.fsys.Mkdir(ctx, name, perm)
}

func (c *countingFS) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	c.count()
	return c.fsys.MkdirAll(ctx, name, perm)
}

func (c *countingFS) Remove(ctx context.Context, name string) error {
	c.count()
	return c.fsys.Remove(ctx, name)
}

func (c *countingFS) RemoveAll(ctx context.Context, name string) error {
	c.count()
	return c.fsys.RemoveAll(ctx, name)
}

func (c *countingFS) Rename(ctx context.Context, oldname, newname string) error {
	c.count()
	return c.fsys.Rename(ctx, oldname, newname)
}

func (c *countingFS) Symlink(ctx context.Context, target, name string) error {
	c.count()
	return c.fsys.Symlink(ctx, target, name)
}

func (c *countingFS) Readlink(ctx context.Context, name string) (string, error) {
	c.count()
	return c.fsys.Readlink(ctx, name)
}

func (c *countingFS) Lock(ctx context.Context, name string) (func(), error) {
	c.count()
	return c.fsys.Lock(ctx, name)
}

func (c *countingFS) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	c.count()
	return c.fsys.Walk(ctx, req)
}

func (c *countingFS) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	c.count()
	return c.fsys.Grep(ctx, req)
}

func (c *countingFS) Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error) {
	c.count()
	return c.fsys.Swap(ctx, req)
}
