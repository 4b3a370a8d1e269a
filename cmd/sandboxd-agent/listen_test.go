package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestListen: `serve --listen` serves a client that presents the token of
// $SANDBOXD_AGENT_TOKEN over TCP, and its commands never see the token.
func TestListen(t *testing.T) {
	token := strings.Repeat("7f", agent.TokenLen/2)
	cmd := exec.Command(os.Args[0], "serve", "--root", t.TempDir(), "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), asAgentEnv+"=1", EnvToken+"="+token)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The agent logs the address it listens on.
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg=listening .*address=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	var at string
	select {
	case at = <-addr:
	case <-time.After(time.Minute):
		t.Fatal("the agent did not say where it listens")
	}
	conn, err := net.Dial("tcp", at)
	if err != nil {
		t.Fatal(err)
	}
	pre, _ := agent.Preamble(token, 1)
	conn.Write(pre)
	c, err := agent.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out strings.Builder
	res, err := c.Run(context.Background(), workspace.Command{Script: "env; cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'",
		Output: func(_ workspace.Stream, p []byte) { out.Write(p) }})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("env: exit %d, %v", res.ExitCode, err)
	}
	if strings.Contains(out.String(), token) || strings.Contains(out.String(), EnvToken) {
		t.Fatalf("a command saw the token:\n%s", out.String())
	}
}
