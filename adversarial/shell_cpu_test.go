package adversarial

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// blockingFS holds every ReadFile of a name starting with "block" until
// release is closed, and says on entered when one is held.
type blockingFS struct {
	*memfs.FS
	entered chan string
	release chan struct{}
}

func (b *blockingFS) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	if strings.HasPrefix(name, "block") {
		b.entered <- name
		<-b.release
	}
	return b.FS.ReadFile(ctx, name, max)
}

// TestShellInterpreterBounded: the shell tool's interpreter runs in the
// daemon's process, outside every container's CPU quota. A line's CPU is
// bounded by its budget of statements, and the lines running at once by
// session and by tenant, so loops cannot take the daemon's CPUs.
func TestShellInterpreterBounded(t *testing.T) {
	t.Run("RunawayLoopStopped", func(t *testing.T) {
		t.Parallel()
		for _, line := range []string{"while pwd > /dev/null; do pwd > /dev/null; done", "until ! ls > /dev/null; do ls > /dev/null; done", "while cat a > /dev/null; do cat a b > /dev/null; done"} {
			fsys := memfs.New()
			fsys.WriteFile(context.Background(), "a", []byte("a\n"), 0o644)
			fsys.WriteFile(context.Background(), "b", []byte("b\n"), 0o644)
			res, err := interp.Run(context.Background(), workspaceshell.Env{FS: fsys}, line, workspaceshell.Read)
			if err != nil || res.ExitCode != 124 || res.TimedOut || !strings.Contains(res.Stderr, "CPU budget") {
				t.Errorf("%q = %+v, %v; want it stopped by its budget, not its timeout", line, res, err)
			}
		}
	})
	t.Run("LinesPerSessionAndTenant", func(t *testing.T) {
		t.Parallel()
		fsys := &blockingFS{FS: memfs.New(), entered: make(chan string), release: make(chan struct{})}
		for _, f := range []string{"block1", "block2", "free"} {
			fsys.FS.WriteFile(context.Background(), f, []byte(f+"\n"), 0o644)
		}
		env := func(session, tenant string, timeout time.Duration) workspaceshell.Env {
			return workspaceshell.Env{FS: fsys, Session: workspace.Session{ID: session, Tenant: tenant}, Timeout: timeout,
				SessionLines: 1, TenantLines: 2}
		}
		run := func(e workspaceshell.Env, line string) interp.Result {
			res, err := interp.Run(context.Background(), e, line, workspaceshell.Read)
			if err != nil {
				t.Errorf("%q: %v", line, err)
			}
			return res
		}
		// Two sessions of tenant t each hold a line, which takes both of
		// the tenant's slots.
		held := make(chan interp.Result, 2)
		go func() { held <- run(env("a", "t", time.Minute), "cat block1") }()
		go func() { held <- run(env("b", "t", time.Minute), "cat block2") }()
		for range 2 {
			select {
			case <-fsys.entered:
			case <-time.After(60 * time.Second):
				t.Fatal("the held lines did not start within 60 s")
			}
		}
		// Another line of session a, and a line of a third session of t,
		// wait for a slot until their timeout.
		for _, s := range []string{"a", "c"} {
			if res := run(env(s, "t", time.Second), "cat free"); !res.TimedOut || res.Stdout != "" {
				t.Errorf("a line of session %s while its slots are held: %+v", s, res)
			}
		}
		// Another tenant's session runs.
		if res := run(env("d", "u", time.Minute), "cat free"); res.ExitCode != 0 || res.Stdout != "free\n" {
			t.Errorf("another tenant's line: %+v", res)
		}
		close(fsys.release)
		for range 2 {
			if res := <-held; res.Stdout == "" {
				t.Errorf("a held line: %+v", res)
			}
		}
		if res := run(env("a", "t", time.Minute), "cat free"); res.Stdout != "free\n" {
			t.Errorf("session a once its slot is free: %+v", res)
		}
	})
}
