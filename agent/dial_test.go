package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// dialOne dials ln through c and returns both ends: the host's and the
// program's, the connection ln accepted.
func dialOne(t *testing.T, c *Client, ln net.Listener) (host, program net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			accepted <- conn
		}
		close(accepted)
	}()
	host, err := c.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	program, ok := <-accepted
	if !ok {
		t.Fatal("the program's listener accepted nothing")
	}
	t.Cleanup(func() { host.Close(); program.Close() })
	return host, program
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestDialCarriesBothWays(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	ln := listenLoopback(t)
	host, program := dialOne(t, c, ln)
	if host.RemoteAddr().String() != ln.Addr().String() || host.LocalAddr().String() != program.RemoteAddr().String() {
		t.Errorf("addresses: local %v remote %v; want %v and %v", host.LocalAddr(), host.RemoteAddr(), program.RemoteAddr(), ln.Addr())
	}
	up, down := make([]byte, 5<<20), make([]byte, 3<<20) // over the window each way
	rand.Read(up)
	rand.Read(down)
	errc := make(chan error, 2)
	go func() {
		_, err := host.Write(up)
		if err == nil {
			err = host.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := program.Write(down)
		program.(*net.TCPConn).CloseWrite()
		errc <- err
	}()
	gotUp, err := io.ReadAll(program)
	if err != nil || !bytes.Equal(gotUp, up) {
		t.Errorf("the program read %d bytes of %d: %v", len(gotUp), len(up), err)
	}
	gotDown, err := io.ReadAll(host)
	if err != nil || !bytes.Equal(gotDown, down) {
		t.Errorf("the host read %d bytes of %d: %v", len(gotDown), len(down), err)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

func TestDialCloseEndsTheProgramsConnection(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	host, program := dialOne(t, c, listenLoopback(t))
	if _, err := host.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	host.Close()
	program.SetReadDeadline(time.Now().Add(time.Minute))
	got, err := io.ReadAll(program)
	if err != nil || string(got) != "bye" {
		t.Errorf("the program read %q, %v; want what was written, then the end", got, err)
	}
}

func TestDialRefused(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		addr string
		want error
	}{
		{freeAddr(t), workspace.ErrNotFound}, // nothing listens
		{"10.0.0.1:80", workspace.ErrInvalidArgument},
		{"localhost:80", workspace.ErrInvalidArgument}, // a name: the agent resolves nothing
		{"127.0.0.1:0", workspace.ErrInvalidArgument},
		{"", workspace.ErrInvalidArgument},
	} {
		conn, err := c.Dial(ctx, tc.addr)
		if !errors.Is(err, tc.want) {
			t.Errorf("Dial(%q) = %v, %v; want %v", tc.addr, conn, err, tc.want)
		}
	}
	// The stream is still fine.
	host, program := dialOne(t, c, listenLoopback(t))
	host.Write([]byte("ok"))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(program, buf); err != nil || string(buf) != "ok" {
		t.Errorf("after the refusals, the program read %q, %v", buf, err)
	}
}

func TestDialCancelled(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Dial(ctx, listenLoopback(t).Addr().String()); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial with an ended context: %v", err)
	}
}
