package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// termFunc is a TerminalBash whose RunTerminal is the function.
type termFunc struct {
	bashFunc
	run func(ctx context.Context, cmd workspace.Command, t workspace.Terminal) (workspace.Result, error)
}

func (f termFunc) RunTerminal(ctx context.Context, cmd workspace.Command, t workspace.Terminal) (workspace.Result, error) {
	return f.run(ctx, cmd, t)
}

// An agent whose Bash has no terminal says so in its Hello, and
// RunTerminal fails at once, in the kind callers test for.
func TestTerminalNotOffered(t *testing.T) {
	c := connect(t, memfs.New(), bashFunc(func(context.Context, workspace.Command) (workspace.Result, error) {
		t.Error("a command ran")
		return workspace.Result{}, nil
	}))
	if c.info.Terminal {
		t.Error("the agent offered terminals without a TerminalBash")
	}
	_, err := c.RunTerminal(context.Background(), workspace.Command{Script: "x"}, workspace.Terminal{Size: workspace.TermSize{Rows: 24, Cols: 80}})
	if !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("RunTerminal = %v; want ErrUnavailable", err)
	}
}

// A size asked for before the start is the one the agent's terminal
// opens at, not one that follows the start on the stream: a program that
// looks at once sees it.
func TestResizeBeforeStartOpensAtIt(t *testing.T) {
	opened := make(chan workspace.TermSize, 1)
	c := connect(t, memfs.New(), termFunc{run: func(ctx context.Context, cmd workspace.Command, term workspace.Terminal) (workspace.Result, error) {
		opened <- term.Size
		return workspace.Result{}, nil
	}})
	r := &workspace.Resizer{}
	if err := r.Resize(workspace.TermSize{Rows: 7, Cols: 33}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunTerminal(context.Background(), workspace.Command{Script: "stty size"}, workspace.Terminal{Size: workspace.TermSize{Rows: 24, Cols: 80}, Resize: r}); err != nil {
		t.Fatal(err)
	}
	if got := <-opened; got != (workspace.TermSize{Rows: 7, Cols: 33}) {
		t.Errorf("the terminal opened at %+v; want the 7x33 asked for before the start", got)
	}
}

// A resize reaches the agent's terminal before the input sent after it:
// the program reads its input at the new size.
func TestResizeBeforeLaterInput(t *testing.T) {
	c := connect(t, memfs.New(), termFunc{run: func(ctx context.Context, cmd workspace.Command, term workspace.Terminal) (workspace.Result, error) {
		var mu sync.Mutex
		size := term.Size
		term.Resize.Attach(func(s workspace.TermSize) error { mu.Lock(); size = s; mu.Unlock(); return nil })
		defer term.Resize.Detach()
		buf := make([]byte, 1)
		for {
			if _, err := cmd.Stdin.Read(buf); err != nil {
				return workspace.Result{}, nil
			}
			mu.Lock()
			cmd.Output(workspace.Stdout, fmt.Appendf(nil, "%c@%dx%d ", buf[0], size.Rows, size.Cols))
			mu.Unlock()
		}
	}})
	in, typed := io.Pipe()
	r := &workspace.Resizer{}
	var mu sync.Mutex
	var out strings.Builder
	seen := make(chan struct{}, 16)
	done := make(chan error, 1)
	go func() {
		_, err := c.RunTerminal(context.Background(), workspace.Command{Script: "x", Stdin: in, Output: func(_ workspace.Stream, p []byte) {
			mu.Lock()
			out.Write(p)
			mu.Unlock()
			seen <- struct{}{}
		}}, workspace.Terminal{Size: workspace.TermSize{Rows: 24, Cols: 80}, Resize: r})
		done <- err
	}()
	step := func(key string) {
		t.Helper()
		typed.Write([]byte(key))
		select {
		case <-seen:
		case <-time.After(time.Minute):
			t.Fatal("no output for the input")
		}
	}
	step("a")
	if err := r.Resize(workspace.TermSize{Rows: 5, Cols: 6}); err != nil {
		t.Fatal(err)
	}
	step("b")
	typed.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "a@24x80 b@5x6 "; got != want {
		t.Errorf("output %q; want %q", got, want)
	}
	if err := r.Resize(workspace.TermSize{Rows: 1, Cols: 1}); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Resize after the end: %v; want ErrNotFound", err)
	}
}

// A resize frame the agent cannot act on — one for a call without a
// terminal, or of the wrong length — breaks the protocol: the connection
// ends and its commands are cancelled.
func TestBadResizeBreaksTheStream(t *testing.T) {
	for _, tc := range []struct {
		name    string
		op      string
		payload []byte
	}{
		{"resize of a run", opRun, []byte{0, 24, 0, 80}},
		{"three bytes", opPty, []byte{0, 24, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started, stopped := make(chan struct{}), make(chan struct{})
			wait := func(ctx context.Context) (workspace.Result, error) {
				close(started)
				<-ctx.Done()
				close(stopped)
				return workspace.Result{}, ctx.Err()
			}
			bash := termFunc{
				bashFunc: func(ctx context.Context, _ workspace.Command) (workspace.Result, error) { return wait(ctx) },
				run: func(ctx context.Context, _ workspace.Command, _ workspace.Terminal) (workspace.Result, error) {
					return wait(ctx)
				},
			}
			a, b := net.Pipe()
			served := make(chan error, 1)
			go func() { served <- NewServer(memfs.New(), bash).Serve(context.Background(), b) }()
			go io.Copy(io.Discard, a)
			h, _ := json.Marshal(hello{Version: ProtocolVersion})
			a.Write(appendFrame(nil, frameHello, 0, 0, h, nil))
			req, _ := json.Marshal(request{Op: tc.op, Run: &runRequest{Script: "x", Stdin: true}, Pty: &ptyRequest{Rows: 24, Cols: 80}})
			a.Write(appendFrame(nil, frameCall, 0, 1, req, nil))
			<-started
			a.Write(appendFrame(nil, frameData, flagResize, 1, nil, tc.payload))
			if err := servedStopped(t, served, stopped); !errors.Is(err, errFrame) {
				t.Errorf("Serve = %v; want a protocol error", err)
			}
			a.Close()
		})
	}
}
