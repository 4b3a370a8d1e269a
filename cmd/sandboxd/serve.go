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
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/kubernetes"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
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
	// name, built when missing ("minimal", the default, or "dev"), or an
	// image reference used as it is; policy.defaultImage, when set, wins.
	Image string `json:"image"`
	// DataDir holds the local backend's session directories (default
	// $XDG_STATE_HOME/sandboxd or ~/.local/state/sandboxd).
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
		// WorkspaceBytes caps a session's workspace (default 1 GiB).
		WorkspaceBytes int64 `json:"workspaceBytes"`
		// MemoryBudgetBytes bounds what requests in flight hold in the
		// daemon's memory, all tenants together (default 512 MiB); over it
		// is 503 with Retry-After.
		MemoryBudgetBytes int64 `json:"memoryBudgetBytes"`
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
	// Images declares images beside minimal and dev (name, suite,
	// packages, links, files, env; see images.Declare), built by `sandboxd
	// image build --config FILE NAME` and named like them everywhere.
	Images []images.Definition `json:"images"`
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
	return nil
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
)

var cmdServe = &command{
	name:    "serve",
	args:    "[--listen ADDR] [--config FILE] [--backend docker|kubernetes|local|memory] [--replica NAME]",
	summary: "run the daemon: sessions for many tenants over HTTP (/v1) and MCP (/mcp)",
	setup: func(fs *flag.FlagSet) runFunc {
		listen := fs.String("listen", "", "the `address` to listen on (default "+defaultListen+")")
		config := fs.String("config", "", "the daemon's configuration `file` (JSON); without one, a single dev tenant with a token printed at start")
		backend := fs.String("backend", "", "where sessions run: docker, kubernetes (pods; see the configuration's kubernetes key), or local or memory for development (commands on this host without isolation)")
		replica := fs.String("replica", "", "with --backend kubernetes: run as the replica `NAME` of several that share the daemon's sessions (kubernetes.replica)")
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
	if cfg.Egress.On() && backend.Name() != "docker" {
		logger.Warn("egress applies to the docker backend only: this backend's commands use the host's network, and egress.allow does not bound them", "backend", backend.Name())
	}
	metrics := httpapi.NewMetrics()
	opts := []runner.Option{
		runner.WithPolicy(cfg.Policy), runner.WithTools(toolCfg), runner.WithLogger(logger), runner.WithEgress(cfg.Egress),
		runner.WithObserver(metrics.Observe), runner.WithMaxSessions(cmp.Or(cfg.Limits.SessionsPerTenant, defaultSessionsPerTenant)),
		runner.WithLifetime(time.Duration(cfg.Sessions.Lifetime), cmp.Or(time.Duration(cfg.Sessions.MaxLifetime), defaultMaxLifetime)),
		runner.WithIdleTimeout(cmp.Or(time.Duration(cfg.Sessions.IdleTimeout), defaultIdleTimeout), cmp.Or(time.Duration(cfg.Sessions.MaxIdleTimeout), defaultMaxIdleTimeout)),
		runner.WithWorkspaceBytes(cmp.Or(cfg.Limits.WorkspaceBytes, 1<<30)),
		runner.WithDaemonName(cmp.Or(cfg.Daemon, "sandboxd")),
	}
	if cfg.Limits.CallsInFlight != nil {
		opts = append(opts, runner.WithMaxCallsInFlight(*cfg.Limits.CallsInFlight))
	}
	if cfg.Grants != nil {
		opts = append(opts, runner.WithGrants(cfg.Grants...))
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
	srv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: time.Duration(cmp.Or(cfg.HTTP.HeaderTimeout, runner.Duration(10*time.Second))),
		IdleTimeout:       time.Duration(cmp.Or(cfg.HTTP.IdleTimeout, runner.Duration(2*time.Minute))),
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	url := "http://" + ln.Addr().String()
	printWelcome(sio, url, backend.Name(), cfg.Policy.DefaultImage, devToken)
	logger.Info("listening", "address", ln.Addr().String(), "backend", backend.Name())

	select {
	case <-ctx.Done():
	case err := <-served:
		m.Shutdown(context.Background())
		return err
	}
	logger.Info("shutting down: draining calls in flight")
	api.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(cmp.Or(cfg.ShutdownTimeout, runner.Duration(30*time.Second))))
	defer cancel()
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Shutdown(sctx) }()
	merr := m.Shutdown(sctx)
	// Streams that outlive their sessions (an idle MCP GET) do not hold the
	// daemon past the deadline.
	if err := <-httpDone; err != nil {
		srv.Close()
	}
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
	if backend == "docker" {
		where += ", image " + image
	}
	fmt.Fprintf(w, "sandboxd serve: listening on %s (backend %s)\n", url, where)
	if devToken != "" {
		fmt.Fprintf(w, "No --config: one tenant, \"dev\", whose token for this run is\n  export SANDBOXD_TOKEN=%s\n", devToken)
	} else {
		fmt.Fprintf(w, "Set SANDBOXD_TOKEN to a token of one of the configuration's tenants, then\n")
	}
	fmt.Fprintf(w, "First call (create a session):\n  curl -s -X POST -H \"Authorization: Bearer $SANDBOXD_TOKEN\" %s/v1/sessions\n", url)
	fmt.Fprintf(w, "Or:\n  SANDBOXD_URL=%s sandboxd session create\n", url)
	fmt.Fprintf(w, "API: %s/openapi.json   MCP: %s/mcp   Configuration schema: %s/v1/config.schema.json\n", url, url, url)
}

// openBackend makes the configured backend, docker unless another is named;
// for docker it also makes sure the default image exists, building it when
// missing, with progress. It fails closed: when the engine does not answer
// it refuses to start rather than fall back to a backend without isolation.
func openBackend(ctx context.Context, sio stdio, cfg *serveConfig) (backend.Backend, string, error) {
	name := cmp.Or(cfg.Backend, "docker")
	var cli *client.Client
	if name == "docker" {
		c, err := dockerClient(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("docker backend: the engine does not answer: %w\n"+
				"Start Docker, or point DOCKER_HOST at a running engine (sandboxd doctor checks the setup). "+
				"For development only, --backend memory or --backend local serve without it: their commands run on this host as your user, without isolation", err)
		}
		cli = c
	}
	switch name {
	case "memory":
		return memory.Backend{}, runner.DefaultImage, nil
	case "local":
		dir := cfg.DataDir
		if dir == "" {
			state, err := stateDir()
			if err != nil {
				return nil, "", err
			}
			dir = filepath.Join(state, "sessions")
		}
		return &local.Backend{Dir: dir}, runner.DefaultImage, nil
	case "docker":
		// Every image the configuration names is checked now (and built
		// when it is sandboxd's and missing), not at a session's first use.
		image := cmp.Or(cfg.Policy.DefaultImage, cfg.Image, images.Default)
		fmt.Fprintf(sio.err, "image %s: checking (built when missing; the first build takes a while)\n", image)
		b, ref, err := dockerBackend(ctx, sio, cli, image)
		for _, p := range cfg.Pools {
			if err == nil && p.Image != "" {
				_, err = ensureImage(ctx, sio, cli, p.Image)
			}
		}
		if err != nil {
			cli.Close()
			return nil, "", err
		}
		return b, ref, nil
	case "kubernetes":
		return kubernetesBackend(cfg)
	}
	return nil, "", usagef("unknown backend %q (backends are docker, kubernetes, local, memory)", name)
}

// kubernetesBackend is the kubernetes backend the configuration describes.
// It asks the cluster nothing yet: the images must be where its nodes find
// them, which only the first pod tells.
func kubernetesBackend(cfg *serveConfig) (backend.Backend, string, error) {
	k := cfg.Kubernetes
	rc, err := kubernetes.LoadConfig(k.Kubeconfig)
	if err != nil {
		return nil, "", err
	}
	opts := []kubernetes.Option{kubernetes.WithRuntimeClass(k.RuntimeClass)}
	if k.Namespace != "" {
		opts = append(opts, kubernetes.WithNamespace(k.Namespace))
	}
	if k.AgentImage != "" {
		opts = append(opts, kubernetes.WithAgentImage(k.AgentImage))
	}
	switch k.Stream {
	case "", "attach":
	case "direct":
		opts = append(opts, kubernetes.WithDirect())
	default:
		return nil, "", usagef("kubernetes.stream is %q: it is attach or direct", k.Stream)
	}
	if k.Replica != "" {
		opts = append(opts, kubernetes.WithReplica(k.Replica))
	}
	b, err := kubernetes.New(rc, opts...)
	if err != nil {
		return nil, "", err
	}
	return b, images.Canonical(cmp.Or(cfg.Policy.DefaultImage, cfg.Image, images.Default)), nil
}

func dockerClient(ctx context.Context) (*client.Client, error) {
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		cli.Close()
		return nil, err
	}
	return cli, nil
}

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
