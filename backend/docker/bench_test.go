package docker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

// The benchmarks run the same operations on the Docker adapters, on the
// local adapters and as raw one-shot docker exec calls, in one run, and
// report the median and 99th percentile of each besides Go's mean:
//
//	go test ./backend/docker -run '^$' -bench 'FS|BashTrue' -benchtime 200x
//	go test ./backend/docker -run '^$' -bench ColdSession -benchtime 20x
//
// The cold-session pair compares docker.Start plus a first command with
// the floor of any design: a bare container create, start and one docker
// exec, measured the same way.

// timer collects the duration of each operation of a benchmark.
type timer struct {
	b     *testing.B
	durs  []time.Duration
	start time.Time
}

func newTimer(b *testing.B) *timer {
	b.ReportAllocs()
	return &timer{b: b, durs: make([]time.Duration, 0, b.N)}
}

func (t *timer) op(f func() error) {
	t.start = time.Now()
	if err := f(); err != nil {
		t.b.Fatal(err)
	}
	t.durs = append(t.durs, time.Since(t.start))
}

// report adds p50-µs and p99-µs to the benchmark's line.
func (t *timer) report() {
	if len(t.durs) == 0 {
		return
	}
	slices.Sort(t.durs)
	pct := func(p float64) float64 {
		return float64(t.durs[int(p*float64(len(t.durs)-1))].Nanoseconds()) / 1e3
	}
	t.b.ReportMetric(pct(0.50), "p50-µs")
	t.b.ReportMetric(pct(0.99), "p99-µs")
}

// fsOps are the small-file operations measured on every FileSystem.
var fsOps = []struct {
	name string
	do   func(ctx context.Context, fsys workspace.FileSystem) error
}{
	{"read", func(ctx context.Context, fsys workspace.FileSystem) error {
		_, err := fsys.ReadFile(ctx, "dir/small.txt", 1<<20)
		return err
	}},
	{"write", func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.WriteFile(ctx, "dir/written.txt", []byte("hello, sandbox\n"), 0o644)
	}},
	{"ls", func(ctx context.Context, fsys workspace.FileSystem) error {
		_, err := fsys.ReadDir(ctx, "dir")
		return err
	}},
	{"stat", func(ctx context.Context, fsys workspace.FileSystem) error {
		_, err := fsys.Stat(ctx, "dir/small.txt")
		return err
	}},
}

func benchFS(b *testing.B, fsys workspace.FileSystem) {
	ctx := context.Background()
	if err := workspace.MkdirAll(ctx, fsys, "dir", 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range 20 {
		if err := fsys.WriteFile(ctx, fmt.Sprintf("dir/f%02d.go", i), []byte("package x\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := fsys.WriteFile(ctx, "dir/small.txt", []byte("a small file\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, o := range fsOps {
		b.Run(o.name, func(b *testing.B) {
			t := newTimer(b)
			for b.Loop() {
				t.op(func() error { return o.do(ctx, fsys) })
			}
			t.report()
		})
	}
}

func BenchmarkFS(b *testing.B) {
	b.Run("docker", func(b *testing.B) {
		c := dockertest.Start(b, docker.Spec{})
		benchFS(b, c.Agent())
	})
	// The agent in the container runs localfs without fsync (sandboxd-agent
	// --sync turns it on); the local adapter's default is with.
	for _, sync := range []bool{true, false} {
		b.Run(map[bool]string{true: "local", false: "local-nosync"}[sync], func(b *testing.B) {
			fsys, err := localfs.New(b.TempDir(), localfs.WithLockDir(b.TempDir()), localfs.WithSync(sync))
			if err != nil {
				b.Fatal(err)
			}
			defer fsys.Close()
			benchFS(b, fsys)
		})
	}
}

func benchTrue(b *testing.B, sh workspace.Bash) {
	ctx := context.Background()
	t := newTimer(b)
	for b.Loop() {
		t.op(func() error {
			res, err := sh.Run(ctx, workspace.Command{Argv: []string{"true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("true: %+v", res)
			}
			return err
		})
	}
	t.report()
}

// BenchmarkBashTrue runs `true` through the Docker Bash, the local Bash and
// a raw one-shot docker exec in a container started with testcontainers-go.
func BenchmarkBashTrue(b *testing.B) {
	b.Run("docker", func(b *testing.B) {
		c := dockertest.Start(b, docker.Spec{})
		benchTrue(b, c.Bash())
	})
	b.Run("local", func(b *testing.B) {
		sh, err := localexec.New(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		benchTrue(b, sh)
	})
	b.Run("docker-exec", func(b *testing.B) {
		cli := dockertest.Client(b)
		ctx := context.Background()
		ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
			ContainerRequest: testcontainers.ContainerRequest{
				Image:      dockertest.Image(b),
				Entrypoint: []string{"sleep", "3600"},
				Labels:     dockertest.Labels(),
			},
			Started: true,
		})
		testcontainers.CleanupContainer(b, ctr)
		if err != nil {
			b.Fatal(err)
		}
		id := ctr.GetContainerID()
		t := newTimer(b)
		for b.Loop() {
			t.op(func() error { return docker.ExecOnce(ctx, cli, id, "true") })
		}
		t.report()
	})
}

// BenchmarkColdSession measures a session from nothing to its first answer
// (the container's removal is not timed), beside the floor: create, start,
// one docker exec of a bare container of the same image — with the engine's
// default network, and with none, as sessions have.
func BenchmarkColdSession(b *testing.B) {
	ctx := context.Background()
	b.Run("session", func(b *testing.B) {
		benchColdStart(b, dockertest.Client(b), dockertest.Spec(b, docker.Spec{}), nil)
	})
	for _, floor := range []struct {
		name    string
		network container.NetworkMode
	}{{"floor", ""}, {"floor-nonet", "none"}} {
		b.Run(floor.name, func(b *testing.B) {
			cli := dockertest.Client(b)
			img := dockertest.Image(b)
			t := newTimer(b)
			for b.Loop() {
				var id string
				t.op(func() error {
					ct, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
						Config:     &container.Config{Image: img, Entrypoint: []string{"sleep", "3600"}, Labels: dockertest.Labels()},
						HostConfig: &container.HostConfig{NetworkMode: floor.network},
					})
					if err != nil {
						return err
					}
					id = ct.ID
					if _, err := cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
						return err
					}
					return docker.ExecOnce(ctx, cli, id, "true")
				})
				b.StopTimer()
				if _, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			t.report()
		})
	}
}

// benchColdStart measures docker.Start of spec and a first command,
// first (`true` when nil); the container's removal is not timed.
func benchColdStart(b *testing.B, cli docker.Engine, spec docker.Spec, first func(*docker.Container) error) {
	ctx := context.Background()
	if first == nil {
		first = func(c *docker.Container) error {
			_, err := c.Bash().Run(ctx, workspace.Command{Argv: []string{"true"}})
			return err
		}
	}
	t := newTimer(b)
	for b.Loop() {
		var c *docker.Container
		t.op(func() error {
			var err error
			if c, err = docker.Start(ctx, cli, spec); err != nil {
				return err
			}
			return first(c)
		})
		b.StopTimer()
		if err := c.Close(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	t.report()
}

// writeTree writes 11,500 small Go files in 230 directories of dir,
// pkgDDD/fFF.go, each holding content(DDD, FF).
func writeTree(b *testing.B, dir string, content func(d, f int) string) {
	for d := range 230 {
		sub := filepath.Join(dir, fmt.Sprintf("pkg%03d", d))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 50 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%02d.go", f)), []byte(content(d, f)), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkStartWithTree measures Start with a workspace of 11,500 small
// files in 230 directories copied in (one tar stream into the created
// container), then a first command that counts them.
func BenchmarkStartWithTree(b *testing.B) {
	dir := b.TempDir()
	writeTree(b, dir, func(int, int) string { return "package x\n\nfunc F() {}\n" })
	ctx := context.Background()
	spec := dockertest.Spec(b, docker.Spec{WorkspaceDir: dir})
	benchColdStart(b, dockertest.Client(b), spec, func(c *docker.Container) error {
		var out strings.Builder
		_, err := c.Bash().Run(ctx, workspace.Command{Script: "find . -path ./.sandboxd -prune -o -type f -print | wc -l",
			Output: func(_ workspace.Stream, p []byte) { out.Write(p) }})
		if err == nil && strings.TrimSpace(out.String()) != "11500" {
			err = fmt.Errorf("the workspace holds %q files", out.String())
		}
		return err
	})
}
