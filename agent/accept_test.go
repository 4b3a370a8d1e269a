package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// acceptOne accepts on addr while a program dials it, and returns both ends.
func acceptOne(t *testing.T, c *Client, addr string) (host net.Conn, program net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type res struct {
		conn net.Conn
		err  error
	}
	got := make(chan res, 1)
	go func() {
		conn, err := c.Accept(ctx, addr)
		got <- res{conn, err}
	}()
	// The agent listens from the first Accept on: dial until it does.
	for {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			program = conn
			break
		}
		select {
		case r := <-got:
			t.Fatalf("Accept without a connection: %v", r.err)
		case <-ctx.Done():
			t.Fatal("the agent never listened")
		case <-time.After(10 * time.Millisecond):
		}
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.conn.Close(); program.Close() })
	return r.conn, program
}

func TestAcceptCarriesBothWays(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	addr := freeAddr(t)
	host, program := acceptOne(t, c, addr)
	if host.LocalAddr().String() != addr || host.RemoteAddr().String() != program.LocalAddr().String() {
		t.Errorf("addresses: local %v remote %v; want %s and %v", host.LocalAddr(), host.RemoteAddr(), addr, program.LocalAddr())
	}
	up, down := make([]byte, 5<<20), make([]byte, 3<<20) // over the window each way
	rand.Read(up)
	rand.Read(down)
	errc := make(chan error, 2)
	go func() { // the program writes all, ends its side, reads all
		_, err := program.Write(up)
		program.(*net.TCPConn).CloseWrite()
		errc <- err
	}()
	go func() {
		_, err := host.Write(down)
		if err == nil {
			err = host.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	gotUp, err := io.ReadAll(host)
	if err != nil || !bytes.Equal(gotUp, up) {
		t.Errorf("host read %d bytes of %d: %v", len(gotUp), len(up), err)
	}
	gotDown, err := io.ReadAll(program)
	if err != nil || !bytes.Equal(gotDown, down) {
		t.Errorf("program read %d bytes of %d: %v", len(gotDown), len(down), err)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	if _, err := host.Write([]byte("x")); err == nil {
		t.Error("Write after CloseWrite succeeded")
	}
}

func TestAcceptCloseEndsTheProgramsConnection(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	addr := freeAddr(t)
	host, program := acceptOne(t, c, addr)
	host.Write([]byte("last words"))
	host.Close()
	program.SetReadDeadline(time.Now().Add(time.Minute))
	if got, err := io.ReadAll(program); err != nil || string(got) != "last words" {
		t.Errorf("the program read %q, %v after the host wrote and closed; want what was written, then the end", got, err)
	}
	program.Close()
	if _, err := host.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	// The next connection is served.
	host2, program2 := acceptOne(t, c, addr)
	program2.Write([]byte("again"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(host2, buf); err != nil || string(buf) != "again" {
		t.Errorf("second connection: %q %v", buf, err)
	}
}

func TestAcceptUnreadHoldsOnlyItsConnection(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	addr := freeAddr(t)
	_, stuck := acceptOne(t, c, addr)
	go stuck.Write(make([]byte, 4<<20)) // never read on the host
	host, program := acceptOne(t, c, addr)
	data := make([]byte, 2<<20)
	go func() { program.Write(data); program.Close() }()
	got, err := io.ReadAll(host)
	if err != nil || len(got) != len(data) {
		t.Errorf("read %d of %d beside an unread connection: %v", len(got), len(data), err)
	}
	if _, err := c.Stat(context.Background(), "."); err != nil {
		t.Errorf("a call beside an unread connection: %v", err)
	}
}

func TestAcceptDeadlines(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	host, _ := acceptOne(t, c, freeAddr(t))
	host.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := host.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Read past its deadline: %v", err)
	}
	// Writes past the program's window wait for credit, then give up.
	host.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	var err error
	for range 64 {
		if _, err = host.Write(make([]byte, 1<<20)); err != nil {
			break
		}
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Write to a program that does not read, past its deadline: %v", err)
	}
}

func TestAcceptRefusesWhatIsNotLoopback(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	for _, addr := range []string{"0.0.0.0:3128", "10.0.0.1:80", "localhost:80", "127.0.0.1:0", "[::]:80", "x"} {
		if _, err := c.Accept(context.Background(), addr); !errors.Is(err, workspace.ErrInvalidArgument) {
			t.Errorf("Accept(%q): %v; want ErrInvalidArgument", addr, err)
		}
	}
	first := freeAddr(t)
	acceptOne(t, c, first)
	if _, err := c.Accept(context.Background(), freeAddr(t)); !errors.Is(err, workspace.ErrInvalidArgument) {
		t.Errorf("Accept on a second address: %v", err)
	}
}

func TestAcceptCancelled(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Accept(ctx, addr)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Accept: %v", err)
	}
	acceptOne(t, c, addr) // the stream and the listener still serve
}

// TestAcceptHostileAgent: an agent that sends more than the window, or data
// before its accept notice, breaks the client rather than its memory.
func TestAcceptHostileAgent(t *testing.T) {
	for name, frames := range map[string]func(id uint32) [][]byte{
		"OverTheWindow": func(id uint32) [][]byte {
			out := [][]byte{appendFrame(nil, frameData, 0, id, []byte(`{}`), nil)}
			for range window/chunkSize + 1 {
				out = append(out, appendFrame(nil, frameData, 0, id, nil, make([]byte, chunkSize)))
			}
			return out
		},
		"DataFirst": func(id uint32) [][]byte {
			return [][]byte{appendFrame(nil, frameData, 0, id, nil, []byte("x"))}
		},
		"DataAfterEnd": func(id uint32) [][]byte {
			h, _ := json.Marshal(acceptHeader{Remote: "127.0.0.1:1"})
			return [][]byte{appendFrame(nil, frameData, 0, id, h, nil), appendFrame(nil, frameData, flagEnd, id, nil, nil),
				appendFrame(nil, frameData, 0, id, nil, []byte("x"))}
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, f := newFake(t)
			go func() {
				fr, _ := f.next()
				for _, b := range frames(fr.id) {
					f.write(b)
				}
			}()
			if conn, err := c.Accept(context.Background(), "127.0.0.1:3128"); err == nil {
				defer conn.Close() // never read: what the agent sends must stay within the window
			}
			select {
			case <-c.Done():
			case <-time.After(time.Minute):
				t.Fatal("the client was not broken")
			}
		})
	}
}

// TestListenBeforeAccept: once Listen returns, a program's connection is
// taken at once (it waits in the backlog) and is the next Accept's; before
// it, nothing listened. Listen refuses what Accept refuses.
func TestListenBeforeAccept(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	addr := freeAddr(t)
	if conn, err := net.Dial("tcp", addr); err == nil {
		conn.Close()
		t.Fatal("something listened before Listen")
	}
	ctx := t.Context()
	if err := c.Listen(ctx, addr); err != nil {
		t.Fatal(err)
	}
	program, err := net.Dial("tcp", addr) // no Accept waits: the backlog holds it
	if err != nil {
		t.Fatalf("a connection right after Listen: %v", err)
	}
	defer program.Close()
	if _, err := program.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	host, err := c.Accept(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	got := make([]byte, 5)
	if _, err := io.ReadFull(host, got); err != nil || string(got) != "early" {
		t.Errorf("read %q, %v; want what the program wrote before the Accept", got, err)
	}
	if err := c.Listen(ctx, addr); err != nil {
		t.Errorf("Listen again on the same address: %v", err)
	}
	for _, other := range []string{freeAddr(t), "0.0.0.0:3128"} {
		if err := c.Listen(ctx, other); !errors.Is(err, workspace.ErrInvalidArgument) {
			t.Errorf("Listen(%q): %v; want ErrInvalidArgument", other, err)
		}
	}
}
