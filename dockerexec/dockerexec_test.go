package dockerexec_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/internal/dockertest"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestMain(m *testing.M) { dockertest.Main(m, "dockerexec") }

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
	c := dockertest.Start(t, dockerexec.Spec{})
	res, out := run(t, c.Bash(), "echo hello; id -u", 0)
	t.Logf("%+v %q", res, out)
	if res.ExitCode != 0 || !strings.HasPrefix(out, "hello\n") {
		t.Fatalf("got %+v %q", res, out)
	}
}

// TestHardening shows, from inside a session, what the default profile
// promises.
func TestHardening(t *testing.T) {
	c := dockertest.Start(t, dockerexec.Spec{})
	b := c.Bash()
	checks := []struct {
		name, script string
		want         func(out string) bool
	}{
		{"not root", "id -u", func(o string) bool { return strings.TrimSpace(o) != "0" && strings.TrimSpace(o) != "" }},
		{"no new privileges", "grep NoNewPrivs /proc/self/status", func(o string) bool { return strings.Fields(o)[1] == "1" }},
		{"no effective capabilities", "grep CapEff /proc/self/status", func(o string) bool { return strings.Fields(o)[1] == "0000000000000000" }},
		{"no bounding capabilities", "grep CapBnd /proc/self/status", func(o string) bool { return strings.Fields(o)[1] == "0000000000000000" }},
		{"only loopback", "ls /sys/class/net", func(o string) bool { return strings.Fields(o)[0] == "lo" && len(strings.Fields(o)) == 1 }},
		{"read-only root", "touch /etc/x 2>&1; echo rc=$?", func(o string) bool {
			return strings.Contains(o, "Read-only file system") && strings.Contains(o, "rc=1")
		}},
		{"writable workspace", "touch /workspace/x && ls -ln /workspace/x", func(o string) bool { return strings.Contains(o, " 1000 ") }},
		{"writable tmp", "echo x > /tmp/x && cat /tmp/x && grep ' /tmp ' /proc/mounts", func(o string) bool { return strings.HasPrefix(o, "x\ntmpfs /tmp tmpfs") }},
		{"no docker socket", "ls /var/run/docker.sock /run/docker.sock 2>&1; true", func(o string) bool { return strings.Count(o, "No such file") == 2 }},
		{"pids limit", "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max", func(o string) bool { return strings.TrimSpace(o) == "256" }},
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			res, out := run(t, b, ck.script, 10*time.Second)
			if !ck.want(out) {
				t.Errorf("%s: exit %d, output %q", ck.script, res.ExitCode, out)
			}
		})
	}
}

// limited starts a session with small limits, so that exhausting them is quick.
func limited(t *testing.T) *dockerexec.Container {
	prof := policy.DefaultProfile(dockertest.Image(t))
	prof.PidsLimit = 64
	prof.MemoryBytes = 64 << 20
	return dockertest.Start(t, dockerexec.Spec{Profile: prof})
}

func TestForkBombEndsAtPidsLimit(t *testing.T) {
	c := limited(t)
	res, out := run(t, c.Bash(), "bomb() { bomb | bomb & }; bomb; sleep 30", 3*time.Second)
	if !res.TimedOut {
		t.Errorf("fork bomb: %+v %q", res, tail(out))
	}
	if !strings.Contains(out, "fork") && !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("fork bomb never hit the pids limit: %q", tail(out))
	}
	res, out = run(t, c.Bash(), "echo alive; ps -o pid,stat,args", 10*time.Second)
	if res.ExitCode != 0 || !strings.HasPrefix(out, "alive\n") {
		t.Fatalf("after the fork bomb: %+v %q", res, out)
	}
	// The header, PID 1, the shell and ps.
	if n := strings.Count(out, "\n"); n != 5 {
		t.Errorf("after the fork bomb, processes remain:\n%s", out)
	}
}

func TestMemoryHogIsKilled(t *testing.T) {
	c := limited(t)
	res, out := run(t, c.Bash(), "s=xxxxxxxxxxxxxxxx; while :; do s=$s$s; done", 30*time.Second)
	if res.TimedOut || (res.Signal != "SIGKILL" && res.ExitCode != 137) {
		t.Errorf("memory hog: %+v %q, want killed by SIGKILL", res, tail(out))
	}
	if res, out := run(t, c.Bash(), "echo alive", 10*time.Second); res.ExitCode != 0 || out != "alive\n" {
		t.Fatalf("after the memory hog: %+v %q", res, out)
	}
}

func TestTimeoutKillsEverything(t *testing.T) {
	c := dockertest.Start(t, dockerexec.Spec{})
	script := "sleep 1001 & nohup sleep 1002 >/dev/null 2>&1 & setsid sleep 1003 & (setsid sh -c 'sleep 1004 &' &) ; sleep 1005"
	res, _ := run(t, c.Bash(), script, time.Second)
	if !res.TimedOut {
		t.Fatalf("result %+v, want a timeout", res)
	}
	_, out := run(t, c.Bash(), "ps -o pid,comm,args", 10*time.Second)
	if strings.Contains(out, "sleep") {
		t.Errorf("processes of the timed-out command survive:\n%s", out)
	}
}

func tail(s string) string {
	if len(s) > 300 {
		return "…" + s[len(s)-300:]
	}
	return s
}
