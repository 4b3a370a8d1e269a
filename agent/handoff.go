package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
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
// Handoff returns once the agent listens and has reached the socket once;
// it fails with workspace.ErrInvalidArgument for an address that is not
// loopback or a socket path that is not absolute, and with
// workspace.ErrUnavailable when the agent cannot reach the socket (the
// directory is not shared with it, say) — then nothing listens, and Accept
// may be used instead. The agent hands connections off until the stream
// ends. A stream listens on one address, for Accept or for Handoff.
func (c *Client) Handoff(ctx context.Context, addr, socket string) error {
	_, err := c.roundTrip(ctx, request{Op: opHandoff, Name: addr, Addr: addr, Socket: socket}, nil, 0)
	return err
}

// handoff serves a Handoff call.
func (c *serverConn) handoff(call *serverCall) error {
	socket := call.req.Socket
	if !filepath.IsAbs(socket) {
		return &RemoteError{Kind: workspace.ErrInvalidArgument, Msg: fmt.Sprintf("handoff: %q is not an absolute path", socket)}
	}
	if err := loopbackAddr(call.req.Addr); err != nil {
		return err
	}
	// The socket is reached before anything listens: a daemon whose
	// directory is not this world's hears so at once, and falls back.
	probe, err := net.Dial("unix", socket)
	if err != nil {
		return &RemoteError{Kind: workspace.ErrUnavailable, Msg: "handoff: " + err.Error()}
	}
	probe.Close()
	a, err := c.acceptorFor(call.req.Addr)
	if err != nil {
		return err
	}
	c.wg.Go(func() {
		for {
			select {
			case conn := <-a.conns:
				if err := passConn(conn, socket); err != nil {
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

// passConn sends conn's descriptor to the Unix socket at socket, then
// closes the agent's copy: from then on the connection is the receiver's.
func passConn(conn net.Conn, socket string) error {
	defer conn.Close()
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return fmt.Errorf("a %T has no descriptor", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	u, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return err
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(handoffTimeout))
	var werr error
	if err := raw.Control(func(fd uintptr) {
		_, _, werr = u.WriteMsgUnix([]byte{0}, syscall.UnixRights(int(fd)), nil)
	}); err != nil {
		return err
	}
	return werr
}

// handoffTimeout bounds each handoff: one connection's descriptor sent, or
// received.
const handoffTimeout = 10 * time.Second

// HandoffListener receives the connections an agent hands off (Handoff) on
// a Unix socket. What arrives there is as untrusted as the agent: each
// message is taken for at most one descriptor (any others are closed), and
// only a connected TCP socket is accepted — anything else is closed and
// dropped. Messages are taken one at a time, each within a deadline, so a
// program that connects and sends nothing delays only its own session's
// connections, never the daemon.
type HandoffListener struct {
	ln     *net.UnixListener
	conns  chan net.Conn
	closed chan struct{}
	done   chan struct{} // closed when serve returns
	err    error         // why serve returned, once done is closed
	once   sync.Once
}

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
	l := &HandoffListener{ln: ln, conns: make(chan net.Conn), closed: make(chan struct{}), done: make(chan struct{})}
	go l.serve()
	return l, nil
}

func (l *HandoffListener) serve() {
	defer close(l.done)
	for {
		u, err := l.ln.AcceptUnix()
		if err != nil {
			l.err = err
			return
		}
		conn, _ := receiveConn(u)
		u.Close()
		if conn == nil {
			continue // a probe, or something that is not a connection
		}
		select {
		case l.conns <- conn:
		case <-l.closed:
			conn.Close()
			l.err = net.ErrClosed
			return
		}
	}
}

// errNotConn says what a handoff carried is not a connected TCP socket.
var errNotConn = errors.New("handoff: not a connected TCP socket")

// receiveConn reads one message from u and returns the connection it
// carries; nil, without an error, for a message with no descriptor.
func receiveConn(u *net.UnixConn) (net.Conn, error) {
	u.SetDeadline(time.Now().Add(handoffTimeout))
	var buf [1]byte
	oob := make([]byte, syscall.CmsgSpace(4))
	_, oobn, _, _, err := u.ReadMsgUnix(buf[:], oob)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if got, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) == 0 {
		return nil, nil
	}
	for _, fd := range fds[1:] {
		syscall.Close(fd)
	}
	f := os.NewFile(uintptr(fds[0]), "handoff")
	defer f.Close()
	if listening, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || listening != 0 {
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
		err = l.ln.Close()
	})
	return err
}
