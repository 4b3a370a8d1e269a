package agent_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
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
	})
}
