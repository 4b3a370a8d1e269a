package journal_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// The journal's per-call overhead on a workspace of 10,000 files (100
// directories of 100 files of 1 KiB), against the same change without the
// journal:
//
//	go test ./journal -run X -bench . -benchtime 2s
//
// Record/write is one structured write (what write, writeFile … cost on
// top); Exec/one-change is a workspace_exec whose command changes one file
// (the run itself is a direct write), committed; Exec/restore is one whose
// command fails and is rolled back. Results: /work/notes/bench-journal.md.
func BenchmarkJournal(b *testing.B) {
	ctx := context.Background()
	const dirs, files = 100, 100
	content := make([]byte, 1024)
	for _, name := range []string{"local", "memory"} {
		open := map[string]func(b *testing.B) workspace.FileSystem{
			"local": func(b *testing.B) workspace.FileSystem {
				dir := b.TempDir()
				for d := range dirs {
					p := filepath.Join(dir, fmt.Sprintf("d%03d", d))
					os.Mkdir(p, 0o755)
					for f := range files {
						os.WriteFile(filepath.Join(p, fmt.Sprintf("f%03d.txt", f)), content, 0o644)
					}
				}
				fsys, err := localfs.New(dir)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { fsys.Close() })
				return fsys
			},
			"memory": func(b *testing.B) workspace.FileSystem {
				fsys := memfs.New(memfs.WithUmask(0))
				for d := range dirs {
					p := fmt.Sprintf("d%03d", d)
					fsys.Mkdir(ctx, p, 0o755)
					for f := range files {
						fsys.WriteFile(ctx, fmt.Sprintf("%s/f%03d.txt", p, f), content, 0o644)
					}
				}
				return fsys
			},
		}[name]
		fsys := open(b)
		// The store is kept apart from the workspace, as the daemon keeps it:
		// a directory on disk for local, memory for memory.
		var store workspace.FileSystem = memfs.New()
		if name == "local" {
			lfs, err := localfs.New(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { lfs.Close() })
			store = lfs
		}
		j, err := journal.Open(ctx, fsys, journal.WithMaxCommits(100), journal.WithStore(store))
		if err != nil {
			b.Fatal(err)
		}
		i := 0
		next := func() []byte { i++; return fmt.Appendf(nil, "version %d\n", i) }
		b.Run(name+"/write/bare", func(b *testing.B) {
			warm(b, j)
			defer cpuPerOp(b)()
			for b.Loop() {
				if err := fsys.WriteFile(ctx, "d050/f050.txt", next(), 0o644); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/write/Record", func(b *testing.B) {
			warm(b, j)
			defer cpuPerOp(b)()
			for b.Loop() {
				if _, err := j.Record(ctx, "writeFile", func(f workspace.FileSystem) error {
					return f.WriteFile(ctx, "d050/f050.txt", next(), 0o644)
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/Exec/first-snapshot", func(b *testing.B) {
			defer cpuPerOp(b)()
			for b.Loop() {
				j, _ := journal.Open(ctx, fsys)
				if _, err := j.Exec(ctx, "m", func(context.Context) (bool, error) { return true, nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/Exec/no-change", func(b *testing.B) {
			warm(b, j)
			defer cpuPerOp(b)()
			for b.Loop() {
				if _, err := j.Exec(ctx, "m", func(context.Context) (bool, error) { return true, nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/Exec/one-change", func(b *testing.B) {
			warm(b, j)
			defer cpuPerOp(b)()
			for b.Loop() {
				if _, err := j.Exec(ctx, "m", func(context.Context) (bool, error) {
					return true, fsys.WriteFile(ctx, "d070/f070.txt", next(), 0o644)
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/Exec/restore", func(b *testing.B) {
			warm(b, j)
			defer cpuPerOp(b)()
			for b.Loop() {
				out, err := j.Exec(ctx, "m", func(context.Context) (bool, error) {
					return false, fsys.WriteFile(ctx, "d080/f080.txt", next(), 0o644)
				})
				if err != nil || !out.Restored {
					b.Fatal(out, err)
				}
			}
		})
	}
}

// warm takes the baseline, so that the loop measures the per-call cost.
func warm(b *testing.B, j *journal.Journal) {
	if _, err := j.Exec(context.Background(), "warm", func(context.Context) (bool, error) { return true, nil }); err != nil {
		b.Fatal(err)
	}
}

// cpuPerOp reports the process's CPU time (user and system, all threads) per
// operation as cpu-ms/op: on a shared machine it is the steadier figure.
func cpuPerOp(b *testing.B) func() {
	before := cpuTime()
	return func() {
		b.ReportMetric(float64(cpuTime()-before)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
