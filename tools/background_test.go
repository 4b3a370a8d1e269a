package tools_test

import (
	"context"
	"errors"
	"net"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// treeScript starts a tree — a child, a background job, a process in a
// session of its own — prints their PIDs and a marker, then ticks.
const treeScript = `sleep 1000 & echo pid $!
(setsid sleep 1000 & echo pid $!; wait)&
echo pid $$
echo waiting
while ! grep -q go gate 2>/dev/null; do sleep 0.05; done
echo ready
i=0; while :; do echo tick$i; i=$((i+1)); sleep 0.05; done`

func backgroundSet(t *testing.T, b shellBackend, configure func(*tools.Config)) *tools.Set {
	t.Helper()
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantShellExec, tools.GrantFSWrite}
	cfg.Always = []string{"read", "edit", "shell"}
	if configure != nil {
		configure(&cfg)
	}
	set, err := tools.New(tools.Env{FS: b.fs, Bash: b.bash, Session: workspace.Session{ID: "s", Root: b.root}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close(context.Background()) })
	return set
}

func background(t *testing.T, set *tools.Set, command string) string {
	t.Helper()
	r := callJSON(t, set, "bash", map[string]any{"command": command, "background": true})
	br, ok := r.Structured.(*tools.BackgroundResult)
	if r.IsError || !ok || !br.Running || br.ID == "" {
		t.Fatalf("bash in the background: %s", r.Text)
	}
	return br.ID
}

// readUntil reads a background command's output until it holds marker,
// failing after a generous deadline; it returns all that was read.
func readUntil(t *testing.T, set *tools.Set, id, marker string) string {
	t.Helper()
	var all strings.Builder
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		r := callJSON(t, set, "bash_output", map[string]any{"id": id, "wait": 0.1})
		br, ok := r.Structured.(*tools.BackgroundResult)
		if r.IsError || !ok {
			t.Fatalf("bash_output: %s", r.Text)
		}
		all.WriteString(br.Output)
		if strings.Contains(all.String(), marker) {
			return all.String()
		}
		if !br.Running {
			t.Fatalf("%s ended before %q: %s", id, marker, r.Text)
		}
	}
	t.Fatalf("no %q from %s within a minute; read %q", marker, id, all.String())
	return ""
}

var pidLine = regexp.MustCompile(`(?m)^pid (\d+)$`)

func pids(t *testing.T, out string) []int {
	t.Helper()
	var ps []int
	for _, m := range pidLine.FindAllStringSubmatch(out, -1) {
		p, _ := strconv.Atoi(m[1])
		ps = append(ps, p)
	}
	if len(ps) != 3 {
		t.Fatalf("want 3 pids in %q", out)
	}
	return ps
}

// allGone waits until none of the processes exists.
func allGone(t *testing.T, ps []int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var alive []int
		for _, p := range ps {
			if err := syscall.Kill(p, 0); !errors.Is(err, syscall.ESRCH) {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of the tree survived", alive)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agentBackend is a workspace served by the agent over a pipe, whose
// client keeps background commands in the agent (workspace.BackgroundBash);
// read counts the bytes the client was sent.
func agentBackend(t *testing.T) (b shellBackend, read *atomic.Int64) {
	t.Helper()
	dir := t.TempDir()
	fsys, err := localfs.New(dir, localfs.WithLockDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	sh, err := localexec.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, srvEnd := net.Pipe()
	srv := agent.NewServer(fsys, sh)
	go srv.Serve(context.Background(), srvEnd)
	read = new(atomic.Int64)
	c, err := agent.NewClient(&countingConn{Conn: a, read: read})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		srv.Close(context.Background())
		fsys.Close()
	})
	return shellBackend{"agent", c, c, dir}, read
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// TestBackgroundOutputStaysInTheWorkspace runs four commands that write
// without pause in the background: where the workspace keeps background
// commands (the agent), their output stays in its ring until a read, and
// costs the host nothing meanwhile — not a byte crosses the stream.
func TestBackgroundOutputStaysInTheWorkspace(t *testing.T) {
	b, read := agentBackend(t)
	set := backgroundSet(t, b, func(c *tools.Config) { c.BashBackground = 4 })
	if !set.DurableBackground() {
		t.Fatal("the agent's Set does not keep its background commands in the agent")
	}
	before := read.Load()
	for range 4 {
		background(t, set, "yes")
	}
	for deadline := time.Now().Add(time.Minute); ; {
		list, done := set.Background(), 0
		for _, bg := range list {
			if bg.OutputBytes > 16<<20 {
				done++
			}
		}
		if done == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the commands did not write 16 MiB each: %+v", list)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := read.Load() - before; n > 256<<10 {
		t.Errorf("the host was sent %d bytes while four background commands wrote 64 MiB: their output crossed the stream", n)
	}
}

func TestBackground(t *testing.T) {
	ab, _ := agentBackend(t)
	for _, b := range append(shellBackends(t), ab) {
		t.Run(b.name, func(t *testing.T) {
			set := backgroundSet(t, b, nil)
			id := background(t, set, treeScript)
			first := readUntil(t, set, id, "waiting\n")
			// The command waits for a file a foreground call writes: other
			// calls, bash included, go on while it runs.
			if r := callJSON(t, set, "bash", map[string]any{"command": "echo go > gate"}); r.IsError || r.Structured.(*tools.BashResult).ExitCode != 0 {
				t.Fatalf("a foreground bash beside a background one: %s", r.Text)
			}
			out := readUntil(t, set, id, "tick3\n")
			// The subshell's pid line may come late: only the rest is ordered.
			if rest := regexp.MustCompile(`(?m)^pid \d+\n`).ReplaceAllString(out, ""); !strings.HasPrefix(rest, "ready\ntick0\n") {
				t.Errorf("output %q after the marker", out)
			}
			ps := pids(t, first+out)
			list := set.Background()
			if len(list) != 1 || list[0].ID != id || !list[0].Running || list[0].Command != treeScript {
				t.Errorf("Background() = %+v", list)
			}

			r := callJSON(t, set, "bash_kill", map[string]any{"id": id})
			br, _ := r.Structured.(*tools.BackgroundResult)
			if r.IsError || br == nil || br.Running || !br.Killed || !strings.Contains(r.Text, "was stopped") {
				t.Fatalf("bash_kill: %s", r.Text)
			}
			allGone(t, ps)
			// Its output stays readable; read, nothing new is left.
			r = callJSON(t, set, "bash_output", map[string]any{"id": id})
			if br := r.Structured.(*tools.BackgroundResult); r.IsError || br.Running || !br.Killed || br.Output != "" {
				t.Errorf("bash_output after the kill: %s", r.Text)
			}
			if list := set.Background(); len(list) != 1 || list[0].Running || !list[0].Killed || list[0].Unread != 0 {
				t.Errorf("Background() after the kill = %+v", list)
			}

			// The session's end (Close) kills a tree still running.
			callJSON(t, set, "bash", map[string]any{"command": "rm -f gate"})
			id = background(t, set, treeScript)
			first = readUntil(t, set, id, "waiting\n")
			callJSON(t, set, "bash", map[string]any{"command": "echo go > gate"})
			ps = pids(t, first+readUntil(t, set, id, "tick1\n"))
			if err := set.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			allGone(t, ps)
			if r := callJSON(t, set, "bash", map[string]any{"command": "true", "background": true}); errKind(r) != "Unavailable" {
				t.Errorf("background after Close: %s", r.Text)
			}
			if r := callJSON(t, set, "bash_output", map[string]any{"id": id}); r.IsError || !r.Structured.(*tools.BackgroundResult).Killed {
				t.Errorf("bash_output after Close: %s", r.Text)
			}
		})
	}
}

func TestBackgroundEnds(t *testing.T) {
	b := shellBackends(t)[0]
	set := backgroundSet(t, b, func(c *tools.Config) { c.BashBackgroundBytes = 100 })
	// Over the kept bytes: the oldest output is dropped and counted.
	id := background(t, set, "seq 1000 1999; exit 7")
	r := callJSON(t, set, "bash_output", map[string]any{"id": id, "wait": 60})
	br := r.Structured.(*tools.BackgroundResult)
	if r.IsError || br.Running || br.ExitCode != 7 || br.Killed || br.OutputBytes != 5000 || br.DroppedBytes < 4800 ||
		!strings.HasSuffix(br.Output, "1998\n1999\n") || int64(len(br.Output))+br.DroppedBytes != 5000 || !strings.Contains(r.Text, "is lost") || !strings.Contains(r.Text, "[Exit code 7.]") {
		t.Errorf("bash_output: %+v\n%s", br, r.Text)
	}
	if errKind(callJSON(t, set, "bash", map[string]any{"command": " ", "background": true})) != "InvalidArgument" {
		t.Error("an empty background command was accepted")
	}
}

func TestBackgroundBounds(t *testing.T) {
	b := shellBackends(t)[0]
	set := backgroundSet(t, b, func(c *tools.Config) { c.BashBackground = 1 })
	r := callJSON(t, set, "bash", map[string]any{"command": "echo started; sleep 1000", "background": true, "timeout": 0.5})
	id := r.Structured.(*tools.BackgroundResult).ID
	// One running is the most: a second is refused until it ends.
	if r := callJSON(t, set, "bash", map[string]any{"command": "true", "background": true}); errKind(r) != "Forbidden" || !strings.Contains(r.Text, "bashBackground") {
		t.Errorf("over the count: %s", r.Text)
	}
	r = callJSON(t, set, "bash_output", map[string]any{"id": id, "wait": 60})
	if br := r.Structured.(*tools.BackgroundResult); br.Running || !br.TimedOut || br.Killed || br.Output != "started\n" || !strings.Contains(r.Text, "Timed out after 0.5 s") {
		t.Errorf("after its timeout: %+v\n%s", br, r.Text)
	}
	// The ended one makes room, and is forgotten.
	second := background(t, set, "true")
	if r := callJSON(t, set, "bash_output", map[string]any{"id": id}); errKind(r) != "NotFound" || !strings.Contains(r.Text, second) {
		t.Errorf("the forgotten one: %s", r.Text)
	}
	for _, c := range []map[string]any{{"id": second, "wait": -1}, {"id": second, "wait": 1e9}, {"wait": 1}} {
		if r := callJSON(t, set, "bash_output", c); errKind(r) != "InvalidArgument" && errKind(r) != "NotFound" {
			t.Errorf("bash_output %v: %s", c, r.Text)
		}
	}
	// Without bashBackground the tools are not offered.
	off := backgroundSet(t, b, func(c *tools.Config) { c.BashBackground = 0 })
	for _, tool := range off.List() {
		if tool.Name == "bash_output" || tool.Name == "bash_kill" || strings.Contains(string(tool.InputSchema), "background") {
			t.Errorf("offered with bashBackground 0: %s", tool.Name)
		}
	}
	if r := callJSON(t, off, "bash", map[string]any{"command": "true", "background": true}); errKind(r) != "Forbidden" {
		t.Errorf("background with bashBackground 0: %s", r.Text)
	}
}

// TestBashState: by default each call is a new shell, and the description
// says so; with bashKeepState the working directory and exported variables
// carry over (and a background command starts from them), on the host and
// on the memory backend.
func TestBashState(t *testing.T) {
	run := func(t *testing.T, set *tools.Set, command string) *tools.BashResult {
		t.Helper()
		r := callJSON(t, set, "bash", map[string]any{"command": command})
		br, ok := r.Structured.(*tools.BashResult)
		if r.IsError || !ok {
			t.Fatalf("bash %q: %s", command, r.Text)
		}
		return br
	}
	for _, b := range shellBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			stateless := backgroundSet(t, b, nil)
			if d := stateless.List(); !strings.Contains(toolDesc(d, "bash"), "gone by the next call") {
				t.Errorf("the description does not say bash is stateless: %s", toolDesc(d, "bash"))
			}
			run(t, stateless, "mkdir -p sub && cd sub && export FOO=1")
			if got := run(t, stateless, `echo "${PWD##*/} ${FOO-unset}"`).Output; got != path.Base(b.root)+" unset\n" {
				t.Errorf("stateless: %q", got)
			}

			set := backgroundSet(t, b, func(c *tools.Config) { c.BashKeepState = true })
			if d := set.List(); !strings.Contains(toolDesc(d, "bash"), "carry over") {
				t.Errorf("the description does not say the state is kept: %s", toolDesc(d, "bash"))
			}
			if r := run(t, set, `cd sub && export FOO="a b'c" BAR=2 && unset HOME; exit 3`); r.ExitCode != 3 {
				t.Errorf("exit code %d, want 3 (the trap keeps it)", r.ExitCode)
			}
			if got := run(t, set, `echo "${PWD##*/}|$FOO|$BAR|${HOME-unset}"`).Output; got != "sub|a b'c|2|unset\n" {
				t.Errorf("kept: %q", got)
			}
			id := background(t, set, `echo "bg ${PWD##*/} $FOO"`)
			if out := readUntil(t, set, id, "\n"); out != "bg sub a b'c\n" {
				t.Errorf("background: %q", out)
			}
			run(t, set, "cd .. && unset FOO")
			if got := run(t, set, `echo "${PWD##*/} ${FOO-unset} $BAR"`).Output; got != path.Base(b.root)+" unset 2\n" {
				t.Errorf("after cd .. and unset: %q", got)
			}
		})
	}
}

// TestBashLongScript: a command over what one argument may be (128 KiB)
// runs whole, through a file that is gone once it ran; one over
// maxFileBytes is refused, naming it.
func TestBashLongScript(t *testing.T) {
	for _, b := range shellBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			set := backgroundSet(t, b, func(c *tools.Config) { c.MaxFileBytes = 1 << 20 })
			var long strings.Builder
			for long.Len() < 300<<10 {
				long.WriteString(": 0123456789012345678901234567890123456789012345678901234567890123456789\n")
			}
			long.WriteString("echo \"done $LINENO\"\n")
			lines := strings.Count(long.String(), "\n")
			r := callJSON(t, set, "bash", map[string]any{"command": long.String()})
			if br, ok := r.Structured.(*tools.BashResult); r.IsError || !ok || br.ExitCode != 0 || br.Output != "done "+strconv.Itoa(lines)+"\n" {
				t.Fatalf("a 300 KiB command: %s", r.Text)
			}
			ls := callJSON(t, set, "bash", map[string]any{"command": "ls -A .sandboxd/runtime/scripts 2>/dev/null | wc -l"})
			if out := ls.Structured.(*tools.BashResult).Output; strings.TrimSpace(out) != "0" {
				t.Errorf("scripts left behind: %s", out)
			}
			r = callJSON(t, set, "bash", map[string]any{"command": strings.Repeat("#", 2<<20)})
			if errKind(r) != "InvalidArgument" || !strings.Contains(r.Text, "maxFileBytes") {
				t.Errorf("a command over maxFileBytes: %s", r.Text)
			}
		})
	}
}

func toolDesc(list []tools.Tool, name string) string {
	for _, t := range list {
		if t.Name == name {
			return t.Description
		}
	}
	return ""
}

// TestBookkeepingInvisibleToGit: what the tools keep in the workspace (a
// spilled output, the bash state) never shows in git status.
func TestBookkeepingInvisibleToGit(t *testing.T) {
	for _, b := range shellBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			set := backgroundSet(t, b, func(c *tools.Config) { c.BashKeepState = true })
			must := func(command string) string {
				t.Helper()
				r := callJSON(t, set, "bash", map[string]any{"command": command})
				br, ok := r.Structured.(*tools.BashResult)
				if r.IsError || !ok || br.ExitCode != 0 {
					t.Fatalf("bash %q: %s", command, r.Text)
				}
				return br.Output
			}
			must("git init -q && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m first")
			if r := callJSON(t, set, "bash", map[string]any{"command": "seq 100000"}); r.Structured.(*tools.BashResult).OutputPath == "" {
				t.Fatalf("the output was not spilled: %s", r.Text)
			}
			if st := must("ls .sandboxd/runtime/tool-output | wc -l; git status --porcelain --untracked-files=all"); strings.TrimSpace(st) != "1" {
				t.Errorf("git status shows sandboxd's bookkeeping:\n%s", st)
			}
		})
	}
}
