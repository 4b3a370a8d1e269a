// Package dockerfs is a session container's [workspace.FileSystem]: the
// sandboxd agent's client (package agent), bound to the container
// [dockerexec.Start] made, which serves the FileSystem and every extension
// over the one stream dockerexec attached to the container's PID 1. It adds
// nothing to the client but that binding and the root; the calls are
// carried out in the container on /workspace with the agent's
// traversal-resistant confinement (links are followed only inside the
// workspace, resolution and use are one step). A call costs one round trip
// on an open stream, well under a millisecond; it never runs docker exec or
// touches the archive API.
//
//	c, err := dockerexec.Start(ctx, cli, spec)
//	fsys := dockerfs.New(c)
//	data, err := fsys.ReadFile(ctx, "go.mod", 1<<20)
//
// Everything the agent answers is treated as untrusted by the agent client:
// sizes are bounded, names checked, and a garbled stream makes the FileSystem
// unavailable ([workspace.ErrUnavailable]), never panics.
package dockerfs

import (
	"context"
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
// [workspace.FileSystem] for what each guarantees).
type FS struct {
	agentFS
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
	return &FS{agentFS: c.Agent()}
}

// Root is the workspace root as commands in the container see it.
func (f *FS) Root() string { return policy.WorkspaceDir }
