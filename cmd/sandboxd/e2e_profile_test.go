package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// profileStep is one call of a profile run. Its result must be the error
// err, or succeed with the fields of want; its text must contain says.
// With unchanged set, the workspace tree (see dumpTree) must be the same
// after the call as before it; with restores set, the same as just before
// the call numbered restores (1-based), as a revert must make it.
type profileStep struct {
	tool      string
	args      map[string]any
	err       string
	want      map[string]any
	says      string
	unchanged bool
	restores  int
}

// dumpTree lists the workspace outside .sandboxd/ through the bash tool:
// every path with its type and mode, a file's size and an MD5 of its
// bytes, a link's target. Busybox's stat and md5sum (in the container)
// print these the same as coreutils' (on the host).
const dumpTree = `export LC_ALL=C; find . -path ./.sandboxd -prune -o -print | sort | while IFS= read -r p; do
  if [ -L "$p" ]; then echo "$p $(stat -c %A "$p") -> $(readlink "$p")"
  elif [ -d "$p" ]; then echo "$p $(stat -c %A "$p")"
  else echo "$p $(stat -c '%A %s' "$p") $(md5sum < "$p" | cut -d' ' -f1)"; fi
done`

// profileRuns are the runs TestProfileDockerMatchesLocal makes on each
// backend: the flags given to sandboxd mcp (besides --backend and
// --workspace) and the calls. Every run has bash (shell.exec) for
// dumpTree.
var profileRuns = []struct {
	name  string
	flags []string
	steps []profileStep
}{
	{
		name:  "read mode",
		flags: []string{"--profile", "workspace-tools,workspace-shell", "--grant", "shell.exec", "--always", "read,shell"},
		steps: []profileStep{
			{tool: "shell", args: map[string]any{"command": "rm a.txt"}, err: "Forbidden", says: "rm (at 1:1): rm changes files", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "ls $(rm a.txt)"}, err: "Forbidden", says: "rm (at 1:6)", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "cat a.txt $(rm -r src)"}, err: "Forbidden", says: "rm (at 1:13)", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "echo x > f"}, err: "Forbidden", says: "> f (at 1:8): output redirection writes a file", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "cat a.txt >> a.txt"}, err: "Forbidden", says: ">> a.txt (at 1:11)", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "find . -delete"}, err: "Forbidden", says: "find -delete", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "find . -name '*.go' -exec rm {} ;"}, err: "Forbidden", says: "find -exec", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "sh -c 'rm a.txt'"}, err: "Forbidden", says: "sh is not allowed", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "curl https://example.com/x"}, err: "Forbidden", says: "curl is not allowed", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "(cd src && touch y)"}, err: "Forbidden", says: "touch (at 1:12)", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "f() { mkdir d; }; f"}, err: "Forbidden", says: "mkdir (at 1:7)", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "cat a.txt | wc -l; head -n 1 crlf.txt; tail -n 1 a.txt; ls -a src"},
				want: map[string]any{"exitCode": 0, "stdout": "2\none\r\nbeta\n.\n..\nmain.go\n"}, unchanged: true},
			{tool: "shell", args: map[string]any{"command": "pwd; ls; grep -rn func . ; rg -n alpha; find . -name '*.go'"},
				want: map[string]any{"exitCode": 0}, unchanged: true},
			{tool: "shell", args: map[string]any{"command": "cat missing.txt || echo fell back"}, err: "Forbidden", says: "echo", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "cat /etc/passwd"}, want: map[string]any{"exitCode": 1, "stdout": ""}, unchanged: true},
			{tool: "materialize_sources", args: map[string]any{}, want: map[string]any{"sources": []string{}}, says: "no sources", unchanged: true},
			{tool: "materialize_sources", args: map[string]any{"sources": []string{"docs"}}, err: "NotFound", unchanged: true},
		},
	},
	{
		name: "write mode",
		flags: []string{"--profile", "workspace-tools,workspace-shell", "--mode", "write", "--grant", "fs.write",
			"--grant", "shell.exec", "--always", "read,edit,shell"},
		steps: []profileStep{
			{tool: "writeFile", args: map[string]any{"path": "docs/a.md", "content": "# A\n"}, want: map[string]any{"bytes": 4, "created": true}},
			{tool: "appendFile", args: map[string]any{"path": "docs/a.md", "content": "more\n"}, want: map[string]any{"bytes": 5, "size": 9}},
			{tool: "makeDir", args: map[string]any{"path": "build/out"}, want: map[string]any{"created": true}},
			{tool: "copyPath", args: map[string]any{"from": "src", "to": "lib"}, want: map[string]any{"entries": 2}},
			{tool: "movePath", args: map[string]any{"from": "a.txt", "to": "docs/a.txt"}, want: map[string]any{"to": "docs/a.txt"}},
			{tool: "deletePath", args: map[string]any{"path": "src", "recursive": true}, want: map[string]any{"removed": 2}},
			{tool: "shell", args: map[string]any{"command": "mkdir -p gen && cat docs/a.txt > gen/x && rm -r build && touch t && cp crlf.txt c2 && mv c2 c3"},
				want: map[string]any{"exitCode": 0}},
			{tool: "writeFile", args: map[string]any{"path": ".git/config", "content": "x"}, err: "Protected", unchanged: true},
			{tool: "writeFile", args: map[string]any{"path": "../escape", "content": "x"}, err: "OutsideWorkspace", unchanged: true},
			{tool: "writeFile", args: map[string]any{"content": "x"}, err: "InvalidArgument", unchanged: true},
			{tool: "deletePath", args: map[string]any{"path": "lib"}, err: "NotEmpty", unchanged: true},
			{tool: "movePath", args: map[string]any{"from": "nothing", "to": "x"}, err: "NotFound", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "touch made && cat missing.txt"}, want: map[string]any{"exitCode": 1}},
			{tool: "shell", args: map[string]any{"command": "sh -c 'rm -r docs'"}, err: "Forbidden", unchanged: true},
			{tool: "shell", args: map[string]any{"command": "find . -name t -delete"}, err: "Forbidden", unchanged: true},
			{tool: "journal_list", args: map[string]any{}, says: "shell touch made && cat missing.txt", unchanged: true},
			{tool: "journal_show", args: map[string]any{"id": 2}, says: "+++ b/docs/a.md\n@@ -1 +1,2 @@\n # A\n+more\n", unchanged: true},
			{tool: "journal_show", args: map[string]any{"id": 7}, says: "+++ b/gen/x\n@@ -0,0 +1,2 @@\n+alpha\n+beta\n", unchanged: true},
			{tool: "journal_revert", args: map[string]any{"to": 0}, restores: 1},
			{tool: "journal_list", args: map[string]any{"limit": 2}, says: "revert to the start", unchanged: true},
		},
	},
	{
		name: "provider",
		flags: []string{"--profile", "workspace-tools,workspace-shell", "--driver", "provider", "--mode", "write",
			"--grant", "fs.write", "--grant", "shell.exec", "--always", "read,shell", "--commands", "cat,sh,false"},
		steps: []profileStep{
			{tool: "workspace_exec", args: map[string]any{"command": "cat", "args": []string{"a.txt"}},
				want: map[string]any{"exitCode": 0, "output": "alpha\nbeta\n", "committed": true}, unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "false"}, want: map[string]any{"exitCode": 1, "committed": false, "restored": true}, unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "args": []string{"-c",
				"chmod 0750 src && chmod 0755 src/main.go && ln -s src/main.go mlink"}}, want: map[string]any{"committed": true, "commit": 1}},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "args": []string{"-c",
				"echo changed > a.txt; chmod 0600 crlf.txt; rm src/main.go link mlink; mkdir -p new/d; echo n > new/d/f; " +
					"chmod 0700 src; printf 'x' >> chart.bin; echo failing >&2; exit 3"}},
				want: map[string]any{"exitCode": 3, "output": "failing\n", "committed": false, "restored": true}, unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "args": []string{"-c", "rm -r src; kill -9 $$"}},
				want: map[string]any{"signal": "SIGKILL", "committed": false, "restored": true}, unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "args": []string{"-c", "echo part > a.txt; sleep 5"}, "timeout": 500},
				want: map[string]any{"timedOut": true, "committed": false, "restored": true}, unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "args": []string{"-c", "echo v2 > a.txt && rm crlf.txt && mkdir -p out && echo $X > out/x"},
				"env": map[string]any{"X": "from env"}}, want: map[string]any{"committed": true, "commit": 2}},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "args": []string{"-c", "pwd; ls"}, "cwd": "src"},
				want: map[string]any{"exitCode": 0}, says: "/src\nmain.go\n", unchanged: true},
			{tool: "journal_list", args: map[string]any{}, says: "workspace shell command", unchanged: true},
			{tool: "journal_show", args: map[string]any{"id": 2}, says: "+++ b/out/x\n@@ -0,0 +1 @@\n+from env\n", unchanged: true},
			{tool: "journal_revert", args: map[string]any{"to": 1}, restores: 7},
			{tool: "journal_revert", args: map[string]any{"to": 0}, restores: 3},
			{tool: "journal_list", args: map[string]any{}, says: "revert to the start", unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "rm", "args": []string{"a.txt"}}, err: "Forbidden", unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "cwd": "../x"}, err: "OutsideWorkspace", unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "env": map[string]any{"LD_PRELOAD": "x"}}, err: "Forbidden", says: "LD_PRELOAD", unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "env": map[string]any{"BASH_ENV": "x"}}, err: "Forbidden", says: "BASH_ENV", unchanged: true},
			{tool: "workspace_exec", args: map[string]any{"command": "sh", "timeout": 0}, err: "InvalidArgument", unchanged: true},
		},
	},
}

// TestProfileDockerMatchesLocal makes the calls of each profile run over
// MCP on the local backend and on the docker backend (each on a fresh copy
// of one project) and wants the same structured results, the root, the
// durations and the commits' times aside; and on each backend, the calls
// that must leave the workspace as it was — read-mode refusals, failing
// calls, a failing workspace_exec — leave it so, mode for mode and byte
// for byte, and reverts restore it.
func TestProfileDockerMatchesLocal(t *testing.T) {
	cli := dockertest.Client(t)
	dockertest.Image(t) // build the minimal image once, before timing starts
	// Registered first, so it runs after every sandboxd mcp has exited.
	t.Cleanup(func() { wantNoCLIContainers(t, cli) })
	for _, run := range profileRuns {
		t.Run(run.name, func(t *testing.T) {
			results := map[string][]string{}
			for _, backend := range []string{"local", "docker"} {
				dir, _ := newWorkspace(t)
				root := dir
				if backend == "docker" {
					root = "/workspace"
				}
				c := startMCP(t, append([]string{"--backend", backend, "--workspace", dir}, run.flags...)...)
				dump := func() string {
					t.Helper()
					res, sc := c.call(t, "bash", map[string]any{"command": dumpTree})
					if out, _ := sc["output"].(string); res.IsError || sc["exitCode"] != 0.0 || out == "" {
						t.Fatalf("%s: dumping the tree: %s", backend, textOf(res))
					}
					return sc["output"].(string)
				}
				var before []string // the tree before each step
				for i, step := range run.steps {
					before = append(before, dump())
					res, sc := c.call(t, step.tool, step.args)
					what := backend + ": " + step.tool + " " + fmt.Sprint(step.args)
					if step.err != "" {
						wantError(t, what, res, sc, step.err)
					} else {
						want(t, what, res, sc, step.want)
					}
					if !strings.Contains(textOf(res), step.says) {
						t.Errorf("%s: the text does not say %q:\n%s", what, step.says, textOf(res))
					}
					results[backend] = append(results[backend], normalizeProfileResult(res.IsError, sc, root))
					after := dump()
					if step.unchanged && after != before[i] {
						t.Errorf("%s: step %d, %s %v, changed the workspace:\n%s\nbefore:\n%s\nafter:\n%s",
							backend, i+1, step.tool, step.args, textOf(res), before[i], after)
					}
					if n := step.restores; n > 0 && after != before[n-1] {
						t.Errorf("%s: step %d, %s %v, did not restore the tree before step %d:\n%s\nwant:\n%s\ngot:\n%s",
							backend, i+1, step.tool, step.args, n, textOf(res), before[n-1], after)
					}
				}
				results[backend+" tree"] = []string{dump()}
			}
			for i, step := range run.steps {
				if l, d := results["local"][i], results["docker"][i]; l != d {
					t.Errorf("step %d, %s %v:\n local: %s\ndocker: %s", i+1, step.tool, step.args, l, d)
				}
			}
			if l, d := results["local tree"][0], results["docker tree"][0]; l != d {
				t.Errorf("the trees at the end differ:\n local:\n%s\ndocker:\n%s", l, d)
			}
		})
	}
}

// normalizeProfileResult is normalizeResult with the journal's commit
// times left out as well.
func normalizeProfileResult(isError bool, sc map[string]any, root string) string {
	return rfc3339.ReplaceAllString(normalizeResult(isError, sc, root), "$$TIME")
}

var rfc3339 = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)

// startedMCP holds the process IDs (as their label's text) of the sandboxd
// mcp processes this test binary started: the containers they leave are
// its to judge; other checkouts' runs on the same engine are not.
var startedMCP sync.Map

// wantNoCLIContainers fails t when a container of a sandboxd mcp process
// (its daemon label "cli-…") is left.
func wantNoCLIContainers(t *testing.T, cli *client.Client) {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", backend.LabelDaemon)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		if _, ours := startedMCP.Load(c.Labels[backend.LabelOwnerPID]); !ours || c.Labels[backend.LabelOwnerHost] != backend.Self().Host {
			continue
		}
		if strings.HasPrefix(c.Labels[backend.LabelDaemon], "cli-") {
			t.Errorf("container %s of sandboxd mcp left after it exited", c.Names)
		}
	}
}

// TestKilledRunIsReaped: a `sandboxd mcp` killed with SIGKILL leaves its
// session container and volume. The next run on this host removes what
// holds no work (the run's marker), keeps the container and volume while
// the killed run's record keeps the baseline of its undelivered work, and
// once that record is gone (as for a run of an earlier version) harvests
// the container's work and removes it; a living run's are left alone.
func TestKilledRunIsReaped(t *testing.T) {
	cli := dockertest.Client(t)
	ctx := context.Background()
	startRun := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command(sandboxdBin, "mcp", "--backend", "docker", "--workspace", t.TempDir())
		stdin, err := cmd.StdinPipe() // held open: the server waits for messages
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			stdin.Close() // the server ends at EOF, removing its session
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				<-done
			}
		})
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	left := func(pid int) []string {
		t.Helper()
		f := make(client.Filters).Add("label", backend.LabelOwnerPID+"="+strconv.Itoa(pid)).Add("label", backend.LabelOwnerHost+"="+backend.Self().Host)
		return dockertest.Leftovers(t, f)
	}
	// waitLeft waits for the run's session container to run (beside its
	// volume and the run's marker, backend.Claimer): the run is past
	// creating what it needs.
	waitLeft := func(pid, n int) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			got := left(pid)
			if len(got) == n && strings.Contains(strings.Join(got, " "), " running") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %d: %v, want a running session container and its volume", pid, got)
			}
		}
	}
	living := startRun()
	waitLeft(living.Process.Pid, 3)
	killed := startRun()
	waitLeft(killed.Process.Pid, 3)
	killed.Process.Kill()
	killed.Wait()
	if got := left(killed.Process.Pid); len(got) != 3 {
		t.Fatalf("the killed run left %v; the test needs its marker, container and volume", got)
	}
	var said strings.Builder
	reap := func() {
		t.Helper()
		if _, err := reapDeadRuns(ctx, stdio{err: &said}, cli); err != nil {
			t.Fatal(err)
		}
	}
	reap()
	if got := left(killed.Process.Pid); len(got) != 2 || !strings.Contains(strings.Join(got, " "), "container ") {
		t.Fatalf("left after reaping: %v, want the container and volume of the undelivered work", got)
	}
	f := make(client.Filters).Add("label", backend.LabelOwnerPID+"="+strconv.Itoa(killed.Process.Pid)).Add("label", policy.LabelSession)
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil || len(cs.Items) != 1 || !strings.Contains(cs.Items[0].Labels[labelMCPRun], filepath.Join("mcp", "runs")) {
		t.Fatalf("the killed run's container: %v, %+v", err, cs.Items)
	}
	if err := os.RemoveAll(cs.Items[0].Labels[labelMCPRun]); err != nil {
		t.Fatal(err)
	}
	reap()
	if got := left(killed.Process.Pid); len(got) != 0 {
		t.Errorf("left after the record was gone: %v", got)
	}
	if got := left(living.Process.Pid); len(got) != 3 {
		t.Errorf("the living run's marker, container and volume were touched: now %v", got)
	}
}
