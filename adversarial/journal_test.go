package adversarial

import (
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
