package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// BenchmarkDockerConcurrentSessions runs 100 sessions at once on the Docker
// backend: it starts them all concurrently, then — every one of them alive —
// has each make a round of tool calls (write, read, edit, grep, bash, ls) at
// the same time, then ends them. It reports the calls and starts that
// failed (errors, which must be 0), how long the starts took (start-s),
// how long the round of calls took with all sessions running (calls-s), and
// calls/s in that round. Run it with -benchtime 1x: one iteration is 100
// containers.
func BenchmarkDockerConcurrentSessions(b *testing.B) {
	const sessions = 100
	m, _ := dockerManager(b, runner.WithDaemonName(dockertest.DaemonName("bench-concurrent")))
	defer m.Shutdown(context.Background())
	calls := []struct{ tool, args string }{
		{"write", `{"path":"src/f.txt","content":"one\ntwo\nthree\n"}`},
		{"read", `{"path":"src/f.txt"}`},
		{"edit", `{"path":"src/f.txt","edits":[{"oldText":"two","newText":"TWO"}]}`},
		{"grep", `{"pattern":"TWO"}`},
		{"bash", `{"command":"cat src/f.txt | wc -l; ls src","timeout":60}`},
		{"ls", `{"path":"src"}`},
	}
	all := runner.Settings{Grants: []string{tools.GrantFSWrite, tools.GrantShellExec}, Always: []string{"read", "edit", "shell"}}
	var failed atomic.Int64
	var once sync.Once
	fail := func(err error) {
		failed.Add(1)
		once.Do(func() { b.Errorf("first failure: %v", err) })
	}
	var starting, calling time.Duration
	for b.Loop() {
		begin := time.Now()
		live := make([]*runner.Session, sessions)
		var wg sync.WaitGroup
		for i := range live {
			wg.Go(func() {
				s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "t" + strconv.Itoa(i%10), Settings: all})
				if err != nil {
					fail(err)
					return
				}
				live[i] = s
			})
		}
		wg.Wait()
		starting += time.Since(begin)
		begin = time.Now()
		for _, s := range live {
			if s == nil {
				continue
			}
			wg.Go(func() {
				for _, c := range calls {
					res, err := s.Call(context.Background(), c.tool, json.RawMessage(c.args), tools.CallOptions{})
					switch {
					case err != nil:
						fail(err)
					case res.IsError:
						fail(fmt.Errorf("%s: %s", c.tool, res.Text))
					case c.tool == "bash" && res.Structured.(*tools.BashResult).Output != "3\nf.txt\n":
						fail(fmt.Errorf("bash output %q", res.Structured.(*tools.BashResult).Output))
					}
				}
			})
		}
		wg.Wait()
		calling += time.Since(begin)
		b.StopTimer()
		for _, s := range live {
			if s != nil {
				wg.Go(func() { m.Delete(context.Background(), s.Tenant(), s.ID()) })
			}
		}
		wg.Wait()
		b.StartTimer()
	}
	b.ReportMetric(float64(failed.Load()), "errors")
	b.ReportMetric(starting.Seconds()/float64(b.N), "start-s")
	b.ReportMetric(calling.Seconds()/float64(b.N), "calls-s")
	b.ReportMetric(float64(sessions*len(calls)*b.N)/calling.Seconds(), "calls/s")
}

// BenchmarkIdleSessionMemory measures what an idle session costs the
// daemon's own process: the Go heap in use and the resident set, before
// and after creating N sessions that then wait, per session. The Docker
// backend's containers are not counted (they are the engine's); the memory
// backend's workspaces are, being in the daemon. Run it with -benchtime 1x.
func BenchmarkIdleSessionMemory(b *testing.B) {
	for _, tc := range []struct {
		name string
		n    int
		open func(b *testing.B) *runner.Manager
	}{
		{"memory", 500, func(b *testing.B) *runner.Manager {
			m, err := runner.New(context.Background(), memory.Backend{})
			if err != nil {
				b.Fatal(err)
			}
			return m
		}},
		{"docker", 100, func(b *testing.B) *runner.Manager {
			m, _ := dockerManager(b, runner.WithDaemonName(dockertest.DaemonName("bench-idle")))
			return m
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				m := tc.open(b)
				// One session first, so what every session shares (the
				// agent volume, the client's connections, code paths
				// warmed) is not counted against the others.
				create(b, m, "warm", runner.Settings{})
				before := memNow()
				for i := range tc.n {
					create(b, m, "t"+strconv.Itoa(i%10), runner.Settings{})
				}
				after := memNow()
				per := func(a, b int64) float64 { return float64(a-b) / float64(tc.n) }
				b.ReportMetric(per(after.heap, before.heap)/1024, "heap-KiB/session")
				b.ReportMetric(per(after.stack, before.stack)/1024, "stack-KiB/session")
				b.ReportMetric(per(after.goroutines, before.goroutines), "goroutines/session")
				b.ReportMetric(per(after.rss, before.rss)/1024, "rss-KiB/session")
				m.Shutdown(context.Background())
			}
		})
	}
}

type memUse struct{ heap, stack, goroutines, rss int64 }

// memNow returns the Go heap and stacks in use and the goroutines after a
// collection that returns freed memory to the system, and the process's
// resident set size then.
func memNow() memUse {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u := memUse{heap: int64(ms.HeapInuse), stack: int64(ms.StackInuse), goroutines: int64(runtime.NumGoroutine())}
	data, err := os.ReadFile("/proc/self/statm")
	if f := strings.Fields(string(data)); err == nil && len(f) > 1 {
		pages, _ := strconv.ParseInt(f[1], 10, 64)
		u.rss = pages * int64(os.Getpagesize())
	}
	return u
}
