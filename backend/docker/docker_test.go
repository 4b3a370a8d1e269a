package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/agentbin"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestMain(m *testing.M) { dockertest.Main(m, "docker") }

// run runs a script and returns its combined output.
func run(t *testing.T, b workspace.Bash, script string, timeout time.Duration) (workspace.Result, string) {
	t.Helper()
	var out bytes.Buffer
	res, err := b.Run(context.Background(), workspace.Command{Script: script, Timeout: timeout,
		Output: func(_ workspace.Stream, p []byte) { out.Write(p) }})
	if err != nil {
		t.Fatalf("Run(%q): %v", script, err)
	}
	return res, out.String()
}

func TestSmoke(t *testing.T) {
	c := dockertest.Start(t, docker.Spec{})
	res, out := run(t, c.Bash(), "echo hello; id -u", 0)
	t.Logf("%+v %q", res, out)
	if res.ExitCode != 0 || !strings.HasPrefix(out, "hello\n") {
		t.Fatalf("got %+v %q", res, out)
	}
}

// TestHardening shows, from inside a session, what the default profile
// promises.
func TestHardening(t *testing.T) {
	c := dockertest.Start(t, docker.Spec{})
	b := c.Bash()
	checks := []struct {
		name, script string
		want         func(out string) bool
	}{
		{"a session uid of its own", "id -u; id -g", func(o string) bool { return o == sessionUID(o)+"\n"+sessionUID(o)+"\n" }},
		{"no new privileges", "grep NoNewPrivs /proc/self/status", func(o string) bool { return strings.Fields(o)[1] == "1" }},
		{"no effective capabilities", "grep CapEff /proc/self/status", func(o string) bool { return strings.Fields(o)[1] == "0000000000000000" }},
		{"no bounding capabilities", "grep CapBnd /proc/self/status", func(o string) bool { return strings.Fields(o)[1] == "0000000000000000" }},
		// /proc/net/dev, not /sys/class/net, which gVisor has not.
		{"only loopback", "tail -n +3 /proc/net/dev | cut -d: -f1", func(o string) bool { return strings.Fields(o)[0] == "lo" && len(strings.Fields(o)) == 1 }},
		// The mount's flag: gVisor refuses a write to /etc as not the
		// user's before it looks at the mount.
		{"read-only root", "awk '$2 == \"/\" {print $4}' /proc/mounts; touch /etc/x 2>&1; echo rc=$?", func(o string) bool {
			return strings.HasPrefix(o, "ro,") && strings.Contains(o, "rc=1")
		}},
		{"writable workspace", "touch /workspace/x && stat -c %u /workspace/x", func(o string) bool { return sessionUID(o) != "" }},
		{"writable tmp", "echo x > /tmp/x && cat /tmp/x && grep ' /tmp ' /proc/mounts | cut -d' ' -f2,3", func(o string) bool { return o == "x\n/tmp tmpfs\n" }},
		// The agent (PID 1, not dumpable, not root) cannot raise its own
		// value for a command to inherit: the command's is set.
		{"commands are the OOM killer's first choice", "cat /proc/self/oom_score_adj /proc/1/oom_score_adj", func(o string) bool {
			f := strings.Fields(o)
			return len(f) == 2 && f[0] == "1000" && f[1] != "1000"
		}},
		{"no docker socket", "ls /var/run/docker.sock /run/docker.sock 2>&1; true", func(o string) bool { return strings.Count(o, "No such file") == 2 }},
		{"pids limit", "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max", func(o string) bool { return strings.TrimSpace(o) == "256" }},
	}
	if dockertest.GVisor() {
		// The pids cgroup bounds the sandbox's host threads there; the
		// session's processes are bounded by RLIMIT_NPROC inside it.
		checks[len(checks)-1] = struct {
			name, script string
			want         func(out string) bool
		}{"pids limit", "ulimit -u", func(o string) bool { return strings.TrimSpace(o) == "256" }}
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			res, out := run(t, b, ck.script, time.Minute)
			if !ck.want(out) {
				t.Errorf("%s: exit %d, output %q", ck.script, res.ExitCode, out)
			}
		})
	}
}

// limited starts a session with small limits, so that exhausting them is quick.
func limited(t *testing.T) *docker.Container {
	prof := policy.DefaultProfile(dockertest.Image(t))
	prof.PidsLimit = 64
	prof.MemoryBytes = 64 << 20
	return dockertest.Start(t, docker.Spec{Profile: prof})
}

func TestForkBombEndsAtPidsLimit(t *testing.T) {
	c := limited(t)
	res, out := run(t, c.Bash(), "bomb() { bomb | bomb & }; bomb; sleep 600", 10*time.Second)
	if !res.TimedOut {
		t.Errorf("fork bomb: %+v %q", res, tail(out))
	}
	if !strings.Contains(out, "fork") && !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("fork bomb never hit the pids limit: %q", tail(out))
	}
	res, out = run(t, c.Bash(), "echo alive; ps -o pid,stat,args", time.Minute)
	if res.ExitCode != 0 || !strings.HasPrefix(out, "alive\n") {
		t.Fatalf("after the fork bomb: %+v %q", res, out)
	}
	// Besides the header: PID 1, this command (the shell, and ps if it
	// forked one) and, if it runs under one, proctree's shim — the agent
	// runs a command that runs alone without it.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[2:] {
		f := strings.Fields(line)
		if len(f) == 0 || (f[0] != "1" && !strings.Contains(line, "echo alive") && !strings.Contains(line, "proctree-shim") && !strings.HasSuffix(line, " ps -o pid,stat,args")) {
			t.Errorf("after the fork bomb, processes remain:\n%s", out)
			break
		}
	}
}

func TestMemoryHogIsKilled(t *testing.T) {
	c := limited(t)
	if dockertest.GVisor() {
		// gVisor's kernel keeps the session's memory in the sandbox's
		// cgroup, whole: at the limit the host's OOM killer ends the
		// sandbox, agent and all, and the session says so.
		var out strings.Builder
		_, err := c.Bash().Run(context.Background(), workspace.Command{Script: "s=xxxxxxxxxxxxxxxx; while :; do s=$s$s; done", Timeout: time.Minute,
			Output: func(_ workspace.Stream, p []byte) { out.WriteString(string(p)) }})
		if err == nil || !strings.Contains(err.Error(), "lack of memory") {
			t.Fatalf("a memory hog under gVisor: %v (output %q); want the session ended, killed for lack of memory", err, tail(out.String()))
		}
		return
	}
	res, out := run(t, c.Bash(), "s=xxxxxxxxxxxxxxxx; while :; do s=$s$s; done", time.Minute)
	if res.TimedOut || (res.Signal != "SIGKILL" && res.ExitCode != 137) {
		t.Errorf("memory hog: %+v %q, want killed by SIGKILL", res, tail(out))
	}
	if res, out := run(t, c.Bash(), "echo alive", time.Minute); res.ExitCode != 0 || out != "alive\n" {
		t.Fatalf("after the memory hog: %+v %q", res, out)
	}
}

func TestTimeoutKillsEverything(t *testing.T) {
	c := dockertest.Start(t, docker.Spec{})
	script := "sleep 1001 & nohup sleep 1002 >/dev/null 2>&1 & setsid sleep 1003 & (setsid sh -c 'sleep 1004 &' &) ; echo started; sleep 1005"
	// A timeout that passed before the escapes started proves little: it is
	// doubled until they had.
	for limit := time.Second; ; limit *= 2 {
		res, out := run(t, c.Bash(), script, limit)
		if !res.TimedOut {
			t.Fatalf("result %+v, want a timeout", res)
		}
		_, ps := run(t, c.Bash(), "ps -o pid,comm,args", time.Minute)
		if strings.Contains(ps, "sleep") {
			t.Fatalf("processes of the timed-out command survive:\n%s", ps)
		}
		if strings.Contains(out, "started") {
			return
		}
		if limit > 30*time.Second {
			t.Fatalf("the escapes never started within %v: output %q", limit, out)
		}
	}
}

func tail(s string) string {
	if len(s) > 300 {
		return "…" + s[len(s)-300:]
	}
	return s
}

// TestWorkspaceCopiedIn copies a host directory in at start: its files,
// modes and links, owned by the session's user.
func TestWorkspaceCopiedIn(t *testing.T) {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "src/sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "src/sub/a.txt"), []byte("alpha\n"), 0o640))
	must(t, os.Symlink("sub/a.txt", filepath.Join(dir, "src/link")))
	c := dockertest.Start(t, docker.Spec{WorkspaceDir: dir})

	_, out := run(t, c.Bash(), "cat src/link; stat -c '%u:%g %a %n' . src src/sub/a.txt; readlink src/link", time.Minute)
	u := sessionUID(strings.TrimPrefix(out, "alpha\n"))
	want := strings.ReplaceAll("alpha\nU:U 755 .\nU:U 755 src\nU:U 640 src/sub/a.txt\nsub/a.txt\n", "U", u)
	if out != want {
		t.Errorf("workspace as copied in:\n%s\nwant:\n%s", out, want)
	}
}

// TestHomeOutsideTheWork: a session's HOME is a writable directory of its
// own under .sandboxd (whatever the image says), which git is told to
// ignore: caches programs keep there are never among the work.
func TestHomeOutsideTheWork(t *testing.T) {
	c := dockertest.Start(t, docker.Spec{})
	res, out := run(t, c.Bash(), `echo "$HOME"; mkdir -p "$HOME/.cache/go-build" && echo x > "$HOME/.cache/go-build/f" && stat -c '%a' "$HOME"; cat .sandboxd/.gitignore`, time.Minute)
	want := docker.Home + "\n700\n# sandboxd's bookkeeping, never part of the work\n*\n"
	if res.ExitCode != 0 || out != want {
		t.Errorf("home: %+v\n%s\nwant:\n%s", res, out, want)
	}
}

// TestStartFailureLeavesNothing fails Start early (an unknown runtime) and
// late (an agent that exits at once, so the handshake fails after the
// container started): neither leaves a container or a workspace volume.
func TestStartFailureLeavesNothing(t *testing.T) {
	cli := dockertest.Client(t)
	ctx := context.Background()
	agentPath, err := agentbin.Path()
	must(t, err)
	quitter := filepath.Join(t.TempDir(), "quitter")
	must(t, os.WriteFile(quitter+".go", []byte("package main\n\nimport \"os\"\n\nfunc main() { os.Stderr.WriteString(\"bye\\n\"); os.Exit(3) }\n"), 0o644))
	build := exec.Command("go", "build", "-o", quitter, quitter+".go")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	labels := map[string]string{dockertest.LabelTest: dockertest.Label(), "sandboxd.case": "failure"}
	cases := []struct {
		name, agent, runtime, want string
	}{
		{"unknown runtime", agentPath, "no-such-runtime", "runtime"},
		{"agent exits", quitter, "", `exit code 3); agent's log: "bye"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := docker.Spec{Profile: policy.DefaultProfile(dockertest.Image(t)), Agent: tc.agent, Labels: labels}
			if tc.runtime != "" {
				spec.Profile.Runtime = tc.runtime
			}
			c, err := docker.Start(ctx, cli, spec)
			if err == nil {
				c.Close(ctx)
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start: %v; want it to mention %q", err, tc.want)
			}
			n, err := docker.Reap(ctx, cli, map[string]string{dockertest.LabelTest: dockertest.Label(), "sandboxd.case": "failure"}, nil)
			if err != nil || n != 0 {
				t.Errorf("a failed Start left %d containers (%v)", n, err)
			}
			vols, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: make(client.Filters).Add("label", "sandboxd.case=failure")})
			if err != nil || len(vols.Items) != 0 {
				t.Errorf("a failed Start left volumes %v (%v)", vols.Items, err)
			}
		})
	}
	// The quitter's agent volume is the test's to remove.
	data, err := os.ReadFile(quitter)
	must(t, err)
	sum := sha256.Sum256(data)
	if _, err := cli.VolumeRemove(ctx, "sandboxd-agent-"+hex.EncodeToString(sum[:])[:16], client.VolumeRemoveOptions{}); err != nil {
		t.Errorf("remove the quitter's agent volume: %v", err)
	}
}

func TestReap(t *testing.T) {
	cli := dockertest.Client(t)
	ctx := context.Background()
	c := dockertest.Start(t, docker.Spec{})
	n, err := docker.Reap(ctx, cli, map[string]string{policy.LabelSession: dockertest.Label(), "sandboxd.case": "none"}, nil)
	if err != nil || n != 0 {
		t.Fatalf("Reap of a label nothing has = %d, %v", n, err)
	}
	if _, err := docker.Reap(ctx, cli, nil, nil); err == nil {
		t.Error("Reap with no labels must refuse")
	}
	mine := map[string]string{policy.LabelSession: "docker", dockertest.LabelTest: dockertest.Label()}
	// Reap leaves what its judge keeps (a living owner's).
	n, err = docker.Reap(ctx, cli, mine, func(labels map[string]string) bool { return labels[policy.LabelSession] != "docker" })
	if err != nil || n != 0 {
		t.Fatalf("Reap that keeps the container = %d, %v", n, err)
	}
	if _, err := c.Bash().Run(ctx, workspace.Command{Script: "true"}); err != nil {
		t.Fatalf("the container kept by Reap: %v", err)
	}
	n, err = docker.Reap(ctx, cli, mine, nil)
	if err != nil || n < 1 {
		t.Fatalf("Reap = %d, %v", n, err)
	}
	if _, err := cli.ContainerInspect(ctx, c.ID(), client.ContainerInspectOptions{}); err == nil {
		t.Error("the container survived Reap")
	}
	if _, err := c.Bash().Run(ctx, workspace.Command{Script: "true"}); !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("Run on a reaped container = %v, want ErrUnavailable", err)
	}
}

// TestSeccomp runs a session with a seccomp profile, in the runtime-spec's
// types, that refuses mkdir: the engine must apply it.
func TestSeccomp(t *testing.T) {
	prof := policy.DefaultProfile(dockertest.Image(t))
	prof.Seccomp = &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64},
		Syscalls:      []specs.LinuxSyscall{{Names: []string{"mkdir", "mkdirat"}, Action: specs.ActErrno}},
	}
	c := dockertest.Start(t, docker.Spec{Profile: prof})
	res, out := run(t, c.Bash(), "mkdir /tmp/d", time.Minute)
	if res.ExitCode == 0 || !strings.Contains(out, "not permitted") {
		t.Errorf("mkdir under a profile that refuses it: %+v %q", res, out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestForeignImage runs a session in an image that is not sandboxd's and has
// no /workspace: the workspace volume must still belong to the session's
// user, and the agent must run there too.
func TestForeignImage(t *testing.T) {
	cli := dockertest.Client(t)
	ctx := context.Background()
	ref := "sandboxd-test/foreign:latest"
	// The minimal image's files without /workspace, no labels, no user.
	ct, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Image: dockertest.Image(t),
		Config: &container.Config{Labels: dockertest.Labels(), Cmd: []string{"/never-started"}}})
	must(t, err)
	exp, err := cli.ContainerExport(ctx, ct.ID, client.ContainerExportOptions{})
	must(t, err)
	pr, pw := io.Pipe()
	go func() {
		tr, tw := tar.NewReader(exp), tar.NewWriter(pw)
		var err error
		for {
			var h *tar.Header
			if h, err = tr.Next(); err != nil {
				break
			}
			if strings.HasPrefix(h.Name, "workspace") {
				continue
			}
			if err = tw.WriteHeader(h); err != nil {
				break
			}
			if _, err = io.Copy(tw, tr); err != nil {
				break
			}
		}
		if err == io.EOF {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	res, err := cli.ImageImport(ctx, client.ImageImportSource{Source: pr, SourceName: "-"}, ref, client.ImageImportOptions{})
	must(t, err)
	io.Copy(io.Discard, res)
	res.Close()
	exp.Close()
	cli.ContainerRemove(ctx, ct.ID, client.ContainerRemoveOptions{Force: true})
	t.Cleanup(func() { cli.ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true}) })

	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "given"), []byte("g"), 0o644))
	c := dockertest.Start(t, docker.Spec{Profile: policy.DefaultProfile(ref), WorkspaceDir: dir})
	r, out := run(t, c.Bash(), "touch made && stat -c '%u:%g %n' . given made", time.Minute)
	if u := sessionUID(out); r.ExitCode != 0 || out != strings.ReplaceAll("U:U .\nU:U given\nU:U made\n", "U", u) {
		t.Errorf("workspace in a foreign image: %+v %q", r, out)
	}
}

// sessionUID returns the number out starts with when it is a uid of
// policy.DefaultSessionUIDs, the range every test container runs as one
// of, else "".
func sessionUID(out string) string {
	s := out[:len(out)-len(strings.TrimLeft(out, "0123456789"))]
	if uid, err := strconv.Atoi(s); err != nil || !policy.DefaultSessionUIDs.Contains(uid) {
		return ""
	}
	return s
}

// TestToolsBashOnDocker: the bash tool's long scripts (past the kernel's
// 128 KiB for one argument and the agent's 1 MiB frame) and kept state
// work through the agent as on the host.
func TestToolsBashOnDocker(t *testing.T) {
	c := dockertest.Start(t, docker.Spec{})
	cfg := tools.DefaultConfig()
	cfg.Grants, cfg.Always, cfg.BashKeepState = []string{tools.GrantShellExec}, []string{"shell"}, true
	set, err := tools.New(tools.Env{FS: c.Agent(), Bash: c.Bash(), Session: workspace.Session{ID: "s", Root: "/workspace"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close(context.Background())
	bash := func(command string) string {
		t.Helper()
		args, _ := json.Marshal(map[string]string{"command": command})
		r := set.Call(context.Background(), "bash", args, tools.CallOptions{})
		br, ok := r.Structured.(*tools.BashResult)
		if r.IsError || !ok || br.ExitCode != 0 {
			t.Fatalf("bash: %.300s", r.Text)
		}
		return br.Output
	}
	long := strings.Repeat(": "+strings.Repeat("x", 98)+"\n", 12<<10) + "echo long done\n" // 1.2 MB
	if out := bash(long); out != "long done\n" {
		t.Errorf("a 1.2 MB script: %q", out)
	}
	bash("mkdir -p d && cd d && export KEPT=yes")
	if out := bash(`echo "${PWD##*/} $KEPT"`); out != "d yes\n" {
		t.Errorf("kept state: %q", out)
	}
}
