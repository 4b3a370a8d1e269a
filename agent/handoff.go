package agent

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/workspace"
)

// Handoff asks the agent to listen on addr — a loopback address and port of
// its world, as for Accept — and to pass each connection it accepts there,
// as a file descriptor (SCM_RIGHTS), to the Unix socket at socket, a path in
// its world where a HandoffListener listens. The connections then bypass
// the stream: whoever holds the listener reads and writes the program's
// socket itself, at the kernel's speed. It is the fast path of a session's
// egress where the daemon shares a host with the agent (a directory of the
// daemon's, bind-mounted into the container); Accept is the path that works
// everywhere.
//
// Each message the agent sends there carries token (the listener's,
// HandoffListener.Token), so that the listener takes no other.
//
// Handoff returns once the agent listens and has reached the socket once;
// it fails with workspace.ErrInvalidArgument for an address that is not
// loopback or a socket path that is not absolute, and with
// workspace.ErrUnavailable when the agent cannot reach the socket (the
// directory is not shared with it, say) — then nothing listens, and Accept
// may be used instead. The agent hands connections off until the stream
// ends. A stream listens on one address, for Accept or for Handoff.
func (c *Client) Handoff(ctx context.Context, addr, socket string, token []byte) error {
	_, err := c.roundTrip(ctx, request{Op: opHandoff, Name: addr, Addr: addr, Socket: socket, Token: token}, nil, 0)
	return err
}

// handoff serves a Handoff call.
func (c *serverConn) handoff(call *serverCall) error {
	socket := call.req.Socket
	if !filepath.IsAbs(socket) {
		return &RemoteError{Kind: workspace.ErrInvalidArgument, Msg: fmt.Sprintf("handoff: %q is not an absolute path", socket)}
	}
	if err := loopbackAddr(opHandoff, call.req.Addr); err != nil {
		return err
	}
	// The socket is reached before anything listens: a daemon whose
	// directory is not this world's hears so at once, and falls back. The
	// probe carries the token with no descriptor: it tells the listener
	// which process the agent is.
	if err := sendMsg(socket, call.req.Token, nil); err != nil {
		return &RemoteError{Kind: workspace.ErrUnavailable, Msg: "handoff: " + err.Error()}
	}
	a, err := c.acceptorFor(call.req.Addr)
	if err != nil {
		return err
	}
	c.wg.Go(func() {
		for {
			select {
			case conn := <-a.conns:
				if err := passConn(conn, socket, call.req.Token); err != nil {
					c.s.opts.log.Warn("agent: handoff of a connection failed", "remote", conn.RemoteAddr().String(), "err", err)
				}
			case <-a.failed:
				return
			case <-c.ctx.Done():
				return
			}
		}
	})
	return nil
}

// passConn sends conn's descriptor to the Unix socket at socket, with
// token, then closes the agent's copy: from then on the connection is the
// receiver's.
func passConn(conn net.Conn, socket string, token []byte) error {
	defer conn.Close()
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return fmt.Errorf("a %T has no descriptor", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = sendMsg(socket, token, syscall.UnixRights(int(fd))) }); err != nil {
		return err
	}
	return serr
}

// sendMsg sends one message, token and rights, to the Unix socket at
// socket, on a connection of its own.
func sendMsg(socket string, token, rights []byte) error {
	u, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return err
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(handoffTimeout))
	if len(token) == 0 {
		token = []byte{0} // a message carries a byte at least
	}
	_, _, err = u.WriteMsgUnix(token, rights, nil)
	return err
}

// handoffTimeout bounds each handoff: one connection's descriptor sent, or
// received.
const handoffTimeout = 10 * time.Second

// HandoffListener receives the connections an agent hands off (Handoff) on
// a Unix socket. Anyone in the agent's world may connect there, and what
// arrives is as untrusted as the agent: a message is taken only when it
// carries the listener's token (Token, given to the agent over its stream)
// and at most one descriptor (any others are closed), and only a connected
// TCP socket is accepted — anything else is closed and dropped. The
// process that sent the token (the agent's probe) is the only peer heard
// from then on, where the peer's pid can be read (SO_PEERCRED): any other
// is closed at once, unread. Up to handoffReaders messages are read at
// once, each within a deadline (handoffTimeout), so a peer that connects
// and sends nothing holds up no handoff behind it, and the daemon holds a
// bounded number of such peers.
type HandoffListener struct {
	ln      *net.UnixListener
	ctx     context.Context // ends when Close is called
	cancel  context.CancelFunc
	token   []byte
	agent   atomic.Int64  // the pid that sent the token first, or 0
	readers chan struct{} // messages being read
	conns   chan net.Conn
	closed  chan struct{}
	done    chan struct{} // closed when serve returns
	err     error         // why serve returned, once done is closed
	once    sync.Once
}

// handoffReaders bounds the messages a HandoffListener reads at once.
const handoffReaders = 8

// handoffTokenBytes is the size of a listener's token.
const handoffTokenBytes = 32

// ListenHandoff listens on a new Unix socket at path, which any user of the
// agent's world may connect to (its mode is 0666: the directory holding it
// is what keeps others out). Close removes it.
func ListenHandoff(path string) (*HandoffListener, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	l := &HandoffListener{ln: ln, readers: make(chan struct{}, handoffReaders), conns: make(chan net.Conn), closed: make(chan struct{}), done: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.token = make([]byte, handoffTokenBytes)
	rand.Read(l.token)
	go l.serve()
	return l, nil
}

// Token is what each message must carry: give it to the agent's Handoff.
func (l *HandoffListener) Token() []byte { return slices.Clone(l.token) }

func (l *HandoffListener) serve() {
	var wg sync.WaitGroup
	defer close(l.done)
	defer wg.Wait()
	for {
		u, err := l.ln.AcceptUnix()
		if err != nil {
			l.err = err
			return
		}
		pid, known := peerPID(u)
		if agent := l.agent.Load(); agent != 0 && known && int64(pid) != agent {
			u.Close() // not the agent's process: unread
			continue
		}
		select {
		case l.readers <- struct{}{}:
		case <-l.closed:
			u.Close()
			l.err = net.ErrClosed
			return
		}
		wg.Go(func() {
			defer func() { <-l.readers }()
			stop := context.AfterFunc(l.ctx, func() { u.Close() }) // Close does not wait for a slow peer
			defer stop()
			conn, ok, _ := receiveConn(u, l.token)
			u.Close()
			if ok && known && pid > 0 {
				l.agent.CompareAndSwap(0, int64(pid))
			}
			if conn == nil {
				return // a probe, or something that is not a connection
			}
			select {
			case l.conns <- conn:
			case <-l.closed:
				conn.Close()
			}
		})
	}
}

// errNotConn says what a handoff carried is not a connected TCP socket.
var errNotConn = errors.New("handoff: not a connected TCP socket")

// receiveConn reads one message from u and returns whether it carried
// token and, if so, the connection it carries: none, and no error, for a
// message with no descriptor. The descriptors of a message without token,
// and all but the first of one with it, are closed.
func receiveConn(u *net.UnixConn, token []byte) (conn net.Conn, ok bool, err error) {
	u.SetDeadline(time.Now().Add(handoffTimeout))
	buf := make([]byte, len(token)+1)
	oob := make([]byte, syscall.CmsgSpace(4))
	n, oobn, _, _, err := u.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, false, err
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, false, err
	}
	var fds []int
	for _, m := range msgs {
		if got, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	ok = n == len(token) && subtle.ConstantTimeCompare(buf[:n], token) == 1
	keep := 1
	if !ok {
		keep = 0
	}
	for _, fd := range fds[min(keep, len(fds)):] {
		syscall.Close(fd)
	}
	switch {
	case !ok:
		return nil, false, errNoToken
	case len(fds) == 0:
		return nil, true, nil
	}
	conn, err = fileConn(fds[0])
	return conn, true, err
}

// errNoToken says a message did not carry the listener's token.
var errNoToken = errors.New("handoff: a message without the listener's token")

// fileConn takes fd, which must be a connected TCP socket, as a
// connection; it closes fd either way.
func fileConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "handoff")
	defer f.Close()
	if listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || listening != 0 {
		return nil, errNotConn
	}
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	tc, ok := conn.(*net.TCPConn)
	if ra, _ := conn.RemoteAddr().(*net.TCPAddr); !ok || ra == nil {
		conn.Close()
		return nil, errNotConn
	}
	return tc, nil
}

// Accept waits for the next connection handed off, until ctx ends or the
// listener is closed (net.ErrClosed). The connection is a *net.TCPConn:
// the program's own socket.
func (l *HandoffListener) Accept(ctx context.Context) (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("handoff: %w", l.err)
	case <-l.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops listening and removes the socket. Connections already
// accepted are the caller's to close.
func (l *HandoffListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.closed)
		l.cancel()
		err = l.ln.Close()
	})
	return err
}
