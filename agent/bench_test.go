package agent_test

import (
	"context"
	"io"
	"net"
	"os"
	"testing"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// osPipes is one end of two kernel pipes, as a container's attached stdio is.
type osPipes struct {
	r *os.File
	w *os.File
}

func (p osPipes) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p osPipes) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p osPipes) Close() error                { p.w.Close(); return p.r.Close() }

// transports make the two ends of a stream.
var transports = []struct {
	name string
	pair func(b *testing.B) (client, server io.ReadWriteCloser)
}{
	{"net.Pipe", func(*testing.B) (io.ReadWriteCloser, io.ReadWriteCloser) { return net.Pipe() }},
	{"os.Pipe", func(b *testing.B) (io.ReadWriteCloser, io.ReadWriteCloser) {
		r1, w1, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		r2, w2, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		return osPipes{r: r2, w: w1}, osPipes{r: r1, w: w2}
	}},
}

// BenchmarkRoundTrip measures one call through the agent, over an
// in-process stream to a Server over localfs (writes not flushed, as the
// sandboxd-agent binary serves them) and localexec, beside the same call on
// the adapters directly.
//
//	go test -run XXX -bench RoundTrip ./agent
func BenchmarkRoundTrip(b *testing.B) {
	dir := b.TempDir()
	fsys, err := localfs.New(dir, localfs.WithSync(false), localfs.WithLockDir(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	defer fsys.Close()
	sh, err := localexec.New(dir)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	small := []byte("a small file of a few dozen bytes\n")
	if err := fsys.WriteFile(ctx, "small.txt", small, 0o644); err != nil {
		b.Fatal(err)
	}
	ops := []struct {
		name string
		fs   func(fsys workspace.FileSystem, sh workspace.Bash) error
	}{
		{"Stat", func(f workspace.FileSystem, _ workspace.Bash) error { _, err := f.Stat(ctx, "small.txt"); return err }},
		{"ReadFile", func(f workspace.FileSystem, _ workspace.Bash) error {
			_, err := f.ReadFile(ctx, "small.txt", 1<<20)
			return err
		}},
		{"WriteFile", func(f workspace.FileSystem, _ workspace.Bash) error { return f.WriteFile(ctx, "w.txt", small, 0o644) }},
		// A journaled write's swap, as the write tool asks it: under the
		// file's lock, on condition that the name leads where it says.
		{"Swap", func(f workspace.FileSystem, _ workspace.Bash) error {
			_, err := workspace.Swap(ctx, f, workspace.SwapRequest{Name: "w.txt", Data: small, Perm: 0o644, Root: dir, Max: 1 << 20, Real: "w.txt", Lock: true})
			return err
		}},
		{"ReadDir", func(f workspace.FileSystem, _ workspace.Bash) error { _, err := f.ReadDir(ctx, "."); return err }},
		{"BashTrue", func(_ workspace.FileSystem, sh workspace.Bash) error {
			_, err := sh.Run(ctx, workspace.Command{Argv: []string{"true"}})
			return err
		}},
	}
	for _, op := range ops {
		b.Run(op.name+"/direct", func(b *testing.B) {
			for b.Loop() {
				if err := op.fs(fsys, sh); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, tr := range transports {
			b.Run(op.name+"/"+tr.name, func(b *testing.B) {
				client, server := tr.pair(b)
				go agent.NewServer(fsys, sh).Serve(ctx, server)
				c, err := agent.NewClient(client)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				for b.Loop() {
					if err := op.fs(c, c); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
