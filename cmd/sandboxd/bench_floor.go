package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	sandboxd "github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// benchEngine is what a Docker part of bench runs on: the engine's client,
// the docker backend and its image, and the daemon name and owner labels
// its containers carry, so that close removes whatever is left of them.
type benchEngine struct {
	cli    *client.Client
	b      *docker.Backend
	ref    string
	daemon string
	labels map[string]string
}

func openBenchEngine(ctx context.Context, sio stdio, image string) (*benchEngine, error) {
	cli, err := dockerClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w (run 'sandboxd doctor')", err)
	}
	b, ref, err := dockerBackend(ctx, sio, cli, image, false)
	if err != nil {
		cli.Close()
		return nil, err
	}
	e := &benchEngine{cli: cli, b: b, ref: ref, daemon: "cli-bench-" + strings.ToLower(rand.Text()[:8]), labels: backend.Self().Labels()}
	e.labels[backend.LabelDaemon] = e.daemon
	return e, nil
}

// close removes the containers and volumes labelled with e's daemon name,
// and closes the client.
func (e *benchEngine) close(ctx context.Context, sio stdio) {
	if _, err := docker.Reap(context.WithoutCancel(ctx), e.cli, map[string]string{backend.LabelDaemon: e.daemon}, nil); err != nil {
		fmt.Fprintf(sio.err, "sandboxd bench: removing the bench's containers: %v\n", err)
	}
	e.cli.Close()
}

// floorCall is one of the small calls issue 31 holds to a floor: sandboxd's
// tool call, made through the HTTP API and through MCP, and the floor
// server's request for the same thing. port, when set, is the same through
// the session's FileSystem port alone (one agent round trip).
type floorCall struct {
	name, tool string
	args       map[string]any
	// method and path are the floor server's request.
	method, path string
	port         func(ctx context.Context, fsys workspace.FileSystem) error
}

// floorDirEntries is how many files the listed directory holds.
const floorDirEntries = 10

// floorCalls are the calls held to the floor. sandboxd's tools have no
// stat of their own: the workspace-shell profile's `ls -ld FILE` is the
// one call that stats a file alone (one Lstat through the agent).
var floorCalls = []floorCall{
	{"read, 4 KB", "read", map[string]any{"path": "f4k.txt"}, http.MethodGet, "/file?path=f4k.txt",
		func(ctx context.Context, fsys workspace.FileSystem) error {
			_, err := fsys.ReadFile(ctx, "f4k.txt", 1<<20)
			return err
		}},
	{"stat (`shell` `ls -ld FILE`)", "shell", map[string]any{"command": "ls -ld f4k.txt"}, http.MethodGet, "/stat?path=f4k.txt",
		func(ctx context.Context, fsys workspace.FileSystem) error {
			_, err := fsys.Lstat(ctx, "f4k.txt")
			return err
		}},
	{fmt.Sprintf("ls, %d entries", floorDirEntries), "ls", map[string]any{"path": "dir"}, http.MethodGet, "/ls?path=dir",
		func(ctx context.Context, fsys workspace.FileSystem) error {
			_, err := fsys.ReadDir(ctx, "dir")
			return err
		}},
	{"bash `true` (floor: fork+exec `bash -c true`)", "bash", map[string]any{"command": "true"}, http.MethodPost, "/exec", nil},
}

// The paths a floor call is timed on, in the order of floorRow.stats.
const (
	pathFloor = iota
	pathPort
	pathRunner
	pathAPI
	pathMCP
	floorPaths
)

// floorRow is one call's figures on each path; a path the call does not
// take (bash has no port call) has no samples.
type floorRow struct {
	name  string
	stats [floorPaths]benchStats
	timed [floorPaths]bool
}

// floorText is the 4 KB file read: 64 lines of 64 bytes.
var floorText = strings.Repeat(strings.Repeat("x", 63)+"\n", 64)

// benchAgainstFloor times floorCalls on Docker three ways, interleaved call by
// call in one run (the order rotated each round): through sandboxd's HTTP
// API (a runner and httpapi in this process on loopback, the client
// package calling it), through MCP (a spawned `sandboxd mcp --backend
// docker` on standard input and output, a session and container of its
// own), and the floor server (o.floorServer) in a sibling container of the
// HTTP session's: the same image, user and hardening, the session's
// workspace volume mounted read-only, but the host's network, so that it is
// reached over loopback without the agent's stream. It returns a row per
// call.
func benchAgainstFloor(ctx context.Context, sio stdio, o benchOptions) ([]floorRow, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	floorBin, err := filepath.Abs(o.floorServer)
	if err != nil {
		return nil, err
	}
	e, err := openBenchEngine(ctx, sio, o.image)
	if err != nil {
		return nil, err
	}
	defer e.close(ctx, sio)
	cli, b, ref, daemon := e.cli, e.b, e.ref, e.daemon

	// The workspace: for MCP a directory, for the HTTP session the same
	// files written through the API.
	dir, err := os.MkdirTemp("", "sandboxd-bench-floor-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	files := map[string]string{"f4k.txt": floorText}
	for i := range floorDirEntries {
		files[fmt.Sprintf("dir/f%02d.txt", i)] = fmt.Sprintf("file %d\n", i)
	}
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return nil, err
		}
	}

	cfg := tools.DefaultConfig()
	cfg.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
	cfg.MaxCallsPerRun = 0 // as serve has it
	m, err := runner.New(ctx, b, runner.WithPolicy(policy.Policy{DefaultImage: ref}), runner.WithDaemonName(daemon),
		runner.WithJournalStores(journalStore), runner.WithTools(cfg))
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := m.Shutdown(sctx); err != nil {
			fmt.Fprintf(sio.err, "sandboxd bench: stopping the floor's daemon: %v\n", err)
		}
	}()
	token := "sbx_" + rand.Text()
	hs, err := httpapi.New(m, httpapi.WithTenants([]httpapi.Tenant{{Name: "bench", Tokens: []string{httpapi.HashToken(token)}}}))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: hs, ReadHeaderTimeout: time.Minute}
	go srv.Serve(ln)
	defer srv.Close()
	api, err := sandboxd.New(sandboxd.WithBaseURL("http://"+ln.Addr().String()), sandboxd.WithToken(token))
	if err != nil {
		return nil, err
	}
	created, err := api.SessionCreate(ctx, sandboxd.SessionCreateOptions{Settings: runner.Settings{
		Grants: []string{"fs.write", "shell.exec"}, Always: []string{"read", "edit", "shell"}}})
	if err != nil {
		return nil, fmt.Errorf("the HTTP API's session: %w", err)
	}
	id := created.Session.ID
	apiCall := func(tool string, args any) error {
		res, err := api.ToolCall(ctx, id, sandboxd.ToolCallOptions{Tool: tool, Arguments: args})
		if err == nil && res.IsError {
			var text []string
			for _, c := range res.Content {
				text = append(text, c.Text)
			}
			err = fmt.Errorf("the call failed: %s", strings.Join(text, " "))
		}
		if err != nil {
			return fmt.Errorf("%s through the HTTP API: %w", tool, err)
		}
		return nil
	}
	for name, text := range files {
		if err := apiCall("write", map[string]any{"path": name, "content": text}); err != nil {
			return nil, err
		}
	}

	floorURL, err := startFloor(ctx, cli, id, floorBin, e.labels)
	if err != nil {
		return nil, fmt.Errorf("the floor server: %w", err)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	floorReq := func(c floorCall) error {
		req, err := http.NewRequestWithContext(ctx, c.method, floorURL+c.path, nil)
		if err != nil {
			return err
		}
		res, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if err == nil && res.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s %s: %s", c.method, c.path, res.Status)
		}
		return err
	}

	mc, err := startBench(ctx, exe, "mcp", "--backend", "docker", "--workspace", dir, "--image", o.image, "--deliver", "none",
		"--grant", "fs.write", "--grant", "shell.exec", "--always", "read,edit,shell",
		"--profile", tools.ProfileWorkspaceTools+","+tools.ProfileWorkspaceShell)
	if err != nil {
		return nil, fmt.Errorf("sandboxd mcp: %w", err)
	}
	defer mc.close()

	sess, err := m.Get("bench", id)
	if err != nil {
		return nil, err
	}
	paths := [floorPaths]func(floorCall) error{
		pathFloor: floorReq,
		pathPort:  func(c floorCall) error { return c.port(ctx, sess.FS()) },
		pathRunner: func(c floorCall) error {
			args, err := json.Marshal(c.args)
			if err != nil {
				return err
			}
			res, err := sess.Call(ctx, c.tool, args, tools.CallOptions{})
			if err == nil && res.IsError {
				err = errors.New(res.Text)
			}
			return err
		},
		pathAPI: func(c floorCall) error { return apiCall(c.tool, c.args) },
		pathMCP: func(c floorCall) error { return mc.callTool(c.tool, c.args) },
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	durs := make([][floorPaths][]time.Duration, len(floorCalls))
	for round := range o.calls + 3 { // the first three warm up: connections, caches, code
		for i, c := range floorCalls {
			for k := range paths {
				p := (k + round) % len(paths)
				if p == pathPort && c.port == nil {
					continue
				}
				start := time.Now()
				if err := paths[p](c); err != nil {
					return nil, fmt.Errorf("%s: %w", c.name, err)
				}
				if round >= 3 {
					durs[i][p] = append(durs[i][p], time.Since(start))
				}
			}
		}
	}
	rows := make([]floorRow, len(floorCalls))
	for i, c := range floorCalls {
		rows[i].name = c.name
		for p, d := range durs[i] {
			if len(d) > 0 {
				rows[i].stats[p], rows[i].timed[p] = statsOf(d), true
			}
		}
	}
	return rows, mc.close()
}

// startFloor runs the floor server in a sibling of session's container,
// and returns its URL once it answers. The sibling has the session's image,
// user, capabilities, seccomp profile and limits, its workspace volume
// read-only at the same place, and floorBin mounted read-only; its network
// is the host's, so it listens on the host's loopback. It carries labels
// (the bench engine's), so that its reap removes it.
func startFloor(ctx context.Context, cli *client.Client, session, floorBin string, labels map[string]string) (string, error) {
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", policy.LabelSession+"="+session)})
	if err != nil {
		return "", err
	}
	if len(list.Items) != 1 {
		return "", fmt.Errorf("%d containers of session %s, want 1", len(list.Items), session)
	}
	in, err := cli.ContainerInspect(ctx, list.Items[0].ID, client.ContainerInspectOptions{})
	if err != nil {
		return "", err
	}
	sc, shc := in.Container.Config, in.Container.HostConfig
	var vol string
	for _, mt := range in.Container.Mounts {
		if mt.Destination == policy.WorkspaceDir {
			vol = mt.Name
		}
	}
	if vol == "" {
		return "", fmt.Errorf("session %s's container mounts no volume at %s", session, policy.WorkspaceDir)
	}
	// A free port on loopback, for the floor to listen on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	l.Close()
	const bin = "/.sandboxd-floor"
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: sc.Image, User: sc.User, Env: sc.Env, WorkingDir: sc.WorkingDir, Labels: labels,
			Entrypoint: []string{bin, "-addr", addr, "-root", policy.WorkspaceDir}},
		HostConfig: &container.HostConfig{
			NetworkMode: "host", CapDrop: shc.CapDrop, CapAdd: shc.CapAdd, SecurityOpt: shc.SecurityOpt,
			ReadonlyRootfs: shc.ReadonlyRootfs, Tmpfs: shc.Tmpfs, Runtime: shc.Runtime, IpcMode: shc.IpcMode, Resources: shc.Resources,
			Mounts: []mount.Mount{
				{Type: mount.TypeBind, Source: floorBin, Target: bin, ReadOnly: true},
				{Type: mount.TypeVolume, Source: vol, Target: policy.WorkspaceDir, ReadOnly: true},
			},
		},
	})
	if err != nil {
		return "", err
	}
	if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return "", err
	}
	url := "http://" + addr
	// Wait for it to answer: a refused connection is a server not yet
	// listening, until the container is seen to have stopped.
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := http.Get(url + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return url, nil
			}
			err = errors.New(res.Status)
		}
		st, ierr := cli.ContainerInspect(ctx, created.ID, client.ContainerInspectOptions{})
		if ierr != nil {
			return "", ierr
		}
		if running := st.Container.State != nil && st.Container.State.Running; !running || time.Now().After(deadline) {
			return "", fmt.Errorf("it does not answer on %s (running: %v): %w", addr, running, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// printFloor prints benchAgainstFloor's rows: each path's median and 90th
// percentile, and the ratios of the HTTP API's and MCP's medians to the
// floor's (issue 31's target: within 1.2×).
func printFloor(w io.Writer, rows []floorRow) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| Docker call, interleaved: median / p90 | floor server | agent port | runner Session.Call | HTTP API | MCP | HTTP API / floor | MCP / floor |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		row := "| " + r.name + " |"
		for p := range floorPaths {
			if !r.timed[p] {
				row += " – |"
				continue
			}
			row += fmt.Sprintf(" %s / %s |", ms(r.stats[p].median), ms(r.stats[p].p90))
		}
		fmt.Fprintf(w, "%s %s | %s |\n", row, ratio(r.stats[pathAPI].median, r.stats[pathFloor].median), ratio(r.stats[pathMCP].median, r.stats[pathFloor].median))
	}
}
