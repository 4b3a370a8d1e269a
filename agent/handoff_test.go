package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// listenHandoff listens for handoffs in a fresh directory.
func listenHandoff(t *testing.T) (*HandoffListener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "h.sock")
	l, err := ListenHandoff(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func TestHandoffPassesTheProgramsSocket(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	l, path := listenHandoff(t)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode: %v %v; want 0666 (the directory guards it)", fi, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := freeAddr(t)
	if err := c.Handoff(ctx, addr, path, l.Token()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // each connection on its own, in turn
		program, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		host, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := host.(*net.TCPConn); !ok {
			t.Fatalf("handed a %T; want the program's *net.TCPConn", host)
		}
		if host.RemoteAddr().String() != program.LocalAddr().String() {
			t.Errorf("connection %d: remote %v; want the program's %v", i, host.RemoteAddr(), program.LocalAddr())
		}
		program.Write([]byte("ping"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(host, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("host read %q, %v", buf, err)
		}
		host.Write([]byte("pong"))
		host.Close() // the agent's copy is gone: this ends the connection
		got, err := io.ReadAll(program)
		if err != nil || string(got) != "pong" {
			t.Fatalf("program read %q, %v; want pong and the end", got, err)
		}
		program.Close()
	}
}

func TestHandoffRefusals(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	ctx := context.Background()
	l, path := listenHandoff(t)
	for _, tc := range []struct {
		name, addr, socket string
		want               error
	}{
		{"no socket there", freeAddr(t), filepath.Join(t.TempDir(), "none.sock"), workspace.ErrUnavailable},
		{"relative socket", freeAddr(t), "h.sock", workspace.ErrInvalidArgument},
		{"not loopback", "0.0.0.0:3128", path, workspace.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.Handoff(ctx, tc.addr, tc.socket, l.Token()); !errors.Is(err, tc.want) {
				t.Fatalf("Handoff: %v; want %v", err, tc.want)
			}
		})
	}
}

// sendFD sends fds with token to the handoff socket at path, as the agent
// does, or as a program in its world could.
func sendFD(t *testing.T, path string, token []byte, fds ...int) {
	t.Helper()
	u, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	if _, _, err := u.WriteMsgUnix(token, oob, nil); err != nil {
		t.Fatal(err)
	}
}

// fdOf is c's descriptor.
func fdOf(c syscall.Conn) int {
	raw, _ := c.SyscallConn()
	var out int
	raw.Control(func(fd uintptr) { out = int(fd) })
	return out
}

func TestHandoffListenerTakesOnlyConnectedTCP(t *testing.T) {
	l, path := listenHandoff(t)
	tok := l.Token()
	tcpListener, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer tcpListener.Close()
	pr, pw, _ := os.Pipe()
	defer pr.Close()
	defer pw.Close()
	unixA, unixB := socketPair(t)
	sendFD(t, path, tok)                    // a probe: nothing
	sendFD(t, path, tok, int(pr.Fd()))      // a pipe
	sendFD(t, path, tok, unixA)             // a Unix socket
	sendFD(t, path, tok, fdOf(tcpListener)) // a listening socket
	program, err := net.DialTCP("tcp", nil, tcpListener.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer program.Close()
	wrong := slices.Clone(tok)
	wrong[0] ^= 1
	sendFD(t, path, wrong, fdOf(program))      // a connection without the token
	sendFD(t, path, tok[:8], fdOf(program))    // with part of it
	sendFD(t, path, tok, fdOf(program), unixB) // a connection, and one too many
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if got.LocalAddr().String() != program.LocalAddr().String() {
		t.Fatalf("accepted %v; want the connection %v, the only one that counts", got.LocalAddr(), program.LocalAddr())
	}
	short, stop := context.WithCancel(ctx)
	stop()
	if c, err := l.Accept(short); err == nil {
		t.Fatalf("a second connection %v came from what is not one", c.LocalAddr())
	}
	l.Close()
	if _, err := l.Accept(ctx); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v; want net.ErrClosed", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket outlived Close: %v", err)
	}
}

func socketPair(t *testing.T) (int, int) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fds[0]); syscall.Close(fds[1]) })
	return fds[0], fds[1]
}

// TestHandoffIdlePeerDelaysNothing: a peer that connects to the handoff
// socket and sends nothing does not hold up the handoffs after it: the
// next connection is accepted while the idle peer is still waited for.
func TestHandoffIdlePeerDelaysNothing(t *testing.T) {
	l, path := listenHandoff(t)
	idle, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	handOffOne(t, l, path)
	// The idle peer is still being waited for (its deadline, handoffTimeout,
	// has not passed): the listener has not closed it.
	idle.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := idle.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the idle peer's connection: %v; the handoff after it waited for its deadline", err)
	}
}

// TestHandoffFromTheAgentOnly: once the agent's process has sent the
// token (its probe), a peer of another process is closed at once, unread,
// and the agent's handoffs are still taken.
func TestHandoffFromTheAgentOnly(t *testing.T) {
	l, path := listenHandoff(t)
	sendFD(t, path, l.Token()) // the agent's probe
	for deadline := time.Now().Add(time.Minute); l.agent.Load() != int64(os.Getpid()); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the probe's sender was not taken for the agent: %d", l.agent.Load())
		}
	}
	peer := exec.Command(os.Args[0], "-test.run=^TestHandoffFromTheAgentOnly$")
	peer.Env = append(os.Environ(), handoffPeerEnv+"="+path)
	out, err := peer.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "closed unread") {
		t.Fatalf("another process's peer: %v\n%s", err, out)
	}
	handOffOne(t, l, path)
}

// handOffOne hands a connection of its own to l, as the agent does, and
// waits for l to take it.
func handOffOne(t *testing.T, l *HandoffListener, path string) {
	t.Helper()
	tcpListener, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer tcpListener.Close()
	program, err := net.DialTCP("tcp", nil, tcpListener.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer program.Close()
	sendFD(t, path, l.Token(), fdOf(program))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got.Close()
}

// handoffPeerEnv names, in a helper process, the handoff socket it
// connects to as a program in the agent's world would.
const handoffPeerEnv = "SANDBOXD_TEST_HANDOFF_PEER"

// The helper process's part: connect, send nothing, and say whether the
// listener closed the connection without waiting for it (before half its
// deadline for a message).
func init() {
	path := os.Getenv(handoffPeerEnv)
	if path == "" {
		return
	}
	u, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	u.SetReadDeadline(time.Now().Add(handoffTimeout / 2))
	if _, err := u.Read(make([]byte, 1)); err == io.EOF {
		fmt.Println("closed unread")
		os.Exit(0)
	}
	fmt.Println("not closed:", err)
	os.Exit(1)
}
