package docker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/testharness/agentbin"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// diskBytes is the size of the test sessions' disks.
const diskBytes = 64 << 20

// diskSpec is a spec whose workspace is a disk of diskBytes in dir; it
// skips the test where this host cannot make one (and fails under CI).
func diskSpec(t *testing.T, dir string) docker.Spec {
	t.Helper()
	if err := docker.CheckDisks(context.Background(), dockertest.Client(t), dir); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("disks: %v", err)
		}
		t.Skipf("disks: %v", err)
	}
	t.Cleanup(func() { docker.DetachLoopsUnder(dir) })
	return docker.Spec{DiskBytes: diskBytes, DiskDir: dir}
}

// TestWorkspaceDisk: a session on a disk of its own cannot write past it —
// not with fallocate, dd, a sparse file filled in or the write tool — and
// its image on the host holds no more than its size; another session is
// not hurt, and once the session ends nothing of its disk is left.
func TestWorkspaceDisk(t *testing.T) {
	ctx := context.Background()
	cli := dockertest.Client(t)
	dir := t.TempDir()
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hi\n"), 0o644))
	spec := diskSpec(t, dir)
	spec.WorkspaceDir = src
	full, err := docker.Start(ctx, cli, dockertest.Spec(t, spec))
	must(t, err)
	spec.WorkspaceDir, spec.Profile.Session = "", "docker-other"
	other := dockertest.Start(t, spec)

	imgs, _ := filepath.Glob(filepath.Join(dir, "*.img"))
	if len(imgs) != 2 {
		t.Fatalf("images in the disk directory: %q, want two", imgs)
	}
	res, out := run(t, full.Bash(), `cat hello.txt && touch mine && df -k /workspace | tail -1`, 0)
	if res.ExitCode != 0 || !strings.HasPrefix(out, "hi\n") || !onDisk(strings.TrimPrefix(out, "hi\n")) {
		t.Fatalf("the initial workspace on the disk: %+v %q", res, out)
	}
	for _, tc := range []struct{ name, script string }{
		{"fallocate", "fallocate -l 1G big"},
		{"dd", "dd if=/dev/zero of=dd bs=1M count=100"},
		{"a sparse file filled in", "truncate -s 1G sparse && dd if=/dev/zero of=sparse bs=1M count=100 conv=notrunc"},
	} {
		res, out := run(t, full.Bash(), tc.script+"; s=$?; rm -f big dd sparse; sync; exit $s", 0)
		if res.ExitCode == 0 || !strings.Contains(out, "No space left on device") {
			t.Errorf("%s past the disk: %+v %q, want No space left on device", tc.name, res, out)
		}
	}
	// Hard links of one file hold its blocks once.
	res, out = run(t, full.Bash(), `dd if=/dev/zero of=f bs=1M count=40 2>&1 && for i in 1 2 3 4; do ln f f$i || exit 1; done && df -k . && echo linked`, 0)
	if res.ExitCode != 0 || !strings.HasSuffix(out, "linked\n") {
		t.Errorf("hard links: %+v %q", res, out)
	}
	// The write tool says the disk is full, and what to do.
	set, err := tools.New(tools.Env{FS: full.Agent(), Bash: full.Bash(), Session: workspace.Session{ID: "s", Root: "/workspace"}},
		func() tools.Config {
			c := tools.DefaultConfig()
			c.Grants, c.Always = []string{tools.GrantFSWrite}, []string{"edit"}
			return c
		}())
	must(t, err)
	defer set.Close(ctx)
	args, _ := json.Marshal(map[string]string{"path": "w.txt", "content": strings.Repeat("x", 40<<20)})
	r := set.Call(ctx, "write", args, tools.CallOptions{})
	if er, ok := r.Structured.(*tools.ErrorResult); !r.IsError || !ok || er.Error != "NoSpace" || !strings.Contains(er.Message, "disk is full") {
		t.Errorf("write past the disk: %.300s, want NoSpace saying the disk is full", r.Text)
	}
	if err := full.Agent().WriteFile(ctx, "w2.txt", make([]byte, 40<<20), 0o644); !errors.Is(err, workspace.ErrNoSpace) {
		t.Errorf("WriteFile past the disk = %v, want NoSpace", err)
	}

	// What the host holds of the disk: no more than its size.
	for _, img := range imgs {
		var st syscall.Stat_t
		must(t, syscall.Stat(img, &st))
		if used := st.Blocks * 512; used > diskBytes {
			t.Errorf("the image %s holds %d bytes on the host, over its %d", img, used, diskBytes)
		}
	}
	// The other session has its own room.
	if res, out := run(t, other.Bash(), "dd if=/dev/zero of=f bs=1M count=20 2>&1 && ls", 0); res.ExitCode != 0 || strings.Contains(out, "mine") {
		t.Errorf("the other session: %+v %q", res, out)
	}

	volume := full.Name() + "-workspace"
	must(t, full.Close(ctx))
	assertNoDisk(t, cli, dir, volume)
}

// onDisk reports whether a line of df -k shows a file system no larger
// than a test disk.
func onDisk(df string) bool {
	f := strings.Fields(df)
	kb, err := strconv.ParseInt(f[min(1, len(f)-1)], 10, 64)
	return err == nil && kb*1024 <= diskBytes
}

// assertNoDisk fails t if anything of volume's disk in dir is left: the
// volume, its files, a loop device on its image.
func assertNoDisk(t *testing.T, cli *client.Client, dir, volume string) {
	t.Helper()
	if _, err := cli.VolumeInspect(context.Background(), volume, client.VolumeInspectOptions{}); err == nil {
		t.Errorf("the volume %s is left", volume)
	}
	img := filepath.Join(dir, volume+".img")
	for _, name := range []string{img, filepath.Join(dir, volume+".dev")} {
		if _, err := os.Lstat(name); err == nil {
			t.Errorf("%s is left", name)
		}
	}
	if devs := docker.LoopsOf(img); len(devs) > 0 {
		t.Errorf("loop devices %q are left on %s", devs, img)
	}
}

// diskBackend is a Backend whose sessions have disks in dir, its state in
// state ("" for none).
func diskBackend(t *testing.T, dir, state string) *docker.Backend {
	t.Helper()
	diskSpec(t, dir)
	agent, err := agentbin.Path()
	must(t, err)
	return &docker.Backend{Client: dockertest.Client(t), Agent: agent, DiskBytes: diskBytes, DiskDir: dir, StateDir: state}
}

// diskLabels are the labels of a case of the lifecycle tests.
func diskLabels(name string) map[string]string {
	return map[string]string{dockertest.LabelTest: dockertest.Label(), "sandboxd.case": name, backend.LabelDaemon: dockertest.DaemonName("disk-" + name)}
}

func diskOpen(t *testing.T, d *docker.Backend, labels map[string]string, session string) *backend.Instance {
	t.Helper()
	prof := dockertest.Spec(t, docker.Spec{}).Profile
	prof.Session = session
	inst, err := d.Open(context.Background(), backend.Spec{Session: session, Profile: prof, Labels: labels})
	must(t, err)
	return inst
}

// TestWorkspaceDiskLifecycle: a session's disk goes with it on every
// path — a failed start, a warm container, a pause whose device the host
// lost meanwhile, a daemon's restart, and a killed daemon's leftovers,
// which Reap finds.
func TestWorkspaceDiskLifecycle(t *testing.T) {
	ctx := context.Background()
	cli := dockertest.Client(t)

	t.Run("failed start", func(t *testing.T) {
		dir := t.TempDir()
		spec := dockertest.Spec(t, diskSpec(t, dir))
		spec.Profile.Runtime = "no-such-runtime"
		if c, err := docker.Start(ctx, cli, spec); err == nil {
			c.Close(ctx)
			t.Fatal("Start succeeded")
		}
		assertNoDisk(t, cli, dir, "sandboxd-"+spec.Profile.Session+"-workspace")
		if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) > 0 {
			t.Errorf("a failed start left %q", left)
		}
	})

	t.Run("snapshot restored onto a disk", func(t *testing.T) {
		dir := t.TempDir()
		spec := diskSpec(t, dir)
		spec.Profile.Session = "docker-disk-from"
		from := dockertest.Start(t, spec)
		run(t, from.Bash(), "echo kept > f && dd if=/dev/zero of=big bs=1M count=40 2>/dev/null", 0)
		var snap bytes.Buffer
		must(t, from.Export(ctx, &snap))
		spec.Profile.Session = "docker-disk-to"
		to := dockertest.Start(t, spec)
		must(t, to.Import(ctx, bytes.NewReader(snap.Bytes())))
		if res, out := run(t, to.Bash(), "cat f && df -k /workspace | tail -1", 0); res.ExitCode != 0 || !strings.HasPrefix(out, "kept\n") || !onDisk(strings.TrimPrefix(out, "kept\n")) {
			t.Errorf("restored: %+v %q", res, out)
		}
		// Twice the 40 MiB file does not fit: the restore fails, saying so.
		spec.Profile.Session = "docker-disk-small"
		small := dockertest.Start(t, spec)
		run(t, small.Bash(), "dd if=/dev/zero of=filler bs=1M count=30 2>/dev/null", 0)
		if err := small.Import(ctx, bytes.NewReader(snap.Bytes())); err == nil || !strings.Contains(err.Error(), "no space left on device") {
			t.Errorf("a restore past the disk = %v, want no space left on device", err)
		}
	})

	t.Run("warm", func(t *testing.T) {
		dir := t.TempDir()
		d := diskBackend(t, dir, "")
		prof := dockertest.Spec(t, docker.Spec{}).Profile
		w, err := d.Warm(ctx, backend.Spec{Profile: prof, Labels: diskLabels("warm")})
		must(t, err)
		if res, out := run(t, w.Bash, "df -k /workspace | tail -1", 0); res.ExitCode != 0 || !onDisk(out) {
			t.Errorf("a warm container's workspace: %+v %q", res, out)
		}
		must(t, w.Close(ctx))
		must(t, d.WaitRemovals(ctx))
		assertNoDisk(t, cli, dir, w.ID+"-workspace")
	})

	t.Run("pause, the device lost", func(t *testing.T) {
		dir := t.TempDir()
		d := diskBackend(t, dir, "")
		inst := diskOpen(t, d, diskLabels("pause"), "docker-disk-pause")
		volume := inst.ID + "-workspace"
		img := filepath.Join(dir, volume+".img")
		run(t, inst.Bash, "echo kept > f", 0)
		p, err := inst.Pause(ctx)
		must(t, err)
		// As a restarted host would have it: no device on the image.
		for _, dev := range docker.LoopsOf(img) {
			if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
				t.Fatalf("losetup --detach %s: %v %s", dev, err, out)
			}
		}
		if devs := docker.LoopsOf(img); len(devs) > 0 {
			t.Fatalf("still attached to %q", devs)
		}
		back, err := p.Resume(ctx)
		must(t, err)
		if res, out := run(t, back.Bash, "cat f", 0); res.ExitCode != 0 || out != "kept\n" {
			t.Errorf("after the resume: %+v %q", res, out)
		}
		must(t, back.Close(ctx))
		assertNoDisk(t, cli, dir, volume)
	})

	t.Run("daemon restarts", func(t *testing.T) {
		dir, state := t.TempDir(), t.TempDir()
		labels := diskLabels("restart")
		inst := diskOpen(t, diskBackend(t, dir, state), labels, "docker-disk-restart")
		volume := inst.ID + "-workspace"
		must(t, inst.Publish(ctx, backend.Record{Session: "docker-disk-restart", Tenant: "t"}))
		run(t, inst.Bash, "echo kept > f", 0)
		must(t, inst.Leave(ctx))
		got, err := diskBackend(t, dir, state).Resume(ctx, labels)
		must(t, err)
		if len(got) != 1 || got[0].Instance == nil {
			t.Fatalf("Resume = %+v", got)
		}
		back := got[0].Instance
		if res, out := run(t, back.Bash, "cat f && fallocate -l 1G big", 0); res.ExitCode == 0 || !strings.Contains(out, "No space left on device") {
			t.Errorf("the resumed session's disk: %+v %q", res, out)
		}
		must(t, back.Close(ctx))
		assertNoDisk(t, cli, dir, volume)
	})

	t.Run("a killed daemon's leftovers", func(t *testing.T) {
		dir := t.TempDir()
		labels := diskLabels("killed")
		d := diskBackend(t, dir, "")
		// The daemon died with both sessions running; the second's volume
		// was gone already (it died between removing the volume and the
		// disk).
		kept := diskOpen(t, d, labels, "docker-disk-killed-1")
		half := diskOpen(t, d, labels, "docker-disk-killed-2")
		_, err := cli.ContainerRemove(ctx, half.ID, client.ContainerRemoveOptions{Force: true})
		must(t, err)
		must(t, docker.RemoveVolume(ctx, cli, half.ID+"-workspace"))
		if imgs, _ := filepath.Glob(filepath.Join(dir, "*.img")); len(imgs) != 2 {
			t.Fatalf("images %q, want two", imgs)
		}
		n, err := diskBackend(t, dir, "").Reap(ctx, labels)
		if err != nil || n != 1 {
			t.Errorf("Reap = %d, %v; want 1", n, err)
		}
		assertNoDisk(t, cli, dir, kept.ID+"-workspace")
		assertNoDisk(t, cli, dir, half.ID+"-workspace")
	})
}

// BenchmarkStartWithDisk measures what a disk of its own (1 GiB, as
// limits.workspaceBytes's default) costs a session's start — docker.Start
// and a first command — and its Close, against the same start without
// one, the two taken in turn in one loop so that the host's load weighs
// on both alike. It reports the medians and their ratio.
func BenchmarkStartWithDisk(b *testing.B) {
	ctx := context.Background()
	cli := dockertest.Client(b)
	dir := b.TempDir()
	if err := docker.CheckDisks(ctx, cli, dir); err != nil {
		b.Skipf("disks: %v", err)
	}
	b.Cleanup(func() { docker.DetachLoopsUnder(dir) })
	plain := dockertest.Spec(b, docker.Spec{})
	disk := dockertest.Spec(b, docker.Spec{DiskBytes: 1 << 30, DiskDir: dir})
	var starts, closes [2][]time.Duration
	for b.Loop() {
		for i, spec := range []docker.Spec{plain, disk} {
			t0 := time.Now()
			c, err := docker.Start(ctx, cli, spec)
			if err == nil {
				_, err = c.Bash().Run(ctx, workspace.Command{Argv: []string{"true"}})
			}
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := c.Close(ctx); err != nil {
				b.Fatal(err)
			}
			starts[i] = append(starts[i], t1.Sub(t0))
			closes[i] = append(closes[i], time.Since(t1))
		}
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	sp, sd, cp, cd := median(starts[0]), median(starts[1]), median(closes[0]), median(closes[1])
	b.ReportMetric(sp, "start-plain-ms")
	b.ReportMetric(sd, "start-disk-ms")
	b.ReportMetric(sd/sp, "start-ratio")
	b.ReportMetric(cp, "close-plain-ms")
	b.ReportMetric(cd, "close-disk-ms")
}
