package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// BenchmarkJournaledTools measures the read, write and edit tools on a
// small file of a Docker workspace with the journal on, as a session of the
// daemon has it (its store a private directory on the host, written without
// fsync as runner's is), in one run:
//
//	go test ./backend/docker -run '^$' -bench JournaledTools -benchtime 200x
//
// Each line reports the median (p50-µs), the 90th percentile and the agent
// round trips one call makes (rt/op), counted by a wrapper around the
// workspace's FileSystem, with the medians of the time one call spends in
// them (agent-µs) and in the journal's store (store-µs); the ratio of write
// and edit to read is what issue 16 targets (within 2×). WriteFile and Swap
// are the port's own calls on the same file: the floor of any write.
func BenchmarkJournaledTools(b *testing.B) {
	ctx := context.Background()
	counted := &countingFS{fsys: dockertest.Start(b, docker.Spec{}).Agent()}
	ls, err := localfs.New(b.TempDir(), localfs.WithSync(false))
	if err != nil {
		b.Fatal(err)
	}
	defer ls.Close()
	store := &timedFS{FileSystem: ls}
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
		// Swap of the same file (as the write tool asks it of the journal,
		// and the journal of the agent), without the tool or the journal.
		{"WriteFile", func() error {
			return counted.WriteFile(ctx, "small.txt", []byte("package small\n\n// the floor\n"), 0o644)
		}},
		{"Swap", func() error {
			_, err := counted.Swap(ctx, workspace.SwapRequest{Name: "small.txt", Data: []byte("package small\n\n// the floor\n"), Perm: 0o644, Root: "/workspace",
				Max: journal.DefaultMaxBlobBytes, Real: "small.txt", Lock: true})
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
			var durs, ag, st []time.Duration
			counted.calls.Store(0)
			for b.Loop() {
				start := time.Now()
				counted.d.Store(0)
				store.d.Store(0)
				if err := o.do(); err != nil {
					b.Fatal(err)
				}
				durs = append(durs, time.Since(start))
				ag = append(ag, time.Duration(counted.d.Load()))
				st = append(st, time.Duration(store.d.Load()))
			}
			pct := func(d []time.Duration, p float64) float64 {
				slices.Sort(d)
				return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3
			}
			b.ReportMetric(pct(ag, 0.5), "agent-µs")
			b.ReportMetric(pct(st, 0.5), "store-µs")
			b.ReportMetric(pct(durs, 0.5), "p50-µs")
			b.ReportMetric(pct(durs, 0.9), "p90-µs")
			b.ReportMetric(float64(counted.calls.Load())/float64(len(durs)), "rt/op")
		})
	}
}

// countingFS counts the calls made to a FileSystem with every extension
// (each a round trip to the agent in the container), passing them on.
type countingFS struct {
	fsys  *agent.Client
	calls atomic.Int64
	d     atomic.Int64 // nanoseconds spent in the calls
}

// count counts a call and returns what times it: defer c.count()().
func (c *countingFS) count() func() {
	c.calls.Add(1)
	start := time.Now()
	return func() { c.d.Add(int64(time.Since(start))) }
}

func (c *countingFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	defer c.count()()
	return c.fsys.Stat(ctx, name)
}

func (c *countingFS) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	defer c.count()()
	return c.fsys.Lstat(ctx, name)
}

func (c *countingFS) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	defer c.count()()
	return c.fsys.ReadDir(ctx, name)
}

func (c *countingFS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	defer c.count()()
	return c.fsys.ReadFile(ctx, name, max)
}

func (c *countingFS) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	defer c.count()()
	return c.fsys.WriteFile(ctx, name, data, perm)
}

func (c *countingFS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	defer c.count()()
	return c.fsys.Mkdir(ctx, name, perm)
}

func (c *countingFS) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	defer c.count()()
	return c.fsys.MkdirAll(ctx, name, perm)
}

func (c *countingFS) Remove(ctx context.Context, name string) error {
	defer c.count()()
	return c.fsys.Remove(ctx, name)
}

func (c *countingFS) RemoveAll(ctx context.Context, name string) error {
	defer c.count()()
	return c.fsys.RemoveAll(ctx, name)
}

func (c *countingFS) Rename(ctx context.Context, oldname, newname string) error {
	defer c.count()()
	return c.fsys.Rename(ctx, oldname, newname)
}

func (c *countingFS) Symlink(ctx context.Context, target, name string) error {
	defer c.count()()
	return c.fsys.Symlink(ctx, target, name)
}

func (c *countingFS) Readlink(ctx context.Context, name string) (string, error) {
	defer c.count()()
	return c.fsys.Readlink(ctx, name)
}

func (c *countingFS) Lock(ctx context.Context, name string) (func(), error) {
	defer c.count()()
	return c.fsys.Lock(ctx, name)
}

func (c *countingFS) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	defer c.count()()
	return c.fsys.Walk(ctx, req)
}

func (c *countingFS) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	defer c.count()()
	return c.fsys.Grep(ctx, req)
}

func (c *countingFS) Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error) {
	defer c.count()()
	return c.fsys.Swap(ctx, req)
}

// timedFS times the calls the journal makes of its store.
type timedFS struct {
	workspace.FileSystem
	d atomic.Int64
}

func (t *timedFS) timed() func() {
	start := time.Now()
	return func() { t.d.Add(int64(time.Since(start))) }
}

func (t *timedFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	defer t.timed()()
	return t.FileSystem.Stat(ctx, name)
}

func (t *timedFS) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	defer t.timed()()
	return t.FileSystem.Lstat(ctx, name)
}

func (t *timedFS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	defer t.timed()()
	return t.FileSystem.ReadFile(ctx, name, max)
}

func (t *timedFS) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	defer t.timed()()
	return t.FileSystem.WriteFile(ctx, name, data, perm)
}

func (t *timedFS) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	defer t.timed()()
	return t.FileSystem.Mkdir(ctx, name, perm)
}

func (t *timedFS) Remove(ctx context.Context, name string) error {
	defer t.timed()()
	return t.FileSystem.Remove(ctx, name)
}

func (t *timedFS) AppendFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	defer t.timed()()
	return workspace.AppendFile(ctx, t.FileSystem, name, data, perm)
}
