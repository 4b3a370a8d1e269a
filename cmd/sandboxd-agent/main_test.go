package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/workspace"
)

// The test binary is the agent when this variable is set: it has the same
// main, links the same proctree shim, and builds in no time.
const asAgentEnv = "SANDBOXD_AGENT_TEST_AS_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(asAgentEnv) != "" || os.Getenv(probeEnv) != "" {
		main()
	}
	os.Exit(m.Run())
}

// agentProc is a running agent and its client.
type agentProc struct {
	cmd    *exec.Cmd
	client *agent.Client
	stderr *bytes.Buffer
}

// pipes joins the agent's stdin and stdout into the client's stream.
type pipes struct {
	io.WriteCloser
	io.Reader
}

// startAgent runs the agent with args prefixed by wrap (a command such as
// unshare, or nothing), serving a fresh directory.
func startAgent(t *testing.T, wrap ...string) (*agentProc, string) {
	t.Helper()
	dir := t.TempDir()
	argv := append(wrap, os.Args[0], "serve", "--root", dir)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), asAgentEnv+"=1", "AGENT_TEST_VAR=from-the-agent")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, stderr: &bytes.Buffer{}}
	cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	p.client, err = agent.NewClient(pipes{stdin, stdout}, agent.WithHandshakeTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("%v; agent's stderr:\n%s", err, p.stderr)
	}
	return p, dir
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// closeAndWait closes the agent's input and expects it to exit with status 0.
func (p *agentProc) closeAndWait(t *testing.T) {
	t.Helper()
	p.client.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent exited with %v; stderr:\n%s", err, p.stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not exit when its input closed")
	}
}

func run(t *testing.T, c *agent.Client, script string) (workspace.Result, string) {
	t.Helper()
	var out strings.Builder
	res, err := c.Run(context.Background(), workspace.Command{Script: script, Timeout: 10 * time.Second,
		Output: func(_ workspace.Stream, p []byte) { out.Write(p) }})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return res, out.String()
}

func TestServeOverStdio(t *testing.T) {
	p, dir := startAgent(t)
	c, ctx := p.client, context.Background()
	if c.Agent().Version != agent.ProtocolVersion || c.Agent().Build == "" {
		t.Errorf("Agent() = %+v", c.Agent())
	}
	if err := c.WriteFile(ctx, "f.txt", []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(dir + "/f.txt"); err != nil || string(got) != "data" {
		t.Errorf("file on disk: %q, %v", got, err)
	}
	res, out := run(t, c, `cat f.txt; echo " $AGENT_TEST_VAR"; echo oops >&2; exit 3`)
	if res.ExitCode != 3 || out != "data from-the-agent\noops\n" {
		t.Errorf("Run = %+v, output %q", res, out)
	}
	if _, err := c.Stat(ctx, "../etc"); !errors.Is(err, workspace.ErrOutsideWorkspace) && !errors.Is(err, workspace.ErrInvalidArgument) {
		t.Errorf("Stat outside: %v", err)
	}
	// Signals that would end a Go program do not end the agent.
	for _, s := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE} {
		p.cmd.Process.Signal(s)
	}
	time.Sleep(50 * time.Millisecond)
	if res, _ := run(t, c, "exit 0"); res.ExitCode != 0 {
		t.Errorf("after signals: %+v", res)
	}
	// Commands start with default signal dispositions.
	if res, _ := run(t, c, "kill -TERM $$; exit 0"); res.Signal != "SIGTERM" {
		t.Errorf("a command that signals itself: %+v", res)
	}
	p.closeAndWait(t)
}

// TestPID1ReapsOrphansOnly runs the agent as PID 1 of a new PID namespace. It
// orphans processes to it (a command kills its own shim) and checks that
// they are reaped while the exit statuses of concurrent commands, which the
// agent's own waiters need, are never stolen.
func TestPID1ReapsOrphansOnly(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("PID namespaces are Linux's")
	}
	if err := exec.Command("unshare", "-p", "-f", "--mount-proc", "true").Run(); err != nil {
		t.Skipf("cannot make a PID namespace here: %v", err)
	}
	p, _ := startAgent(t, "unshare", "-p", "-f", "--kill-child", "--mount-proc")
	c := p.client
	if res, out := run(t, c, "echo $$ $PPID; cat /proc/1/comm"); res.ExitCode != 0 || !strings.Contains(out, "\n") {
		t.Fatalf("Run = %+v %q", res, out)
	}

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := 10 + i
			for range 5 {
				res, err := c.Run(context.Background(), workspace.Command{Script: "exit " + strconv.Itoa(code)})
				if err != nil || res.ExitCode != code {
					t.Errorf("exit %d: %+v, %v", code, res, err)
					return
				}
			}
		}()
	}
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The command's shell kills its shim: it and its child become
			// orphans of PID 1.
			c.Run(context.Background(), workspace.Command{Script: "sleep 0.2 & kill -9 $PPID; wait"})
		}()
	}
	wg.Wait()

	agentPid := agentHostPid(t, p.cmd.Process.Pid)
	deadline := time.Now().Add(5 * time.Second)
	for {
		z := zombieChildren(agentPid)
		if len(z) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombies left under PID 1: %v; stderr:\n%s", z, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res, _ := run(t, c, "true"); res.ExitCode != 0 {
		t.Errorf("after the orphans: %+v", res)
	}
	p.closeAndWait(t)
}

// agentHostPid finds the agent: the one child of unshare.
func agentHostPid(t *testing.T, unsharePid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(unsharePid) + "/task/" + strconv.Itoa(unsharePid) + "/children")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("children of unshare: %q", b)
	}
	return pid
}
