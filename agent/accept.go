package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// Listen makes the agent listen on addr as the first Accept does, and
// returns once it listens: from then on a program's connection to addr waits
// in the listen backlog for an Accept, where before Listen it would be
// refused. A caller that hands the workspace to programs right after
// starting its Accept loop calls Listen first, so that no program connects
// before anything listens. It fails as Accept does for an address that is
// not loopback or not the one the stream listens on.
func (c *Client) Listen(ctx context.Context, addr string) error {
	_, err := c.roundTrip(ctx, request{Op: opListen, Name: addr, Addr: addr}, nil, 0)
	return err
}

// acceptHeader is the header of the first Data frame of an Accept call: the
// agent accepted a connection.
type acceptHeader struct {
	Remote string `json:"remote,omitempty"` // the connecting program's address
}

// Accept waits until a program in the agent's world connects to addr — a
// loopback address and port, such as "127.0.0.1:3128", that the agent
// listens on from the first Accept on, until its stream ends — and returns
// that connection: what the program writes is read from the returned
// net.Conn, and what is written to it the program reads. Each direction is
// flow-controlled on its own, so a side that does not read holds up only
// its own connection. Connections that arrive while no Accept waits queue
// in the agent's listen backlog. CloseWrite (the conn is a *Conn) ends
// what the program reads; Close ends the connection, in the agent too once
// the program has read what was written (see Linger).
//
// Accept fails with ctx's error when ctx ends first (a connection the
// agent accepted just as ctx ended is closed), with
// workspace.ErrInvalidArgument for an address that is not loopback, and
// with workspace.ErrUnavailable once the stream is broken. The agent is
// as untrusted here as anywhere: what it sends is bounded by the window,
// and nothing it sends is taken for more than the program's bytes.
func (c *Client) Accept(ctx context.Context, addr string) (net.Conn, error) {
	return c.open(ctx, opAccept, addr)
}

// open starts a call of op (accept or dial) on addr and returns its
// connection once the agent's first Data frame says it has one.
func (c *Client) open(ctx context.Context, op, addr string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	call := newCall(op, addr, 0)
	connCtx, end := context.WithCancel(context.Background())
	t := &Conn{c: c, call: call, op: op, addr: addr, end: end, done: connCtx.Done(), accepted: make(chan struct{})}
	t.cond = sync.NewCond(&t.mu)
	t.rdl.init(&t.mu, t.cond)
	t.wdl.init(&t.mu, t.cond)
	call.onData = t.push
	call.onEnd = t.ended
	call.stdin = newCreditGate(connCtx, window)
	if err := c.start(call, request{Op: op, Name: addr, Addr: addr}, nil); err != nil {
		end()
		return nil, err
	}
	select {
	case <-t.accepted:
		return t, nil
	case r := <-call.reply:
		select {
		case <-t.accepted: // a connection that came and went at once
			return t, nil
		default:
		}
		switch {
		case r.err != nil:
			return nil, r.err
		case r.header.Err != nil:
			return nil, r.header.Err.decode(op, addr)
		}
		return nil, badReply(op, addr, fmt.Errorf("%s ended before a connection came", op))
	case <-ctx.Done():
		c.abandon(call, ctx.Err())
		return nil, ctx.Err()
	}
}

// Conn is a connection accepted (Client.Accept) or dialled
// (Client.Dial) in the agent. It is safe for concurrent use, as a net.Conn
// is.
type Conn struct {
	c        *Client
	call     *call
	op       string // accept or dial
	addr     string
	remote   string
	end      context.CancelFunc // ends the write credit: the call is over
	done     <-chan struct{}    // closed when the call is over
	accepted chan struct{}

	mu       sync.Mutex
	cond     *sync.Cond
	chunks   [][]byte // what the program sent, not yet read
	queued   int      // bytes in chunks
	unacked  int      // bytes read but not yet granted back
	eof      bool     // the program's direction has ended
	over     bool     // the call has ended
	closed   bool     // Close was called
	shutWr   bool     // CloseWrite was called
	rdl, wdl connDeadline
}

var _ net.Conn = (*Conn)(nil)

// push takes a Data frame of the call, on the client's read loop.
func (t *Conn) push(f frame) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.accepted:
	default:
		var h acceptHeader
		if len(f.payload) > 0 || len(f.header) > 0 && json.Unmarshal(f.header, &h) != nil {
			return fmt.Errorf("%w: %s %s: a bad first frame", errFrame, t.op, t.addr)
		}
		t.remote = clip(h.Remote)
		close(t.accepted)
		return nil
	}
	switch {
	case t.eof:
		return fmt.Errorf("%w: %s %s: data after its end", errFrame, t.op, t.addr)
	case t.queued+t.unacked+len(f.payload) > window:
		return fmt.Errorf("%w: %s %s: data over the window", errFrame, t.op, t.addr)
	}
	if len(f.payload) > 0 {
		t.chunks = append(t.chunks, f.payload)
		t.queued += len(f.payload)
	}
	t.eof = f.flags&flagEnd != 0
	t.cond.Broadcast()
	return nil
}

// ended runs once when the call leaves the client's table.
func (t *Conn) ended() {
	t.end()
	t.mu.Lock()
	t.over = true
	t.cond.Broadcast()
	t.mu.Unlock()
}

// grantEvery is how many bytes a reader takes before it grants them back
// (sooner when it has read everything queued).
const grantEvery = 64 << 10

// Read reads what the program sent. After the program's end it returns
// io.EOF; once the connection is over otherwise (Close, a broken stream)
// it fails with net.ErrClosed or io.ErrUnexpectedEOF.
func (t *Conn) Read(p []byte) (int, error) {
	t.mu.Lock()
	for t.queued == 0 && !t.eof && !t.over && !t.closed && !t.rdl.passed() {
		t.cond.Wait()
	}
	switch {
	case t.closed:
		t.mu.Unlock()
		return 0, t.opError("read", net.ErrClosed)
	case t.queued == 0 && t.eof:
		t.mu.Unlock()
		return 0, io.EOF
	case t.queued == 0 && t.over:
		t.mu.Unlock()
		return 0, t.opError("read", io.ErrUnexpectedEOF)
	case t.queued == 0:
		t.mu.Unlock()
		return 0, t.opError("read", os.ErrDeadlineExceeded)
	}
	n := 0
	for n < len(p) && len(t.chunks) > 0 {
		k := copy(p[n:], t.chunks[0])
		n += k
		if t.chunks[0] = t.chunks[0][k:]; len(t.chunks[0]) == 0 {
			t.chunks[0] = nil
			t.chunks = t.chunks[1:]
		}
	}
	t.queued -= n
	t.unacked += n
	grant := 0
	if t.unacked >= grantEvery || t.queued == 0 {
		grant, t.unacked = t.unacked, 0
	}
	id, live := t.call.id, !t.over && !t.eof
	t.mu.Unlock()
	if grant > 0 && live {
		t.c.sendWindow(id, grant)
	}
	return n, nil
}

// Write sends p to the program, as the agent grants credit.
func (t *Conn) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		t.mu.Lock()
		err := t.writable()
		wctx := t.wdl.context()
		t.mu.Unlock()
		if err != nil {
			return written, t.opError("write", err)
		}
		n := t.call.stdin.takeCtx(wctx, min(len(p), chunkSize))
		if n == 0 {
			t.mu.Lock()
			err := t.writable()
			t.mu.Unlock()
			return written, t.opError("write", cmpErr(err, os.ErrDeadlineExceeded))
		}
		if err := t.c.send(frameData, 0, t.call.id, nil, p[:n]); err != nil {
			return written, t.opError("write", err)
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// writable says why the connection cannot be written; t.mu is held.
func (t *Conn) writable() error {
	switch {
	case t.closed, t.over:
		return net.ErrClosed
	case t.shutWr:
		return errors.New("write after CloseWrite")
	}
	return nil
}

// CloseWrite ends what the program reads (it sees the end of its input);
// the program's direction stays open.
func (t *Conn) CloseWrite() error {
	t.mu.Lock()
	err := t.writable()
	t.shutWr = true
	t.mu.Unlock()
	if err != nil {
		return t.opError("close", err)
	}
	return t.c.send(frameData, flagEnd, t.call.id, nil, nil)
}

// Close ends the connection. What was written is still delivered: the
// program reads it and then the end of its input, and the agent closes its
// connection once the program has closed its side too, or Linger after
// Close at the latest.
func (t *Conn) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return t.opError("close", net.ErrClosed)
	}
	t.closed = true
	shut := t.shutWr || t.over
	t.shutWr = true
	t.cond.Broadcast()
	t.mu.Unlock()
	if !shut {
		t.c.send(frameData, flagEnd, t.call.id, nil, nil)
	}
	go func() {
		timer := time.NewTimer(Linger)
		defer timer.Stop()
		select {
		case <-t.done:
		case <-timer.C:
		}
		t.c.abandon(t.call, net.ErrClosed)
	}()
	return nil
}

// Linger is how long after Close a connection's program may take to close
// its side before the agent closes it.
const Linger = 10 * time.Second

func (t *Conn) opError(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "agent", Source: t.LocalAddr(), Addr: t.RemoteAddr(), Err: err}
}

// LocalAddr is the address the agent accepted the connection on; of a
// dialled connection, the agent's end, as the agent reported it.
func (t *Conn) LocalAddr() net.Addr {
	if t.op == opDial {
		return agentAddr(t.remote)
	}
	return agentAddr(t.addr)
}

// RemoteAddr is the connecting program's address, as the agent reported
// it; of a dialled connection, the address dialled.
func (t *Conn) RemoteAddr() net.Addr {
	if t.op == opDial {
		return agentAddr(t.addr)
	}
	return agentAddr(t.remote)
}

// agentAddr is an address in the agent's world.
type agentAddr string

func (a agentAddr) Network() string { return "agent" }
func (a agentAddr) String() string  { return string(a) }

// SetDeadline sets both deadlines.
func (t *Conn) SetDeadline(d time.Time) error {
	t.SetReadDeadline(d)
	return t.SetWriteDeadline(d)
}

// SetReadDeadline makes a Read waiting at d fail with os.ErrDeadlineExceeded.
func (t *Conn) SetReadDeadline(d time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rdl.set(d)
	return nil
}

// SetWriteDeadline makes a Write waiting for credit at d fail with
// os.ErrDeadlineExceeded.
func (t *Conn) SetWriteDeadline(d time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wdl.set(d)
	return nil
}

// connDeadline is a net.Conn deadline over a condition variable: when it
// passes, waiters are woken, and context is a context that ends then.
type connDeadline struct {
	mu     *sync.Mutex
	cond   *sync.Cond
	at     time.Time
	timer  *time.Timer
	ctx    context.Context
	cancel context.CancelFunc
}

func (d *connDeadline) init(mu *sync.Mutex, cond *sync.Cond) { d.mu, d.cond = mu, cond }

// set moves the deadline; d.mu is held.
func (d *connDeadline) set(at time.Time) {
	d.at = at
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if d.cancel != nil {
		d.cancel()
		d.ctx, d.cancel = nil, nil
	}
	if !at.IsZero() {
		d.timer = time.AfterFunc(time.Until(at), func() {
			d.mu.Lock()
			d.cond.Broadcast()
			d.mu.Unlock()
		})
	}
	d.cond.Broadcast()
}

func (d *connDeadline) passed() bool { return !d.at.IsZero() && !time.Now().Before(d.at) }

// context ends at the deadline; d.mu is held.
func (d *connDeadline) context() context.Context {
	if d.at.IsZero() {
		return context.Background()
	}
	if d.ctx == nil {
		d.ctx, d.cancel = context.WithDeadline(context.Background(), d.at)
	}
	return d.ctx
}

// loopbackAddr checks that addr is a loopback IP address and a port; op
// names the call in its error.
func loopbackAddr(op, addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
		return &RemoteError{Kind: workspace.ErrInvalidArgument, Msg: fmt.Sprintf("%s: %q is not a loopback address and port", op, addr)}
	}
	return nil
}

// acceptor is a stream's listener and the connections it accepted that no
// call has taken yet.
type acceptor struct {
	addr   string
	conns  chan net.Conn
	failed chan struct{} // closed when the listener fails
	err    error         // why, once failed is closed
}

// acceptorFor returns the stream's listener on addr, listening from the
// first call on until the stream ends; a stream listens on one address.
func (c *serverConn) acceptorFor(addr string) (*acceptor, error) {
	if err := loopbackAddr(opAccept, addr); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.acceptor; a != nil {
		if a.addr != addr {
			return nil, &RemoteError{Kind: workspace.ErrInvalidArgument, Msg: fmt.Sprintf("accept: this stream listens on %s, not %s", a.addr, addr)}
		}
		return a, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &RemoteError{Kind: workspace.ErrUnavailable, Msg: "accept: " + err.Error()}
	}
	a := &acceptor{addr: addr, conns: make(chan net.Conn), failed: make(chan struct{})}
	c.acceptor = a
	context.AfterFunc(c.ctx, func() { ln.Close() })
	c.wg.Add(1) // the caller is a call, counted: Serve is not yet waiting
	go func() {
		defer c.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				a.err = err
				close(a.failed)
				return
			}
			select {
			case a.conns <- conn:
			case <-c.ctx.Done():
				conn.Close()
			}
		}
	}()
	return a, nil
}

// accept serves an Accept call: it waits for a connection, then carries it
// until both directions have ended, or the call is cancelled.
func (c *serverConn) accept(call *serverCall) error {
	a, err := c.acceptorFor(call.req.Addr)
	if err != nil {
		return err
	}
	var conn net.Conn
	select {
	case <-a.failed:
		return &RemoteError{Kind: workspace.ErrUnavailable, Msg: "accept: " + a.err.Error()}
	case conn = <-a.conns:
		if call.ctx.Err() != nil { // cancelled meanwhile: the next call takes it
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				select {
				case a.conns <- conn:
				case <-c.ctx.Done():
					conn.Close()
				}
			}()
			return call.ctx.Err()
		}
	case <-call.ctx.Done():
		return call.ctx.Err()
	}
	return c.carry(call, conn, conn.RemoteAddr().String())
}

// carry serves a connection of an accept or dial call until both
// directions have ended, or the call is cancelled: its first Data frame
// names the other end (end), then what the program sends goes out in Data
// frames and what the client sends comes in, each under the window.
func (c *serverConn) carry(call *serverCall, conn net.Conn, end string) error {
	defer conn.Close()
	stop := context.AfterFunc(call.ctx, func() { conn.Close() })
	defer stop()
	h, _ := json.Marshal(acceptHeader{Remote: end})
	if err := c.send(frameData, 0, call.id, h, nil); err != nil {
		return err
	}
	input := make(chan struct{})
	go func() { // what the client sends, to the program
		defer close(input)
		if _, err := io.CopyBuffer(conn, call.in, make([]byte, chunkSize)); err != nil {
			conn.Close()
		} else if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	buf := make([]byte, chunkSize)
	for {
		n, err := conn.Read(buf)
		for p := buf[:n]; len(p) > 0; {
			k := call.out.take(len(p))
			if k == 0 || c.send(frameData, 0, call.id, nil, p[:k]) != nil {
				conn.Close()
				break
			}
			p = p[k:]
		}
		if err != nil {
			break
		}
	}
	c.send(frameData, flagEnd, call.id, nil, nil)
	<-input
	return nil
}
