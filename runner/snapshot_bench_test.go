package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// benchTree writes n files of about total bytes in all, in 50×20
// directories, of sizes drawn from a fixed seed, contents random.
func benchTree(tb testing.TB, dir string, n int, total int64) {
	tb.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 2*total/int64(n))
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for i := range n {
		d := filepath.Join(dir, fmt.Sprintf("d%02d/e%02d", i%50, i/50%20))
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
		size := r.IntN(len(buf))
		off := r.IntN(len(buf) - size + 1)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d.bin", i)), buf[off:off+size], 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkDockerSnapshots measures, once each on the Docker backend with
// a workspace of 10,000 files and about 100 MB, what issue 25's goals name,
// beside the floors of the same run: the snapshot against cp -a of the
// same tree (the workspace volume's, read as root; else the host copy it
// was made from); a session from the snapshot to its first call, from a
// warm pool; fork into 1 and into 8 to every fork's first call, each also
// as Fork was before it wrote the snapshot into the forks as it is read
// (-stored-first); and docker
// stop -t 0 / docker start of a container of the same image. Run it with
// -benchtime 1x; SNAPSHOT_BENCH_FILES and SNAPSHOT_BENCH_MB change the tree.
func BenchmarkDockerSnapshots(b *testing.B) {
	files, mb := envInt("SNAPSHOT_BENCH_FILES", 10000), envInt("SNAPSHOT_BENCH_MB", 100)
	host := b.TempDir()
	benchTree(b, host, files, int64(mb)<<20)
	st, err := snapshot.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	m, cli := dockerManager(b, runner.WithSnapshots(st), runner.WithPool(runner.PoolConfig{Size: 8}),
		runner.WithWorkspaceBytes(1<<30), runner.WithDaemonName(dockertest.DaemonName("bench-snapshots")))
	defer m.Shutdown(context.Background())
	ctx := context.Background()
	src, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: shell, Source: host})
	if err != nil {
		b.Fatal(err)
	}
	first := func(s *runner.Session) {
		res, err := s.Call(ctx, "bash", json.RawMessage(`{"command":"true"}`), tools.CallOptions{})
		if err != nil || res.IsError {
			b.Fatalf("first call: %v %s", err, res.Text)
		}
	}
	once := func(name string, fn func() string) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if note := fn(); note != "" {
					b.Log(note)
				}
			}
		})
	}
	waitPool := func() {
		waitFor(b, func() bool { p := m.Stats().Pools[0]; return p.Ready == p.Size })
	}
	once("floor-cp-a", func() string {
		from := host
		if v, err := cli.VolumeInspect(ctx, src.Info().Workspace+"-workspace", client.VolumeInspectOptions{}); err == nil {
			if _, err := os.Stat(v.Volume.Mountpoint); err == nil {
				from = v.Volume.Mountpoint
			}
		}
		to := filepath.Join(b.TempDir(), "copy")
		if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
			b.Fatalf("cp -a: %v: %s", err, out)
		}
		return "cp -a " + from
	})
	var info snapshot.Info
	once("snapshot", func() string {
		if info, err = src.Snapshot(ctx); err != nil {
			b.Fatal(err)
		}
		return fmt.Sprintf("%d files, %d bytes, %d stored", info.Files, info.Bytes, info.StoredBytes)
	})
	waitPool()
	once("restore-to-first-call", func() string {
		s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Snapshot: info.ID, Grants: shell.Grants, Always: shell.Always}})
		if err != nil {
			b.Fatal(err)
		}
		first(s)
		return fmt.Sprintf("pooled %v", s.Info().Pooled)
	})
	fork := func(n int) string {
		forks, err := m.Fork(ctx, "acme", src.ID(), runner.ForkRequest{Count: n})
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		pooled := 0
		for _, f := range forks {
			if f.Info().Pooled {
				pooled++
			}
			wg.Go(func() { first(f) })
		}
		wg.Wait()
		for _, f := range forks {
			m.Delete(ctx, "acme", f.ID())
		}
		return fmt.Sprintf("%d of %d pooled", pooled, n)
	}
	// Each fork twice: as it was (the snapshot made whole, then restored
	// into each fork) and as it is (written into the forks as it is read).
	for _, n := range []int{1, 8} {
		for _, way := range []string{"-stored-first", ""} {
			waitPool()
			b.Run(fmt.Sprintf("fork-%d-to-first-calls%s", n, way), func(b *testing.B) {
				if way != "" {
					runner.ForkStoredFirst(b)
				}
				for b.Loop() {
					b.Log(fork(n))
				}
			})
		}
	}
	// The floors of pause and resume: a container of the same image
	// stopped without grace (its PID 1 ignores SIGTERM, as the agent does)
	// and started again.
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: dockertest.Image(b), Cmd: []string{"sleep", "100000"}, Labels: dockertest.Labels()},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
	if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		b.Fatal(err)
	}
	zero := 0
	once("floor-docker-stop-t0", func() string {
		if _, err := cli.ContainerStop(ctx, c.ID, client.ContainerStopOptions{Timeout: &zero}); err != nil {
			b.Fatal(err)
		}
		return ""
	})
	once("floor-docker-start", func() string {
		if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
			b.Fatal(err)
		}
		return ""
	})
	b.Logf("load average %s", loadAvg())
}

func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err == nil && n > 0 {
		return n
	}
	return def
}

func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	return string(data[:min(len(data), 14)])
}
