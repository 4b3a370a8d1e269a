package docker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/moby/moby/api/types/mount"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/workspace"
)

// mountHandoff is where a container's handoff directory is mounted,
// read-only (Spec.HandoffDir).
const mountHandoff = "/.sandboxd-handoff"

// handoffSocket is the socket's name in a handoff directory.
const handoffSocket = "s"

// handoffPrefix starts the name of each container's handoff directory.
const handoffPrefix = "h-"

// maxSocketPath is the longest path a Unix socket may have (sun_path less
// its terminating NUL).
const maxSocketPath = 107

// handoffMount makes the container's handoff directory under dir and
// returns its mount; ok is false, and nothing is made, when dir is "" or
// too long a path for a socket in it.
func handoffMount(dir string) (m mount.Mount, hostDir string, ok bool, err error) {
	if dir == "" || len(dir)+len("/"+handoffPrefix+"0123456789/"+handoffSocket) > maxSocketPath {
		return mount.Mount{}, "", false, nil
	}
	// The parent keeps every other user of the host out; the container's
	// own directory lets its session user reach the socket.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return mount.Mount{}, "", false, fmt.Errorf("dockerexec: the handoff directory: %w", err)
	}
	if err := ownDir(dir); err != nil {
		return mount.Mount{}, "", false, err
	}
	hostDir, err = os.MkdirTemp(dir, handoffPrefix)
	if err == nil {
		err = os.Chmod(hostDir, 0o755)
	}
	if err != nil {
		return mount.Mount{}, "", false, fmt.Errorf("dockerexec: the handoff directory: %w", err)
	}
	return mount.Mount{Type: mount.TypeBind, Source: hostDir, Target: mountHandoff, ReadOnly: true}, hostDir, true, nil
}

// ownDir checks that dir is a directory (not a link to one) of the
// daemon's user that no other user may enter: one made by someone else in
// a shared place such as /tmp would let them reach the sockets in it.
func ownDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("dockerexec: the handoff directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("dockerexec: the handoff directory %s must be a directory of the daemon's user (uid %d) that no one else may enter (mode 0700); it is %v, owned by uid %d", dir, os.Geteuid(), fi.Mode(), st.Uid)
	}
	return nil
}

// removeHandoffDir removes a handoff directory that Start made; any other
// path is left alone.
func removeHandoffDir(dir string) error {
	if dir == "" || !strings.HasPrefix(filepath.Base(dir), handoffPrefix) {
		return nil
	}
	return os.RemoveAll(dir)
}

// handoffSourceMissing reports whether the engine refused a container
// because a bind mount's source does not exist on its host: the daemon
// does not share the engine's filesystem (it runs in another container,
// or talks to a remote engine).
func handoffSourceMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "bind source path does not exist")
}

// Accept waits for a program in the container to connect to addr, a
// loopback address and port of the container, and returns the connection
// (see agent.Client.Accept): the path of the session's egress. A container
// started with a handoff directory asks its agent, on the first call, to
// hand each connection to the daemon over a Unix socket there: the
// returned connection is then the program's own socket, and its bytes
// never cross the attach stream. When the agent cannot reach the socket
// (the daemon does not share the engine's filesystem), the connections are
// carried on the stream instead. A container listens on one address.
func (c *Container) Accept(ctx context.Context, addr string) (net.Conn, error) {
	l, err := c.listening(ctx, addr)
	if err != nil {
		return nil, err
	}
	if l != nil {
		return l.Accept(ctx)
	}
	return c.agent.Accept(ctx, addr)
}

// Listen starts what the first Accept starts — the handoff, or else the
// agent's listener for the stream — and returns once programs' connections
// to addr wait for an Accept (agent.Client.Listen).
func (c *Container) Listen(ctx context.Context, addr string) error {
	l, err := c.listening(ctx, addr)
	if err != nil || l != nil {
		return err
	}
	return c.agent.Listen(ctx, addr)
}

// listening starts the handoff on the first call, and returns its listener
// (nil when connections go on the stream).
func (c *Container) listening(ctx context.Context, addr string) (*agent.HandoffListener, error) {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if c.handoffAddr == "" {
		c.handoffAddr = addr
		c.handoff, c.handoffErr = c.startHandoff(ctx, addr)
	}
	if addr != c.handoffAddr {
		return nil, fmt.Errorf("dockerexec: accept on %s: %w: the container listens on %s", addr, workspace.ErrInvalidArgument, c.handoffAddr)
	}
	return c.handoff, nil
}

// Handoff reports whether the container's connections are handed off to
// the daemon (known after the first Accept), and if not, why not (nil
// when the container has no handoff directory).
func (c *Container) Handoff() (bool, error) {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	return c.handoff != nil, c.handoffErr
}

// startHandoff listens in the container's handoff directory and asks the
// agent to hand its connections there; nil when there is no directory or
// the agent cannot reach it.
func (c *Container) startHandoff(ctx context.Context, addr string) (*agent.HandoffListener, error) {
	if c.handoffDir == "" {
		return nil, c.handoffErr
	}
	// A socket a killed daemon left (a resumed container's) is stale:
	// nothing else listens in the container's own directory.
	if err := os.Remove(filepath.Join(c.handoffDir, handoffSocket)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l, err := agent.ListenHandoff(filepath.Join(c.handoffDir, handoffSocket))
	if err != nil {
		return nil, err
	}
	if err := c.agent.Handoff(ctx, addr, mountHandoff+"/"+handoffSocket, l.Token()); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
