package adversarial

import (
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// The journal cannot be poisoned by the session it protects: a process
// that rewrites whatever the journal keeps in the workspace, or links its
// way into .sandboxd/, does not choose what a failed workspace_exec
// restores or what an out-of-scope change is put back to.
func TestJournal(t *testing.T) {
	// poison overwrites every object the journal could keep in the
	// workspace (and plants one more through a link) with the attacker's
	// bytes, then writes the same bytes over the files it wants to keep.
	const poison = `for f in .sandboxd/journal/objects/*/*; do printf attacker > "$f"; done 2>/dev/null
ln -s .sandboxd j 2>/dev/null; mkdir -p j/journal/objects 2>/dev/null
printf attacker > notes.txt; printf attacker > src/a.go; `
	execSet := func(t *testing.T, w *world, commit []string) *tools.Set {
		t.Helper()
		w.sh(t, `mkdir -p src && printf 'package a\n' > src/a.go && printf 'hello\n' > notes.txt`)
		return w.toolSet(t, func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite}
			c.Always = nil
			c.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write, Commands: workspaceshell.Commands{Names: []string{"sh"}}}
			c.Driver = workspaceshell.DriverProvider
			c.Commit = commit
		})
	}
	exec := func(t *testing.T, set *tools.Set, script string) *tools.ExecResult {
		t.Helper()
		r := call(t, set, "workspace_exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
		er, ok := r.Structured.(*tools.ExecResult)
		if !ok {
			t.Fatalf("workspace_exec: %s", r.Text)
		}
		return er
	}
	runAttacks(t, []attack{
		{"FailedExecRestoresTheTruth", func(t *testing.T, w *world) {
			set := execSet(t, w, nil)
			// The first run fills the journal's copies; the second poisons
			// them and fails.
			if er := exec(t, set, "true"); er.ExitCode != 0 {
				t.Fatalf("exit %d", er.ExitCode)
			}
			er := exec(t, set, poison+"exit 1")
			if er.ExitCode != 1 || !er.Restored || len(er.Unrestored) > 0 {
				t.Fatalf("failing run: %+v", er)
			}
			if got := w.sh(t, `cat notes.txt src/a.go`); got != "hello\npackage a\n" {
				t.Fatalf("a failed run restored %q, want the workspace as it was", got)
			}
		}},
		{"SandboxdDirIsTheDaemons", func(t *testing.T, w *world) {
			// A run's own cut output is saved by sandboxd into .sandboxd/;
			// then runs, failing, succeeding and out of scope, rewrite that
			// file, plant others and remove the directory's entries: each is
			// put back, and the output the daemon saved for the attacking run
			// is kept.
			const state = `cd .sandboxd && find . | sort | while read -r f; do stat -c '%n %a %F' "$f"; done && find . -type f | sort | xargs md5sum`
			const attack = `for f in $(find .sandboxd -type f); do printf attacker > "$f"; done; mkdir -p .sandboxd/runtime/new; printf x > .sandboxd/planted; ` +
				`printf x > .sandboxd/runtime/new/planted; chmod 0777 .sandboxd/runtime; seq 1 30000; `
			for _, c := range []struct {
				name   string
				commit []string
				end    string
			}{{"failing", nil, "exit 1"}, {"succeeding", nil, "exit 0"}, {"outOfScope", []string{"docs/**"}, "exit 0"}} {
				set := execSet(t, w, c.commit)
				if er := exec(t, set, "seq 1 30000"); er.OutputPath == "" {
					t.Fatalf("the first run's output was not saved: %+v", er)
				}
				before := w.sh(t, state)
				er := exec(t, set, attack+c.end)
				if !slices.Contains(er.Protected, ".sandboxd/planted") {
					t.Errorf("%s: put back under .sandboxd/: %q", c.name, er.Protected)
				}
				if saved := w.sh(t, "cat "+er.OutputPath+" | wc -l"); er.OutputPath == "" || strings.TrimSpace(saved) != "30000" {
					t.Errorf("%s: the output sandboxd saved for the run, %q, holds %s lines", c.name, er.OutputPath, saved)
				}
				var after []string // but the run's saved output
				for line := range strings.Lines(w.sh(t, state)) {
					if er.OutputPath == "" || !strings.Contains(line, path.Base(er.OutputPath)) {
						after = append(after, line)
					}
				}
				if got := strings.Join(after, ""); got != before {
					t.Errorf("%s: .sandboxd/ after the run:\n%s\nwant as before:\n%s", c.name, got, before)
				}
			}
		}},
		{"OutOfScopePutBackForReal", func(t *testing.T, w *world) {
			set := execSet(t, w, []string{"docs/**"})
			exec(t, set, "true")
			er := exec(t, set, poison+"exit 0")
			if !strings.Contains(strings.Join(er.OutOfScope, " "), "notes.txt") {
				t.Fatalf("out of scope %q", er.OutOfScope)
			}
			if got := w.sh(t, `cat notes.txt src/a.go`); got != "hello\npackage a\n" {
				t.Fatalf("reported put back, but the workspace holds %q", got)
			}
		}},
	})
}
