package adversarial

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

// probeBinary is testdata/probe built as a static Linux executable, which
// calls the kernel directly from inside a container.
var probeBinary = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "sbx-probe-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "probe")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = filepath.Join("testdata", "probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the probe: %v\n%s", err, msg)
	}
	return os.ReadFile(out)
})

// putProbe writes the probe into the workspace as ./probe.
func putProbe(t *testing.T, fsys workspace.FileSystem) {
	t.Helper()
	bin, err := probeBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile(context.Background(), "probe", bin, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestKernelSurface attacks the kernel's interfaces a session's commands
// can reach, and the agent beside them.
func TestKernelSurface(t *testing.T) {
	runAttacks(t, []attack{
		{"SyscallsRefused", func(t *testing.T, w *world) {
			w.dockerOnly(t, "the local backend runs as the host user by design")
			putProbe(t, w.fs)
			// Each of these is refused by sandboxd's seccomp profile with
			// EPERM; the engine's default let io_uring_setup and
			// name_to_handle_at through.
			denied := []string{"io_uring_setup", "io_uring_enter", "bpf", "userfaultfd", "perf_event_open", "keyctl", "add_key",
				"unshare", "setns", "mount", "open_by_handle_at", "name_to_handle_at", "kexec_load", "fsopen"}
			out := w.sh(t, "./probe syscalls getpid "+strings.Join(denied, " "))
			want := "getpid ok\n"
			for _, name := range denied {
				want += name + " EPERM\n"
			}
			if out != want {
				t.Errorf("system calls from a command:\n%s\nwant:\n%s", out, want)
			}
		}},
		{"AgentNotTraceable", func(t *testing.T, w *world) {
			w.dockerOnly(t, "the local backend runs as the host user by design")
			putProbe(t, w.fs)
			// A command runs as the agent's user; the agent is not
			// dumpable, so it cannot be traced, nor its memory, descriptors
			// or environment read.
			if out := w.sh(t, "./probe ptrace 1"); out != "EPERM\n" {
				t.Errorf("ptrace of the agent from a command: %q; want EPERM", out)
			}
			// gVisor lets the agent's user list its descriptors (not read
			// its environment or memory): what they are, not what they hold.
			want := 3
			if dockertest.GVisor() {
				want = 2
			}
			if out := w.sh(t, "cat /proc/1/environ /proc/1/mem 2>&1 >/dev/null; ls /proc/1/fd 2>&1 >/dev/null; true"); strings.Count(out, "Permission denied") != want {
				t.Errorf("the agent's /proc files from a command:\n%s", out)
			}
			// A command's own processes stay traceable (debuggers work).
			if out := w.sh(t, "./probe ptrace child"); out != "attached\n" {
				t.Errorf("ptrace of a command's own child: %q; want attached", out)
			}
		}},
	})
}

// TestSessionUIDs: sessions run as host uids of their own, so per-user
// kernel limits are not shared. One session holds every inotify instance
// its uid may have (128 by default); another must still get its own.
func TestSessionUIDs(t *testing.T) {
	var a, b *docker.Container
	var wg sync.WaitGroup
	wg.Go(func() { a = dockertest.Start(t, docker.Spec{}) })
	wg.Go(func() { b = dockertest.Start(t, docker.Spec{}) })
	wg.Wait()
	if t.Failed() {
		return
	}
	uids := [2]string{}
	for i, c := range []*docker.Container{a, b} {
		putProbe(t, c.Agent())
		res, out := runIn(t, context.Background(), c, "id -u")
		uids[i] = strings.TrimSpace(out)
		if n, err := strconv.Atoi(uids[i]); res.ExitCode != 0 || err != nil || !policy.DefaultSessionUIDs.Contains(n) {
			t.Fatalf("session %d runs as %q, not a session uid", i, out)
		}
	}
	if uids[0] == uids[1] {
		t.Fatalf("two sessions run as one uid %s", uids[0])
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holding := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var once sync.Once
		a.Bash().Run(ctx, workspace.Command{Script: "./probe inotify hold", Output: func(_ workspace.Stream, p []byte) {
			once.Do(func() { holding <- string(p) })
		}})
	}()
	select {
	case h := <-holding:
		if !strings.HasPrefix(h, "holding ") || !strings.Contains(h, "EMFILE") {
			t.Fatalf("session a: %q", h)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("session a did not take its inotify instances within 60 s")
	}
	if res, out := runIn(t, context.Background(), b, "./probe inotify 8"); res.ExitCode != 0 || out != "opened 8\n" {
		t.Errorf("session b while a holds every instance of its uid: exit %d, %q", res.ExitCode, out)
	}
	cancel()
	<-done
}

// TestFrozenAgent: an agent that stops answering — frozen, as a command
// tracing it could once do — no longer enforces its commands' timeouts, so
// the host does: the call returns a grace after its timeout with
// ErrUnavailable, and the container is killed.
func TestFrozenAgent(t *testing.T) {
	c := dockertest.Start(t, docker.Spec{})
	cli := dockertest.Client(t)
	if _, err := cli.ContainerKill(context.Background(), c.ID(), client.ContainerKillOptions{Signal: "STOP"}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Bash().Run(context.Background(), workspace.Command{Script: "sleep 600", Timeout: 2 * time.Second})
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "did not answer") || !strings.Contains(err.Error(), "container was killed") {
			t.Errorf("Run with a frozen agent: %v", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("Run with a 2 s timeout and a frozen agent had not returned after 90 s")
	}
	res, err := cli.ContainerInspect(context.Background(), c.ID(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Container.State.Running {
		t.Errorf("the container still runs: %+v", res.Container.State)
	}
}

// runIn runs script in c and returns its result and output.
func runIn(t *testing.T, ctx context.Context, c *docker.Container, script string) (workspace.Result, string) {
	t.Helper()
	var mu sync.Mutex
	var b strings.Builder
	res, err := c.Bash().Run(ctx, workspace.Command{Script: script, Timeout: 60 * time.Second, Output: func(_ workspace.Stream, p []byte) {
		mu.Lock()
		b.Write(p)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return res, b.String()
}

// TestSparseWorkspace: the initial copy of a workspace directory once wrote
// a sparse file at its full size (8 KiB on the host's disk, 3 GB in the
// engine's). Now its holes are kept, and the copy is capped by the data it
// writes: a start past the cap fails, naming it, and leaves nothing behind.
func TestSparseWorkspace(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("0123456789abcde\n"), 4096) // 64 KiB at 1 GiB
	sparse := filepath.Join(dir, "sparse")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(3 << 30); err != nil { // 3 GiB, all hole but the data
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(dir, "small"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := dockertest.Start(t, docker.Spec{WorkspaceDir: dir})
	sum := md5.Sum(data)
	script := fmt.Sprintf("stat -c '%%s %%n' sparse small; dd if=sparse bs=%d skip=%d count=1 2>/dev/null | md5sum; stat -c '%%b %%B' sparse",
		len(data), (1<<30)/len(data))
	res, out := runIn(t, context.Background(), c, script)
	want := fmt.Sprintf("3221225472 sparse\n1 small\n%x  -\n", sum)
	var blocks, blockSize int64
	rest, _ := strings.CutPrefix(out, want)
	if _, err := fmt.Sscan(rest, &blocks, &blockSize); res.ExitCode != 0 || !strings.HasPrefix(out, want) || err != nil {
		t.Errorf("copied workspace:\n%s\nwant:\n%sBLOCKS SIZE", out, want)
	}
	if blocks*blockSize > 4<<20 {
		t.Errorf("the 3 GiB sparse file takes %d bytes in the container", blocks*blockSize)
	}

	// Past the cap, Start fails and leaves nothing.
	cli := dockertest.Client(t)
	spec := dockertest.Spec(t, docker.Spec{WorkspaceDir: dir, MaxWorkspaceBytes: 64 << 10})
	spec.Profile.Session = "sparse-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	c, err = docker.Start(context.Background(), cli, spec)
	if err == nil {
		c.Close(context.Background())
		t.Fatal("a workspace over its cap was copied")
	}
	if !strings.Contains(err.Error(), "MaxWorkspaceBytes") {
		t.Errorf("Start: %v; want the cap named", err)
	}
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", policy.LabelSession+"="+spec.Profile.Session)})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("containers left after the refused start: %d, %v", len(list.Items), err)
	}
}
