package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

var cmdBench = &command{
	name:    "bench",
	args:    "[--calls N] [--backends " + strings.Join(backendNames(sessionable), ",") + "] [--floor-calls N] [--image IMAGE] [--fsserver VERSION|PATH|none]",
	summary: "measure what each tool costs on this machine, per backend over MCP, beside the Docker floors, and print the tables",
	setup: func(fs *flag.FlagSet) runFunc {
		var o benchOptions
		var backends string
		fs.IntVar(&o.calls, "calls", 200, "timed calls of each tool on each backend")
		fs.StringVar(&backends, "backends", strings.Join(backendNames(sessionable), ","), "the `backends` to measure, comma-separated; docker adds the Docker floors")
		fs.IntVar(&o.floorCalls, "floor-calls", 10, "timed runs of each Docker floor (each takes a fraction of a second to seconds)")
		fs.StringVar(&o.image, "image", images.Default, "the docker backend's and the floors' `image`")
		fs.StringVar(&o.peer, "fsserver", fsserverVersion, "with local, the `version` of "+fsserverModule+" to build from the module proxy and hold the local backend's read, write and edit to, or the path of its binary; none skips it")
		fs.StringVar(&o.floorServer, "floor-server", "", "with docker: the floor server's static `binary` (CGO_ENABLED=0 go build ./cmd/sandboxd/testdata/floorserver), to hold a read, a stat, an ls and bash `true` through the HTTP API and MCP to it")
		fs.StringVar(&o.cpuProfile, "cpuprofile", "", "with --floor-server: write a CPU profile of this process (the HTTP API's daemon runs in it) over the floor calls to `file`")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			if o.calls <= 0 || o.floorCalls <= 0 {
				return usagef("--calls and --floor-calls must be positive")
			}
			for b := range strings.SplitSeq(backends, ",") {
				if b = strings.TrimSpace(b); b == "" {
					continue
				}
				if _, err := backendNamed(b, sessionable); err != nil {
					return usagef("--backends: %v", err)
				}
				if !slices.Contains(o.backends, b) {
					o.backends = append(o.backends, b)
				}
			}
			if len(o.backends) == 0 {
				return usagef("--backends names no backend")
			}
			if o.floorServer != "" && !slices.Contains(o.backends, "docker") {
				return usagef("--floor-server holds Docker calls to the floor: add docker to --backends")
			}
			if o.cpuProfile != "" && o.floorServer == "" {
				return usagef("--cpuprofile profiles the calls against the floor: give --floor-server too")
			}
			// The table's order is the backends', as mcp (which bench spawns) offers them.
			order := backendNames(sessionable)
			slices.SortFunc(o.backends, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) })
			return bench(ctx, sio, o)
		}
	},
}

type benchOptions struct {
	calls, floorCalls int
	backends          []string
	image             string
	peer              string // benchPeer's: a version, a binary's path, or none
	floorServer       string // the floor server binary, or ""
	cpuProfile        string // where the floor calls' CPU profile goes, or ""
}

// benchOp is one tool call bench times; args makes the i-th call's
// arguments (a write or an edit changes the file each time).
type benchOp struct {
	name, tool string
	args       func(i int) any
}

// benchFiles is how many files grep searches.
const benchFiles = 200

var benchOps = []benchOp{
	{"read small file", "read", func(int) any { return map[string]any{"path": "small.txt"} }},
	{"write small file", "write", func(i int) any {
		return map[string]any{"path": "small.txt", "content": fmt.Sprintf("alpha\nwritten by call %d\n", i)}
	}},
	{"edit small file", "edit", func(i int) any {
		from, to := "alpha\n", "beta\n"
		if i%2 == 1 {
			from, to = to, from
		}
		return map[string]any{"path": "small.txt", "edits": []tools.Replacement{{OldText: from, NewText: to}}}
	}},
	{fmt.Sprintf("grep, %d files", benchFiles), "grep", func(int) any { return map[string]any{"pattern": "needle"} }},
	{"bash `true`", "bash", func(int) any { return map[string]any{"command": "true"} }},
}

// bench runs `sandboxd mcp` on each backend as a user would — this
// executable, spawned, spoken to over its standard input and output — and
// times every tool's calls; then, with docker, the floors a Docker user
// pays without sandboxd. It prints Markdown tables: the medians and 90th
// percentiles, the ratios, the floors, and the load average before and
// after, which says how far to trust the figures.
func bench(ctx context.Context, sio stdio, o benchOptions) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	loadBefore := loadAverage()
	began := time.Now()
	results := map[string][]benchStats{} // by backend, in the order of benchOps
	for _, b := range o.backends {
		fmt.Fprintf(sio.err, "sandboxd bench: %s backend, %d calls of each tool…\n", b, o.calls)
		stats, err := benchBackend(ctx, exe, b, o)
		if err != nil {
			return fmt.Errorf("%s backend: %w", b, err)
		}
		results[b] = stats
	}
	var peer *peerRun
	if slices.Contains(o.backends, "local") && o.peer != "none" {
		fmt.Fprintf(sio.err, "sandboxd bench: the local backend against mcp-filesystem-server, %d calls of each…\n", o.calls)
		run, err := benchPeer(ctx, sio, exe, o)
		if err != nil {
			return fmt.Errorf("against mcp-filesystem-server: %w", err)
		}
		peer = &run
	}
	var floors []benchFloor
	if slices.Contains(o.backends, "docker") {
		fmt.Fprintf(sio.err, "sandboxd bench: the Docker floors, %d runs of each…\n", o.floorCalls)
		if floors, err = dockerFloors(ctx, sio, o); err != nil {
			return fmt.Errorf("docker floors: %w", err)
		}
	}
	var floorRows []floorRow
	if o.floorServer != "" {
		fmt.Fprintf(sio.err, "sandboxd bench: the calls against the floor server, %d rounds…\n", o.calls)
		if floorRows, err = benchAgainstFloor(ctx, sio, o); err != nil {
			return fmt.Errorf("the floor server: %w", err)
		}
	}
	loadAfter := loadAverage()

	w := sio.out
	fmt.Fprintf(w, "sandboxd bench, %s: %d calls of each tool per backend over MCP on standard input and output (`sandboxd mcp`, spawned), %d CPUs, %s/%s, took %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), o.calls, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, time.Since(began).Round(time.Second))
	fmt.Fprintf(w, "Load average (1 min): %s before, %s after — above the CPU count, the figures are inflated; compare the ratios.\n\n", loadBefore, loadAfter)

	header := "| operation |"
	rule := "| --- |"
	for _, b := range o.backends {
		header += fmt.Sprintf(" %s median | %s p90 |", b, b)
		rule += " --- | --- |"
	}
	fmt.Fprintln(w, header)
	fmt.Fprintln(w, rule)
	for i, op := range benchOps {
		row := "| " + op.name + " |"
		for _, b := range o.backends {
			s := results[b][i]
			row += fmt.Sprintf(" %s | %s |", ms(s.median), ms(s.p90))
		}
		fmt.Fprintln(w, row)
	}

	fmt.Fprintln(w)
	header, rule = "| ratio of medians |", "| --- |"
	for _, b := range o.backends {
		header += " " + b + " |"
		rule += " --- |"
	}
	fmt.Fprintln(w, header)
	fmt.Fprintln(w, rule)
	for _, r := range []struct{ name, num, den string }{
		{"write / read", "write", "read"}, {"edit / read", "edit", "read"},
	} {
		row := "| " + r.name + " |"
		for _, b := range o.backends {
			row += " " + ratio(opMedian(results[b], r.num), opMedian(results[b], r.den)) + " |"
		}
		fmt.Fprintln(w, row)
	}
	if len(floors) > 0 {
		row := "| `docker exec true` / bash `true` |"
		for _, b := range o.backends {
			row += " " + ratio(floors[0].stats.median, opMedian(results[b], "bash")) + " |"
		}
		fmt.Fprintln(w, row)

		fmt.Fprintln(w)
		fmt.Fprintln(w, "| Docker floor | median | p90 |")
		fmt.Fprintln(w, "| --- | --- | --- |")
		for _, f := range floors {
			fmt.Fprintf(w, "| %s | %s | %s |\n", f.name, ms(f.stats.median), ms(f.stats.p90))
		}
	}
	if peer != nil {
		printPeer(w, *peer)
	}
	if len(floorRows) > 0 {
		printFloor(w, floorRows)
	}
	return nil
}

// benchStats are a series' median and 90th percentile.
type benchStats struct{ median, p90 time.Duration }

func statsOf(durs []time.Duration) benchStats {
	slices.Sort(durs)
	at := func(p float64) time.Duration { return durs[int(p*float64(len(durs)-1))] }
	return benchStats{at(0.5), at(0.9)}
}

func opMedian(stats []benchStats, tool string) time.Duration {
	i := slices.IndexFunc(benchOps, func(op benchOp) bool { return op.tool == tool })
	return stats[i].median
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + " ms"
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "–"
	}
	return strconv.FormatFloat(float64(a)/float64(b), 'f', 2, 64) + "×"
}

// loadAverage is the 1-minute load average, or "unknown" where /proc does
// not say.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// benchBackend times every tool on one backend, in a session of its own
// over a fresh workspace: small.txt and benchFiles files for grep.
func benchBackend(ctx context.Context, exe, backend string, o benchOptions) ([]benchStats, error) {
	dir, err := os.MkdirTemp("", "sandboxd-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "small.txt"), []byte("alpha\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "src"), 0o755); err != nil {
		return nil, err
	}
	for i := range benchFiles {
		text := fmt.Sprintf("package src\n\n// F%03d is file %d.\nfunc F%03d() {}\n", i, i, i)
		if i%20 == 0 {
			text += "// a needle\n"
		}
		if err := os.WriteFile(filepath.Join(dir, "src", fmt.Sprintf("f%03d.go", i)), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	args := []string{"mcp", "--backend", backend, "--workspace", dir, "--grant", "fs.write", "--grant", "shell.exec", "--always", "read,edit,shell"}
	entry, err := backendNamed(backend, sessionable)
	if err != nil {
		return nil, err
	}
	if entry.container {
		args = append(args, "--image", o.image)
	}
	if !entry.inPlace {
		args = append(args, "--deliver", "none")
	}
	c, err := startBench(ctx, exe, args...)
	if err != nil {
		return nil, err
	}
	defer c.close()
	var out []benchStats
	for _, op := range benchOps {
		for i := range 3 { // warm up: first calls load code and fill caches
			if err := c.callTool(op.tool, op.args(i)); err != nil {
				return nil, fmt.Errorf("%s: %w", op.tool, err)
			}
		}
		durs := make([]time.Duration, 0, o.calls)
		for i := range o.calls {
			start := time.Now()
			if err := c.callTool(op.tool, op.args(i+3)); err != nil {
				return nil, fmt.Errorf("%s: %w", op.tool, err)
			}
			durs = append(durs, time.Since(start))
		}
		out = append(out, statsOf(durs))
	}
	return out, c.close()
}

// benchClient speaks MCP to a spawned `sandboxd mcp`, one request at a time,
// one JSON-RPC message a line.
type benchClient struct {
	who    string // the server, for errors: sandboxd mcp unless set
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
	id     int
	closed bool
}

func startBench(ctx context.Context, exe string, args ...string) (*benchClient, error) {
	c := &benchClient{who: "sandboxd mcp", cmd: exec.CommandContext(ctx, exe, args...)}
	c.cmd.Stderr = &c.stderr
	var err error
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.out = bufio.NewScanner(stdout)
	c.out.Buffer(nil, 64<<20)
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	if _, err := c.request("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "sandboxd-bench", "version": sandboxdVersion()}}); err != nil {
		return nil, errors.Join(err, c.close())
	}
	if err := c.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"}); err != nil {
		return nil, errors.Join(err, c.close())
	}
	return c, nil
}

func (c *benchClient) send(msg any) error {
	line, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	_, err = c.in.Write(append(line, '\n'))
	return err
}

// request sends one request and returns its result, passing over the
// notifications (progress) that come before it.
func (c *benchClient) request(method string, params any) (json.RawMessage, error) {
	c.id++
	if err := c.send(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method, "params": params}); err != nil {
		return nil, c.failed(err)
	}
	for c.out.Scan() {
		var msg struct {
			ID     *int            `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(c.out.Bytes(), &msg); err != nil {
			return nil, fmt.Errorf("%s answered %q: %w", c.who, c.out.Bytes(), err)
		}
		switch {
		case msg.ID == nil || *msg.ID != c.id:
			continue // a notification
		case msg.Error != nil:
			return nil, fmt.Errorf("%s: %s", method, msg.Error.Message)
		}
		return msg.Result, nil
	}
	return nil, c.failed(cmp.Or(c.out.Err(), io.ErrUnexpectedEOF))
}

// failed adds what sandboxd mcp said on standard error to err.
func (c *benchClient) failed(err error) error {
	if s := strings.TrimSpace(c.stderr.String()); s != "" {
		return fmt.Errorf("%w; %s said: %s", err, c.who, s)
	}
	return err
}

// callTool calls a tool and fails unless it succeeds.
func (c *benchClient) callTool(name string, args any) error {
	raw, err := c.request("tools/call", map[string]any{"name": name, "arguments": args})
	if err != nil {
		return err
	}
	var res struct {
		IsError bool `json:"isError"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return err
	}
	if res.IsError {
		var text []string
		for _, c := range res.Content {
			text = append(text, c.Text)
		}
		return fmt.Errorf("the call failed: %s", strings.Join(text, " "))
	}
	return nil
}

// close ends the session (end of input) and waits for sandboxd mcp.
func (c *benchClient) close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	c.in.Close()
	if err := c.cmd.Wait(); err != nil {
		return c.failed(err)
	}
	return nil
}

// benchFloor is one Docker floor's figures.
type benchFloor struct {
	name  string
	stats benchStats
}

// dockerFloors times what Docker costs without sandboxd — a one-shot
// `docker exec true` into a running container, `docker run --rm IMAGE
// true` — beside what a sandboxd session costs to get: a cold session (a
// container created and started for it) and one claimed from a warm pool,
// each up to the end of its first call (`ls`). The engine API is called as
// the docker CLI calls it, without the CLI's own start-up. The floor
// containers carry this run's owner labels, so a run killed midway leaves
// them to the next `sandboxd mcp --backend docker` to remove.
func dockerFloors(ctx context.Context, sio stdio, o benchOptions) ([]benchFloor, error) {
	e, err := openBenchEngine(ctx, sio, o.image)
	if err != nil {
		return nil, err
	}
	// Whatever a floor left — a removal that lost a race, a warm container
	// a pool was still making at its shutdown — goes at the end.
	defer e.close(ctx, sio)
	cli, b, ref, daemon, labels := e.cli, e.b, e.ref, e.daemon, e.labels
	create := func(cmd ...string) (string, error) {
		ct, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
			Config:     &container.Config{Image: ref, Entrypoint: cmd, Labels: labels},
			HostConfig: &container.HostConfig{NetworkMode: "none"},
		})
		if err != nil {
			return "", err
		}
		_, err = cli.ContainerStart(ctx, ct.ID, client.ContainerStartOptions{})
		return ct.ID, err
	}
	remove := func(id string) {
		cli.ContainerRemove(context.WithoutCancel(ctx), id, client.ContainerRemoveOptions{Force: true})
	}
	var floors []benchFloor
	// measure times n runs of f; what f returns to do afterwards (a
	// session's deletion) is not timed.
	measure := func(name string, n int, f func() (after func() error, err error)) error {
		durs := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			after, err := f()
			durs = append(durs, time.Since(start))
			if after != nil {
				err = errors.Join(err, after())
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		floors = append(floors, benchFloor{name, statsOf(durs)})
		return nil
	}

	id, err := create("sleep", "3600")
	if err != nil {
		return nil, err
	}
	err = measure("`docker exec CONTAINER true`", o.floorCalls, func() (func() error, error) { return nil, docker.ExecOnce(ctx, cli, id, "true") })
	remove(id)
	if err != nil {
		return nil, err
	}
	// The removal is timed: `docker run --rm` waits for it.
	if err := measure("`docker run --rm IMAGE true`", o.floorCalls, func() (func() error, error) {
		id, err := create("true")
		if err != nil {
			return nil, err
		}
		defer remove(id)
		wait := cli.ContainerWait(ctx, id, client.ContainerWaitOptions{})
		select {
		case res := <-wait.Result:
			if res.StatusCode != 0 {
				return nil, fmt.Errorf("true exited %d", res.StatusCode)
			}
			return nil, nil
		case err := <-wait.Error:
			return nil, err
		}
	}); err != nil {
		return nil, err
	}

	for _, pool := range []int{0, 2} {
		opts := []runner.Option{runner.WithPolicy(policy.Policy{DefaultImage: ref}), runner.WithDaemonName(daemon), runner.WithJournalStores(journalStore)}
		name := "cold session: create, start, first call (`ls`)"
		if pool > 0 {
			opts = append(opts, runner.WithPool(runner.PoolConfig{Size: pool}))
			name = "warm-pool claim: create, first call (`ls`)"
		}
		m, err := runner.New(ctx, b, opts...)
		if err != nil {
			return nil, err
		}
		if pool > 0 {
			if err := waitReady(ctx, m); err != nil {
				return nil, err
			}
		}
		err = measure(name, o.floorCalls, func() (func() error, error) { return firstCall(ctx, m, pool > 0) })
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err = errors.Join(err, m.Shutdown(sctx))
		cancel()
		if err != nil {
			return nil, err
		}
	}
	return floors, nil
}

// waitReady waits until m's pool holds a ready container.
func waitReady(ctx context.Context, m *runner.Manager) error {
	for {
		if pools := m.Stats().Pools; len(pools) > 0 && pools[0].Ready > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// firstCall creates a session and makes its first call; it returns the
// session's deletion, and, with a pool, the wait for the pool to be ready
// again, for the caller to run untimed.
func firstCall(ctx context.Context, m *runner.Manager, pooled bool) (after func() error, err error) {
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "bench"})
	if err != nil {
		return nil, err
	}
	after = func() error {
		err := m.Delete(ctx, "bench", s.ID())
		if pooled {
			err = errors.Join(err, waitReady(ctx, m))
		}
		return err
	}
	res, err := s.Call(ctx, "ls", nil, tools.CallOptions{})
	if err == nil && res.IsError {
		err = errors.New(res.Text)
	}
	return after, err
}
