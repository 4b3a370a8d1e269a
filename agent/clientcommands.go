package agent

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// Run runs a command in the agent. Its input is sent as the command reads it
// and its output is passed to cmd.Output in the order the agent sent it, one
// call at a time, under flow control: a slow Output holds up this command,
// not the stream. When ctx ends, the agent kills the command's process tree
// and Run waits for its report (at most the cancel grace, see
// WithCancelGrace) and returns the result so far with ctx's error.
//
// A Run stays blocked in nothing but the stream: when cmd.Stdin blocks, the
// goroutine reading it stays until the read returns, after Run has.
func (c *Client) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	return c.run(ctx, cmd, nil)
}

// run is Run, on a terminal when term is not nil (RunTerminal).
func (c *Client) run(ctx context.Context, cmd workspace.Command, term *workspace.Terminal) (workspace.Result, error) {
	if err := ctx.Err(); err != nil {
		return workspace.Result{}, err
	}
	req := request{Op: opRun, Name: cmd.Dir, Run: &runRequest{
		Script: cmd.Script, Argv: cmd.Argv, Dir: cmd.Dir, Env: cmd.Env, Timeout: cmd.Timeout, Stdin: cmd.Stdin != nil,
		Combined: cmd.Combined,
	}}
	if term != nil {
		size := term.Size
		if term.Resize != nil {
			size = term.Resize.Opening(size) // a size asked for before the start
		}
		req.Op, req.Pty = opPty, &ptyRequest{Rows: size.Rows, Cols: size.Cols}
	}
	call := newCall(req.Op, cmd.Dir, 0)
	q := newOutQueue()
	call.onData = q.push
	call.onEnd = q.close
	pumpCtx, stopPump := context.WithCancel(context.Background())
	defer stopPump()
	if cmd.Stdin != nil {
		call.stdin = newCreditGate(pumpCtx, window)
	}
	if err := c.start(call, req, nil); err != nil {
		return workspace.Result{}, err
	}
	if term != nil && term.Resize != nil {
		c.attachResize(call, term.Resize)
		defer term.Resize.Detach()
	}
	c.watch(call, deadline(ctx, cmd.Timeout))
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		for {
			chunk, ok := q.pop()
			if !ok {
				return
			}
			if cmd.Output != nil {
				cmd.Output(chunk.stream, chunk.p)
			}
			q.delivered(len(chunk.p))
			c.sendWindow(call.id, len(chunk.p))
		}
	}()
	if cmd.Stdin != nil {
		go c.pumpStdin(pumpCtx, call, cmd.Stdin)
	}

	var r reply
	select {
	case r = <-call.reply:
	case <-ctx.Done():
		go c.send(frameCancel, 0, call.id, nil, nil)
		grace := time.NewTimer(c.opts.cancelGrace)
		select {
		case r = <-call.reply:
		case <-grace.C:
			// The agent did not report the tree killed: return now; if it
			// does not answer within the hang grace either, it is hung and
			// the command runs on unbounded, so it is hung up.
			c.abandon(call, ctx.Err())
			r = <-call.reply
		}
		grace.Stop()
	}
	stopPump()
	<-delivered
	var res workspace.Result
	if r.err == nil && len(r.body) > 0 {
		var err error
		if res, err = decodeResult(r.body); err != nil {
			return workspace.Result{}, badReply(req.Op, cmd.Dir, err)
		}
	}
	switch {
	case ctx.Err() != nil:
		return res, ctx.Err()
	case r.err != nil:
		return res, r.err
	case r.header.Err != nil:
		return workspace.Result{}, r.header.Err.decode(req.Op, cmd.Dir)
	}
	return res, nil
}

// pumpStdin sends a command's input as credit allows, then its end. A read
// error other than io.EOF ends the input too.
func (c *Client) pumpStdin(ctx context.Context, call *call, stdin io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n := call.stdin.take(len(buf))
		if n == 0 {
			return // the call is over
		}
		m, err := stdin.Read(buf[:n])
		call.stdin.grant(n - m)
		if ctx.Err() != nil {
			return
		}
		if m > 0 && c.send(frameData, 0, call.id, nil, buf[:m]) != nil {
			return
		}
		if err != nil {
			c.send(frameData, flagEnd, call.id, nil, nil)
			return
		}
	}
}

// outChunk is a piece of a command's output.
type outChunk struct {
	stream workspace.Stream
	p      []byte
}

// outQueue holds a command's output between the read loop and Output; the
// agent's credit bounds it to the window.
type outQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks []outChunk
	bytes  int // queued or being delivered: credit not yet returned
	closed bool
}

func newOutQueue() *outQueue {
	q := &outQueue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *outQueue) push(f frame) error {
	s := workspace.Stdout
	if f.flags&flagStderr != 0 {
		s = workspace.Stderr
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.bytes+len(f.payload) > window {
		return fmt.Errorf("%w: output over the window", errFrame)
	}
	if len(f.payload) > 0 {
		q.chunks = append(q.chunks, outChunk{s, f.payload})
		q.bytes += len(f.payload)
		q.cond.Signal()
	}
	return nil
}

func (q *outQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Signal()
	q.mu.Unlock()
}

// pop returns the next chunk, or false once the queue is closed and empty.
func (q *outQueue) pop() (outChunk, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.chunks) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.chunks) == 0 {
		return outChunk{}, false
	}
	ch := q.chunks[0]
	q.chunks[0] = outChunk{}
	q.chunks = q.chunks[1:]
	return ch, true
}

// delivered returns n bytes of credit.
func (q *outQueue) delivered(n int) {
	q.mu.Lock()
	q.bytes -= n
	q.mu.Unlock()
}
