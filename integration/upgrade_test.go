package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// copyBinary copies the built sandboxd to dir/sandboxd and returns its
// path: the old and the new binary of an upgrade.
func copyBinary(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(binDir, "sandboxd"))
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), dir, "sandboxd")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// reader calls read on a session in a loop, as a client that retries
// would, until stop: it keeps when each call was answered and every error
// it saw.
type reader struct {
	mu   sync.Mutex
	oks  []time.Time
	errs []error
	done chan struct{}
}

func readLoop(ctx context.Context, cl *client.Client, id string) *reader {
	r := &reader{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			res, err := cl.ToolCall(ctx, id, client.ToolCallOptions{Tool: "read", Arguments: map[string]any{"path": "kept.txt"}})
			if err == nil && (res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, "kept")) {
				err = fmt.Errorf("read kept.txt: %+v", res.CallResult)
			}
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			if err == nil {
				r.oks = append(r.oks, time.Now())
			} else {
				r.errs = append(r.errs, err)
			}
			r.mu.Unlock()
			select { // a client's pace, and its pause before a retry
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return r
}

// answeredSince reports whether a call was answered after t.
func (r *reader) answeredSince(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.oks) > 0 && r.oks[len(r.oks)-1].After(t)
}

// TestServeUpgrade replaces a running `sandboxd serve` with another binary
// (two copies of one build) as README's *Upgrades without downtime* says:
// SIGTERM to the old one, which drains and leaves its session, then the
// new one on the same address and state directory. A client reading in a
// loop sees only retryable errors (503 ShuttingDown, a refused or cut
// connection) and then answers from the same session; the session keeps
// its ID, its file, and its background command, which printed a line a
// second throughout: bash_output gives the lines written while no daemon
// ran.
func TestServeUpgrade(t *testing.T) {
	cli := dockertest.Client(t) // fails under CI without an engine; skips elsewhere
	name := daemonName(t)
	leaveNothing(t, name)
	oldExe, newExe := copyBinary(t, "old"), copyBinary(t, "new")
	file := config(t, "docker", name, func(cfg map[string]any) { cfg["endSessionsOnExit"] = false })
	d := startBinary(t, oldExe, file)
	file = withListen(t, file, strings.TrimPrefix(d.url, "http://")) // the new one listens where the old one did
	const perSecond = `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo "tick $i"; echo $i > /workspace/n; sleep 1; done`
	s, id := countingSession(t, d, perSecond)
	output := func(d *daemon) string { return bgOutput(t, d, s.ID, id, 1.5) }
	before := 0
	for before < 2 {
		before = max(before, dockertest.LastTick(output(d)))
	}

	cl, err := client.New(client.WithBaseURL(d.url), client.WithToken(acmeToken), client.WithHTTPClient(&http.Client{Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reads := readLoop(ctx, cl, s.ID)

	stopped := time.Now()
	d.stop() // the old binary drains, leaves the session, exits 0
	exited := time.Now()
	meanwhile := countsOn(t, cli, s.Workspace, before)
	d = startBinary(t, newExe, file)
	var back runner.Info
	d.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &back)
	if back.Workspace != s.Workspace || !back.Created.Equal(s.Created) {
		t.Fatalf("after the upgrade: the session is %+v, was %+v", back, s)
	}
	if r := d.call(acmeToken, s.ID, "read", map[string]any{"path": "kept.txt"}); r.IsError || !strings.Contains(r.Content[0].Text, "kept") {
		t.Fatalf("after the upgrade: its file: %+v", r)
	}
	if out := output(d); !strings.Contains(out, "tick "+strconv.Itoa(meanwhile)+"\n") {
		t.Fatalf("after the upgrade: bash_output %q lacks tick %d, written while no daemon ran", out, meanwhile)
	}
	for deadline := time.Now().Add(time.Minute); !reads.answeredSince(d.started); {
		if time.Now().After(deadline) {
			t.Fatalf("the retrying client got no answer from the new daemon within a minute: %v", reads.errs)
		}
		time.Sleep(50 * time.Millisecond) // a poll of the client's record
	}
	cancel()
	<-reads.done
	kinds := map[string]int{}
	for _, err := range reads.errs {
		if !retryable(err) {
			t.Fatalf("across the upgrade the client got %v: not a retryable error", err)
		}
		kinds[err.Error()]++
	}
	t.Logf("the old daemon exited %s after SIGTERM; no daemon ran for %s (the test waits for the command to count on); the new one answered the client %s after its start; the client saw: %v",
		exited.Sub(stopped), d.started.Sub(exited), reads.firstAfter(d.started).Sub(d.started), kinds)
	if r := d.call(acmeToken, s.ID, "bash_kill", map[string]any{"id": id}); r.IsError {
		t.Fatalf("bash_kill after the upgrade: %+v", r)
	}
	d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)
}

// firstAfter is when the first call after t was answered.
func (r *reader) firstAfter(t time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ok := range r.oks {
		if ok.After(t) {
			return ok
		}
	}
	return time.Time{}
}
