package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/runner"
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
	egress    listFlag
	caCerts   listFlag
	shell     shellFlags
	// buildMissing builds an image of sandboxd's that the engine lacks,
	// rather than failing at once naming `sandboxd image build`.
	buildMissing bool
	// uncapped: the session has no turns (MCP), so it has no call cap
	// unless the configuration file sets maxCallsPerRun.
	uncapped bool
	// defaultBackend is --backend's default: docker for mcp, whose
	// commands run; local for tools, which runs none.
	defaultBackend string
	// labels are added to what the backend makes (runner.WithLabels); by
	// default, labelMCPRun says that nothing of the session is kept
	// should the run be killed.
	labels map[string]string
	// daemon is the runner's daemon name ("" for a new one of its own,
	// cli-…); stateDir, when set, keeps the records of Docker sessions so
	// that another run may take them back (docker.Backend.StateDir).
	daemon, stateDir string
	// resume is the session that run takes back, of those daemon's earlier
	// run left in stateDir (sandboxd mcp --resume), rather than one it
	// creates.
	resume string
}

func (f *sessionFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.backend, "backend", cmp.Or(f.defaultBackend, "docker"), backendHelp("where the workspace lives (docker unless another is named; memory and local run commands on this host, without isolation)", sessionable))
	fs.BoolVar(&f.buildMissing, "build-missing", false, "build the --image when it is sandboxd's (minimal, dev) and the engine lacks it, rather than fail naming 'sandboxd image build' (the first build of dev takes minutes)")
	fs.StringVar(&f.workspace, "workspace", ".", "the workspace `dir`ectory: worked on in place (local), or copied (memory, docker)")
	fs.StringVar(&f.config, "config", "", "a JSON configuration `file` of tool options (maxLines, bashTimeoutMs, …)")
	fs.Var(&f.grants, "grant", "a `permission` to give: fs.write (write, edit) or shell.exec (bash); repeatable")
	fs.Var(&f.always, "always", "`skills` active from the first step, comma separated: read, edit, shell (replaces the configuration's always)")
	fs.StringVar(&f.image, "image", "", "the container `image` of the docker backend")
	fs.Var(&f.egress, "egress", "what the docker backend's commands may reach through sandboxd's proxy: a `preset` ("+
		strings.Join(egress.PresetNames(), ", ")+") or HOST:PORT (*.domain:PORT for the names below it); repeatable (default: nothing)")
	fs.Var(&f.caCerts, "ca-cert", "a PEM `file` of certificate authorities the docker backend's commands trust beside their image's (and sandboxd's egress trusts); repeatable "+
		"(default: those this host's administrator added, in "+strings.Join(hostCADirs, " and ")+"; \"\" for none)")
	f.shell.register(fs)
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
	f := sessionFlags{defaultBackend: "local"} // it lists tools and runs no command
	f.register(fs)
	return func(ctx context.Context, sio stdio, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected arguments %q", args)
		}
		s, err := f.openSession(ctx, sio)
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
	var data []byte
	if f.config != "" {
		var err error
		if data, err = os.ReadFile(f.config); err != nil {
			return tools.Config{}, err
		}
		if cfg, err = parseToolsConfig(data, ""); err != nil {
			return tools.Config{}, fmt.Errorf("%s: %w", f.config, err)
		}
	}
	if f.uncapped && !jsonSets(data, "maxCallsPerRun") {
		cfg.MaxCallsPerRun = 0
	}
	for _, g := range f.grants.values {
		if !slices.Contains(cfg.Grants, g) {
			cfg.Grants = append(cfg.Grants, g)
		}
	}
	if f.always.set {
		cfg.Always = slices.Clone(f.always.values)
	}
	if err := f.shell.apply(&cfg); err != nil {
		return tools.Config{}, err
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

// jsonSets reports whether the JSON object data names option.
func jsonSets(data []byte, option string) bool {
	var keys map[string]json.RawMessage
	if json.Unmarshal(data, &keys) != nil {
		return false
	}
	_, ok := keys[option]
	return ok
}

// session is an open workspace and the tool set over it.
type session struct {
	id    string
	fs    workspace.FileSystem // the workspace's files, without the tools' rules
	set   *tools.Set
	close func() error
	// lost is what a resumed session did not get back (runner.Info.Lost).
	lost []string
}

// cliTenant is the tenant of the command line's sessions.
const cliTenant = "cli"

// newDaemonName is a daemon name of a command-line run's own.
func newDaemonName() string { return "cli-" + strings.ToLower(rand.Text()[:12]) }

// openSession opens the workspace the flags name and builds its tool set,
// through the same runner backends and session code as "sandboxd serve":
// one runner.Manager holding one session. The caller must call close.
// Mistakes in the flags are usage errors; a configuration that cannot start
// (an always-on skill without its grant) fails naming what is missing.
func (f *sessionFlags) openSession(ctx context.Context, sio stdio) (*session, error) {
	entry, err := backendNamed(f.backend, sessionable)
	if err != nil {
		return nil, err
	}
	inContainers := orList(backendNames(sessionable, inContainer))
	if f.image != "" && !entry.container {
		return nil, usagef("--image applies to --backend %s only", inContainers)
	}
	out := egress.Policy{Allow: f.egress.values}
	if f.egress.set && !entry.container {
		return nil, usagef("--egress applies to --backend %s only: %s commands use the host's network", inContainers, andList(backendNames(sessionable, onHost)))
	}
	if err := out.Validate(); err != nil {
		return nil, usagef("--egress: %v", err)
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
	var caFiles []string
	if f.caCerts.set {
		caFiles = append([]string{}, f.caCerts.values...)
	}
	_, caPEM, err := sessionCAs(caFiles)
	if err != nil {
		return nil, usagef("--ca-cert: %v", err)
	}
	b, err := entry.session(ctx, sio, f)
	if err != nil {
		return nil, err
	}
	labels := f.labels
	if labels == nil {
		labels = map[string]string{labelMCPRun: runDiscard}
	}
	// A daemon name of its own (newDaemonName): this process reaps nothing
	// of another's living run (see reapDeadRuns for those whose process is
	// gone). Its session ends with it, unless it dies: the run's end
	// delivers the work and closes it, or leaves it on purpose.
	opts := []runner.Option{runner.WithTools(cfg), runner.WithPolicy(b.policy), runner.WithEgress(out), runner.WithCACerts(caPEM),
		runner.WithJournalStores(journalStore),
		runner.WithLabels(labels),
		runner.WithDaemonName(cmp.Or(f.daemon, newDaemonName())),
		runner.WithEndOnShutdown(true)}
	if f.resume != "" {
		// Why the earlier run's session is not taken back, if it is not.
		opts = append(opts, runner.WithLogger(slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	}
	m, err := runner.New(ctx, b.backend, opts...)
	if err != nil {
		b.release()
		return nil, err
	}
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		defer b.release()
		return m.Shutdown(sctx)
	}
	if f.resume != "" {
		s, err := m.Get(cliTenant, f.resume)
		if err != nil {
			shutdown()
			return nil, fmt.Errorf("session %s was not taken back (%w); its work stays in its container: a plain 'sandboxd mcp --backend docker --workspace %s' delivers it", f.resume, err, f.workspace)
		}
		if b.taken != nil {
			b.taken()
		}
		return &session{id: s.ID(), fs: s.FS(), set: s.Tools(), close: shutdown, lost: s.Info().Lost}, nil
	}
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: cliTenant, Source: b.source})
	if err != nil {
		shutdown()
		var se *runner.SettingError
		if errors.As(err, &se) {
			// The message names the option, or the grant an always-on skill lacks.
			return nil, fmt.Errorf("cannot start the session: %s", se.Reason)
		}
		return nil, err
	}
	return &session{id: s.ID(), fs: s.FS(), set: s.Tools(), close: shutdown}, nil
}
