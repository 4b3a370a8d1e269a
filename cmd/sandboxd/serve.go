package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/workspace"

	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/tools"
)

// serveConfig is the daemon's configuration file (JSON). Every key is
// optional; unknown keys are an error. Each field's doc comment is its
// description in the JSON Schema (config.schema.json).
type serveConfig struct {
	// Schema names the JSON Schema the file follows, so that editors check
	// it; sandboxd ignores it.
	Schema string `json:"$schema"`
	// Listen is the address to listen on (default 127.0.0.1:7878).
	Listen string `json:"listen"`
	// Backend is docker (the default), kubernetes, local or memory. Local
	// and memory run commands on the host without isolation: for
	// development, and only when named.
	Backend string `json:"backend"`
	// Kubernetes configures the kubernetes backend: session pods in a
	// cluster (package backend/kubernetes).
	Kubernetes struct {
		// Kubeconfig is the kubeconfig file of the cluster (default: the
		// in-cluster configuration of sandboxd's own pod).
		Kubeconfig string `json:"kubeconfig"`
		// Namespace holds the session pods (default "default").
		Namespace string `json:"namespace"`
		// RuntimeClass is the RuntimeClass of session pods (gVisor, Kata)
		// when the policy's runtime is runc (default: the cluster's).
		RuntimeClass string `json:"runtimeClass"`
		// AgentImage is the image that brings the agent into each pod, the
		// static agent binary alone at /sandboxd-agent (default
		// localhost/sandboxd-agent:latest).
		AgentImage string `json:"agentImage"`
		// Stream is how the daemon reaches each pod's agent: "attach"
		// (the default; through the API server) or "direct" (a TCP
		// connection to the pod's address, authenticated per session).
		Stream string `json:"stream"`
		// Replica, when set, makes this daemon one replica of several
		// sharing the daemon's sessions, named so (distinct per replica;
		// --replica wins); it implies the direct stream.
		Replica string `json:"replica"`
	} `json:"kubernetes"`
	// Image is the docker backend's default image: an image definition's
	// name ("minimal", the default, or "dev"; sandboxd image build NAME
	// builds it) or an image reference used as it is; policy.defaultImage,
	// when set, wins. An image the engine lacks stops the start, naming
	// the fix, unless buildMissing is set.
	Image string `json:"image"`
	// BuildMissing builds, before the daemon listens, the images of
	// sandboxd's that the configuration names and the engine lacks
	// (--build-missing sets it too).
	BuildMissing bool `json:"buildMissing"`
	// StateDir is the daemon's own state: the records of Docker sessions
	// that outlive it, with their journals and first trees
	// (docker/daemon-NAME), and the defaults of dataDir
	// (sessions) and snapshots.dir (snapshots/NAME) (default
	// $XDG_STATE_HOME/sandboxd or ~/.local/state/sandboxd).
	StateDir string `json:"stateDir"`
	// EndSessionsOnExit ends every session at SIGTERM or SIGINT, removing
	// its container; by default Docker sessions outlive the daemon, which
	// takes them back when it starts again (--end-sessions-on-exit sets
	// it too).
	EndSessionsOnExit bool `json:"endSessionsOnExit"`
	// DataDir holds the local backend's session directories (default
	// STATEDIR/sessions).
	DataDir string `json:"dataDir"`
	// Daemon names this daemon in container labels (default "sandboxd").
	Daemon string `json:"daemon"`
	// Tenants are who may use the daemon, each with the hashes of its
	// bearer tokens (sandboxd token new, sandboxd token hash). Required
	// with a configuration file.
	Tenants []httpapi.Tenant `json:"tenants"`
	// MetricsTokens are the hashed tokens that may read /metrics, which
	// shows every tenant's activity (without one, /metrics answers 401).
	MetricsTokens []string `json:"metricsTokens"`
	// Limits bound what tenants and requests may hold.
	Limits struct {
		// SessionsPerTenant caps each tenant's sessions (0: no cap); a
		// tenant's maxSessions overrides it.
		SessionsPerTenant int `json:"sessionsPerTenant"`
		// CallsInFlight caps the tool calls running at once in one
		// session (default 8; 0: no cap).
		CallsInFlight *int `json:"callsInFlight"`
		// MaxBodyBytes caps a JSON request body (default 64 MiB).
		MaxBodyBytes int64 `json:"maxBodyBytes"`
		// MaxTransferBytes caps an upload's tar stream and a download
		// (default 256 MiB).
		MaxTransferBytes int64 `json:"maxTransferBytes"`
		// WorkspaceBytes caps a session's workspace (default 1 GiB): a
		// memory workspace's bytes, a Kubernetes pod's emptyDir, and,
		// with workspaceDisk, a Docker session's disk.
		WorkspaceBytes int64 `json:"workspaceBytes"`
		// WorkspaceDisk is how a Docker session's workspace is bounded on
		// disk: "off" (the default; it takes the engine's disk, unbounded)
		// or "loop" (a file system of workspaceBytes of its own, an ext4
		// image on a loop device: the daemon must run as root beside the
		// engine; sandboxd doctor says whether it works).
		WorkspaceDisk string `json:"workspaceDisk"`
		// MemoryBudgetBytes bounds what requests in flight hold in the
		// daemon's memory, all tenants together (default 512 MiB); over it
		// is 503 with Retry-After.
		MemoryBudgetBytes int64 `json:"memoryBudgetBytes"`
		// DetachedResultBytes bounds the results of a session's detached
		// calls kept once they end (default 16 MiB; a newer result
		// displaces the oldest). They count against the memory budget too:
		// a tenant's at most a quarter of it.
		DetachedResultBytes int64 `json:"detachedResultBytes"`
		// DetachedResultTTL is how long a detached call's result is kept
		// after its call ends (default 10m).
		DetachedResultTTL runner.Duration `json:"detachedResultTTL"`
	} `json:"limits"`
	// Sessions are the session lifetimes: durations as "90s", "1h30m" or
	// a number of seconds.
	Sessions struct {
		// Lifetime ends a session that long after it was created (default:
		// none); a session may ask for less.
		Lifetime runner.Duration `json:"lifetime"`
		// MaxLifetime is the longest lifetime a session may ask for.
		MaxLifetime runner.Duration `json:"maxLifetime"`
		// IdleTimeout ends a session after that long without calls
		// (default 30m).
		IdleTimeout runner.Duration `json:"idleTimeout"`
		// MaxIdleTimeout is the longest idle timeout a session may ask for.
		MaxIdleTimeout runner.Duration `json:"maxIdleTimeout"`
		// AutoResume makes a request for a paused session (POST
		// /v1/sessions/ID/pause) resume it first, rather than answer 409
		// Paused (default false).
		AutoResume bool `json:"autoResume"`
	} `json:"sessions"`
	// Grants lists the grants sessions may ask for (default: any).
	Grants []string `json:"grants"`
	// Egress is what sessions' commands may reach through sandboxd's egress
	// proxy (docker backend; local and memory commands use the host's
	// network): allow lists HOST:PORT rules and presets (go, pypi, npm,
	// debian, github), allowPrivate the private addresses they may reach,
	// maxConnections and maxBytes cap each session (package egress).
	// Default: no egress. A tenant's egress and a session's narrow it.
	Egress egress.Policy `json:"egress"`
	// Secrets are credentials sessions' commands use without holding
	// them: a session gets a placeholder in the variable name, and the
	// egress proxy puts the value — read from the daemon's env or a file —
	// in place of it in requests to the secret's allow (and methods,
	// paths) only, refusing it anywhere else (package runner, Secret).
	Secrets []runner.Secret `json:"secrets"`
	// CACerts are PEM files of certificate authorities every session
	// trusts, beside its image's own, and the daemon's outbound TLS trusts,
	// beside the host's (the egress proxy's inspected connections, the
	// source gateway). Default: the authorities this host's administrator
	// added (/usr/local/share/ca-certificates,
	// /etc/pki/ca-trust/source/anchors), so that sessions trust what the
	// host's network needs; [] for none.
	CACerts []string `json:"caCerts"`
	// Policy is the operator's word on sessions: their default image and
	// runtime, what they may choose instead, and how far they may relax
	// the hardened profile (package policy).
	Policy policy.Policy `json:"policy"`
	// Tools are the tool options sessions start from (package tools: the
	// same keys as sandboxd mcp --config).
	Tools json.RawMessage `json:"tools"`
	// Pools are the warm pools: workspaces started ahead of time, each
	// handed to one session.
	Pools []runner.PoolConfig `json:"pools"`
	// Snapshots configure the daemon's snapshot store (package snapshot):
	// sessions' saved workspace trees, forks, and the operator's templates.
	Snapshots struct {
		// Dir is the store's directory, the daemon's own and no other's
		// (default on docker and kubernetes
		// STATEDIR/snapshots/DAEMON; on local and memory a
		// temporary directory removed at exit); "off" keeps no snapshots.
		Dir string `json:"dir"`
		// MaxCount caps each tenant's snapshots (default 50; -1: no cap).
		MaxCount int `json:"maxCount"`
		// MaxBytes caps what each tenant's snapshots hold in the store,
		// every file at its full size (default 10 GiB; -1: no cap).
		MaxBytes int64 `json:"maxBytes"`
		// Templates are prepared trees sessions may start from
		// ("template" when created; a pool's "template"): each a name and
		// a host dir, or an image and a path in it (default /workspace),
		// made in the store at start.
		Templates []templateConfig `json:"templates"`
	} `json:"snapshots"`
	// Images declares images beside minimal and dev (name, suite,
	// packages, links, files, env; see images.Declare), built by `sandboxd
	// image build --config FILE NAME` and named like them everywhere.
	Images []images.Definition `json:"images"`
	// E2B serves E2B's sandbox API beside sandboxd's own, so that E2B's
	// SDKs run unchanged against this daemon (package e2b): the control
	// plane at /e2b (E2B_API_URL=http://LISTEN/e2b), envd on every request
	// naming its sandbox (E2B_SANDBOX_URL=http://LISTEN). An E2B API key is
	// a tenant's token.
	E2B e2bConfig `json:"e2b"`
	// ShutdownTimeout bounds how long calls in flight may finish at
	// shutdown (default 30s).
	ShutdownTimeout runner.Duration `json:"shutdownTimeout"`
	// HTTP bounds what a client connection may hold.
	HTTP struct {
		// HeaderTimeout bounds reading a request's headers (default 10s).
		HeaderTimeout runner.Duration `json:"headerTimeout"`
		// IdleTimeout closes a keep-alive connection idle that long
		// (default 2m).
		IdleTimeout runner.Duration `json:"idleTimeout"`
		// MinBodyRate is the pace, in bytes per second, a request body must
		// keep after BodyGrace (default 4096 after 10s; -1 turns it off).
		MinBodyRate int64 `json:"minBodyRate"`
		// BodyGrace is how long a request body may take before
		// minBodyRate applies (default 10s).
		BodyGrace runner.Duration `json:"bodyGrace"`
		// WriteTimeout is how long a client may leave 64 KiB of its
		// response untaken before its connection is closed and its call
		// canceled (default 30s).
		WriteTimeout runner.Duration `json:"writeTimeout"`
	} `json:"http"`
}

// loadServeConfig reads the configuration file; "" is the zero
// configuration. A key the file cannot hold, a value of the wrong kind, a
// tenant without a name or with a token that is not a hash, and a bad tool
// option are errors naming the key's full path ("policy.images",
// "tenants[1].tokens[0]", "tools.maxLines"); no error shows what a tenant's
// token holds.
func loadServeConfig(file string) (serveConfig, error) {
	var c serveConfig
	if file == "" {
		return c, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return c, err
	}
	if err := c.parse(data); err != nil {
		return serveConfig{}, fmt.Errorf("%s: %w", file, err)
	}
	for _, d := range c.Images {
		if _, err := images.Declare(d); err != nil {
			return c, fmt.Errorf("%s: images: %w", file, err)
		}
	}
	return c, nil
}

// parse decodes and checks the configuration in data, as loadServeConfig
// says.
func (c *serveConfig) parse(data []byte) error {
	if err := decodeConfig(data, c); err != nil {
		return err
	}
	if err := c.Egress.Validate(); err != nil {
		return &configError{Path: "egress", Reason: err.Error()}
	}
	for i, sec := range c.Secrets {
		if err := sec.Validate(c.Egress); err != nil {
			return &configError{Path: fmt.Sprintf("secrets[%d]", i), Reason: err.Error()}
		}
		for j, o := range c.Secrets[:i] {
			if o.Name == sec.Name {
				return &configError{Path: fmt.Sprintf("secrets[%d].name", i), Reason: fmt.Sprintf("secrets[%d] has this name already", j)}
			}
		}
	}
	switch c.Limits.WorkspaceDisk {
	case "", diskOff, diskLoop:
	default:
		return &configError{Path: "limits.workspaceDisk", Reason: fmt.Sprintf("%q: want %s or %s", c.Limits.WorkspaceDisk, diskOff, diskLoop)}
	}
	for i, f := range c.CACerts {
		if !filepath.IsAbs(f) {
			return &configError{Path: fmt.Sprintf("caCerts[%d]", i), Reason: fmt.Sprintf("%q: want an absolute path of a PEM file", f)}
		}
	}
	names := map[string]int{}
	for i, t := range c.Tenants {
		at := fmt.Sprintf("tenants[%d]", i)
		if t.Name == "" {
			return &configError{Path: at + ".name", Reason: "every tenant needs a name"}
		}
		if j, dup := names[t.Name]; dup {
			return &configError{Path: at + ".name", Reason: fmt.Sprintf("tenants[%d] has this name already: give each tenant its own", j)}
		}
		names[t.Name] = i
		if t.Egress != nil {
			if _, err := c.Egress.Narrow(t.Egress); err != nil {
				return &configError{Path: at + ".egress", Reason: err.Error()}
			}
		}
		for k, h := range t.Tokens {
			if !isTokenHash(h) {
				return &configError{Path: fmt.Sprintf("%s.tokens[%d]", at, k), Reason: "not a token hash (the value is not shown: it may be a token): " +
					"write the line 'sandboxd token hash' prints for the token, \"sha256:\" and 64 hex digits, or make a token and its hash with 'sandboxd token new'"}
			}
		}
	}
	if len(c.Tools) > 0 {
		if _, err := parseToolsConfig(c.Tools, "tools"); err != nil {
			return err
		}
	}
	return c.E2B.Ports.validate(c.E2B.Domain, names)
}

// isTokenHash reports whether h is a token as the configuration holds it:
// "sha256:" and 64 lowercase or uppercase hex digits.
func isTokenHash(h string) bool {
	hexPart, ok := strings.CutPrefix(h, "sha256:")
	if !ok || len(hexPart) != 64 {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil
}

const defaultListen = "127.0.0.1:7878"

// The daemon's ceilings when its configuration sets none: no tenant's
// session lives or idles for ever, and no tenant holds sessions without
// bound (a tenant's maxSessions, limits.sessionsPerTenant,
// sessions.maxLifetime and sessions.maxIdleTimeout raise or lower them).
const (
	defaultSessionsPerTenant = 32
	defaultMaxLifetime       = 24 * time.Hour
	defaultIdleTimeout       = 30 * time.Minute
	defaultMaxIdleTimeout    = 4 * time.Hour
	// defaultWorkspaceBytes is limits.workspaceBytes's default,
	// defaultDaemon the daemon's name's.
	defaultWorkspaceBytes = 1 << 30
	defaultDaemon         = "sandboxd"
)

var cmdServe = &command{
	name:    "serve",
	args:    "[--listen ADDR] [--config FILE] [--backend " + backendChoices(servable) + "] [--replica NAME] [--build-missing] [--end-sessions-on-exit] [--e2b]",
	summary: "run the daemon: sessions for many tenants over HTTP (/v1) and MCP (/mcp)",
	setup: func(fs *flag.FlagSet) runFunc {
		listen := fs.String("listen", "", "the `address` to listen on (default "+defaultListen+")")
		config := fs.String("config", "", "the daemon's configuration `file` (JSON); without one, a single dev tenant with a token printed at start")
		backend := fs.String("backend", "", backendHelp("where sessions run (default docker)", servable))
		replica := fs.String("replica", "", "with --backend kubernetes: run as the replica `NAME` of several that share the daemon's sessions (kubernetes.replica)")
		e2bOn := fs.Bool("e2b", false, "serve E2B's sandbox API too: the control plane at /e2b, envd on requests naming their sandbox (e2b.enabled)")
		buildMissing := fs.Bool("build-missing", false, "build the images of sandboxd's (minimal, dev) that the configuration names and the engine lacks, before listening, rather than fail naming 'sandboxd image build'")
		endOnExit := fs.Bool("end-sessions-on-exit", false, "end every session at SIGTERM or SIGINT, removing its container, rather than leave Docker sessions running for the daemon's next start (endSessionsOnExit)")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			cfg, err := loadServeConfig(*config)
			if err != nil {
				return err
			}
			cfg.Listen = cmp.Or(*listen, cfg.Listen, defaultListen)
			cfg.Backend = cmp.Or(*backend, cfg.Backend)
			cfg.Kubernetes.Replica = cmp.Or(*replica, cfg.Kubernetes.Replica)
			cfg.BuildMissing = cfg.BuildMissing || *buildMissing
			cfg.EndSessionsOnExit = cfg.EndSessionsOnExit || *endOnExit
			cfg.E2B.Enabled = cfg.E2B.Enabled || *e2bOn
			return serve(ctx, sio, cfg, *config == "")
		}
	},
}

// serve runs the daemon until ctx ends, then drains and removes what it made.
// It binds its address before it touches the backend, so a daemon that
// cannot listen leaves every other alone; on Docker the manager then claims
// the daemon's name (backend.Claimer) before it reaps what ended runs left.
func serve(ctx context.Context, sio stdio, cfg serveConfig, dev bool) error {
	logger := slog.New(slog.NewJSONHandler(sio.err, nil))
	var devToken string
	if dev {
		devToken = "sbx_" + rand.Text()
		cfg.Tenants = []httpapi.Tenant{{Name: "dev", Tokens: []string{httpapi.HashToken(devToken)}}}
		cfg.MetricsTokens = cfg.Tenants[0].Tokens // one tenant: its activity is all there is
	}
	if len(cfg.Tenants) == 0 {
		return errors.New("the configuration names no tenants: add \"tenants\": [{\"name\": …, \"tokens\": [\"sha256:…\"]}] (sandboxd token new)")
	}
	toolCfg := tools.DefaultConfig()
	if len(cfg.Tools) > 0 {
		var err error
		if toolCfg, err = tools.ParseConfig(cfg.Tools); err != nil {
			return fmt.Errorf("tools: %w", err)
		}
	}
	// No call cap unless the operator sets one, as for sandboxd mcp: an MCP
	// client (the daemon's /mcp) has no turn to finish, and a platform whose
	// agents have turns sets maxCallsPerRun here or narrows it per session.
	if !jsonSets(cfg.Tools, "maxCallsPerRun") {
		toolCfg.MaxCallsPerRun = 0
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w (choose another address with --listen or \"listen\" in the configuration)", err)
	}
	defer ln.Close()
	backend, image, err := openBackend(ctx, sio, &cfg)
	if err != nil {
		return err
	}
	if cfg.Policy.DefaultImage == "" {
		cfg.Policy.DefaultImage = image
	}
	if entry, _ := backendNamed(backend.Name(), servable); cfg.Egress.On() && !entry.container {
		logger.Warn("egress applies to the "+andList(backendNames(servable, inContainer))+" backends only: this backend's commands use the host's network, and egress.allow does not bound them", "backend", backend.Name())
	}
	caFiles, caPEM, err := sessionCAs(cfg.CACerts)
	if err != nil {
		return err
	}
	if len(caFiles) > 0 {
		logger.Info("sessions and the daemon's outbound TLS trust these certificate authorities beside their own (caCerts)", "files", caFiles)
	}
	metrics := httpapi.NewMetrics()
	opts := []runner.Option{
		runner.WithPolicy(cfg.Policy), runner.WithTools(toolCfg), runner.WithLogger(logger), runner.WithEgress(cfg.Egress),
		runner.WithJournalStores(journalStore), runner.WithSecrets(cfg.Secrets...), runner.WithCACerts(caPEM),
		runner.WithObserver(metrics.Observe), runner.WithMaxSessions(cmp.Or(cfg.Limits.SessionsPerTenant, defaultSessionsPerTenant)),
		runner.WithLifetime(time.Duration(cfg.Sessions.Lifetime), cmp.Or(time.Duration(cfg.Sessions.MaxLifetime), defaultMaxLifetime)),
		runner.WithIdleTimeout(cmp.Or(time.Duration(cfg.Sessions.IdleTimeout), defaultIdleTimeout), cmp.Or(time.Duration(cfg.Sessions.MaxIdleTimeout), defaultMaxIdleTimeout)),
		runner.WithWorkspaceBytes(cmp.Or(cfg.Limits.WorkspaceBytes, defaultWorkspaceBytes)),
		runner.WithDaemonName(cmp.Or(cfg.Daemon, defaultDaemon)),
		runner.WithEndOnShutdown(cfg.EndSessionsOnExit),
		runner.WithAutoResume(cfg.Sessions.AutoResume),
		runner.WithDetachedResults(cfg.Limits.DetachedResultBytes, time.Duration(cfg.Limits.DetachedResultTTL)),
	}
	if cfg.Limits.CallsInFlight != nil {
		opts = append(opts, runner.WithMaxCallsInFlight(*cfg.Limits.CallsInFlight))
	}
	if cfg.Grants != nil {
		opts = append(opts, runner.WithGrants(cfg.Grants...))
	}
	store, closeStore, err := openSnapshots(cfg, backend.Name(), logger)
	if err != nil {
		return err
	}
	defer closeStore()
	if store != nil {
		ts, err := templates(cfg.Snapshots.Templates)
		if err != nil {
			return err
		}
		opts = append(opts, runner.WithSnapshots(store), runner.WithTemplates(ts...))
		logger.Info("snapshot store", "dir", store.Dir())
	}
	for _, p := range cfg.Pools {
		opts = append(opts, runner.WithPool(p))
		fmt.Fprintf(sio.err, "warm pool: keeping %d workspaces of %s ready (filling in the background)\n", p.Size, cmp.Or(p.Image, cfg.Policy.DefaultImage))
	}
	m, err := runner.New(ctx, backend, opts...)
	if err != nil {
		return err
	}
	fillCtx, stopFill := context.WithCancel(ctx)
	defer stopFill()
	go reportPoolFill(fillCtx, sio, m, 250*time.Millisecond)
	apiOpts := []httpapi.Option{httpapi.WithTenants(cfg.Tenants), httpapi.WithLogger(logger), httpapi.WithMetrics(metrics), httpapi.WithVersion(sandboxdVersion()),
		httpapi.WithConfigSchema(configSchema), httpapi.WithMetricsTokens(cfg.MetricsTokens...)}
	if cfg.Limits.MaxBodyBytes > 0 {
		apiOpts = append(apiOpts, httpapi.WithMaxBodyBytes(cfg.Limits.MaxBodyBytes))
	}
	if cfg.Limits.MaxTransferBytes > 0 {
		apiOpts = append(apiOpts, httpapi.WithMaxTransferBytes(cfg.Limits.MaxTransferBytes))
	}
	if cfg.Limits.MemoryBudgetBytes > 0 {
		apiOpts = append(apiOpts, httpapi.WithMemoryBudget(cfg.Limits.MemoryBudgetBytes))
	}
	if cfg.HTTP.WriteTimeout > 0 {
		apiOpts = append(apiOpts, httpapi.WithWriteTimeout(time.Duration(cfg.HTTP.WriteTimeout)))
	}
	if rate := cfg.HTTP.MinBodyRate; rate != 0 {
		apiOpts = append(apiOpts, httpapi.WithMinBodyRate(max(rate, 0), time.Duration(cmp.Or(cfg.HTTP.BodyGrace, runner.Duration(10*time.Second)))))
	}
	api, err := httpapi.New(m, apiOpts...)
	if err != nil {
		m.Shutdown(context.Background())
		return err
	}
	var handler http.Handler = api
	var ports *portsServer
	if cfg.E2B.Enabled {
		if handler, ports, err = e2bHandler(m, api, cfg.E2B, logger); err != nil {
			m.Shutdown(context.Background())
			return err
		}
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: time.Duration(cmp.Or(cfg.HTTP.HeaderTimeout, runner.Duration(10*time.Second))),
		IdleTimeout:       time.Duration(cmp.Or(cfg.HTTP.IdleTimeout, runner.Duration(2*time.Minute))),
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	go func() {
		if err := ports.serve(); err != nil {
			served <- fmt.Errorf("e2b.ports: %w", err)
		}
	}()

	url := "http://" + ln.Addr().String()
	printWelcome(sio, url, backend.Name(), cfg.Policy.DefaultImage, devToken)
	logger.Info("listening", "address", ln.Addr().String(), "backend", backend.Name())

	select {
	case <-ctx.Done():
	case err := <-served:
		ports.shutdown()
		m.Shutdown(context.Background())
		return err
	}
	// A drain: new requests are answered 503 ShuttingDown (the listener
	// stays open, so a client is told, not refused), /readyz turns 503,
	// and the requests in flight finish, until the shutdown timeout.
	logger.Info("shutting down: draining requests in flight")
	api.Drain()
	ports.shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(cmp.Or(cfg.ShutdownTimeout, runner.Duration(30*time.Second))))
	defer cancel()
	if err := api.WaitIdle(sctx); err != nil {
		logger.Warn("requests still in flight at the shutdown timeout: their calls are cancelled", "error", err)
	}
	merr := m.Shutdown(sctx)
	// Removals the engine refused (down, slow) are retried: an exit waits
	// for them, a minute at most, so that it leaks nothing.
	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	if err := m.WaitRemovals(rctx); err != nil {
		merr = errors.Join(merr, err)
	}
	rcancel()
	// Streams that outlive their sessions (an idle MCP GET) do not hold the
	// daemon past a moment.
	hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := srv.Shutdown(hctx); err != nil {
		srv.Close()
	}
	hcancel()
	return merr
}

// reportPoolFill shows the warm pools filling at start: a line each time a
// pool has more workspaces ready, every interval at most, until every pool
// is full once or ctx ends. Refills after claims are not reported.
func reportPoolFill(ctx context.Context, sio stdio, m *runner.Manager, interval time.Duration) {
	pools := m.Stats().Pools
	if len(pools) == 0 {
		return
	}
	report := make([]func(string), len(pools))
	last := make([]int, len(pools))
	for i, p := range pools {
		report[i] = progressPrinter(sio, "warm pool "+p.Image)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		full := true
		for i, p := range m.Stats().Pools {
			if last[i] >= p.Size {
				continue
			}
			if ready := p.Ready + int(p.Claimed); ready > last[i] {
				last[i] = min(ready, p.Size)
				msg := fmt.Sprintf("%d/%d workspaces started", last[i], p.Size)
				if last[i] == p.Size {
					msg += ": ready"
				}
				report[i](msg)
			}
			full = full && last[i] >= p.Size
		}
		if full {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// printWelcome says where the daemon listens and how to make a first call,
// as lines that work when pasted into a POSIX shell: the token is in
// SANDBOXD_TOKEN (exported here in development, where the daemon made it),
// which the curl line expands in double quotes.
func printWelcome(sio stdio, url, backend, image, devToken string) {
	w := bufio.NewWriter(sio.out)
	defer w.Flush()
	where := backend
	if entry, _ := backendNamed(backend, servable); entry.container {
		where += ", image " + image
	}
	fmt.Fprintf(w, "sandboxd serve: listening on %s (backend %s)\n", url, where)
	if devToken != "" {
		fmt.Fprintf(w, "No --config: one tenant, \"dev\", whose token for this run is\n  export SANDBOXD_TOKEN=%s\n", devToken)
	} else {
		fmt.Fprintf(w, "Set SANDBOXD_TOKEN to a token of one of the configuration's tenants, then\n")
	}
	fmt.Fprintf(w, "First call (create a session):\n  curl -s -X POST -H \"Authorization: Bearer $SANDBOXD_TOKEN\" %s/v1/sessions\n", url)
	fmt.Fprintf(w, "Or:\n  SANDBOXD_URL=%s %s session create\n", url, self)
	fmt.Fprintf(w, "API: %s/openapi.json   MCP: %s/mcp   Configuration schema: %s/v1/config.schema.json\n", url, url, url)
}

// journalStore makes the store of a session's journal (runner.JournalStores):
// a private directory of the daemon's (mode 0700), outside every backend's
// workspace — a container's processes cannot reach it — so a session's
// commands cannot choose what the journal restores. For a session that
// outlives the daemon's run (req.Dir: Docker with a state directory) it
// is that directory, which drop leaves and the backend removes with the
// session; for any other, a new one in the host's temporary directory,
// which drop removes (a crashed daemon's stay behind as
// sandboxd-journal-*). Its writes are not flushed to stable storage
// (fsync cost a journaled write three flushes, most of its time): the
// store outlives the daemon's death, not the host's — and a host's
// restart ends the sessions, whose containers do not run again.
func journalStore(req runner.JournalStoreRequest) (store workspace.FileSystem, drop func() error, err error) {
	dir, keep := req.Dir, req.Dir != ""
	if keep {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("the session's journal store: %w (check the state directory, stateDir)", err)
		}
	} else if dir, err = os.MkdirTemp("", "sandboxd-journal-"); err != nil {
		return nil, nil, fmt.Errorf("the session's journal store: %w (set TMPDIR to a writable directory)", err)
	}
	fsys, err := localfs.New(dir, localfs.WithSync(false))
	if err != nil {
		if !keep {
			err = errors.Join(err, os.RemoveAll(dir))
		}
		return nil, nil, err
	}
	if keep {
		return fsys, fsys.Close, nil
	}
	return fsys, func() error { return errors.Join(fsys.Close(), os.RemoveAll(dir)) }, nil
}

// templateConfig declares a template: a name, and a host directory or an
// image and a directory in it.
type templateConfig struct {
	// Name is how sessions ask for it ("template" when created).
	Name string `json:"name"`
	// Dir is a host directory whose tree it is: its directories, regular
	// files and links, read through os.Root (nothing outside it is
	// followed; links are kept as links).
	Dir string `json:"dir"`
	// Image is an image whose directory Path (default /workspace) it is,
	// read from a container made of it and never started (docker).
	Image string `json:"image"`
	Path  string `json:"path"`
}

// templates are the runner's templates the configuration declares.
func templates(cfg []templateConfig) ([]runner.Template, error) {
	var out []runner.Template
	for i, tc := range cfg {
		if (tc.Dir == "") == (tc.Image == "") {
			return nil, &configError{Path: fmt.Sprintf("snapshots.templates[%d]", i), Reason: "give it a dir or an image, one of them"}
		}
		t := runner.Template{Name: tc.Name, Image: tc.Image, Path: tc.Path}
		if dir := tc.Dir; dir != "" {
			t.Source = func(ctx context.Context, w io.Writer) error {
				fsys, err := localfs.New(dir)
				if err != nil {
					return err
				}
				defer fsys.Close()
				return snapshot.WriteTree(ctx, fsys, w)
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// The defaults of the snapshot store's caps, per tenant.
const (
	defaultSnapshotCount = 50
	defaultSnapshotBytes = 10 << 30
)

// openSnapshots opens the snapshot store the configuration names: nil with
// snapshots.dir "off" (and templates then refused). On local and memory,
// whose sessions do not outlive the daemon, the default store is a
// temporary directory that close removes.
func openSnapshots(cfg serveConfig, backend string, logger *slog.Logger) (_ *snapshot.Store, close func(), err error) {
	sc := cfg.Snapshots
	if sc.Dir == "off" {
		if len(sc.Templates) > 0 {
			return nil, nil, errors.New("snapshots.templates: templates live in the snapshot store, and snapshots.dir is off")
		}
		return nil, func() {}, nil
	}
	dir, temp := sc.Dir, false
	switch {
	case dir != "":
	case backend == "local" || backend == "memory":
		if dir, err = os.MkdirTemp("", "sandboxd-snapshots-"); err != nil {
			return nil, nil, fmt.Errorf("snapshots: %w", err)
		}
		temp = true
	default:
		state, err := cfg.stateDir()
		if err != nil {
			return nil, nil, fmt.Errorf("snapshots: %w (set snapshots.dir)", err)
		}
		dir = filepath.Join(state, "snapshots", cmp.Or(cfg.Daemon, defaultDaemon))
	}
	limit := func(n, def int64) int64 {
		switch {
		case n < 0:
			return 0
		case n == 0:
			return def
		}
		return n
	}
	st, err := snapshot.Open(dir, snapshot.WithLogger(logger), snapshot.WithLimits(snapshot.Limits{
		Count: int(limit(int64(sc.MaxCount), defaultSnapshotCount)), Bytes: limit(sc.MaxBytes, defaultSnapshotBytes)}))
	if err != nil {
		return nil, nil, fmt.Errorf("snapshots: %w", err)
	}
	return st, func() {
		st.Close()
		if temp {
			os.RemoveAll(dir)
		}
	}, nil
}

// stateDir is the daemon's state directory: stateDir, or the user's
// (stateDir()).
func (cfg *serveConfig) stateDir() (string, error) {
	if cfg.StateDir != "" {
		return cfg.StateDir, nil
	}
	return stateDir()
}

// stateDir is the user's state directory of sandboxd:
// $XDG_STATE_HOME/sandboxd or ~/.local/state/sandboxd.
func stateDir() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "sandboxd"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".local", "state", "sandboxd"), nil
}

var cmdTokenNew = &command{
	name:    "token new",
	summary: "print a new random bearer token and the hash the configuration holds for it",
	setup: func(fs *flag.FlagSet) runFunc {
		return func(_ context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			token := "sbx_" + rand.Text()
			fmt.Fprintf(sio.out, "token: %s\nhash:  %s\n", token, httpapi.HashToken(token))
			return nil
		}
	},
}

var cmdTokenHash = &command{
	name:    "token hash",
	args:    "[TOKEN]",
	summary: "print the hash of a bearer token (read from standard input when not given) for the configuration's tenants",
	setup: func(fs *flag.FlagSet) runFunc {
		return func(_ context.Context, sio stdio, args []string) error {
			var token string
			switch len(args) {
			case 0:
				line, err := bufio.NewReader(sio.in).ReadString('\n')
				if err != nil && line == "" {
					return errors.New("no token on standard input")
				}
				token = strings.TrimSpace(line)
			case 1:
				token = args[0]
			default:
				return usagef("give one token")
			}
			if token == "" {
				return errors.New("the token is empty")
			}
			fmt.Fprintln(sio.out, httpapi.HashToken(token))
			return nil
		}
	},
}
