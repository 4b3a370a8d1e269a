package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/internal/proctree"
	"github.com/sandboxd/sandboxd/runner"
)

var cmdSoak = &command{
	name:    "soak",
	args:    "[--backend " + backendChoices(soakable) + "] [--sessions N] [--duration D] [--concurrency C]",
	summary: "run a daemon in this process, drive many sessions through it, and check nothing leaked",
	setup: func(fs *flag.FlagSet) runFunc {
		var o soakOptions
		fs.StringVar(&o.backend, "backend", "memory", "the daemon's `backend`: "+orList(backendNames(soakable)))
		fs.IntVar(&o.sessions, "sessions", 1000, "how many sessions to create, use and end (0: until --duration)")
		fs.DurationVar(&o.duration, "duration", 0, "stop starting sessions after this long (0: after --sessions)")
		fs.IntVar(&o.concurrency, "concurrency", 8, "sessions in flight at once")
		fs.StringVar(&o.dataDir, "data-dir", "", "the local backend's `directory` (default: a temporary one)")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			if o.sessions <= 0 && o.duration <= 0 {
				return usagef("give --sessions or --duration")
			}
			if o.concurrency <= 0 {
				return usagef("--concurrency must be positive")
			}
			if _, err := backendNamed(o.backend, soakable); err != nil {
				return err
			}
			return soak(ctx, sio, o)
		}
	},
}

type soakOptions struct {
	backend     string
	sessions    int
	duration    time.Duration
	concurrency int
	dataDir     string
}

// soakFigures is what must come back to where it started.
type soakFigures struct {
	Goroutines, OpenFiles, Processes, Containers int
}

func (f soakFigures) String() string {
	return fmt.Sprintf("goroutines %d, open files %d, child processes %d, containers %d", f.Goroutines, f.OpenFiles, f.Processes, f.Containers)
}

// soak runs `sandboxd serve` in this process on a free loopback port and
// drives sessions through its HTTP API: most are created, used by every
// tool and deleted; one in ten asks for a privileged container (refused),
// one in ten for an image that does not exist (fails to start on docker),
// one in ten is left to its idle timeout, one in ten runs a command past its
// timeout. Afterwards it compares goroutines, open files, child processes
// and the daemon's containers with the figures taken before.
func soak(ctx context.Context, sio stdio, o soakOptions) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	token := "soak_" + rand.Text()
	name := "sandboxd-soak-" + strconv.Itoa(os.Getpid())
	var cfg serveConfig
	cfg.Listen, cfg.Backend, cfg.Daemon = addr, o.backend, name
	cfg.Tenants = []httpapi.Tenant{{Name: "soak", Tokens: []string{httpapi.HashToken(token)}}}
	cfg.Limits.SessionsPerTenant = o.concurrency * 4
	cfg.Policy.Images = []string{"sandboxd/*"}
	cfg.ShutdownTimeout = runner.Duration(20 * time.Second)
	cfg.EndSessionsOnExit = true // a soak leaves nothing behind
	if o.backend == "local" {
		cfg.DataDir = o.dataDir
		if cfg.DataDir == "" {
			if cfg.DataDir, err = os.MkdirTemp("", "sandboxd-soak-"); err != nil {
				return err
			}
			defer os.RemoveAll(cfg.DataDir)
		}
	}
	var docker *client.Client
	if o.backend == "docker" {
		if docker, err = dockerClient(ctx); err != nil {
			return fmt.Errorf("docker: %w", err)
		}
		defer docker.Close()
	}

	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serve(sctx, stdio{in: sio.in, out: io.Discard, err: io.Discard}, cfg, false) }()
	c := &soakClient{url: "http://" + addr, token: token, http: &http.Client{Timeout: 2 * time.Minute}}
	if err := c.waitReady(ctx, served); err != nil {
		stop()
		return err
	}
	// A first round of sessions, as many at once as the soak runs, warms
	// what is made once (image checks, the agent volume) and fills the
	// connection pools (to the engine too) before the figures are taken.
	if err := c.warm(ctx, o.concurrency); err != nil {
		stop()
		<-served
		return fmt.Errorf("first sessions: %w", err)
	}
	before, err := c.settle(ctx, docker, name)
	if err != nil {
		stop()
		<-served
		return err
	}
	fmt.Fprintf(sio.out, "soak: backend %s, daemon %s on %s\nbefore: %v\n", o.backend, name, c.url, before)

	start := time.Now()
	var next, done, failed atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range o.concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if o.sessions > 0 && i >= int64(o.sessions) || o.duration > 0 && time.Since(start) > o.duration {
					return
				}
				if err := c.session(ctx, int(i)); err != nil {
					failed.Add(1)
					mu.Lock()
					firstErr = cmp.Or(firstErr, fmt.Errorf("session %d: %w", i, err))
					mu.Unlock()
				}
				if n := done.Add(1); n%100 == 0 {
					fmt.Fprintf(sio.err, "soak: %d sessions (%d failed unexpectedly), %v\n", n, failed.Load(), time.Since(start).Round(time.Second))
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := c.settle(ctx, docker, name)
	stop()
	serr := <-served
	if err != nil {
		return err
	}
	fmt.Fprintf(sio.out, "after:  %v\n%d sessions in %v (%.1f/s), %d failed unexpectedly\n",
		after, done.Load(), elapsed.Round(time.Second), float64(done.Load())/elapsed.Seconds(), failed.Load())
	var errs []error
	if firstErr != nil {
		errs = append(errs, firstErr)
	}
	if after.Goroutines > before.Goroutines+2 || after.OpenFiles > before.OpenFiles || after.Processes > before.Processes || after.Containers > before.Containers {
		errs = append(errs, fmt.Errorf("leak: before %v; after %v", before, after))
	}
	if serr != nil {
		errs = append(errs, fmt.Errorf("daemon: %w", serr))
	}
	return errors.Join(errs...)
}

type soakClient struct {
	url, token string
	http       *http.Client
}

func (c *soakClient) waitReady(ctx context.Context, served <-chan error) error {
	for range 600 {
		select {
		case err := <-served:
			return fmt.Errorf("the daemon stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if resp, err := c.http.Get(c.url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New("the daemon was not ready after a minute")
}

// do sends a request and decodes a JSON answer into out (when not nil); it
// fails unless the status is want.
func (c *soakClient) do(ctx context.Context, method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		js, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d, want %d: %.200s", method, path, resp.StatusCode, want, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// warm runs n ordinary sessions at once.
func (c *soakClient) warm(ctx context.Context, n int) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = c.session(ctx, 10*i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// session runs the i-th session of the soak, of the kind i selects.
func (c *soakClient) session(ctx context.Context, i int) error {
	settings := map[string]any{"grants": []string{"fs.write", "shell.exec"}, "always": []string{"edit", "shell"}}
	switch i % 10 {
	case 1: // refused by the policy: nothing may start
		settings["privileged"] = true
		return c.do(ctx, "POST", "/v1/sessions", settings, http.StatusForbidden, nil)
	case 2: // allowed by the policy, but no such image: fails to start on docker
		settings["image"] = "sandboxd/soak-no-such-image:" + strconv.Itoa(i)
		var info runner.Info
		if err := c.do(ctx, "POST", "/v1/sessions", settings, http.StatusCreated, &info); err == nil {
			return c.do(ctx, "DELETE", "/v1/sessions/"+info.ID, nil, http.StatusNoContent, nil) // backends without images
		}
		return nil
	case 3: // left to its idle timeout
		settings["idleTimeout"] = "1s"
	}
	var info runner.Info
	if err := c.do(ctx, "POST", "/v1/sessions", settings, http.StatusCreated, &info); err != nil {
		return err
	}
	tool := func(name string, args any) error {
		var res struct {
			IsError bool `json:"isError"`
		}
		if err := c.do(ctx, "POST", "/v1/sessions/"+info.ID+"/tools/"+name, map[string]any{"arguments": args}, http.StatusOK, &res); err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("%s failed", name)
		}
		return nil
	}
	steps := []func() error{
		func() error {
			return tool("write", map[string]any{"path": "src/main.go", "content": "package main\n\nfunc main() {}\n"})
		},
		func() error {
			return tool("edit", map[string]any{"path": "src/main.go", "edits": []map[string]string{{"oldText": "func main() {}", "newText": "func main() { println(1) }"}}})
		},
		func() error { return tool("read", map[string]any{"path": "src/main.go"}) },
		func() error { return tool("grep", map[string]any{"pattern": "println"}) },
		func() error { return tool("bash", map[string]any{"command": "ls -la src && echo $((6*7))"}) },
	}
	if i%10 == 4 {
		// A command past its timeout is a result, and its tree dies.
		steps = append(steps, func() error { return tool("bash", map[string]any{"command": "sleep 30 & sleep 30", "timeout": 0.3}) })
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	if i%10 == 3 {
		return nil // the daemon ends it after a second
	}
	return c.do(ctx, "DELETE", "/v1/sessions/"+info.ID, nil, http.StatusNoContent, nil)
}

// settle waits until the daemon has no session left (those left to their
// idle timeout end within seconds), lets the runtime quiesce, and takes the
// figures.
func (c *soakClient) settle(ctx context.Context, docker *client.Client, daemon string) (soakFigures, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		var list struct{ Sessions []runner.Info }
		if err := c.do(ctx, "GET", "/v1/sessions", nil, http.StatusOK, &list); err != nil {
			return soakFigures{}, err
		}
		if len(list.Sessions) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return soakFigures{}, fmt.Errorf("%d sessions still alive a minute after the last was used", len(list.Sessions))
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.http.CloseIdleConnections()
	proctree.CloseIdle() // the shims kept for the next command, as the connections
	var f soakFigures
	// Background work that ends by itself (HTTP connections closing, a
	// container's removal) gets a few seconds; the lowest reading counts.
	for round := range 10 {
		time.Sleep(500 * time.Millisecond)
		runtime.GC()
		g := soakFigures{Goroutines: runtime.NumGoroutine(), OpenFiles: countDir("/proc/self/fd"), Processes: descendants(os.Getpid())}
		if docker != nil {
			list, err := docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", backend.LabelDaemon+"="+daemon)})
			if err != nil {
				return f, err
			}
			g.Containers = len(list.Items)
		}
		if round == 0 || g.Goroutines+g.OpenFiles+g.Processes+g.Containers < f.Goroutines+f.OpenFiles+f.Processes+f.Containers {
			f = g
		}
	}
	return f, nil
}

func countDir(dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	return len(entries)
}

// descendants counts the processes below pid, from /proc (Linux; 0
// elsewhere).
func descendants(pid int) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	parent := map[int]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 {
			parent[p], _ = strconv.Atoi(fields[1])
		}
	}
	n := 0
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				n++
				break
			}
		}
	}
	return n
}
