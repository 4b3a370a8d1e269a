package docker_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
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
	c := dockertest.Start(t, docker.Spec{HandoffDir: dir})
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
	if dockertest.GVisor() {
		// gVisor's sandbox reaches no Unix socket of the host (runsc has no
		// --host-uds), and its TCP sockets are its own kernel's, not the
		// host's to receive: the connection is carried on the stream.
		if ok, err := c.Handoff(); ok || err == nil {
			t.Fatalf("Handoff() = %v, %v under gVisor; want no handoff, and why", ok, err)
		}
	} else {
		if _, ok := a.conn.(*net.TCPConn); !ok {
			t.Fatalf("Accept gave a %T; want the program's *net.TCPConn, handed off", a.conn)
		}
		if ok, err := c.Handoff(); !ok {
			t.Fatalf("not handed off: %v", err)
		}
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
	if !dockertest.GVisor() && len(socks) != 1 {
		t.Fatalf("handoff sockets: %q; want the container's one", socks)
	}
	// Reaped from outside (a dead daemon's), the container's directory goes.
	mine := map[string]string{policy.LabelSession: "docker", dockertest.LabelTest: dockertest.Label()}
	if _, err := docker.Reap(ctx, dockertest.Client(t), mine, nil); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "h-*")); len(left) != 0 {
		t.Errorf("Reap left %q", left)
	}
	if _, err := c.Bash().Run(ctx, workspace.Command{Script: "true"}); err == nil {
		t.Error("the reaped container still runs commands")
	}
}

// TestHandoffSocketIgnoresPrograms: a program in the container that finds
// the handoff socket and holds a connection to it, saying nothing, is cut
// off at once — only the agent's process is heard there — and the
// session's egress connections are handed off meanwhile.
func TestHandoffSocketIgnoresPrograms(t *testing.T) {
	dir, err := os.MkdirTemp("", "sbx-h")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if dockertest.GVisor() {
		t.Skip("gVisor: nothing in the sandbox reaches the handoff socket (TestAcceptHandoff: connections are carried on the stream)")
	}
	dev := dockertest.NamedImage(t, "dev")
	c := dockertest.Start(t, docker.Spec{HandoffDir: dir, Profile: policy.DefaultProfile(dev)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const addr = "127.0.0.1:3128"
	if err := c.Listen(ctx, addr); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.Handoff(); !ok {
		t.Fatalf("not handed off: %v", err)
	}
	// The program: connect to the socket, send nothing, and wait for the
	// daemon's side to end it (well before the 10 s a message may take);
	// then reach the egress port.
	got := make(chan net.Conn, 1)
	go func() {
		conn, err := c.Accept(ctx, addr)
		if err != nil {
			t.Error(err)
		}
		got <- conn
	}()
	res, out := run(t, c.Bash(), `python3 - <<'EOF'
import socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/.sandboxd-handoff/s")
s.settimeout(5)
start = time.time()
try:
    print("ended" if s.recv(1) == b"" else "data", flush=True)
except socket.timeout:
    print("held", flush=True)
t = socket.create_connection(("127.0.0.1", 3128), timeout=30)
t.sendall(b"hello\n")
EOF`, 2*time.Minute)
	conn := <-got
	if conn == nil {
		t.Fatalf("no connection handed off; the program said %q (%+v)", out, res)
	}
	defer conn.Close()
	if !strings.HasPrefix(out, "ended\n") {
		t.Errorf("the program's idle connection to the handoff socket: %q; want it ended at once", out)
	}
	line := make([]byte, len("hello\n"))
	if _, err := io.ReadFull(conn, line); err != nil || string(line) != "hello\n" {
		t.Fatalf("read %q, %v", line, err)
	}
}
