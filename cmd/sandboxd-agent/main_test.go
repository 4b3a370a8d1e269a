package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
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
	p.client, err = agent.NewClient(pipes{stdin, stdout}, agent.WithHandshakeTimeout(time.Minute))
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
	case <-time.After(time.Minute):
		t.Fatal("the agent did not exit when its input closed")
	}
}

func run(t *testing.T, c *agent.Client, script string) (workspace.Result, string) {
	t.Helper()
	var out strings.Builder
	res, err := c.Run(context.Background(), workspace.Command{Script: script, Timeout: time.Minute,
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
	// Standard output and error are separate pipes: their chunks may
	// arrive in either order.
	if res.ExitCode != 3 || strings.Replace(out, "oops\n", "", 1) != "data from-the-agent\n" {
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

// TestWriteSparse: extents land at their offsets, the rest stays a hole, the
// size is the one given; bad extents and names that leave the root fail.
func TestWriteSparse(t *testing.T) {
	for _, tc := range []struct {
		name, file, size, extents string
		want                      string // the file's contents; "" with bad set
		bad                       string
	}{
		{"holes kept", "f", "8", "1 2\nab5 1\nc", "\x00ab\x00\x00c\x00\x00", ""},
		{"no extents", "f", "3", "", "\x00\x00\x00", ""},
		{"extent past the size", "f", "2", "1 2\nab", "", "outside"},
		{"short data", "f", "8", "0 4\nab", "", "EOF"},
		{"garbled extent", "f", "8", "x y\n", "", "extent"},
		{"bad size", "f", "-1", "", "", "size"},
		{"name leaves the root", "../f", "1", "", "", "escapes"},
		{"link out of the root", "out", "1", "", "", "escapes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			root := base + "/root"
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(root+"/f", []byte("old contents"), 0o644)
			os.WriteFile(base+"/f", []byte("outside"), 0o644)
			os.Symlink("../f", root+"/out")
			err := writeSparse(root, tc.file, tc.size, strings.NewReader(tc.extents))
			if tc.bad != "" {
				if err == nil || !strings.Contains(err.Error(), tc.bad) {
					t.Errorf("writeSparse = %v; want an error about %q", err, tc.bad)
				}
				if b, _ := os.ReadFile(base + "/f"); string(b) != "outside" {
					t.Errorf("the file outside the root became %q", b)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(root + "/" + tc.file); string(b) != tc.want {
				t.Errorf("file = %q, want %q", b, tc.want)
			}
		})
	}
}

// TestInstall: `sandboxd-agent install DEST` leaves a copy of the running
// binary at DEST, mode 0555, that runs; over an existing file it replaces it.
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	dest := dir + "/sandboxd-agent"
	if err := os.WriteFile(dest, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "install", dest)
	cmd.Env = append(os.Environ(), asAgentEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install: %v: %s", err, out)
	}
	want, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dest)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("DEST holds %d bytes (%v), want the %d of the binary", len(got), err, len(want))
	}
	if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o555 {
		t.Errorf("DEST mode = %v, want 0555", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want DEST alone", len(entries))
	}
	run := exec.Command(dest, "install", t.TempDir()+"/again")
	run.Env = append(os.Environ(), asAgentEnv+"=1")
	if out, err := run.CombinedOutput(); err != nil {
		t.Errorf("the installed copy does not run: %v: %s", err, out)
	}
}
