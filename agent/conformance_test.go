package agent_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// overPipe serves localfs and localexec over dir through an in-process pipe
// and returns the client: the whole agent path but the container.
func overPipe(t *testing.T, dir string, opts ...localexec.Option) *agent.Client {
	t.Helper()
	fsys, err := localfs.New(dir, localfs.WithLockDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	sh, err := localexec.New(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	served := make(chan error, 1)
	go func() { served <- agent.NewServer(fsys, sh).Serve(context.Background(), b) }()
	c, err := agent.NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		select {
		case <-served:
		case <-time.After(time.Minute):
			t.Error("Serve did not return")
		}
		fsys.Close()
	})
	return c
}

func TestConformanceFileSystem(t *testing.T) {
	conformance.TestFileSystem(t, conformance.FileSystemHarness{
		New: func(t *testing.T) conformance.Instance {
			dir, outside := t.TempDir(), t.TempDir()
			return conformance.HostInstance(t, overPipe(t, dir), dir, outside)
		},
	})
}

func TestConformanceBash(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			dir := t.TempDir()
			c := overPipe(t, dir, localexec.WithEnv(env))
			return conformance.BashInstance{Bash: c, FS: c, Root: dir, Env: env}
		},
		Skip: map[conformance.Capability]string{conformance.CapDurable: "one pipe, served once (Serve): a new client needs ServeShared (TestConformanceBashShared) or ServeListener"},
	})
}

// engine is what a container engine makes of a container's standard
// streams, for ServeShared: one input that outlives each attached client
// (what a client wrote, a frame cut short included, is what the agent
// reads next), and output that goes to the client attached now, or
// nowhere. The output is buffered, as the engine's sockets are.
type engine struct {
	inR *io.PipeReader
	inW *io.PipeWriter
	mu  sync.Mutex
	out *attachment // attached now, or nil
}

func newEngine() *engine {
	e := &engine{}
	e.inR, e.inW = io.Pipe()
	return e
}

// Write is the agent's standard output.
func (e *engine) Write(p []byte) (int, error) {
	e.mu.Lock()
	a := e.out
	e.mu.Unlock()
	if a != nil {
		a.deliver(p)
	}
	return len(p), nil
}

// attach is a new client's stream: what it writes joins the input, and it
// reads the output from now on. Closing it detaches it, as a client's
// death would: the agent's input stays open.
func (e *engine) attach() *attachment {
	a := &attachment{e: e}
	a.cond = sync.NewCond(&a.mu)
	e.mu.Lock()
	if e.out != nil {
		e.out.Close()
	}
	e.out = a
	e.mu.Unlock()
	return a
}

type attachment struct {
	e    *engine
	mu   sync.Mutex
	cond *sync.Cond
	buf  bytes.Buffer // output not read yet
	gone bool
	cut  int // when positive, the attachment dies after writing this many more bytes
}

func (a *attachment) deliver(p []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.gone {
		a.buf.Write(p)
		a.cond.Broadcast()
	}
}

func (a *attachment) Read(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.buf.Len() == 0 && !a.gone {
		a.cond.Wait()
	}
	if a.buf.Len() == 0 {
		return 0, io.EOF
	}
	return a.buf.Read(p)
}

func (a *attachment) Write(p []byte) (int, error) {
	a.mu.Lock()
	if a.gone {
		a.mu.Unlock()
		return 0, io.ErrClosedPipe
	}
	n := len(p)
	if a.cut > 0 {
		if n >= a.cut {
			n, a.gone = a.cut, true // dies mid-write
		}
		a.cut -= n
	}
	gone := a.gone
	a.mu.Unlock()
	a.e.inW.Write(p[:n])
	if gone {
		a.Close()
		return n, io.ErrClosedPipe
	}
	return n, nil
}

func (a *attachment) Close() error {
	a.mu.Lock()
	a.gone = true
	a.cond.Broadcast()
	a.mu.Unlock()
	a.e.mu.Lock()
	if a.e.out == a {
		a.e.out = nil
	}
	a.e.mu.Unlock()
	return nil
}

// shared serves localfs and localexec over dir on an engine's shared
// stream (ServeShared), as the agent serves a container, and returns the
// engine and its server. The server ends when the test does.
func shared(t *testing.T, dir string, opts ...localexec.Option) (*engine, *agent.Server) {
	t.Helper()
	fsys, err := localfs.New(dir, localfs.WithLockDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	sh, err := localexec.New(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine()
	srv := agent.NewServer(fsys, sh)
	served := make(chan error, 1)
	go func() { served <- srv.ServeShared(context.Background(), e.inR, e) }()
	t.Cleanup(func() {
		e.inW.Close() // the container's input ends: the agent with it
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("ServeShared: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("ServeShared did not return")
		}
		srv.Close(context.Background())
		fsys.Close()
	})
	return e, srv
}

// attachClient attaches a client to e, resynchronising unless it is the
// first.
func attachClient(t *testing.T, e *engine, resync bool) (*agent.Client, *attachment) {
	t.Helper()
	a := e.attach()
	var opts []agent.ClientOption
	if resync {
		opts = append(opts, agent.WithResync())
	}
	c, err := agent.NewClient(a, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, a
}

func TestConformanceBashShared(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			dir := t.TempDir()
			e, _ := shared(t, dir, localexec.WithEnv(env))
			c, a := attachClient(t, e, false)
			return conformance.BashInstance{Bash: c, FS: c, Root: dir, Env: env,
				Reconnect: func(t *testing.T, meanwhile func(func(string) bool)) (workspace.Bash, workspace.FileSystem) {
					a.Close() // no goodbye: the client is gone
					meanwhile(func(name string) bool {
						_, err := os.Lstat(filepath.Join(dir, name))
						return err == nil
					})
					c, a = attachClient(t, e, true)
					return c, c
				}}
		},
	})
}
