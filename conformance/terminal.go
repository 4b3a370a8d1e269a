package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// Commands on a terminal (workspace.TerminalBash, CapTerminal): the
// program sees a terminal on its three streams, input typed reaches it and
// is echoed, the size is the one asked for and follows a Resize, and its
// tree dies as a plain command's does.

// termRun is a command running on a terminal: its output so far, its
// input, its Resizer, and its end.
type termRun struct {
	x      *bashFixture
	in     *io.PipeWriter
	resize *workspace.Resizer

	mu      sync.Mutex
	out     bytes.Buffer
	changed chan struct{} // closed and replaced at each output
	stdout  bool          // every output was Stdout

	done chan struct{}
	res  workspace.Result
	err  error
}

// startTerm starts script on a terminal of size under ctx.
func startTerm(x *bashFixture, ctx context.Context, script string, size workspace.TermSize, timeout time.Duration) *termRun {
	stdin, in := io.Pipe()
	tr := &termRun{x: x, in: in, resize: &workspace.Resizer{}, changed: make(chan struct{}), stdout: true, done: make(chan struct{})}
	cmd := workspace.Command{Script: script, Stdin: stdin, Timeout: timeout, Output: func(s workspace.Stream, p []byte) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.out.Write(p)
		tr.stdout = tr.stdout && s == workspace.Stdout
		close(tr.changed)
		tr.changed = make(chan struct{})
	}}
	go func() {
		defer close(tr.done)
		tr.res, tr.err = workspace.RunTerminal(ctx, x.Bash, cmd, workspace.Terminal{Size: size, Resize: tr.resize})
		stdin.Close()
	}()
	x.t.Cleanup(func() { in.Close() })
	return tr
}

// await waits, at most eventTimeout, for the output to hold text, and
// fails the test otherwise.
func (tr *termRun) await(text string) {
	tr.x.t.Helper()
	timer := time.NewTimer(eventTimeout)
	defer timer.Stop()
	for {
		tr.mu.Lock()
		has, ch := strings.Contains(tr.out.String(), text), tr.changed
		tr.mu.Unlock()
		if has {
			return
		}
		select {
		case <-ch:
		case <-tr.done:
			tr.mu.Lock()
			has = strings.Contains(tr.out.String(), text)
			tr.mu.Unlock()
			if !has {
				tr.x.t.Fatalf("the command on the terminal ended (%+v, %v) without writing %q: %q", tr.res, tr.err, text, tr.output())
			}
			return
		case <-timer.C:
			tr.x.t.Fatalf("the command on the terminal did not write %q within %v: %q", text, eventTimeout, tr.output())
		}
	}
}

// typed sends input to the terminal.
func (tr *termRun) typed(s string) {
	tr.x.t.Helper()
	if _, err := tr.in.Write([]byte(s)); err != nil {
		tr.x.t.Fatalf("typing %q: %v", s, err)
	}
}

// wait waits for the command's end, at most hangTimeout.
func (tr *termRun) wait() (workspace.Result, error) {
	tr.x.t.Helper()
	select {
	case <-tr.done:
	case <-time.After(hangTimeout):
		tr.x.t.Fatalf("RunTerminal did not return within %v: %q", hangTimeout, tr.output())
	}
	return tr.res, tr.err
}

func (tr *termRun) output() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.out.String()
}

var size24x80 = workspace.TermSize{Rows: 24, Cols: 80}

var terminalTests = []bashTest{
	{name: "Terminal/EchoRoundTrip", needs: needs(CapTerminal), run: func(x *bashFixture) {
		tr := startTerm(x, x.ctx, `[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo on-a-terminal; read line; echo "got:$line"`, size24x80, 0)
		tr.await("on-a-terminal")
		tr.typed("hello\n")
		tr.await("got:hello")
		res, err := tr.wait()
		if err != nil || res.ExitCode != 0 {
			x.t.Errorf("RunTerminal = %+v, %v; want exit 0", res, err)
		}
		out := tr.output()
		if !strings.Contains(strings.ReplaceAll(out, "got:hello", ""), "hello") {
			x.t.Errorf("the terminal did not echo the input: %q", out)
		}
		if !tr.stdout {
			x.t.Errorf("a terminal's output came as Stderr too; want one stream, Stdout")
		}
	}},
	{name: "Terminal/Resize", needs: needs(CapTerminal), run: func(x *bashFixture) {
		tr := startTerm(x, x.ctx, `stty size; read x; stty size`, size24x80, 0)
		tr.await("24 80")
		if err := tr.resize.Resize(workspace.TermSize{Rows: 30, Cols: 100}); err != nil {
			x.t.Fatalf("Resize: %v", err)
		}
		tr.typed("\n")
		tr.await("30 100")
		if res, err := tr.wait(); err != nil || res.ExitCode != 0 {
			x.t.Errorf("RunTerminal = %+v, %v; want exit 0", res, err)
		}
		if err := tr.resize.Resize(size24x80); !errors.Is(err, workspace.ErrNotFound) {
			x.t.Errorf("Resize after the end = %v; want ErrNotFound", err)
		}
	}},
	{name: "Terminal/ResizeBeforeStart", needs: needs(CapTerminal), run: func(x *bashFixture) {
		stdin, in := io.Pipe()
		defer in.Close()
		r := &workspace.Resizer{}
		if err := r.Resize(workspace.TermSize{Rows: 7, Cols: 33}); err != nil {
			x.t.Fatal(err)
		}
		var out bytes.Buffer
		var mu sync.Mutex
		res := within(x.t, hangTimeout, "RunTerminal(stty size)", func() result[workspace.Result] {
			res, err := workspace.RunTerminal(x.ctx, x.Bash, workspace.Command{Script: "stty size", Stdin: stdin, Output: func(_ workspace.Stream, p []byte) {
				mu.Lock()
				out.Write(p)
				mu.Unlock()
			}}, workspace.Terminal{Size: size24x80, Resize: r})
			return result[workspace.Result]{res, err}
		})
		mu.Lock()
		defer mu.Unlock()
		if res.err != nil || !strings.Contains(out.String(), "7 33") {
			x.t.Errorf("RunTerminal = %+v, %v, output %q; want the size asked for before it started, 7 33", res.v, res.err, out.String())
		}
	}},
	{name: "Terminal/BadSize", needs: needs(CapTerminal), run: func(x *bashFixture) {
		_, err := workspace.RunTerminal(x.ctx, x.Bash, workspace.Command{Script: "true"}, workspace.Terminal{Size: workspace.TermSize{Rows: 0, Cols: 80}})
		if !errors.Is(err, workspace.ErrInvalidArgument) {
			x.t.Errorf("RunTerminal of 0 rows = %v; want ErrInvalidArgument", err)
		}
	}},
	{name: "Terminal/Timeout", needs: needs(CapTerminal), run: func(x *bashFixture) {
		tr := startTerm(x, x.ctx, `echo started; exec sleep 600`, size24x80, 2*time.Second)
		tr.await("started")
		if res, err := tr.wait(); err != nil || !res.TimedOut {
			x.t.Errorf("RunTerminal = %+v, %v; want it cut short by its timeout", res, err)
		}
	}},
	{name: "Terminal/Context/TreeDies", needs: needs(CapTerminal, CapProcessTree), run: func(x *bashFixture) {
		ctx, cancel := context.WithCancel(x.ctx)
		defer cancel()
		tr := startTerm(x, ctx, spawner, size24x80, 0)
		tr.await("ready")
		cancel()
		if _, err := tr.wait(); !errors.Is(err, context.Canceled) {
			x.t.Errorf("RunTerminal = %v; want it cut short by its context", err)
		}
		x.treeGone()
	}},
	{name: "Terminal/Env", needs: needs(CapTerminal, CapConfiguredEnv), run: func(x *bashFixture) {
		var name, value string
		for name, value = range x.Env {
			break
		}
		tr := startTerm(x, x.ctx, fmt.Sprintf(`printf 'env:%%s:\n' "$%s"`, name), size24x80, 0)
		tr.await(fmt.Sprintf("env:%s:", value))
		tr.wait()
	}},
}
