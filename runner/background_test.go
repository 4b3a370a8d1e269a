package runner_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// bgScript starts a tree — a double fork whose child is orphaned, a nohup
// job — prints their PIDs and its own, then ticks.
const bgScript = `sh -c 'sleep 1000 & echo pid $!'
nohup sleep 1000 >/dev/null 2>&1 & echo pid $!
echo pid $$; sleep 0.2; echo ready
i=0; while :; do echo tick$i; i=$((i+1)); sleep 0.05; done`

var pidOf = regexp.MustCompile(`(?m)^pid (\d+)$`)

func toolCall[T any](t *testing.T, s *runner.Session, tool string, args map[string]any) (*T, tools.Result) {
	t.Helper()
	raw, _ := json.Marshal(args)
	res, err := s.Call(context.Background(), tool, raw, tools.CallOptions{})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	out, _ := res.Structured.(*T)
	if res.IsError || out == nil {
		t.Fatalf("%s %v: %s", tool, args, res.Text)
	}
	return out, res
}

// startTree starts bgScript in the background, reads its output until
// it ticks (never a fixed sleep), and returns its id and PIDs.
func startTree(t *testing.T, s *runner.Session) (string, []string) {
	t.Helper()
	started, _ := toolCall[tools.BackgroundResult](t, s, "bash", map[string]any{"command": bgScript, "background": true})
	var out strings.Builder
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "tick2\n"); {
		r, text := toolCall[tools.BackgroundResult](t, s, "bash_output", map[string]any{"id": started.ID, "wait": 0.1})
		out.WriteString(r.Output)
		if !r.Running || time.Now().After(deadline) {
			t.Fatalf("no ticks from the background command: %s (read %q)", text.Text, out.String())
		}
	}
	var pids []string
	for _, m := range pidOf.FindAllStringSubmatch(out.String(), -1) {
		pids = append(pids, m[1])
	}
	if len(pids) != 3 {
		t.Fatalf("pids in %q", out.String())
	}
	return started.ID, pids
}

// treeGoneInside polls, with a command in the session, until none of pids
// is alive where the session's commands run.
func treeGoneInside(t *testing.T, s *runner.Session, pids []string) {
	t.Helper()
	script := "for p in " + strings.Join(pids, " ") + "; do kill -0 $p 2>/dev/null && echo alive $p; done; true"
	for deadline := time.Now().Add(30 * time.Second); ; {
		br, _ := bash(t, s, script)
		if br.Output == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("survived: %s", br.Output)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// backgroundCommands: a background command's output is read while it runs,
// the session's description lists it, bash_kill stops it and nothing of
// its tree survives. It returns the PIDs of a second tree left running.
func backgroundCommands(t *testing.T, m *runner.Manager) (*runner.Session, []string) {
	s := create(t, m, "acme", runner.Settings{Grants: []string{"shell.exec"}, Always: []string{"read", "shell"}})
	id, pids := startTree(t, s)
	if bg := s.Info().Background; len(bg) != 1 || bg[0].ID != id || !bg[0].Running {
		t.Errorf("Info().Background = %+v", bg)
	}
	killed, _ := toolCall[tools.BackgroundResult](t, s, "bash_kill", map[string]any{"id": id})
	if killed.Running || !killed.Killed {
		t.Errorf("bash_kill = %+v", killed)
	}
	treeGoneInside(t, s, pids)
	if bg := s.Info().Background; len(bg) != 1 || bg[0].Running || !bg[0].Killed {
		t.Errorf("Info().Background after the kill = %+v", bg)
	}
	_, pids = startTree(t, s)
	return s, pids
}

func TestBackgroundCommands(t *testing.T) {
	for _, b := range []backend.Backend{&local.Backend{Dir: t.TempDir()}, memory.Backend{TempDir: t.TempDir()}} {
		t.Run(b.Name(), func(t *testing.T) {
			m := newManager(t, b)
			s, pids := backgroundCommands(t, m)
			// The session's end kills the tree still running: another
			// session's commands share the host's processes to look.
			if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
				t.Fatal(err)
			}
			treeGoneInside(t, create(t, m, "acme", runner.Settings{Grants: []string{"shell.exec"}, Always: []string{"shell"}}), pids)
		})
	}
}

func TestDockerBackgroundCommands(t *testing.T) {
	m, _ := dockerManager(t)
	defer m.Shutdown(context.Background())
	s, _ := backgroundCommands(t, m)
	// The session's end stops it before the container goes.
	if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if bg := s.Tools().Background(); len(bg) != 2 || bg[1].Running || !bg[1].Killed {
		t.Errorf("after the session's end: %+v", bg)
	}
}
