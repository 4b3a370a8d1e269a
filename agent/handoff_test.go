package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
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
	if err := c.Handoff(ctx, addr, path); err != nil {
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
	_, path := listenHandoff(t)
	for _, tc := range []struct {
		name, addr, socket string
		want               error
	}{
		{"no socket there", freeAddr(t), filepath.Join(t.TempDir(), "none.sock"), workspace.ErrUnavailable},
		{"relative socket", freeAddr(t), "h.sock", workspace.ErrInvalidArgument},
		{"not loopback", "0.0.0.0:3128", path, workspace.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.Handoff(ctx, tc.addr, tc.socket); !errors.Is(err, tc.want) {
				t.Fatalf("Handoff: %v; want %v", err, tc.want)
			}
		})
	}
}

// sendFD sends fd (none when fd < 0) to the handoff socket at path as a
// program in the agent's world could.
func sendFD(t *testing.T, path string, fds ...int) {
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
	if _, _, err := u.WriteMsgUnix([]byte{0}, oob, nil); err != nil {
		t.Fatal(err)
	}
}

func TestHandoffListenerTakesOnlyConnectedTCP(t *testing.T) {
	l, path := listenHandoff(t)
	fdOf := func(c syscall.Conn) int {
		raw, _ := c.SyscallConn()
		var out int
		raw.Control(func(fd uintptr) { out = int(fd) })
		return out
	}
	tcpListener, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer tcpListener.Close()
	pr, pw, _ := os.Pipe()
	defer pr.Close()
	defer pw.Close()
	unixA, unixB := socketPair(t)
	sendFD(t, path)                    // a probe: nothing
	sendFD(t, path, int(pr.Fd()))      // a pipe
	sendFD(t, path, unixA)             // a Unix socket
	sendFD(t, path, fdOf(tcpListener)) // a listening socket
	program, err := net.DialTCP("tcp", nil, tcpListener.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer program.Close()
	sendFD(t, path, fdOf(program), unixB) // a connection, and one too many
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
