package runner

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memexec"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// Backend makes the workspaces sessions run in: a hardened container on
// Docker, a directory on local disk, a tree in memory. The tool layer never
// sees a backend, only the Instance's ports, so another one (Kubernetes pods,
// say) is one more implementation of this interface. Implementations must be
// safe for concurrent use.
type Backend interface {
	// Name is the backend's name as configuration spells it ("memory").
	Name() string
	// Open starts a workspace for the session spec names. On failure it
	// leaves nothing behind.
	Open(ctx context.Context, spec Spec) (*Instance, error)
	// Reap removes what earlier runs of this daemon left behind — found by
	// labels, which carry the daemon's name — and reports how many
	// workspaces it removed. A backend that keeps the owner's labels
	// (Owner) removes only what an owner that has ended left; one without
	// labels takes every run's leftovers as dead. It runs once, before the
	// first Open.
	Reap(ctx context.Context, labels map[string]string) (int, error)
}

// Claimer is a Backend that several daemons may share (a Docker engine).
// Claim makes this run the only live one of the daemon spec.Labels name
// (LabelDaemon) on it, until release: it fails with ErrDaemonRunning,
// naming the other, while another run of that daemon may live, and takes
// the place of one that has ended. The Manager claims before it reaps, so
// that reaping never races a living run of its own name.
type Claimer interface {
	Backend
	Claim(ctx context.Context, spec Spec) (release func(context.Context) error, err error)
}

// Warmer is a Backend whose workspaces do not depend on the session they
// serve, so they may be started before a session asks (a warm pool) and
// handed to one later. Warm starts such a workspace for spec with
// spec.Session and spec.Tenant empty; what a session adds (its ID and
// variables) reaches commands through the tool layer, not the workspace.
type Warmer interface {
	Backend
	Warm(ctx context.Context, spec Spec) (*Instance, error)
}

// Spec is what a backend needs to start one workspace.
type Spec struct {
	// Session and Tenant name the session ("" for a warm workspace).
	Session, Tenant string
	// Profile is the container isolation the operator's policy granted.
	// Backends without containers ignore it, after the policy has judged it.
	Profile policy.Profile
	// EnvAllow and InheritEnv say which host variables local commands see
	// (the tool options bashEnvAllow and bashInheritEnv, set by the operator).
	EnvAllow   []string
	InheritEnv bool
	// MaxBytes bounds the bytes a workspace held in memory may hold; 0 is
	// no bound.
	MaxBytes int64
	// Source, when set, is a host directory whose contents the workspace
	// starts with: its directories, regular files and symbolic links,
	// copied (nothing is written back). It is the operator's setting, never
	// a tenant's. A backend that cannot copy refuses it; warm workspaces
	// never have one.
	Source string
	// Labels mark everything the workspace creates as the daemon's, so that
	// Reap finds it after a crash.
	Labels map[string]string
}

// poolKey is what makes two specs interchangeable for a warm pool: all of
// the spec but the session's names.
func (s Spec) poolKey() string {
	s.Session, s.Tenant = "", ""
	s.Profile.Session, s.Profile.Tenant = "", ""
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a Spec is plain data
	}
	return string(b)
}

// Instance is one session's workspace in a backend: its ports and how to
// release it.
type Instance struct {
	// FS is the workspace's files. Required.
	FS workspace.FileSystem
	// Bash runs commands in it; nil when the backend has no shell.
	Bash workspace.Bash
	// Root is the workspace root as commands see it ("/workspace").
	Root string
	// ID names the backend resource (a container ID, a directory) in logs.
	ID string
	// Close releases everything the instance holds. It is called once.
	Close func(ctx context.Context) error
	// Done, when not nil, is closed once the workspace is unusable — ended
	// by itself (a container killed from outside) or closed; Err then says
	// why. A pool never hands out such a workspace, and a session whose
	// workspace ends by itself ends with ErrWorkspaceEnded.
	Done <-chan struct{}
	Err  func() error
	// Accept, when not nil, waits for a program in the workspace to
	// connect to a loopback address of its own and returns that
	// connection (agent.Client.Accept): the path of the session's egress
	// proxy. It is nil where commands use the host's network (local,
	// memory), and egress is not served.
	Accept func(ctx context.Context, addr string) (net.Conn, error)
}

// ended reports whether the workspace is unusable (Done is closed).
func (inst *Instance) ended() bool {
	if inst.Done == nil {
		return false
	}
	select {
	case <-inst.Done:
		return true
	default:
		return false
	}
}

// settle waits, up to settleGrace or until ctx ends, for the workspace to
// be known as ended, and reports whether it is. A call that failed as
// Unavailable may have seen the workspace's stream break a moment before
// the backend has said why (it asks the engine how the container ended);
// settling first lets the call say that the session ended, not that the
// backend stumbled.
func (inst *Instance) settle(ctx context.Context) bool {
	if inst.Done == nil {
		return false
	}
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	select {
	case <-inst.Done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return inst.ended()
}

// settleGrace bounds how long a call that failed as Unavailable waits for
// its workspace to be known as ended. Generous: the engine is asked how the
// container ended, and on a loaded host that can take seconds.
const settleGrace = 10 * time.Second

func randomID(prefix string) string {
	return prefix + strings.ToLower(rand.Text()[:16])
}

// Memory is the backend of workspaces held in the daemon's memory (package
// memfs), rooted at /workspace. Commands run through memexec: in a private
// host directory mirrored to and from the memory tree, on the host as the
// daemon's user — no isolation beyond the file system's confinement. For
// development and tests; nothing survives the daemon.
type Memory struct {
	// TempDir is where memexec makes its private directories (default
	// os.TempDir()).
	TempDir string
}

var _ Warmer = Memory{}

// Name returns "memory".
func (Memory) Name() string { return "memory" }

// Open returns a new workspace bounded by spec.MaxBytes: empty, or a copy
// of spec.Source. Its umask is 0, so the modes commands give files are kept
// exactly (the tools ask for 0644 and 0755 themselves).
func (m Memory) Open(ctx context.Context, spec Spec) (*Instance, error) {
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
func (m Memory) Warm(ctx context.Context, spec Spec) (*Instance, error) {
	spec.Source = ""
	return m.Open(ctx, spec)
}

func (m Memory) open(fsys *memfs.FS, spec Spec) (*Instance, error) {
	sh, err := memexec.New(fsys, memexec.WithTempDir(m.TempDir), memexec.WithRootVars("SANDBOXD_WORKSPACE"),
		memexec.WithExec(localexec.WithEnvAllow(spec.EnvAllow), localexec.WithInheritEnv(spec.InheritEnv)))
	if err != nil {
		return nil, fmt.Errorf("memory backend: %w", err)
	}
	return &Instance{FS: fsys, Bash: sh, Root: fsys.Root(), ID: sh.Root(), Close: func(context.Context) error { return sh.Close() }}, nil
}

// Reap has nothing to do: memory does not outlive the process. (memexec's
// private directories of a crashed daemon stay in TempDir.)
func (Memory) Reap(context.Context, map[string]string) (int, error) { return 0, nil }

// Local is the backend of workspaces on the host's disk: each session gets
// a fresh directory under Dir, removed when the session ends, and its
// commands run on the host as the daemon's user (package localexec) — no
// isolation beyond path confinement. For development only.
type Local struct {
	// Dir holds the session directories. It belongs to sandboxd: Reap
	// removes the workspace directories in it whose owner has ended.
	Dir string
}

// ownerSuffix names the file beside a workspace directory that records its
// owner (Owner.Labels, as JSON): outside the workspace, where no command
// of the session sees or changes it.
const ownerSuffix = ".owner"

var _ Warmer = (*Local)(nil)

// localPrefix starts the name of every workspace directory Local makes.
const localPrefix = "ws-"

// Name returns "local".
func (*Local) Name() string { return "local" }

// Open makes a new empty directory and the ports over it. It refuses a
// spec.Source (use Dir to work on a directory in place).
func (l *Local) Open(ctx context.Context, spec Spec) (*Instance, error) {
	if spec.Source != "" {
		return nil, errors.New("local backend: a session directory starts empty (no Source)")
	}
	return l.Warm(ctx, spec)
}

// Warm is Open: a directory belongs to no session until claimed.
func (l *Local) Warm(_ context.Context, spec Spec) (*Instance, error) {
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	dir, err := os.MkdirTemp(l.Dir, localPrefix)
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if owner, ok := OwnerOf(spec.Labels); ok {
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
	return &Instance{
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
// those whose owner has ended (Owner.Gone), or that record none. Another
// daemon's living workspaces in the same Dir are left alone.
func (l *Local) Reap(context.Context, map[string]string) (int, error) {
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
			if o, ok := OwnerOf(labels); ok && !o.Gone() {
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

var _ Backend = Dir{}

// Name returns "local": it is the local backend of a single directory.
func (Dir) Name() string { return "local" }

// Open returns the ports over Path. It refuses a spec.Source: the
// directory is the workspace.
func (d Dir) Open(_ context.Context, spec Spec) (*Instance, error) {
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
	return &Instance{
		FS: fsys, Bash: sh, Root: filepath.ToSlash(dir), ID: dir,
		Close: func(context.Context) error { return fsys.Close() },
	}, nil
}

// Reap has nothing to remove: the directory is the user's.
func (Dir) Reap(context.Context, map[string]string) (int, error) { return 0, nil }
