package adversarial

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// An allowlist of ["git"] lets workspace_exec run git, not the programs git
// can be made to start: no alias, -c, --config-env, GIT_* variable, hook,
// fsmonitor or pager of a hostile repository runs. It runs the host's git
// on the local backend (the minimal image has none); the policy is the
// same on every backend, being checked before the command is sent.
func TestExecGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("git is not installed")
		}
		t.Skip("git is not installed")
	}
	w := localWorld(t)
	flag := filepath.Join(t.TempDir(), "pwned")
	w.sh(t, fmt.Sprintf(`git init -q . && printf 'a\n' > a.txt &&
		mkdir -p .git/hooks && printf '#!/bin/sh\ntouch %[1]s\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit &&
		printf '#!/bin/sh\ntouch %[1]s\n' > hook.sh && chmod +x hook.sh &&
		git config core.fsmonitor "$PWD/hook.sh" && git config core.pager "$PWD/hook.sh" && git config alias.st '!touch %[1]s'`, flag))
	set := w.execSet(t, workspaceshell.Commands{Names: []string{"git"}}, 30_000)
	run := func(env map[string]string, args ...string) tools.Result {
		return call(t, set, "workspace_exec", workspaceshell.ExecRequest{Command: "git", Args: args, Env: env})
	}
	pwned := func(what string) {
		t.Helper()
		if _, err := os.Stat(flag); err == nil {
			t.Fatalf("%s ran a program sandboxd did not allow", what)
		}
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{
		{nil, []string{"-c", "alias.x=!touch " + flag, "x"}},
		{nil, []string{"-c", "core.pager=touch " + flag, "-p", "log"}},
		{nil, []string{"--config-env=alias.x=EVIL", "x"}},
		{nil, []string{"st"}},
		{nil, []string{"config", "alias.y", "!touch " + flag}},
		{nil, []string{"-C", w.outside, "status"}},
		{map[string]string{"GIT_DIR": w.outside}, []string{"status"}},
		{map[string]string{"GIT_SEQUENCE_EDITOR": "touch " + flag}, []string{"rebase", "-i", "HEAD"}},
		{map[string]string{"GIT_CONFIG_PARAMETERS": "'alias.x'='!touch " + flag + "'"}, []string{"x"}},
	} {
		if res := run(tc.env, tc.args...); errKind(res) != workspace.ErrForbidden.Name() {
			t.Errorf("git %q with %v: %s, want it refused", tc.args, tc.env, res.Text)
		}
		pwned(fmt.Sprintf("git %q", tc.args))
	}
	// The repository's own hooks, fsmonitor and pager do not run either.
	for _, args := range [][]string{{"status"}, {"add", "a.txt"}, {"commit", "-q", "-m", "one"}, {"log", "--oneline"}} {
		res := run(map[string]string{"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
			"GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}, args...)
		if er, ok := res.Structured.(*tools.ExecResult); res.IsError || !ok || er.ExitCode != 0 {
			t.Fatalf("git %q: %s", args, res.Text)
		}
		pwned(fmt.Sprintf("git %q in a hostile repository", args))
	}
}
