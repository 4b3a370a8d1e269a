// Package local is the [backend.Backend] of workspaces on the host's disk:
// files through [localfs] (on [os.Root]), commands on the host as the
// daemon's user through [localexec]. [Backend] gives each session a fresh
// directory; [Dir] is one existing directory worked on in place. There is
// no isolation beyond path confinement: for development, and for one user's
// own project.
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
)

// Backend is the backend of workspaces on the host's disk: each session gets
// a fresh directory under Dir, removed when the session ends, and its
// commands run on the host as the daemon's user (package localexec) — no
// isolation beyond path confinement. For development only.
type Backend struct {
	// Dir holds the session directories. It belongs to sandboxd: Reap
	// removes the workspace directories in it whose owner has ended.
	Dir string
}

// ownerSuffix names the file beside a workspace directory that records its
// owner ([backend.Owner.Labels], as JSON): outside the workspace, where no
// command of the session sees or changes it.
const ownerSuffix = ".owner"

var _ backend.Warmer = (*Backend)(nil)

// localPrefix starts the name of every workspace directory Backend makes.
const localPrefix = "ws-"

// Name returns "local".
func (*Backend) Name() string { return "local" }

// Open makes a new empty directory and the ports over it. It refuses a
// spec.Source (use Dir to work on a directory in place).
func (l *Backend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	if spec.Source != "" {
		return nil, errors.New("local backend: a session directory starts empty (no Source)")
	}
	return l.Warm(ctx, spec)
}

// Warm is Open: a directory belongs to no session until claimed.
func (l *Backend) Warm(_ context.Context, spec backend.Spec) (*backend.Instance, error) {
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	dir, err := os.MkdirTemp(l.Dir, localPrefix)
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if owner, ok := backend.OwnerOf(spec.Labels); ok {
		data, _ := json.Marshal(owner.Labels())
		if err := os.WriteFile(dir+ownerSuffix, data, 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("local backend: %w", err)
		}
	}
	fsys, err := localfs.New(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("local backend: %w", err)
	}
	sh, err := localexec.New(dir, localexec.WithEnvAllow(spec.EnvAllow), localexec.WithInheritEnv(spec.InheritEnv))
	if err != nil {
		fsys.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("local backend: %w", err)
	}
	return &backend.Instance{
		FS: fsys, Bash: sh, Root: filepath.ToSlash(dir), ID: dir,
		Close: func(context.Context) error { return errors.Join(fsys.Close(), os.RemoveAll(dir), removeOwner(dir)) },
	}, nil
}

func removeOwner(dir string) error {
	if err := os.Remove(dir + ownerSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Reap removes the workspace directories under Dir that earlier runs left:
// those whose owner has ended ([backend.Owner.Gone]), or that record none.
// Another daemon's living workspaces in the same Dir are left alone.
func (l *Backend) Reap(context.Context, map[string]string) (int, error) {
	entries, err := os.ReadDir(l.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("local backend: reap: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), localPrefix) {
			continue
		}
		dir := filepath.Join(l.Dir, e.Name())
		var labels map[string]string
		if data, err := os.ReadFile(dir + ownerSuffix); err == nil && json.Unmarshal(data, &labels) == nil {
			if o, ok := backend.OwnerOf(labels); ok && !o.Gone() {
				continue
			}
		}
		if err := errors.Join(os.RemoveAll(dir), removeOwner(dir)); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Dir is the backend of one existing host directory, worked on in place:
// every session's workspace is Path itself (its root is Path's absolute
// path), changes are made there, and ending a session leaves the directory
// as the session left it. Commands run on the host as the daemon's user
// (package localexec). It suits one session at a time on a user's own
// project — "sandboxd mcp --backend local" — not a daemon of many tenants.
type Dir struct {
	// Path is the directory. Required.
	Path string
}

var _ backend.Backend = Dir{}

// Name returns "local": it is the local backend of a single directory.
func (Dir) Name() string { return "local" }

// Open returns the ports over Path. It refuses a spec.Source: the
// directory is the workspace.
func (d Dir) Open(_ context.Context, spec backend.Spec) (*backend.Instance, error) {
	if spec.Source != "" {
		return nil, errors.New("local backend: the directory is the workspace (no Source)")
	}
	dir, err := filepath.Abs(d.Path)
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	fsys, err := localfs.New(dir)
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	sh, err := localexec.New(dir, localexec.WithEnvAllow(spec.EnvAllow), localexec.WithInheritEnv(spec.InheritEnv))
	if err != nil {
		fsys.Close()
		return nil, fmt.Errorf("local backend: %w", err)
	}
	return &backend.Instance{
		FS: fsys, Bash: sh, Root: filepath.ToSlash(dir), ID: dir,
		Close: func(context.Context) error { return fsys.Close() },
	}, nil
}

// Reap has nothing to remove: the directory is the user's.
func (Dir) Reap(context.Context, map[string]string) (int, error) { return 0, nil }
