package runner_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// editing are settings with the edit skill off until load_skill.
var editing = runner.Settings{Grants: []string{tools.GrantFSWrite, tools.GrantShellExec}, Always: []string{"read", "shell"}}

// callOK calls tool in s with args and fails the test unless it succeeds.
func callOK(t *testing.T, s *runner.Session, tool string, args any) tools.Result {
	t.Helper()
	data, _ := json.Marshal(args)
	res, err := s.Call(context.Background(), tool, data, tools.CallOptions{})
	if err != nil || res.IsError {
		t.Fatalf("%s %s: %v %s", tool, data, err, res.Text)
	}
	return res
}

// stateOf is the state directory of session id in state.
func stateOf(t *testing.T, state, id string) string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(state, "docker", "daemon-*", id+".state"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("the state directory of %s: %q, %v", id, dirs, err)
	}
	return dirs[0]
}

// journalIDs are the IDs of s's journal's commits, newest first.
func journalIDs(t *testing.T, s *runner.Session) []int {
	t.Helper()
	res := callOK(t, s, "journal_list", map[string]any{})
	var ids []int
	for _, c := range res.Structured.(*tools.JournalListResult).Commits {
		ids = append(ids, c.ID)
	}
	return ids
}

// startedSession makes a session of m whose workspace starts with base.txt,
// activates the edit skill, writes a.txt, edits base.txt and writes c.sh
// with bash, and returns it with its diff since its start once the
// first tree is read.
func startedSession(t *testing.T, m *runner.Manager) (*runner.Session, string) {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "base.txt"), []byte("first\nline\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: editing, Source: src})
	if err != nil {
		t.Fatal(err)
	}
	callOK(t, s, tools.LoadSkill, map[string]any{"skill": "workspace.edit"})
	callOK(t, s, "write", map[string]any{"path": "a.txt", "content": "one\n"})
	callOK(t, s, "edit", map[string]any{"path": "base.txt", "edits": []map[string]string{{"oldText": "first", "newText": "second"}}})
	if br, res := bash(t, s, "echo made > c.sh && chmod +x c.sh"); br == nil || br.ExitCode != 0 {
		t.Fatal(res.Text)
	}
	waitFor(t, func() bool { return runner.BaselineComplete(s) })
	patch, err := diffOf(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-first\n", "+second\n", "b/a.txt", "b/c.sh"} {
		if !strings.Contains(patch, want) {
			t.Fatalf("the diff before the restart lacks %q:\n%s", want, patch)
		}
	}
	return s, patch
}

// TestDockerSessionStateSurvivesRestarts: what a session keeps beside its
// record — its journal, its first tree, the skills load_skill activated —
// comes back with it after the daemon leaves it (Shutdown) and after the
// daemon crashes: an edit made before is undone (journal_revert), the diff
// since its start is the same patch, byte for byte, the skill is still
// active, and nothing is reported lost. All of it is private to the
// daemon (0700) and removed with the session.
func TestDockerSessionStateSurvivesRestarts(t *testing.T) {
	for _, how := range []string{"leave", "crash"} {
		t.Run(how, func(t *testing.T) {
			state := t.TempDir()
			m, _ := durableManager(t, state, restartOptions(t, how)...)
			defer m.Shutdown(context.Background())
			s, patch := startedSession(t, m)
			ids := journalIDs(t, s)
			dir := stateOf(t, state, s.ID())
			for _, d := range []string{dir, filepath.Join(dir, "journal"), filepath.Join(dir, "baseline")} {
				if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
					t.Fatalf("%s: %v, %v; want a directory of mode 0700", d, fi, err)
				}
			}
			if how == "crash" {
				runner.Crash(m)
			} else if err := m.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}

			again, _ := durableManager(t, state, runner.WithJournalStores(privateJournals))
			defer again.Shutdown(context.Background())
			back, err := again.Get("acme", s.ID())
			if err != nil {
				t.Fatalf("the session after the restart: %v", err)
			}
			if lost := back.Info().Lost; len(lost) != 0 {
				t.Fatalf("the session lost %q", lost)
			}
			if !slices.Contains(back.Tools().ActiveSkills(), "workspace.edit") {
				t.Fatalf("active skills after the restart: %q, want workspace.edit among them", back.Tools().ActiveSkills())
			}
			if got, err := diffOf(context.Background(), back); err != nil || got != patch {
				t.Fatalf("the diff since the start after the restart: %v\n%s\nwant\n%s", err, got, patch)
			}
			if got := journalIDs(t, back); !slices.Equal(got, ids) || len(got) != 2 {
				t.Fatalf("the journal's commits after the restart: %v, want %v (the write's and the edit's)", got, ids)
			}
			// Undo the edit, made by the run before.
			callOK(t, back, "journal_revert", map[string]any{"to": ids[1]})
			if got := readFile(t, back, "base.txt"); !strings.Contains(got, "first") || strings.Contains(got, "second") {
				t.Fatalf("base.txt after undoing the edit: %q", got)
			}
			got, err := diffOf(context.Background(), back)
			if err != nil || strings.Contains(got, "base.txt") || !strings.Contains(got, "b/a.txt") {
				t.Fatalf("the diff since the start once the edit is undone: %v\n%s", err, got)
			}
			// The skill is active without load_skill: edit answers.
			callOK(t, back, "edit", map[string]any{"path": "a.txt", "edits": []map[string]string{{"oldText": "one", "newText": "two"}}})

			if err := again.Delete(context.Background(), "acme", back.ID()); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("the session's state directory outlived it: %v", err)
			}
		})
	}
}

// TestDockerDamagedSessionStateIsRefused: a journal or a first tree found
// damaged when the session is resumed is refused, neither used nor
// silently replaced: the session says what it lost and why (Info.Lost), a
// diff since its start fails saying so, a damaged journal is set aside and
// a new one begun, and the session goes on (a write is journaled). A
// content of the first tree altered is found as the diff reads it.
func TestDockerDamagedSessionStateIsRefused(t *testing.T) {
	// damage spoils one file, path of the session's state directory.
	damage := func(t *testing.T, pattern string, spoil func([]byte) []byte) {
		t.Helper()
		names, err := filepath.Glob(pattern)
		if err != nil || len(names) == 0 {
			t.Fatalf("%s: %q, %v", pattern, names, err)
		}
		data, err := os.ReadFile(names[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(names[0], spoil(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	garble := func(data []byte) []byte { copy(data[10:], "garbage garbage"); return data }
	for _, c := range []struct {
		name string
		// file is the glob, in the state directory, of the file spoiled.
		file  string
		spoil func([]byte) []byte
		// lost is what Info.Lost holds, each a few words of one line.
		lost [][]string
		// diff is what the diff since the start fails with ("" for none).
		diff    string
		journal bool // the journal is kept
	}{
		{"journal record", "journal/commits/*.log", garble,
			[][]string{{"journal's history", "damaged", "record 1", "refused", "starts anew"}}, "", false},
		{"first tree cut short", "baseline/tree.json", func(data []byte) []byte { return data[:len(data)/2] },
			[][]string{{"diff since its start", "refused", "tree.json", "damaged"}}, "refused", true},
		{"first tree's content altered", "baseline/objects/[0-9a-f]*", func(data []byte) []byte { return append(data, "altered"...) },
			nil, "altered", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			state := t.TempDir()
			m, _ := durableManager(t, state, runner.WithJournalStores(privateJournals))
			defer m.Shutdown(context.Background())
			s, patch := startedSession(t, m)
			if err := m.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			dir := stateOf(t, state, s.ID())
			damage(t, filepath.Join(dir, c.file), c.spoil)

			again, _ := durableManager(t, state, runner.WithJournalStores(privateJournals))
			defer again.Shutdown(context.Background())
			back, err := again.Get("acme", s.ID())
			if err != nil {
				t.Fatalf("the session after the restart: %v", err)
			}
			lost := back.Info().Lost
			if len(lost) != len(c.lost) {
				t.Fatalf("what the session says it lost: %q, want %d lines", lost, len(c.lost))
			}
			for i, words := range c.lost {
				for _, w := range words {
					if !strings.Contains(lost[i], w) {
						t.Errorf("what the session says it lost: %q lacks %q", lost[i], w)
					}
				}
			}
			got, err := diffOf(context.Background(), back)
			switch {
			case c.diff == "" && (err != nil || got != patch):
				t.Errorf("the diff since the start: %v\n%s\nwant\n%s", err, got, patch)
			case c.diff != "" && (err == nil || !strings.Contains(err.Error(), c.diff)):
				t.Errorf("the diff since the start: %v, want it refused (%q)", err, c.diff)
			}
			aside, _ := filepath.Glob(filepath.Join(dir, "journal.damaged-*"))
			ids := journalIDs(t, back)
			if c.journal && (len(aside) != 0 || len(ids) != 2) || !c.journal && (len(aside) != 1 || len(ids) != 0) {
				t.Fatalf("the journal after the restart: commits %v, set aside %q", ids, aside)
			}
			callOK(t, back, "write", map[string]any{"path": "d.txt", "content": "after\n"})
			if got := journalIDs(t, back); len(got) != len(ids)+1 {
				t.Fatalf("the journal after a write: %v, was %v", got, ids)
			}
		})
	}
}

// TestDockerForkDiffSurvivesRestart: a fork's first tree is its snapshot's,
// which goes once the forks have it; the fork keeps a copy beside its
// record, so its diff since its start is the same patch after the daemon
// leaves it and another run resumes it, and nothing is reported lost.
func TestDockerForkDiffSurvivesRestart(t *testing.T) {
	state := t.TempDir()
	snaps := snapshotStore(t)
	opts := []runner.Option{runner.WithJournalStores(privateJournals), runner.WithSnapshots(snaps)}
	m, _ := durableManager(t, state, opts...)
	defer m.Shutdown(context.Background())
	src, _ := startedSession(t, m)
	forks, err := m.Fork(context.Background(), "acme", src.ID(), runner.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	fork := forks[0]
	callOK(t, fork, tools.LoadSkill, map[string]any{"skill": "workspace.edit"})
	callOK(t, fork, "write", map[string]any{"path": "fork.txt", "content": "forked\n"})
	callOK(t, fork, "edit", map[string]any{"path": "a.txt", "edits": []map[string]string{{"oldText": "one", "newText": "uno"}}})
	kept := filepath.Join(stateOf(t, state, fork.ID()), "baseline", "tree.json")
	waitFor(t, func() bool { _, err := os.Stat(kept); return err == nil })
	patch, err := diffOf(context.Background(), fork)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"b/fork.txt", "-one\n", "+uno\n"} {
		if !strings.Contains(patch, want) {
			t.Fatalf("the fork's diff lacks %q:\n%s", want, patch)
		}
	}
	if strings.Contains(patch, "base.txt") {
		t.Fatalf("the fork's diff shows what its source changed before the fork:\n%s", patch)
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	again, _ := durableManager(t, state, opts...)
	defer again.Shutdown(context.Background())
	back, err := again.Get("acme", fork.ID())
	if err != nil {
		t.Fatalf("the fork after the restart: %v", err)
	}
	if lost := back.Info().Lost; len(lost) != 0 {
		t.Fatalf("the fork lost %q", lost)
	}
	if got, err := diffOf(context.Background(), back); err != nil || got != patch {
		t.Fatalf("the fork's diff since its start after the restart: %v\n%s\nwant\n%s", err, got, patch)
	}
}
