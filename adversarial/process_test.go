package adversarial

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// marker returns a sleep duration unique to the test and backend, so that
// processes can be found by their command line (the host's /proc shows the
// containers' processes too).
func (w *world) marker(n int) string {
	base := 3900
	if w.loan != nil {
		base = 4900
	}
	return fmt.Sprint(base + n)
}

// survivors counts processes whose command line holds "sleep <mark>", where
// the backend's commands run: the host for local, the container for docker.
func (w *world) survivors(t *testing.T, marks ...string) int {
	pattern := strings.Join(marks, "|")
	out := w.sh(t, fmt.Sprintf(`n=0; for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in *"sleep "*) for m in %s; do case "$c" in "sleep $m"*|*" sleep $m"*) n=$((n+1));; esac; done;; esac; done; echo $n`, strings.ReplaceAll(pattern, "|", " ")))
	var n int
	fmt.Sscan(out, &n)
	return n
}

// dockerOnly skips an attack that only a container can stop, saying why the
// local backend does not.
func (w *world) dockerOnly(t *testing.T, why string) {
	if w.loan == nil {
		t.Skip(why)
	}
}

func TestProcesses(t *testing.T) {
	runAttacks(t, []attack{
		{"TimeoutKillsTree", func(t *testing.T, w *world) {
			m := []string{w.marker(1), w.marker(2), w.marker(3), w.marker(4), w.marker(5), w.marker(6)}
			script := fmt.Sprintf(`sleep %s & setsid sleep %s & nohup sleep %s >/dev/null 2>&1 &
(setsid sh -c 'sleep %s & sleep %s' &) ; sleep %s`, m[0], m[1], m[2], m[3], m[4], m[5])
			set := w.toolSet(t, nil)
			var res tools.Result
			within(t, 30*time.Second, "bash with a timeout", func() { res = call(t, set, "bash", map[string]any{"command": script, "timeout": 1}) })
			if b, ok := res.Structured.(*tools.BashResult); !ok || !b.TimedOut {
				t.Fatalf("bash: %.300s", res.Text)
			}
			if n := w.survivors(t, m...); n != 0 {
				t.Errorf("%d processes of the command outlived its timeout", n)
			}
		}},
		{"EscapesAfterExit", func(t *testing.T, w *world) {
			m := []string{w.marker(7), w.marker(8), w.marker(9)}
			script := fmt.Sprintf(`setsid sleep %s >/dev/null 2>&1 < /dev/null & nohup sleep %s >/dev/null 2>&1 & (sleep %s &) ; echo started`, m[0], m[1], m[2])
			set := w.toolSet(t, nil)
			within(t, 30*time.Second, "bash leaving background jobs", func() {
				if res := call(t, set, "bash", map[string]any{"command": script}); res.IsError {
					t.Fatalf("bash: %s", res.Text)
				}
			})
			if n := w.survivors(t, m...); n != 0 {
				t.Errorf("%d background processes outlived the command", n)
			}
		}},
		{"OutputFloodBothStreams", func(t *testing.T, w *world) {
			set := w.toolSet(t, nil)
			var res tools.Result
			within(t, 90*time.Second, "an output flood", func() {
				res = call(t, set, "bash", map[string]any{"command": `yes out | head -c 50000000 & yes err | head -c 50000000 >&2; wait`, "timeout": 80})
			})
			b, ok := res.Structured.(*tools.BashResult)
			if !ok || b.ExitCode != 0 || !b.Truncated || b.OutputBytes < 100_000_000 || len(b.Output) > 100_000 || len(res.Text) > 100_000 {
				t.Fatalf("flood: %T exit %v, %d bytes in the result: %.200s", res.Structured, b, len(res.Text), res.Text)
			}
			if b.SavedBytes > tools.DefaultConfig().MaxFileBytes {
				t.Errorf("saved %d bytes of output, over maxFileBytes", b.SavedBytes)
			}
		}},
		{"StdinNeverCloses", func(t *testing.T, w *world) {
			r, pw := io.Pipe()
			defer pw.Close()
			var res workspace.Result
			var err error
			within(t, 30*time.Second, "a command reading a stdin that never ends", func() {
				res, err = w.bash.Run(context.Background(), workspace.Command{Script: "cat", Stdin: r, Timeout: time.Second})
			})
			if err != nil || !res.TimedOut {
				t.Errorf("Run = %+v, %v; want a timeout", res, err)
			}
			// Through the tool, stdin is a string: a command waiting on it ends.
			set := w.toolSet(t, nil)
			within(t, 30*time.Second, "cat through the tool", func() {
				res := call(t, set, "bash", map[string]any{"command": "cat; read x; echo done"})
				if !strings.Contains(res.Text, "done") {
					t.Errorf("bash: %s", res.Text)
				}
			})
		}},
		{"ForkBomb", func(t *testing.T, w *world) {
			w.dockerOnly(t, "local commands run as the host user: no pids limit to test (Docker only)")
			set := w.toolSet(t, nil)
			within(t, 60*time.Second, "a fork bomb", func() {
				call(t, set, "bash", map[string]any{"command": `f(){ f | f & }; f; sleep 3`, "timeout": 5})
			})
			// The session recovers: the bomb's tree is killed when its shell
			// ends. (Until the last of it is reaped, a command may fail to
			// start for lack of pids.) The agent must survive: the pids limit
			// counts its threads too, so it keeps idle threads in reserve and
			// waits through Go's poller (SECURITY.md, findings).
			start := time.Now()
			var res tools.Result
			for {
				res = call(t, set, "bash", map[string]any{"command": "echo alive; ls -d /proc/[0-9]* | wc -l"})
				if strings.Contains(res.Text, "alive") {
					break
				}
				if strings.HasPrefix(res.Text, "Unavailable") && strings.Contains(res.Text, "agent closed the stream") {
					t.Fatalf("the fork bomb ended its session: %s", res.Text)
				}
				if time.Since(start) > 30*time.Second {
					t.Fatalf("30 s after the fork bomb: %s", res.Text)
				}
				t.Logf("after the fork bomb (%v): %s", time.Since(start).Round(time.Millisecond), res.Text)
				time.Sleep(500 * time.Millisecond)
			}
			var n int
			fmt.Sscan(strings.TrimSpace(strings.TrimPrefix(strings.SplitN(res.Text, "alive", 2)[1], "\n")), &n)
			if n > 10 {
				t.Errorf("%d processes in the container after the fork bomb: %s", n, res.Text)
			}
		}},
		{"MemoryHog", func(t *testing.T, w *world) {
			w.dockerOnly(t, "local commands run as the host user: no memory limit to test (Docker only)")
			if dockertest.GVisor() {
				t.Skip("gVisor: a memory hog ends the whole sandbox, the session with it (backend/docker TestMemoryHogIsKilled)")
			}
			var res workspace.Result
			var err error
			within(t, 90*time.Second, "a memory hog", func() {
				// dd holds one block of 1.5 GB in memory,
				// against the 1 GiB limit.
				_, res, err = w.run(t, context.Background(), `dd if=/dev/zero of=/dev/null bs=1500M count=1`, 80*time.Second)
			})
			switch {
			case err != nil:
				// The kernel chose the agent: the session ends, clearly.
				if !errors.Is(err, workspace.ErrUnavailable) {
					t.Fatalf("memory hog: %v", err)
				}
				t.Logf("the OOM killer took the session: %v", err)
			case res.ExitCode == 0:
				t.Fatalf("1.6 GB held in a 1 GiB container: %+v", res)
			default:
				w.sh(t, "echo alive") // the session survived the hog
			}
		}},
	})
}

// The host's environment never reaches a command or a tool result, and
// workspace_exec refuses the variables that make programs run other code.
func TestEnvironment(t *testing.T) {
	runAttacks(t, []attack{
		{"HostSecretsNeverVisible", func(t *testing.T, w *world) {
			set := w.toolSet(t, nil)
			script := `env; printf '\n'; tr '\0' '\n' < /proc/self/environ`
			if w.loan != nil {
				// In a container every process is the session's: none of
				// their environments holds a host variable.
				script += `; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'`
			}
			res := call(t, set, "bash", map[string]any{"command": script}) // call fails on the secret
			if !strings.Contains(res.Text, "PATH=") {
				t.Errorf("no environment shown: %s", res.Text)
			}
			if strings.Contains(res.Text, "AWS_SECRET_ACCESS_KEY") || strings.Contains(res.Text, "SANDBOXD_ADVERSARIAL_SECRET") {
				t.Errorf("a host variable reached the command: %s", res.Text)
			}
		}},
		{"HostileGitConfigNeverRun", func(t *testing.T, w *world) {
			// sandboxd itself never runs git, hooks or a repository's
			// configuration: a hostile .git is only files.
			flag := filepath.Join(t.TempDir(), "pwned")
			w.sh(t, fmt.Sprintf(`mkdir -p .git/hooks && printf '[core]\n\tfsmonitor = "touch %[1]s"\n\thooksPath = .git/hooks\n[diff "x"]\n\ttextconv = touch %[1]s\n' > .git/config &&
				printf '#!/bin/sh\ntouch %[1]s\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && printf '* diff=x\n' > .gitattributes && printf 'a\n' > a.txt`, flag))
			set := w.toolSet(t, nil)
			call(t, set, "read", map[string]any{"path": "a.txt"})
			call(t, set, "grep", map[string]any{"pattern": "a"})
			call(t, set, "find", map[string]any{"pattern": "**"})
			call(t, set, "ls", map[string]any{"path": "."})
			call(t, set, "edit", map[string]any{"path": "a.txt", "edits": []map[string]string{{"oldText": "a", "newText": "b"}}})
			call(t, set, "write", map[string]any{"path": "b.txt", "content": "x"})
			if _, err := os.Stat(flag); err == nil {
				t.Error("a repository's git configuration ran on the host")
			}
		}},
		{"InjectionKeysRefused", func(t *testing.T, w *world) {
			set := w.execSet(t, workspaceshell.Commands{All: true}, 5000)
			for _, k := range []string{"LD_PRELOAD", "ld_preload", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "PATH", "NODE_OPTIONS",
				"PYTHONSTARTUP", "PERL5OPT", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_SSH_COMMAND", "GIT_EXTERNAL_DIFF", "BASH_FUNC_x%%",
				"PROMPT_COMMAND", "HOME", "DYLD_INSERT_LIBRARIES", "JAVA_TOOL_OPTIONS"} {
				res := call(t, set, "workspace_exec", workspaceshell.ExecRequest{Command: "env", Env: map[string]string{k: "/tmp/x"}})
				if kind := errKind(res); kind != workspace.ErrForbidden.Name() && kind != workspace.ErrInvalidArgument.Name() {
					t.Errorf("workspace_exec with %s: %s, want it refused", k, res.Text)
				}
			}
			res := call(t, set, "workspace_exec", workspaceshell.ExecRequest{Command: "env", Env: map[string]string{"GOFLAGS": "-mod=mod"}})
			if er, ok := res.Structured.(*tools.ExecResult); res.IsError || !ok || er.ExitCode != 0 || !strings.Contains(er.Output, "GOFLAGS=-mod=mod") {
				t.Errorf("workspace_exec with an ordinary variable: %s", res.Text)
			}
		}},
	})
}

// A session container has only a loopback interface: no route out, no DNS,
// no cloud metadata endpoint, no port of the host.
func TestNetwork(t *testing.T) {
	// A listener on every host address, which nothing in a session may reach.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	runAttacks(t, []attack{
		{"OnlyLoopback", func(t *testing.T, w *world) {
			w.dockerOnly(t, "local commands use the host's network (Docker only)")
			// /proc/net/dev, not /sys/class/net, which gVisor has not.
			if got := strings.TrimSpace(w.sh(t, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)); got != "lo" {
				t.Errorf("interfaces: %q, want lo only", got)
			}
			// Loopback's own routes aside, which gVisor lists in the main table.
			if got := strings.TrimSpace(w.sh(t, `{ ip route 2>&1; ip -6 route 2>&1; } | grep -v '^$' | grep -v '::1' | grep -v ' dev lo '; true`)); got != "" {
				t.Errorf("routes: %q, want none", got)
			}
		}},
		{"NoWayOut", func(t *testing.T, w *world) {
			w.dockerOnly(t, "local commands use the host's network (Docker only)")
			for _, target := range []string{
				"169.254.169.254 80",        // cloud metadata
				"169.254.170.2 80",          // ECS task metadata
				"fd00:ec2::254 80",          // EC2 IPv6 metadata
				"1.1.1.1 53", "8.8.8.8 443", // the internet
				"172.17.0.1 " + fmt.Sprint(port), // the host on docker0
				"host.docker.internal " + fmt.Sprint(port),
				"127.0.0.1 " + fmt.Sprint(port), // the container's own loopback, not the host's
			} {
				out, res, err := w.run(t, context.Background(), "nc -w 2 "+target+" </dev/null", 10*time.Second)
				if err != nil || res.ExitCode == 0 {
					t.Errorf("nc %s: exit %d, %v: %s", target, res.ExitCode, err, out)
				}
			}
			out, res, _ := w.run(t, context.Background(), "nslookup example.com", 10*time.Second)
			if res.ExitCode == 0 {
				t.Errorf("DNS answered: %s", out)
			}
			select {
			case <-accepted:
				t.Error("a session reached a port of the host")
			default:
			}
		}},
	})
}

// What the runtime escapes of the CVE-2019-5736 and CVE-2024-21626 kind
// need, a session container does not give: no capability, no new
// privileges, a read-only root and agent, no descriptor of the host, no
// Docker socket.
func TestContainerHardening(t *testing.T) {
	runAttacks(t, []attack{
		{"NoPrivileges", func(t *testing.T, w *world) {
			w.dockerOnly(t, "the local backend runs as the host user by design")
			status := w.sh(t, `grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status`)
			uid := strings.TrimSpace(w.sh(t, "id -u"))
			if n, _ := strconv.Atoi(uid); !policy.DefaultSessionUIDs.Contains(n) {
				t.Errorf("commands run as uid %s, not one of the session uids", uid)
			}
			for _, want := range []string{"Uid:\t" + uid + "\t" + uid + "\t" + uid + "\t" + uid, "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000",
				"CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
				if !strings.Contains(status, want) {
					t.Errorf("/proc/self/status lacks %q:\n%s", want, status)
				}
			}
		}},
		{"RuntimeBinaryOverwrite", func(t *testing.T, w *world) {
			w.dockerOnly(t, "the local backend runs as the host user by design")
			// CVE-2019-5736 overwrote the runtime through /proc/self/exe of
			// a process it started; here nothing the session can reach is
			// writable outside /workspace and /tmp.
			for _, target := range []string{"/proc/1/exe", "/proc/self/exe", "/.sandboxd-agent/sandboxd-agent", "/bin/busybox", "/etc/passwd", "/newfile"} {
				out, res, _ := w.run(t, context.Background(), "printf x >> "+target, 10*time.Second)
				if res.ExitCode == 0 {
					t.Errorf("wrote %s: %s", target, out)
				}
			}
			w.sh(t, `[ "$(stat -c %u /.sandboxd-agent/sandboxd-agent)" != "$(id -u)" ]`)
		}},
		{"NoLeakedDescriptors", func(t *testing.T, w *world) {
			w.dockerOnly(t, "the local backend runs as the host user by design")
			w.sh(t, `! ls /sys/fs/cgroup/cpu/ 2>/dev/null | grep -q docker && ! touch /sys/fs/cgroup/cpu/x 2>/dev/null`)
			// CVE-2024-21626 leaked a descriptor of the host's cgroup
			// directory into the container. Every descriptor of PID 1 and
			// of a command is a pipe, a socket, /dev/null or in the session.
			for _, proc := range []string{"1", "self"} {
				out := w.sh(t, `for f in /proc/`+proc+`/fd/*; do readlink "$f"; done; true`)
				for _, l := range strings.Fields(out) {
					ok := l == "/dev/null" || strings.HasPrefix(l, "pipe:") || strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "anon_inode:") ||
						l == "/workspace" || strings.HasPrefix(l, "/workspace/") || strings.HasPrefix(l, "/tmp") || strings.HasPrefix(l, "/proc/") ||
						// The Go runtime of the agent reads its CPU quota from the
						// container's own (read-only) cgroup files.
						strings.HasPrefix(l, "/sys/fs/cgroup/cpu") ||
						// The agent holds the container's own /proc open (it
						// reads it without a path walk through the root's
						// fuse-overlayfs); commands must not inherit it.
						(proc == "1" && l == "/proc")
					if !ok {
						t.Errorf("a descriptor of /proc/%s names %s", proc, l)
					}
				}
			}
			w.sh(t, `[ "$(pwd)" = /workspace ]`)
		}},
		{"NoDockerSocket", func(t *testing.T, w *world) {
			w.dockerOnly(t, "the local backend runs as the host user by design")
			out := w.sh(t, `ls -la /var/run/docker.sock /run/docker.sock /run/containerd 2>&1; grep -c docker.sock /proc/self/mountinfo; env | grep -c DOCKER_; true`)
			if !strings.Contains(out, "No such file") || strings.Contains(out, "srw") {
				t.Errorf("the engine's socket is reachable: %s", out)
			}
		}},
	})
}
