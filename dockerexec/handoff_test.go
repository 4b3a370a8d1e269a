package dockerexec_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/internal/dockertest"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestAcceptHandoff connects to the container's egress port from a command
// and reads what it sent from the daemon's side: on a container with a
// handoff directory the connection is the program's own socket, handed
// over; the directory goes with the container, and with a reaped one.
func TestAcceptHandoff(t *testing.T) {
	dir, err := os.MkdirTemp("", "sbx-h")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	c := dockertest.Start(t, dockerexec.Spec{HandoffDir: dir})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const addr = "127.0.0.1:3128"
	type accepted struct {
		conn net.Conn
		err  error
	}
	got := make(chan accepted, 1)
	go func() {
		conn, err := c.Accept(ctx, addr)
		got <- accepted{conn, err}
	}()
	ran := make(chan string, 1)
	go func() {
		// The agent listens once Accept has asked it to: try until then.
		_, out := run(t, c.Bash(), `for i in $(seq 600); do exec 3<>/dev/tcp/127.0.0.1/3128 && break; sleep 0.1; done 2>/dev/null
echo hello >&3; read -r reply <&3; echo "$reply"`, 2*time.Minute)
		ran <- out
	}()
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.conn.Close()
	if _, ok := a.conn.(*net.TCPConn); !ok {
		t.Fatalf("Accept gave a %T; want the program's *net.TCPConn, handed off", a.conn)
	}
	if ok, err := c.Handoff(); !ok {
		t.Fatalf("not handed off: %v", err)
	}
	line := make([]byte, len("hello\n"))
	if _, err := io.ReadFull(a.conn, line); err != nil || string(line) != "hello\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	io.WriteString(a.conn, "hi from the daemon\n")
	if out := <-ran; out != "hi from the daemon\n" {
		t.Fatalf("the program read %q", out)
	}
	if _, err := c.Accept(ctx, "127.0.0.1:3129"); err == nil || !strings.Contains(err.Error(), "listens on "+addr) {
		t.Errorf("Accept on a second address: %v", err)
	}
	socks, _ := filepath.Glob(filepath.Join(dir, "h-*", "s"))
	if len(socks) != 1 {
		t.Fatalf("handoff sockets: %q; want the container's one", socks)
	}
	// Reaped from outside (a dead daemon's), the container's directory goes.
	mine := map[string]string{policy.LabelSession: "dockerexec", dockertest.LabelTest: dockertest.Label()}
	if _, err := dockerexec.Reap(ctx, dockertest.Client(t), mine, nil); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "h-*")); len(left) != 0 {
		t.Errorf("Reap left %q", left)
	}
	if _, err := c.Bash().Run(ctx, workspace.Command{Script: "true"}); err == nil {
		t.Error("the reaped container still runs commands")
	}
}
