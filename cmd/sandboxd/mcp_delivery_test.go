package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// gitIn runs git in dir and returns its output.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=user", "GIT_AUTHOR_EMAIL=user@host", "GIT_COMMITTER_NAME=user", "GIT_COMMITTER_EMAIL=user@host")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// gitProject lays out a project under git, committed.
func gitProject(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range map[string]string{
		"edit.txt":    "one\ntwo\n",
		"theirs.txt":  "base\n",
		"gone.txt":    "bye\n",
		"run.sh":      "#!/bin/sh\necho hi\n",
		"src/main.go": "package main\n",
	} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitIn(t, dir, "init", "-q", "-b", "main")
	gitIn(t, dir, "add", "-A")
	gitIn(t, dir, "commit", "-qm", "start")
	return dir
}

// session runs an agent's session over sandboxd mcp: it edits, adds and
// deletes files, changes a mode and commits with git in the workspace;
// between runs while the session is open. It returns sandboxd's standard
// error, once the process has exited (delivery included).
func agentSession(t *testing.T, dir string, between func(), args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.Command(sandboxdBin, append([]string{"mcp", "--workspace", dir, "--grant", "fs.write", "--grant", "shell.exec", "--always", "read,edit,shell"}, args...)...)
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "v0"}, nil)
	// A generous wait after closing: the delivery runs then.
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 4 * time.Minute}, nil)
	if err != nil {
		t.Fatalf("sandboxd mcp %v: %v\n%s", args, err, &stderr)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"edit", map[string]any{"path": "edit.txt", "edits": []map[string]any{{"oldText": "two", "newText": "TWO"}}}},
		{"write", map[string]any{"path": "theirs.txt", "content": "the agent's\n"}},
		{"write", map[string]any{"path": "new/added.txt", "content": "added\n"}},
		{"bash", map[string]any{"command": "rm gone.txt && chmod 755 run.sh && git -c user.name=agent -c user.email=agent@sandbox add -A . ':!.sandboxd' && " +
			"git -c user.name=agent -c user.email=agent@sandbox commit -qm 'agent: the work' && git log --format=%s | head -1"}},
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %v\n%s", c.tool, err, res.StructuredContent, &stderr)
		}
		if c.tool == "bash" && !strings.Contains(textOf(res), "agent: the work") {
			t.Fatalf("the agent's commit: %s", textOf(res))
		}
	}
	if between != nil {
		between()
	}
	cs.Close()
	if st := cmd.ProcessState; st == nil || !st.Success() {
		t.Fatalf("sandboxd mcp did not exit cleanly after delivering: %v\n%s", st, &stderr)
	}
	t.Logf("sandboxd mcp said:\n%s", &stderr)
	return stderr.String()
}

// wantWork checks that a tree holds the session's work: read(name) returns
// a file's contents, or "" with ok false when it is absent.
func wantWork(t *testing.T, what string, read func(name string) (string, bool)) {
	t.Helper()
	for name, want := range map[string]string{"edit.txt": "one\nTWO\n", "new/added.txt": "added\n", "src/main.go": "package main\n"} {
		if got, ok := read(name); !ok || got != want {
			t.Errorf("%s: %s = %q, want %q", what, name, got, want)
		}
	}
	for _, name := range []string{"gone.txt", ".sandboxd"} {
		if _, ok := read(name); ok {
			t.Errorf("%s: %s is there", what, name)
		}
	}
}

func readDir(dir string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			_, lerr := os.Lstat(filepath.Join(dir, name))
			return "", lerr == nil
		}
		return string(data), true
	}
}

// TestMCPDelivers: an agent's session on a copy (memory, docker) ends with
// its work delivered: as a branch of the repository (the default there),
// as a patch that git applies, or applied back with a file changed on the
// host meanwhile kept and reported as a conflict.
func TestMCPDelivers(t *testing.T) {
	for _, backend := range []string{"memory", "docker"} {
		t.Run(backend, func(t *testing.T) {
			var extra []string
			if backend == "docker" {
				dockertest.NamedImage(t, "dev")                           // mcp would build it: build the images first
				extra = []string{"--backend", "docker", "--image", "dev"} // git in the container
			} else {
				extra = []string{"--backend", "memory"}
			}
			t.Run("branch", func(t *testing.T) {
				dir := gitProject(t)
				index, _ := os.ReadFile(filepath.Join(dir, ".git/index"))
				head := gitIn(t, dir, "rev-parse", "HEAD")
				stderr := agentSession(t, dir, nil, extra...) // auto: a branch in a repository
				m := regexp.MustCompile(`committed onto branch (sandboxd/s-[a-z0-9]+)`).FindStringSubmatch(stderr)
				if m == nil {
					t.Fatalf("stderr does not name the branch:\n%s", stderr)
				}
				branch := m[1]
				wantWork(t, "the branch", func(name string) (string, bool) {
					cmd := exec.Command("git", "show", branch+":"+name)
					cmd.Dir = dir
					out, err := cmd.Output()
					return string(out), err == nil
				})
				if got := gitIn(t, dir, "rev-parse", branch+"^"); got != head {
					t.Errorf("the branch's parent is %s, want HEAD %s", got, head)
				}
				if ls := gitIn(t, dir, "ls-tree", branch, "run.sh"); !strings.HasPrefix(ls, "100755") {
					t.Errorf("run.sh on the branch: %s, want mode 100755", ls)
				}
				if msg := gitIn(t, dir, "log", "-1", "--format=%B", branch); !strings.Contains(msg, "agent: the work") {
					t.Errorf("the commit's message does not list the agent's commit:\n%s", msg)
				}
				idx, _ := os.ReadFile(filepath.Join(dir, ".git/index"))
				if st := gitIn(t, dir, "status", "--porcelain"); st != "" || !bytes.Equal(idx, index) || gitIn(t, dir, "rev-parse", "HEAD") != head {
					t.Errorf("the work tree, index or HEAD changed: status %q", st)
				}
			})
			t.Run("patch", func(t *testing.T) {
				dir := gitProject(t)
				patch := filepath.Join(t.TempDir(), "work.patch")
				stderr := agentSession(t, dir, nil, append(extra, "--deliver", "patch", "--patch", patch)...)
				if !strings.Contains(stderr, patch) {
					t.Errorf("stderr does not name the patch:\n%s", stderr)
				}
				data, err := os.ReadFile(patch)
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(data, []byte("a/.sandboxd")) || bytes.Contains(data, []byte("a/.git/")) {
					t.Errorf("the patch carries bookkeeping:\n%s", data)
				}
				if st := gitIn(t, dir, "status", "--porcelain"); st != "" {
					t.Errorf("writing the patch changed the directory: %s", st)
				}
				gitIn(t, dir, "apply", "--check", patch)
				gitIn(t, dir, "apply", patch)
				wantWork(t, "after git apply", readDir(dir))
			})
			t.Run("apply", func(t *testing.T) {
				dir := gitProject(t)
				conflicts := filepath.Join(t.TempDir(), "conflicts.patch")
				stderr := agentSession(t, dir, func() {
					// The user changes a file the agent changed too.
					os.WriteFile(filepath.Join(dir, "theirs.txt"), []byte("the user's\n"), 0o644)
				}, append(extra, "--deliver", "apply", "--patch", conflicts)...)
				wantWork(t, "the directory", readDir(dir))
				if got, _ := readDir(dir)("theirs.txt"); got != "the user's\n" {
					t.Errorf("theirs.txt = %q: the user's change was overwritten", got)
				}
				if !strings.Contains(stderr, "conflict, left alone: theirs.txt") {
					t.Errorf("stderr does not report the conflict:\n%s", stderr)
				}
				if info, err := os.Stat(filepath.Join(dir, "run.sh")); err != nil || info.Mode().Perm() != 0o755 {
					t.Errorf("run.sh: %v %v, want mode 0755", info.Mode(), err)
				}
				// Exactly those files changed (git status relative to HEAD).
				st := gitIn(t, dir, "status", "--porcelain", "-uall")
				want := " M edit.txt\n D gone.txt\n M run.sh\n M theirs.txt\n?? new/added.txt\n"
				if st != want {
					t.Errorf("git status after sync-back:\n%s\nwant\n%s", st, want)
				}
				if data, err := os.ReadFile(conflicts); err != nil || !bytes.Contains(data, []byte("+the agent's")) {
					t.Errorf("the conflicting change is not kept in %s: %v\n%s", conflicts, err, data)
				}
			})
		})
	}
}

// TestMCPNoCallCap: 200 calls in one session without a run ID all succeed;
// a cap the operator sets is counted per run ID and names the setting.
func TestMCPNoCallCap(t *testing.T) {
	dir, _ := newWorkspace(t)
	c := startMCP(t, "--backend", "memory", "--workspace", dir, "--deliver", "none")
	for i := range 200 {
		res, err := c.CallTool(t.Context(), &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"path": "a.txt"}})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %v", i+1, err, res.StructuredContent)
		}
	}

	config := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(config, []byte(`{"maxCallsPerRun": 3}`), 0o644)
	c = startMCP(t, "--backend", "memory", "--workspace", dir, "--deliver", "none", "--config", config)
	call := func(run string) (*mcp.CallToolResult, map[string]any) {
		p := &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"path": "a.txt"}}
		if run != "" {
			p.Meta = mcp.Meta{"sandboxd/runId": run}
		}
		res, err := c.CallTool(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		sc, _ := res.StructuredContent.(map[string]any)
		return res, sc
	}
	for range 3 {
		if res, sc := call(""); res.IsError {
			t.Fatalf("a call under the cap: %v", sc)
		}
	}
	res, sc := call("")
	wantError(t, "the fourth call", res, sc, "CallLimit")
	if msg, _ := sc["message"].(string); !strings.Contains(msg, "maxCallsPerRun") || !strings.Contains(msg, "raise") {
		t.Errorf("the cap's message %q does not name the setting that raises it", msg)
	}
	if res, sc := call("run-2"); res.IsError {
		t.Errorf("a new run ID counts afresh: %v", sc)
	}
}

// TestMCPDeliversOnSIGTERM: a client that stops sandboxd mcp with SIGTERM
// (as clients do after closing) still gets the work delivered.
func TestMCPDeliversOnSIGTERM(t *testing.T) {
	for _, backend := range []string{"memory", "docker"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "docker" {
				dockertest.Client(t)
				dockertest.Image(t)
			}
			dir, _ := newWorkspace(t)
			patch := filepath.Join(t.TempDir(), "work.patch")
			c := startRaw(t, "--backend", backend, "--workspace", dir, "--grant", "fs.write", "--always", "read,edit", "--patch", patch)
			c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write","arguments":{"path":"work.txt","content":"kept\n"}}}`)
			if r := c.next("2")["result"].(map[string]any); r["isError"] == true {
				t.Fatalf("write: %v", r)
			}
			if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := c.cmd.Wait(); err != nil {
				t.Errorf("sandboxd mcp after SIGTERM: %v", err)
			}
			data, err := os.ReadFile(patch)
			if err != nil || !bytes.Contains(data, []byte("+++ b/work.txt\n@@ -0,0 +1 @@\n+kept\n")) {
				t.Errorf("the patch after SIGTERM: %v\n%s", err, data)
			}
		})
	}
}

func TestMCPDeliverFlags(t *testing.T) {
	ws := t.TempDir()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--backend", "local", "--deliver", "patch"}, "apply to the memory and docker backends"},
		{[]string{"--backend", "local", "--patch", "p"}, "apply to the memory and docker backends"},
		{[]string{"--backend", "memory", "--deliver", "email"}, `unknown delivery "email"`},
	} {
		code, _, errs := runInProcess(t, append([]string{"mcp", "--workspace", ws}, tc.args...)...)
		if code != 2 || !strings.Contains(errs, tc.says) {
			t.Errorf("mcp %v: exit %d, %q; want 2 saying %q", tc.args, code, errs, tc.says)
		}
	}
}

// TestMCPUntouchedIsNotDelivered: a session that changes nothing delivers
// nothing, whatever the files' modes (a copy must keep them exactly, or
// every file would look changed and be written back).
func TestMCPUntouchedIsNotDelivered(t *testing.T) {
	for _, backend := range []string{"memory", "docker"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "docker" {
				dockertest.Client(t)
				dockertest.Image(t)
			}
			modes := map[string]os.FileMode{"group.txt": 0o664, "private.txt": 0o600, "tool": 0o775, "readonly.txt": 0o444, "d/plain.txt": 0o644}
			dir := t.TempDir()
			for name, mode := range modes {
				p := filepath.Join(dir, name)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(name+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				os.Chmod(p, mode)
			}
			patch := filepath.Join(t.TempDir(), "p.patch")
			for _, mode := range []string{"patch", "apply"} {
				c := startRaw(t, "--backend", backend, "--workspace", dir, "--deliver", mode, "--patch", patch)
				c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ls","arguments":{}}}`)
				c.next("2")
				c.stdin.Close()
				if err := c.cmd.Wait(); err != nil {
					t.Fatalf("sandboxd mcp: %v", err)
				}
			}
			if data, err := os.ReadFile(patch); err == nil {
				t.Errorf("a session that changed nothing wrote a patch:\n%s", data)
			}
			for name, mode := range modes {
				if info, err := os.Stat(filepath.Join(dir, name)); err != nil || info.Mode().Perm() != mode {
					t.Errorf("%s: %v %v after delivery, want %v", name, info.Mode(), err, mode)
				}
			}
		})
	}
}

// TestMCPKilledRunIsDelivered: sandboxd mcp --backend docker killed with
// SIGKILL in the middle of a session leaves its container, with the work
// in it. A run for another workspace leaves it there (and says whose it
// is); the next run for the same workspace delivers the work as the killed
// run would have — a patch here — before it serves a request, and only
// then removes the container, even when the container has stopped
// meanwhile (an engine restart, a host reboot).
func TestMCPKilledRunIsDelivered(t *testing.T) {
	// Each run starts a container, or reads one: minutes on a loaded host.
	const dockerRunTimeout = 3 * time.Minute
	cli := dockertest.Client(t)
	dockertest.Image(t)
	dir, _ := newWorkspace(t)
	patch := filepath.Join(t.TempDir(), "work.patch")
	args := []string{"--backend", "docker", "--workspace", dir, "--grant", "fs.write", "--always", "read,edit", "--patch", patch}
	first, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			data, _ := os.ReadFile(first.Name())
			t.Logf("the killed run said:\n%s", data)
		}
	}()
	begun := time.Now()
	c := startRawTo(t, dockerRunTimeout, first, args...)
	t.Logf("the first run answered initialize after %v", time.Since(begun).Round(time.Millisecond))
	c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write","arguments":{"path":"work.txt","content":"kept\n"}}}`)
	c.send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"edit","arguments":{"path":"a.txt","edits":[{"oldText":"beta","newText":"BETA"}]}}}`)
	for _, id := range []string{"2", "3"} {
		if r := c.next(id)["result"].(map[string]any); r["isError"] == true {
			t.Fatalf("call %s: %v", id, r)
		}
		t.Logf("call %s answered after %v", id, time.Since(begun).Round(time.Millisecond))
	}
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()
	containers := func() []string {
		t.Helper()
		f := make(client.Filters).Add("label", backend.LabelOwnerPID+"="+strconv.Itoa(c.cmd.Process.Pid)).Add("label", policy.LabelSession)
		cs, err := cli.ContainerList(t.Context(), client.ContainerListOptions{All: true, Filters: f})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ct := range cs.Items {
			out = append(out, ct.Labels[policy.LabelSession])
		}
		return out
	}
	killed := containers()
	if len(killed) != 1 {
		t.Fatalf("the killed run's session containers: %q, want one", killed)
	}

	said := func(run func(stderr *os.File)) string {
		t.Helper()
		f, err := os.CreateTemp(t.TempDir(), "stderr")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		run(f)
		data, _ := os.ReadFile(f.Name())
		return string(data)
	}
	end := func(c *rawClient) {
		t.Helper()
		c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("sandboxd mcp at the end of its input: %v", err)
		}
	}
	other := said(func(stderr *os.File) {
		end(startRawTo(t, dockerRunTimeout, stderr, "--backend", "docker", "--workspace", t.TempDir()))
	})
	if got := containers(); len(got) != 1 {
		t.Fatalf("a run for another workspace removed the killed run's container (%q); it said:\n%s", got, other)
	}
	if !strings.Contains(other, "session "+killed[0]+" of "+dir) {
		t.Errorf("a run for another workspace does not name the work left:\n%s", other)
	}
	if _, err := os.Stat(patch); err == nil {
		t.Fatal("the work was delivered by a run for another workspace")
	}

	// As an engine restart or a host reboot leaves it: stopped.
	stop := make(client.Filters).Add("label", backend.LabelOwnerPID+"="+strconv.Itoa(c.cmd.Process.Pid)).Add("label", policy.LabelSession)
	cs, err := cli.ContainerList(t.Context(), client.ContainerListOptions{Filters: stop})
	if err != nil || len(cs.Items) != 1 {
		t.Fatalf("the killed run's running container: %v %v", err, cs.Items)
	}
	if _, err := cli.ContainerStop(t.Context(), cs.Items[0].ID, client.ContainerStopOptions{}); err != nil {
		t.Fatal(err)
	}

	next := said(func(stderr *os.File) {
		n := startRawTo(t, dockerRunTimeout, stderr, args...)
		// Delivered before the first answer.
		data, err := os.ReadFile(patch)
		if err != nil || !bytes.Contains(data, []byte("+++ b/work.txt\n@@ -0,0 +1 @@\n+kept\n")) || !bytes.Contains(data, []byte("+BETA")) {
			t.Errorf("the killed run's patch: %v\n%s", err, data)
		}
		if got := containers(); len(got) != 0 {
			t.Errorf("the killed run's container is left after its work was delivered: %q", got)
		}
		end(n)
	})
	if !strings.Contains(next, "delivering the work of session "+killed[0]) {
		t.Errorf("the next run does not say it delivered the killed run's work:\n%s", next)
	}
	t.Logf("the next run said:\n%s", next)
}
