// Package dockerfs is the workspace.FileSystem adapter of a sandboxd session
// container: every call goes to the sandboxd agent running as the
// container's PID 1, over the one stream dockerexec attached to it, and is
// carried out there on /workspace with the agent's traversal-resistant
// confinement (links are followed only inside the workspace, resolution and
// use are one step). A call costs one round trip on an open stream, well under
// a millisecond; it never runs docker exec or touches the archive API.
//
//	c, err := dockerexec.Start(ctx, cli, spec)
//	fsys := dockerfs.New(c)
//	data, err := fsys.ReadFile(ctx, "go.mod", 1<<20)
//
// Everything the agent answers is treated as untrusted by the agent client:
// sizes are bounded, names checked, and a garbled stream makes the FileSystem
// unavailable (workspace.ErrUnavailable), never panics.
package dockerfs

import (
	"context"
	"io"
	"io/fs"

	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// agentFS is what the agent client offers: the FileSystem and every
// extension, each in one round trip.
type agentFS interface {
	workspace.SymlinkFS
	MkdirAll(ctx context.Context, name string, perm fs.FileMode) error
	RemoveAll(ctx context.Context, name string) error
	Lock(ctx context.Context, name string) (unlock func(), err error)
	Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error)
	Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error)
	Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error)
}

// FS is the workspace of a session container. It is safe for concurrent use;
// calls in flight share the stream. Its methods are the agent client's (see
// workspace.FileSystem for what each guarantees); FS adds the container's
// bulk copy in and out.
type FS struct {
	agentFS
	c *dockerexec.Container
}

var (
	_ workspace.FileSystem  = (*FS)(nil)
	_ workspace.SymlinkFS   = (*FS)(nil)
	_ workspace.MkdirAllFS  = (*FS)(nil)
	_ workspace.RemoveAllFS = (*FS)(nil)
	_ workspace.LockFS      = (*FS)(nil)
	_ workspace.WalkFS      = (*FS)(nil)
	_ workspace.GrepFS      = (*FS)(nil)
	_ workspace.SwapFS      = (*FS)(nil)
)

// New returns the FileSystem of c's workspace. It lives as long as c: once
// c is closed every call fails with workspace.ErrUnavailable.
func New(c *dockerexec.Container) *FS {
	return &FS{agentFS: c.Agent(), c: c}
}

// Root is the workspace root as commands in the container see it.
func (f *FS) Root() string { return policy.WorkspaceDir }

// Export writes the whole workspace as a tar stream to w (names "./a/b"),
// with the container paused for the copy.
func (f *FS) Export(ctx context.Context, w io.Writer) error { return f.c.Export(ctx, w) }

// Import extracts a tar stream into the workspace, with the container paused;
// owners become the session's user.
func (f *FS) Import(ctx context.Context, r io.Reader) error { return f.c.Import(ctx, r) }
