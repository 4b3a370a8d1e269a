package localexec

import (
	"context"
	"io"
	"os"
	"sync"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/proctree"
	"github.com/sandboxd/sandboxd/workspace"
)

var _ workspace.TerminalBash = (*Bash)(nil)

// RunTerminal runs cmd on a new pseudo-terminal; see
// workspace.TerminalBash. The command is started and its tree killed as
// Run's are (a session of its own, whose group is the program's; see
// proctree.Spec.Terminal). Its output — the terminal's one stream — is
// passed to cmd.Output as Stdout until the tree is gone and the terminal
// has nothing more to read (at most proctree.DefaultWaitDelay after), and
// never after RunTerminal returns.
func (b *Bash) RunTerminal(ctx context.Context, cmd workspace.Command, t workspace.Terminal) (workspace.Result, error) {
	if err := t.Size.Check(); err != nil {
		return workspace.Result{}, err
	}
	cmd.Combined = true
	return b.run(ctx, cmd, &t)
}

// terminal is the pseudo-terminal of one command: github.com/creack/pty
// opens it. This process keeps the slave side open while the command runs
// (the size is set through it), so the master reads end of file (EIO) only
// once drain has closed it after the tree is gone.
type terminal struct {
	master *os.File // non-blocking, on Go's poller: Close ends a Read
	slave  *os.File
	pumped chan struct{}      // closed when the output has been read to its end
	resize *workspace.Resizer // attached by serve, detached at drain

	once sync.Once
}

// openTerminal opens a terminal of size and makes it spec's standard
// input, output and error and its controlling terminal.
func openTerminal(size workspace.TermSize, spec *proctree.Spec) (*terminal, error) {
	m, s, err := pty.Open()
	if err != nil {
		return nil, err
	}
	if err := pty.Setsize(s, &pty.Winsize{Rows: size.Rows, Cols: size.Cols}); err != nil {
		m.Close()
		s.Close()
		return nil, err
	}
	// pty.Open's master is in blocking mode (it took its Fd), where Close
	// does not end a Read: a duplicate in non-blocking mode is on the poller.
	// Duplicated close-on-exec at once, so that no command started meanwhile
	// inherits this terminal.
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	m.Close()
	if err == nil {
		if err = unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	t := &terminal{master: os.NewFile(uintptr(fd), "/dev/ptmx"), slave: s, pumped: make(chan struct{})}
	spec.Stdin, spec.Stdout, spec.Stderr, spec.Terminal = s, s, s, true
	return t, nil
}

// serve carries the terminal's output to out, stdin (if any) to it, and
// attaches resize to it, until drain.
func (t *terminal) serve(out *output, stdin io.Reader, resize *workspace.Resizer) {
	go func() {
		defer close(t.pumped)
		buf := make([]byte, 32<<10)
		for {
			n, err := t.master.Read(buf)
			if n > 0 {
				out.mu.Lock()
				out.fn(workspace.Stdout, buf[:n])
				out.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
	if stdin != nil {
		go func() {
			// Until the input ends or the terminal closes; a Read that
			// blocks past the command keeps this goroutine, as Run's.
			io.Copy(t.master, stdin)
		}()
	}
	if resize != nil {
		resize.Attach(func(sz workspace.TermSize) error {
			return pty.Setsize(t.slave, &pty.Winsize{Rows: sz.Rows, Cols: sz.Cols})
		})
		t.resize = resize
	}
}

// drain waits, once the tree is gone, for the output to be read to its
// end, at most delay, and then closes the terminal.
func (t *terminal) drain(delay time.Duration) {
	t.once.Do(func() {
		t.detach()
		t.slave.Close()
		timer := time.NewTimer(delay)
		defer timer.Stop()
		select {
		case <-t.pumped:
		case <-timer.C:
			t.master.Close()
			<-t.pumped
		}
		t.master.Close()
	})
}

// close releases a terminal whose command did not start, or that drain
// has closed already.
func (t *terminal) close() {
	t.once.Do(func() {
		t.detach()
		t.slave.Close()
		t.master.Close()
	})
}

func (t *terminal) detach() {
	if t.resize != nil {
		t.resize.Detach()
	}
}
