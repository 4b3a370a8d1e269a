package integration

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// recoveryWait bounds how long a session may take to answer after a
// restart before it is counted lost; the target is seconds.
const recoveryWait = 2 * time.Minute

// retryEvery is how often a writer tries again while no daemon answers:
// a poll of the port, as a client's retry loop would.
const retryEvery = 10 * time.Millisecond

// leaveNothing removes, once the test and its daemons' stops are over,
// every container and volume of the daemon name: its sessions, which a
// stop leaves running.
func leaveNothing(tb testing.TB, name string) {
	cli := dockertest.Client(tb) // fails under CI without an engine; skips elsewhere
	tb.Cleanup(func() {
		if _, err := docker.Reap(context.Background(), cli, map[string]string{backend.LabelDaemon: name}, nil); err != nil {
			tb.Errorf("removing the sessions of %s: %v", name, err)
		}
	})
}

// retryable reports whether a call's error is what a client sees while
// the daemon is down, draining or starting, and should be retried: no
// answer at all (refused, reset, cut), or a 503 (ShuttingDown,
// Unavailable, Overloaded) or 429 Busy. Anything else (NotFound,
// SessionEnded, Internal) is an answer about the session.
func retryable(err error) bool {
	var e *client.Error
	if !errors.As(err, &e) {
		return true // the transport's: the daemon is not there
	}
	return e.StatusCode == http.StatusServiceUnavailable || errors.Is(err, client.ErrBusy)
}

// ack is one acknowledged call: when it was sent and when its OK came.
type ack struct {
	n          int
	sent, came time.Time
}

// writer is one session's loop of acknowledged writes: write n creates
// acked/n.txt with content(n), and is recorded only after its OK. A write
// the daemon's death cut is tried again, the same file with the same
// content.
type writer struct {
	id  string
	cl  *client.Client
	idx int

	mu    sync.Mutex
	acks  []ack
	lost  error // the answer that says the session is gone
	tick  chan struct{}
	ended chan struct{}
}

func (w *writer) content(n int) string { return fmt.Sprintf("session %d write %d\n", w.idx, n) }

func (w *writer) file(n int) string { return fmt.Sprintf("acked/%06d.txt", n) }

// run writes until ctx ends or the session is lost.
func (w *writer) run(ctx context.Context) {
	defer close(w.ended)
	for n := 0; ctx.Err() == nil; {
		sent := time.Now()
		res, err := w.cl.ToolCall(ctx, w.id, client.ToolCallOptions{Tool: "write", Arguments: map[string]any{"path": w.file(n), "content": w.content(n)}})
		if err == nil && res.IsError {
			err = fmt.Errorf("write %d: %+v", n, res.Content)
		}
		switch {
		case err == nil:
			w.mu.Lock()
			w.acks = append(w.acks, ack{n: n, sent: sent, came: time.Now()})
			w.mu.Unlock()
			select {
			case w.tick <- struct{}{}:
			default:
			}
			n++
		case ctx.Err() != nil:
		case retryable(err):
			select {
			case <-ctx.Done():
			case <-time.After(retryEvery):
			}
		default:
			w.mu.Lock()
			w.lost = fmt.Errorf("session %s: %w", w.id, err)
			w.mu.Unlock()
			select {
			case w.tick <- struct{}{}:
			default:
			}
			return
		}
	}
}

// since is how long after t the first call sent at t or later was
// acknowledged, and false when none was yet; err is the session's loss.
func (w *writer) since(t time.Time) (d time.Duration, ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i, _ := slices.BinarySearchFunc(w.acks, t, func(a ack, t time.Time) int { return a.sent.Compare(t) })
	if i < len(w.acks) {
		return w.acks[i].came.Sub(t), true, w.lost
	}
	return 0, false, w.lost
}

// recovery is the recovery benchmark's rig: a `sandboxd serve` on Docker
// whose sessions each run a writer, killed and restarted round by round.
type recovery struct {
	tb      testing.TB
	file    string
	d       *daemon
	writers []*writer
	tick    chan struct{}
	stop    context.CancelFunc
	samples []time.Duration
}

// newRecovery starts the daemon (on a port its restarts keep) and n
// sessions, each with its writer, and waits for every writer's first OK.
func newRecovery(tb testing.TB, n int) *recovery {
	tb.Helper()
	r := &recovery{tb: tb, tick: make(chan struct{}, 1)}
	name := daemonName(tb)
	leaveNothing(tb, name)
	r.file = config(tb, "docker", name, func(cfg map[string]any) {
		cfg["endSessionsOnExit"] = false
		cfg["limits"] = map[string]any{"maxTransferBytes": 256 << 20} // the read-back of thousands of files
	})
	r.d = start(tb, r.file)
	// The next runs listen where this one does, where the writers retry.
	r.file = withListen(tb, r.file, strings.TrimPrefix(r.d.url, "http://"))
	cl, err := client.New(client.WithBaseURL(r.d.url), client.WithToken(acmeToken), client.WithHTTPClient(&http.Client{Timeout: time.Minute}))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			var s runner.Info
			r.d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
			ids[i] = s.ID
		})
	}
	wg.Wait()
	for i, id := range ids {
		w := &writer{id: id, cl: cl, idx: i, tick: r.tick, ended: make(chan struct{})}
		r.writers = append(r.writers, w)
		go w.run(ctx)
	}
	tb.Cleanup(r.close)
	r.recovered(time.Time{})
	return r
}

// close stops the writers.
func (r *recovery) close() {
	r.stop()
	for _, w := range r.writers {
		<-w.ended
	}
}

// recovered waits until every session acknowledged a write sent after
// since, and returns how long after since each took; a session that is
// lost, or answers nothing within recoveryWait, fails the run.
func (r *recovery) recovered(since time.Time) []time.Duration {
	r.tb.Helper()
	deadline := time.After(recoveryWait)
	for {
		var out []time.Duration
		for _, w := range r.writers {
			d, ok, err := w.since(since)
			if err != nil {
				r.tb.Fatalf("a session was lost across the restart: %v\n%s", err, r.d.stderr)
			}
			if ok {
				out = append(out, d)
			}
		}
		if len(out) == len(r.writers) {
			return out
		}
		select {
		case <-r.tick:
		case <-deadline:
			r.tb.Fatalf("%d of %d sessions did not answer within %s of the restart: lost\n%s", len(r.writers)-len(out), len(r.writers), recoveryWait, r.d.stderr)
		}
	}
}

// round lets the writers write for a random moment, kills the daemon with
// SIGKILL, starts it again and keeps, per session, the time from the new
// process's start to its first acknowledged write.
func (r *recovery) round() {
	r.tb.Helper()
	time.Sleep(time.Duration(200+rand.IntN(1800)) * time.Millisecond) // the random moment of the crash
	r.d.kill()
	r.d = start(r.tb, r.file)
	r.samples = append(r.samples, r.recovered(r.d.started)...)
}

// verify stops the writers and reads every session's acknowledged files
// back: each must be there with its content. It returns how many writes
// were acknowledged, and fails the run on any that is lost.
func (r *recovery) verify() (acked int) {
	r.tb.Helper()
	r.close()
	cl, err := client.New(client.WithBaseURL(r.d.url), client.WithToken(acmeToken))
	if err != nil {
		r.tb.Fatal(err)
	}
	lost := 0
	for _, w := range r.writers {
		res, err := cl.CopyFromSession(context.Background(), w.id, client.CopyFromSessionOptions{Path: "acked"})
		if err != nil {
			r.tb.Fatalf("session %s: reading its files back: %v", w.id, err)
		}
		got := map[string]string{}
		tr := tar.NewReader(res.Content)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				r.tb.Fatalf("session %s: reading its files back: %v", w.id, err)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				r.tb.Fatalf("session %s: reading %s back: %v", w.id, h.Name, err)
			}
			got[h.Name] = string(b)
		}
		res.Content.Close()
		for _, a := range w.acks {
			if name := path.Base(w.file(a.n)); got[name] != w.content(a.n) {
				lost++
				r.tb.Errorf("session %s: acknowledged write %d lost: %s is %q, want %q", w.id, a.n, name, got[name], w.content(a.n))
			}
		}
		acked += len(w.acks)
	}
	if lost > 0 {
		r.tb.Fatalf("%d of %d acknowledged writes lost", lost, acked)
	}
	return acked
}

// quantile is the q-quantile of durs (nearest rank).
func quantile(durs []time.Duration, q float64) time.Duration {
	s := slices.Sorted(slices.Values(durs))
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// TestServeRecovery is the recovery benchmark's check, small enough for
// every CI run: three sessions writing, the daemon killed with SIGKILL
// twice; every session answers again and no acknowledged write is lost.
func TestServeRecovery(t *testing.T) {
	r := newRecovery(t, 3)
	for range 2 {
		r.round()
	}
	acked := r.verify()
	t.Logf("%d acknowledged writes kept; first answer after a restart: p50 %s, max %s", acked, quantile(r.samples, 0.5), quantile(r.samples, 1))
}

// BenchmarkServeRecovery is the recovery benchmark (BENCHMARKS.md,
// *Recovery*): Docker sessions (10, the figure; 30 to show how a
// restart grows with them), each in a loop of acknowledged writes, while
// `sandboxd serve` is killed with SIGKILL at a random moment and started
// again, a round an iteration (-benchtime 20x: 20 rounds). It reports the
// time from the new process's start to each session's first acknowledged
// write (p50, p99), and fails on a lost session or a lost acknowledged
// write (every acknowledged file is read back).
func BenchmarkServeRecovery(b *testing.B) {
	for _, n := range []int{10, 30} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			r := newRecovery(b, n)
			for b.Loop() {
				r.round()
			}
			acked := r.verify()
			p50, p99 := quantile(r.samples, 0.5), quantile(r.samples, 0.99)
			b.ReportMetric(float64(p50.Microseconds())/1e3, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1e3, "p99-ms")
			b.ReportMetric(0, "sessions-lost") // a loss fails the run
			b.ReportMetric(0, "writes-lost")
			b.ReportMetric(float64(acked), "writes-acked")
			b.ReportMetric(0, "ns/op") // a round's time is mostly the random wait
			b.Logf("%d rounds, %d sessions: first answer after the restart p50 %s, p99 %s, max %s; %d acknowledged writes, all read back; 0 sessions lost",
				len(r.samples)/n, n, p50, p99, quantile(r.samples, 1), acked)
		})
	}
}
