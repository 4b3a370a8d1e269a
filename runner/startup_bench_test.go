package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// bigTree writes n small files in 50 directories under a new directory
// and returns it.
func bigTree(t testing.TB, n int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		name := filepath.Join(dir, fmt.Sprintf("d%02d", i%50), fmt.Sprintf("f%05d.txt", i))
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, fmt.Appendf(nil, "file %d\n", i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// maxStartupRatio is how much longer start-up to the first call may take
// on a 10,000-file workspace than on an empty one (issue 31's regression
// guard; its goal is 1.5).
const maxStartupRatio = 3

// startupRounds is how many pairs of start-ups (empty, 10,000 files) one
// iteration of BenchmarkStartup makes; their medians are compared.
const startupRounds = 21

// BenchmarkStartup measures, on the local and memory backends, the time
// from a new manager to the answer of a session's first call (a read of one small file) — what
// `sandboxd mcp` does before its first answer — on an empty workspace and
// on a 10,000-file one, interleaved in one run (after one pair not
// counted, which warms what every start shares), and fails when the ratio
// of their lower quartiles is over maxStartupRatio (see quartileOf; the
// medians' ratio is reported too): the ratio, never an absolute time. The local backend works on the directory in place (local.Dir, as
// `sandboxd mcp --backend local`). The memory backend's workspace is made
// before the clock starts (a copy of the directory, which is the memory
// backend's own cost, as large as the tree: reported as copy-ms, not
// guarded), so that what is compared is what the runner adds to it. Run it
// with -benchtime 1x (CI does):
//
//	go test ./runner -run '^$' -bench '^BenchmarkStartup$' -benchtime 1x
func BenchmarkStartup(b *testing.B) {
	empty, big := b.TempDir(), bigTree(b, 10_000)
	// The first call's own work is the same in both: a read of the one
	// file both have.
	for _, dir := range []string{empty, big} {
		if err := os.WriteFile(filepath.Join(dir, firstFile), []byte("first\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	var copying time.Duration
	for _, tc := range []struct {
		name string
		open func(dir string) backend.Backend
	}{
		{"local", func(dir string) backend.Backend { return local.Dir{Path: dir} }},
		{"memory", func(dir string) backend.Backend {
			start := time.Now()
			inst, err := memory.Backend{TempDir: b.TempDir()}.Open(context.Background(), backend.Spec{Source: dir})
			if err != nil {
				b.Fatal(err)
			}
			if dir == big {
				copying += time.Since(start)
			}
			return opened{"memory", inst}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			startToFirstCall(b, tc.open(empty))
			startToFirstCall(b, tc.open(big))
			copying = 0
			var onEmpty, onBig []time.Duration
			for b.Loop() {
				for range startupRounds {
					b.StopTimer()
					bk := tc.open(empty)
					runtime.GC() // not the last start's garbage
					b.StartTimer()
					onEmpty = append(onEmpty, startToFirstCall(b, bk))
					b.StopTimer()
					bk = tc.open(big)
					runtime.GC()
					b.StartTimer()
					onBig = append(onBig, startToFirstCall(b, bk))
				}
			}
			ms := func(d time.Duration) float64 { return d.Seconds() * 1000 }
			e, g := medianOf(onEmpty), medianOf(onBig)
			ratio := g.Seconds() / e.Seconds()
			qe, qg := quartileOf(onEmpty), quartileOf(onBig)
			guarded := qg.Seconds() / qe.Seconds()
			b.ReportMetric(ms(e), "empty-ms")
			b.ReportMetric(ms(g), "10k-ms")
			b.ReportMetric(ratio, "ratio")
			b.ReportMetric(guarded, "p25-ratio")
			if copying > 0 {
				b.ReportMetric(ms(copying)/float64(len(onBig)), "copy-ms")
			}
			b.Logf("%s: start to first call, median of %d: %.1f ms empty, %.1f ms on 10,000 files: %.2f×; lower quartile %.1f ms, %.1f ms: %.2f×",
				tc.name, len(onBig), ms(e), ms(g), ratio, ms(qe), ms(qg), guarded)
			if guarded > maxStartupRatio {
				b.Fatalf("start-up on 10,000 files is %.2f× that on an empty workspace (lower quartiles), over %d×", guarded, maxStartupRatio)
			}
		})
	}
}

// quartileOf is the lower quartile of ds: on a loaded machine a start-up
// is only ever slowed (a preempted process, a busy disk), so the lower
// quartiles compare what each start-up costs with less of that noise
// than the medians; a workspace-sized cost shows in both.
func quartileOf(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/4]
}

// medianOf is the middle of ds (of the two middle ones, the larger).
func medianOf(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// opened is a backend whose one workspace is already made.
type opened struct {
	name string
	inst *backend.Instance
}

func (o opened) Name() string { return o.name }

func (o opened) Open(context.Context, backend.Spec) (*backend.Instance, error) { return o.inst, nil }

func (opened) Reap(context.Context, map[string]string) (int, error) { return 0, nil }

// firstFile is the file, in the empty workspace and the 10,000-file one,
// whose read is the first call: a call whose own work does not grow with
// the tree (an ls of the root would list 50 directories in one and none
// in the other, which on a loaded disk is milliseconds apart).
const firstFile = "first.txt"

// startToFirstCall is the time from a new manager over bk to the answer
// of the first call of its first session; the session's end is not
// counted.
func startToFirstCall(b *testing.B, bk backend.Backend) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	m, err := runner.New(ctx, bk)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		b.StopTimer()
		m.Shutdown(ctx)
		b.StartTimer()
	}()
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	if r, err := s.Call(ctx, "read", json.RawMessage(`{"path":"`+firstFile+`"}`), tools.CallOptions{}); err != nil || r.IsError {
		b.Fatalf("read: %+v, %v", r, err)
	}
	return time.Since(start)
}
