package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memexec"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// sessionFlags are the flags that describe one session's workspace and tools,
// shared by "sandboxd mcp" and "sandboxd tools".
type sessionFlags struct {
	backend   string
	workspace string
	config    string
	grants    listFlag
	always    listFlag
	image     string
}

func (f *sessionFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.backend, "backend", "local", "where the workspace lives: "+strings.Join(backendNames(), ", "))
	fs.StringVar(&f.workspace, "workspace", ".", "the workspace `dir`ectory: worked on in place (local), or copied (memory, docker)")
	fs.StringVar(&f.config, "config", "", "a JSON configuration `file` of tool options (maxLines, bashTimeoutMs, …)")
	fs.Var(&f.grants, "grant", "a `permission` to give: fs.write (write, edit) or shell.exec (bash); repeatable")
	fs.Var(&f.always, "always", "`skills` active from the first step, comma separated: read, edit, shell (replaces the configuration's always)")
	fs.StringVar(&f.image, "image", "", "the container `image` of the docker backend")
}

// listFlag is a flag that may be repeated and takes comma-separated values.
type listFlag struct {
	set    bool
	values []string
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(s string) error {
	l.set = true
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			l.values = append(l.values, v)
		}
	}
	return nil
}

// withSession declares the session flags on fs and returns a command that
// opens the session they describe, runs run with it, and closes it.
func withSession(fs *flag.FlagSet, run func(ctx context.Context, sio stdio, s *session) error) runFunc {
	var f sessionFlags
	f.register(fs)
	return func(ctx context.Context, sio stdio, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected arguments %q", args)
		}
		s, err := f.openSession(ctx)
		if err != nil {
			return err
		}
		defer s.close()
		return run(ctx, sio, s)
	}
}

// toolsConfig is the tool configuration the flags give: the file's (or the
// defaults), with --grant added to its grants and --always replacing its
// always.
func (f *sessionFlags) toolsConfig() (tools.Config, error) {
	cfg := tools.DefaultConfig()
	if f.config != "" {
		var err error
		if cfg, err = tools.LoadConfig(f.config); err != nil {
			return tools.Config{}, err
		}
	}
	for _, g := range f.grants.values {
		if !slices.Contains(cfg.Grants, g) {
			cfg.Grants = append(cfg.Grants, g)
		}
	}
	if f.always.set {
		cfg.Always = slices.Clone(f.always.values)
	}
	if err := cfg.Validate(); err != nil {
		var oe *tools.OptionError
		if errors.As(err, &oe) && (oe.Option == "grants" && f.grants.set || oe.Option == "always" && f.always.set) {
			return tools.Config{}, usagef("--%s: %s", strings.TrimSuffix(oe.Option, "s"), oe.Reason)
		}
		return tools.Config{}, err
	}
	return cfg, nil
}

// session is an open workspace and the tool set over it.
type session struct {
	set   *tools.Set
	close func() error
}

// openSession opens the workspace the flags name and builds its tool set.
// The caller must call close. Mistakes in the flags are usage errors; a
// configuration that cannot start (an always-on skill without its grant)
// fails naming what is missing.
func (f *sessionFlags) openSession(ctx context.Context) (*session, error) {
	open, ok := backends[f.backend]
	if !ok {
		return nil, usagef("unknown backend %q (backends are %s)", f.backend, strings.Join(backendNames(), ", "))
	}
	if f.image != "" && f.backend != "docker" {
		return nil, usagef("--image applies to --backend docker only")
	}
	if info, err := os.Stat(f.workspace); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	} else if !info.IsDir() {
		return nil, fmt.Errorf("workspace %s is not a directory", f.workspace)
	}
	cfg, err := f.toolsConfig()
	if err != nil {
		return nil, err
	}
	id := "s-" + strings.ToLower(rand.Text()[:16])
	env, closeEnv, err := open(ctx, f, cfg, workspace.Session{ID: id, RunID: id})
	if err != nil {
		return nil, err
	}
	set, err := tools.New(env, cfg)
	if err != nil {
		closeEnv()
		// The message names the option, or the grant an always-on skill lacks.
		return nil, fmt.Errorf("cannot start the session: %s", strings.TrimPrefix(err.Error(), "tools: "))
	}
	return &session{set: set, close: closeEnv}, nil
}

// A backendFunc opens a workspace for a session: its file system, its shell
// (nil when it has none) and the session with its Root set. The returned
// function releases the workspace.
type backendFunc func(ctx context.Context, f *sessionFlags, cfg tools.Config, sess workspace.Session) (tools.Env, func() error, error)

// backends are the values of --backend.
var backends = map[string]backendFunc{
	"local":  openLocal,
	"memory": openMemory,
	"docker": openDocker,
}

func backendNames() []string {
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// openLocal works on the directory itself; the workspace root is its
// absolute path.
func openLocal(ctx context.Context, f *sessionFlags, cfg tools.Config, sess workspace.Session) (tools.Env, func() error, error) {
	dir, err := filepath.Abs(f.workspace)
	if err != nil {
		return tools.Env{}, nil, err
	}
	fsys, err := localfs.New(dir)
	if err != nil {
		return tools.Env{}, nil, err
	}
	sh, err := localexec.New(dir, localexec.WithEnvAllow(cfg.BashEnvAllow), localexec.WithInheritEnv(cfg.BashInheritEnv))
	if err != nil {
		fsys.Close()
		return tools.Env{}, nil, err
	}
	sess.Root = filepath.ToSlash(dir)
	return tools.Env{FS: fsys, Bash: sh, Session: sess}, fsys.Close, nil
}

// openMemory starts from an in-memory copy of the directory, rooted at
// /workspace; nothing is written back to the directory. Commands run in a
// private host copy of the workspace that memexec keeps in step with it, so
// for them the root is that copy's path (SANDBOXD_WORKSPACE, with
// bashSessionEnv, says which), not /workspace. The memory copy has umask 0,
// so the modes commands give files are kept exactly (the tools ask for 0644
// and 0755 themselves, and commands get the process's umask).
func openMemory(ctx context.Context, f *sessionFlags, cfg tools.Config, sess workspace.Session) (tools.Env, func() error, error) {
	fsys, err := memfs.FromDir(ctx, f.workspace, memfs.WithUmask(0))
	if err != nil {
		return tools.Env{}, nil, fmt.Errorf("copying the workspace into memory: %w", err)
	}
	opts := []memexec.Option{memexec.WithExec(localexec.WithEnvAllow(cfg.BashEnvAllow), localexec.WithInheritEnv(cfg.BashInheritEnv))}
	if cfg.BashSessionEnv {
		opts = append(opts, memexec.WithRootVars("SANDBOXD_WORKSPACE"))
	}
	sh, err := memexec.New(fsys, opts...)
	if err != nil {
		return tools.Env{}, nil, fmt.Errorf("the memory backend's commands: %w", err)
	}
	sess.Root = fsys.Root()
	return tools.Env{FS: fsys, Bash: sh, Session: sess}, sh.Close, nil
}

// openDocker is the docker backend's place; it answers until the Docker
// adapters (dockerfs, dockerexec) are wired in here.
func openDocker(ctx context.Context, f *sessionFlags, cfg tools.Config, sess workspace.Session) (tools.Env, func() error, error) {
	return tools.Env{}, nil, errors.New("the docker backend is not part of this build yet: use --backend local or memory")
}
