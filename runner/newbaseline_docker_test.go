package runner_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/runner"
)

// TestDockerRebaselineSurvivesRestarts: a new baseline replaces the first
// tree the session keeps beside its record, so after the daemon leaves the
// session (Shutdown) or crashes, the run that resumes it diffs against the
// new baseline — the same patch, of what changed since it alone — and
// nothing is reported lost.
func TestDockerRebaselineSurvivesRestarts(t *testing.T) {
	for _, how := range []string{"leave", "crash"} {
		t.Run(how, func(t *testing.T) {
			state := t.TempDir()
			m, _ := durableManager(t, state, restartOptions(t, how)...)
			defer m.Shutdown(context.Background())
			s, _ := startedSession(t, m)
			ctx := context.Background()
			if _, err := rebaseline(ctx, s, runner.BaselineRequest{}); err != nil {
				t.Fatal(err)
			}
			if patch, err := diffOf(ctx, s); err != nil || patch != "" {
				t.Fatalf("the diff right after a new baseline: %v\n%s", err, patch)
			}
			callOK(t, s, "write", map[string]any{"path": "d.txt", "content": "dee\n"})
			callOK(t, s, "edit", map[string]any{"path": "a.txt", "edits": []map[string]string{{"oldText": "one", "newText": "uno"}}})
			patch, err := diffOf(ctx, s)
			if err != nil || !strings.Contains(patch, "b/d.txt") || !strings.Contains(patch, "-one\n+uno\n") || strings.Contains(patch, "base.txt") || strings.Contains(patch, "c.sh") {
				t.Fatalf("the diff since the new baseline: %v\n%s", err, patch)
			}
			kept := filepath.Join(stateOf(t, state, s.ID()), "baseline")
			if tree, err := delivery.ReadKeptTree(kept); err != nil || tree.Files["a.txt"].OID != delivery.BlobOID([]byte("one\n")) {
				t.Fatalf("the kept baseline: %+v, %v; want the new one (a.txt: one)", tree, err)
			}
			if how == "crash" {
				runner.Crash(m)
			} else if err := m.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}

			again, _ := durableManager(t, state, runner.WithJournalStores(privateJournals))
			defer again.Shutdown(ctx)
			back, err := again.Get("acme", s.ID())
			if err != nil {
				t.Fatalf("the session after the restart: %v", err)
			}
			if lost := back.Info().Lost; len(lost) != 0 {
				t.Fatalf("the session lost %q", lost)
			}
			if got, err := diffOf(ctx, back); err != nil || got != patch {
				t.Fatalf("the diff since the new baseline after the restart: %v\n%s\nwant\n%s", err, got, patch)
			}
		})
	}
}

// restartOptions are the options of a daemon's run that ends as how says:
// "leave" (Shutdown), or "crash" (runner.Crash), its labels then naming an
// owner that has ended, as a crashed run's do.
func restartOptions(t *testing.T, how string) []runner.Option {
	t.Helper()
	opts := []runner.Option{runner.WithJournalStores(privateJournals)}
	if how == "crash" {
		self := backend.Self()
		if self.Start == "" {
			if os.Getenv("CI") != "" {
				t.Fatal("the kernel does not say when a process started (no /proc), which CI's Linux must")
			}
			t.Skip("the kernel does not say when a process started (no /proc)")
		}
		ended := backend.Owner{Host: self.Host, PID: self.PID, Start: "1"} // its PID now names a later process
		opts = append(opts, runner.WithLabels(ended.Labels()))
	}
	return opts
}
