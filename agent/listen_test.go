package agent

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// dialAgent connects to a listening agent with token and epoch.
func dialAgent(t *testing.T, addr, token string, epoch uint64) (*Client, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	pre, err := Preamble(token, epoch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(pre); err != nil {
		t.Fatal(err)
	}
	return NewClient(conn, WithHandshakeTimeout(5*time.Second))
}

// TestServeListener: only the token's holder is served, a later epoch
// replaces the connection served (which ends), and an earlier one is
// refused; what the first wrote the second reads.
func TestServeListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	token := strings.Repeat("ab", TokenLen/2)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- NewServer(memfs.New(), nil).ServeListener(ctx, ln, token) }()
	addr := ln.Addr().String()

	if _, err := dialAgent(t, addr, strings.Repeat("cd", TokenLen/2), 1); !errors.Is(err, workspace.ErrUnavailable) {
		t.Fatalf("a wrong token: %v, want the handshake to fail", err)
	}
	first, err := dialAgent(t, addr, token, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.WriteFile(ctx, "a.txt", []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	second, err := dialAgent(t, addr, token, 2)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	case <-time.After(time.Minute):
		t.Fatal("the replaced connection did not end")
	}
	data, err := second.ReadFile(ctx, "a.txt", 1<<20)
	if err != nil || string(data) != "one" {
		t.Fatalf("read through the second: %q, %v", data, err)
	}
	if _, err := dialAgent(t, addr, token, 2); err == nil {
		t.Fatal("an epoch not above the last was served")
	}
	if _, err := second.ReadFile(ctx, "a.txt", 1<<20); err != nil {
		t.Fatalf("a refused connection disturbed the one served: %v", err)
	}
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Fatalf("ServeListener: %v", err)
	}
	if _, err := Preamble("short", 1); err == nil {
		t.Fatal("Preamble took a short token")
	}
}
