package dockertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/workspace"
)

// OutsideDir is the directory beside the workspace, inside each pooled
// container, that a Loan's Outside agent serves.
const OutsideDir = "/tmp/outside"

// Pool lends session containers to parallel subtests, so that a suite of
// hundreds of subtests does not start a container for each. A container
// goes back to the pool only once its workspace and OutsideDir are empty
// again and its agent keeps no background command; one that cannot be
// wiped is closed.
type Pool struct {
	tb   testing.TB
	spec docker.Spec
	free chan *Loan
	slot chan struct{} // one token per container that may still be started
}

// Loan is a container lent to one subtest, with a second agent serving
// OutsideDir.
type Loan struct {
	*docker.Container
	Outside *agent.Client
}

// NewPool returns a pool of at most size containers started from spec (see
// Start), all removed when tb ends.
func NewPool(tb testing.TB, size int, spec docker.Spec) *Pool {
	p := &Pool{tb: tb, spec: spec, free: make(chan *Loan, size), slot: make(chan struct{}, size)}
	for range size {
		p.slot <- struct{}{}
	}
	return p
}

// Get lends a container with an empty workspace to t until t ends.
func (p *Pool) Get(t *testing.T) *Loan {
	t.Helper()
	var l *Loan
	select {
	case l = <-p.free:
	default:
		select {
		case l = <-p.free:
		case <-p.slot:
			l = p.start(t)
		}
	}
	t.Cleanup(func() {
		if err := l.wipe(); err != nil {
			t.Logf("dockertest: closing a container that could not be wiped: %v", err)
			l.Outside.Close()
			l.Close(context.Background())
			p.slot <- struct{}{}
			return
		}
		p.free <- l
	})
	return l
}

var startMu sync.Mutex

func (p *Pool) start(t *testing.T) *Loan {
	t.Helper()
	// The engine starts one at a time anyway; keep the order sane. Start
	// may fail the test (runtime.Goexit): the lock is let go all the same,
	// or every other case waits for it until the test binary's timeout.
	c := func() *docker.Container {
		startMu.Lock()
		defer startMu.Unlock()
		return Start(p.tb, p.spec)
	}()
	ctx := context.Background()
	if _, err := c.Bash().Run(ctx, workspace.Command{Argv: []string{"mkdir", "-p", OutsideDir}}); err != nil {
		t.Fatal(err)
	}
	out, err := agentAt(ctx, Client(p.tb), c, OutsideDir)
	if err != nil {
		t.Fatal(err)
	}
	p.tb.Cleanup(func() { out.Close() })
	l := &Loan{Container: c, Outside: out}
	// The mkdir above was the container's first command, before which the
	// session's home is made in the workspace's bookkeeping (docker
	// Bash.Run): a container is lent with its workspace as empty as a
	// returned one's, or a case that lists the workspace exactly (the
	// kit's Walk cases) sees .sandboxd when it gets a new container.
	if err := l.wipe(); err != nil {
		t.Fatal(err)
	}
	return l
}

// agentAt starts a second agent in c, through docker exec, that serves the
// directory root (an absolute path in the container, which must exist) and
// returns its client. It is the container's agent binary (its entrypoint),
// run as the container's user under the same isolation; its process ends
// when the client is closed. A session needs none: tests use it for a
// directory beside the workspace.
func agentAt(ctx context.Context, cli client.APIClient, c *docker.Container, root string) (*agent.Client, error) {
	info, err := cli.ContainerInspect(ctx, c.ID(), client.ContainerInspectOptions{})
	if err != nil {
		return nil, fmt.Errorf("dockertest: agent at %s: %w", root, err)
	}
	if info.Container.Config == nil || len(info.Container.Config.Entrypoint) == 0 {
		return nil, fmt.Errorf("dockertest: agent at %s: the container has no entrypoint", root)
	}
	ex, err := cli.ExecCreate(ctx, c.ID(), client.ExecCreateOptions{
		AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Cmd: []string{info.Container.Config.Entrypoint[0], "serve", "--root", root},
	})
	if err != nil {
		return nil, fmt.Errorf("dockertest: exec agent: %w", err)
	}
	att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return nil, fmt.Errorf("dockertest: exec agent: %w", err)
	}
	// The exec's output is multiplexed: the agent's stream is its stdout.
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, io.Discard, att.Reader)
		pw.CloseWithError(err)
	}()
	ag, err := agent.NewClient(&execStream{Reader: pr, conn: att.Conn})
	if err != nil {
		att.Close()
		return nil, fmt.Errorf("dockertest: agent at %s: %w", root, err)
	}
	return ag, nil
}

// execStream is an exec'd agent's stream: reads from its demultiplexed
// stdout, writes to its stdin.
type execStream struct {
	io.Reader
	conn net.Conn
}

func (s *execStream) Write(p []byte) (int, error) { return s.conn.Write(p) }

// Close ends the agent's input, its signal to exit, and the connection.
func (s *execStream) Close() error {
	if cw, ok := s.conn.(client.CloseWriter); ok {
		cw.CloseWrite()
	}
	return s.conn.Close()
}

const wipeScript = `chmod -R u+rwX /workspace ` + OutsideDir + ` 2>/dev/null
find /workspace ` + OutsideDir + ` -mindepth 1 -maxdepth 1 -exec rm -rf {} +
ls -A /workspace ` + OutsideDir

func (l *Loan) wipe() error {
	// Background commands are the agent's, not the workspace's: a
	// container that kept any is not lent again.
	if list, err := l.Bash().ListBackground(context.Background()); err != nil || len(list) > 0 {
		return fmt.Errorf("it kept %d background commands (%v)", len(list), err)
	}
	var out strings.Builder
	res, err := l.Bash().Run(context.Background(), workspace.Command{Script: wipeScript,
		Output: func(_ workspace.Stream, p []byte) { out.Write(p) }})
	if err == nil && (res.ExitCode != 0 || strings.Count(out.String(), "\n") != 3) {
		err = &wipeError{out.String()}
	}
	return err
}

type wipeError struct{ out string }

func (e *wipeError) Error() string { return "wipe left: " + e.out }
