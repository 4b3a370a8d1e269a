// Package memory is the [backend.Backend] of workspaces held in the
// daemon's memory: each is a [memfs.FS] rooted at /workspace, and its
// commands run through [memexec], in a private host directory kept in step
// with the tree both ways. For development and tests: there is no isolation
// beyond the file system's confinement, and nothing survives the daemon.
package memory

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/memexec"
	"github.com/sandboxd/sandboxd/memfs"
)

// Backend is the backend of workspaces held in the daemon's memory (package
// memfs), rooted at /workspace. Commands run through memexec: in a private
// host directory mirrored to and from the memory tree, on the host as the
// daemon's user — no isolation beyond the file system's confinement. For
// development and tests; nothing survives the daemon.
type Backend struct {
	// TempDir is where memexec makes its private directories (default
	// os.TempDir()).
	TempDir string
}

var _ backend.Warmer = Backend{}

// Name returns "memory".
func (Backend) Name() string { return "memory" }

// Open returns a new workspace bounded by spec.MaxBytes: empty, or a copy
// of spec.Source. Its umask is 0, so the modes commands give files are kept
// exactly (the tools ask for 0644 and 0755 themselves).
func (m Backend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	opts := []memfs.Option{memfs.WithMaxBytes(spec.MaxBytes), memfs.WithUmask(0)}
	if spec.Source == "" {
		return m.open(memfs.New(opts...), spec)
	}
	fsys, err := memfs.FromDir(ctx, spec.Source, opts...)
	if err != nil {
		return nil, fmt.Errorf("memory backend: copying %s: %w", spec.Source, err)
	}
	return m.open(fsys, spec)
}

// Warm is Open: a memory workspace belongs to no session until claimed.
func (m Backend) Warm(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	spec.Source = ""
	return m.Open(ctx, spec)
}

func (m Backend) open(fsys *memfs.FS, spec backend.Spec) (*backend.Instance, error) {
	sh, err := memexec.New(fsys, memexec.WithTempDir(m.TempDir), memexec.WithRootVars("SANDBOXD_WORKSPACE"),
		memexec.WithExec(localexec.WithEnvAllow(spec.EnvAllow), localexec.WithInheritEnv(spec.InheritEnv)))
	if err != nil {
		return nil, fmt.Errorf("memory backend: %w", err)
	}
	return &backend.Instance{FS: fsys, Bash: sh, Root: fsys.Root(), ID: sh.Root(), Close: func(context.Context) error { return sh.Close() }}, nil
}

// Reap has nothing to do: memory does not outlive the process. (memexec's
// private directories of a crashed daemon stay in TempDir.)
func (Backend) Reap(context.Context, map[string]string) (int, error) { return 0, nil }
