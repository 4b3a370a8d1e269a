package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// callTool sends tools/call id of tool with args to c and returns its
// result, failing the test on an error result.
func (c *rawClient) callTool(id int, tool string, args map[string]any) map[string]any {
	c.t.Helper()
	data, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": map[string]any{"name": tool, "arguments": args}})
	if err != nil {
		c.t.Fatal(err)
	}
	c.send(string(data))
	r, _ := c.next(strconv.Itoa(id))["result"].(map[string]any)
	if r == nil || r["isError"] == true {
		c.t.Fatalf("%s %v: %v", tool, args, r)
	}
	return r
}

// structured is a result's structuredContent.
func structured(r map[string]any) map[string]any {
	sc, _ := r["structuredContent"].(map[string]any)
	return sc
}

// sessionSaid is the session a run of mcp named on its standard error,
// kept in file, at its start.
func sessionSaid(t *testing.T, file string) string {
	t.Helper()
	data, _ := os.ReadFile(file)
	m := regexp.MustCompile(`sandboxd: session (\S+) of .*'sandboxd mcp --resume (\S+)' continues it`).FindSubmatch(data)
	if m == nil || !bytes.Equal(m[1], m[2]) {
		t.Fatalf("the run does not say how to resume its session:\n%s", data)
	}
	return string(m[1])
}

// TestMCPKilledRunIsResumed: sandboxd mcp --backend docker killed with
// SIGKILL, after a skill's activation, a write, a journaled edit and a
// background command, is continued by a run with --resume SESSION: the
// same files, the edit undone through the journal, the skill still
// active, the background command's output with what it wrote while no run
// was there. --resume is refused, naming the fix,
// for a session it does not know, one of another workspace, one of
// sandboxd serve, one a living run serves and one delivered. The work is
// delivered once, when the resumed run ends, and a plain run after it
// delivers its own work and nothing of the resumed session's.
func TestMCPKilledRunIsResumed(t *testing.T) {
	const dockerRunTimeout = 3 * time.Minute
	cli := dockertest.Client(t)
	dockertest.Image(t)
	dir, _ := newWorkspace(t)
	patch := filepath.Join(t.TempDir(), "work.patch")
	// workspace.edit is activated by load_skill, which the resumed session
	// keeps.
	args := []string{"--backend", "docker", "--workspace", dir, "--grant", "fs.write", "--grant", "shell.exec", "--always", "read,shell", "--patch", patch}
	logs := t.TempDir()
	stderrOf := func(name string) *os.File {
		t.Helper()
		f, err := os.Create(filepath.Join(logs, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	defer func() {
		if t.Failed() {
			names, _ := filepath.Glob(filepath.Join(logs, "*"))
			for _, name := range names {
				data, _ := os.ReadFile(name)
				t.Logf("run %s said:\n%s", filepath.Base(name), data)
			}
		}
	}()
	first := stderrOf("1")
	c := startRawTo(t, dockerRunTimeout, first, args...)
	session := sessionSaid(t, first.Name())
	c.callTool(20, "load_skill", map[string]any{"skill": "workspace.edit"})
	c.callTool(2, "write", map[string]any{"path": "work.txt", "content": "kept\n"})
	c.callTool(3, "edit", map[string]any{"path": "a.txt", "edits": []map[string]any{{"oldText": "beta", "newText": "BETA"}}})
	commits, _ := structured(c.callTool(4, "journal_list", map[string]any{}))["commits"].([]any)
	if len(commits) == 0 {
		t.Fatal("journal_list: no commits after a write and an edit")
	}
	bg, _ := structured(c.callTool(5, "bash", map[string]any{"command": dockertest.Counting, "background": true}))["id"].(string)
	before := 0
	for id := 6; before < 3; id++ {
		out, _ := structured(c.callTool(id, "bash_output", map[string]any{"id": bg, "wait": 0.5}))["output"].(string)
		before = max(before, dockertest.LastTick(out))
	}
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()

	containers := func() []string {
		t.Helper()
		f := make(client.Filters).Add("label", policy.LabelSession+"="+session)
		cs, err := cli.ContainerList(t.Context(), client.ContainerListOptions{All: true, Filters: f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, ct := range cs.Items {
			ids = append(ids, ct.ID)
		}
		return ids
	}
	left := containers()
	if len(left) != 1 {
		t.Fatalf("the killed run's session containers: %q, want one", left)
	}
	// The background command counts on with no run of mcp connected.
	meanwhile := 0
	for deadline := time.Now().Add(time.Minute); meanwhile <= before+3; meanwhile = dockertest.Count(t.Context(), cli, left[0]) {
		if time.Now().After(deadline) {
			t.Fatalf("the background command did not count on without a run: %d, %d before", meanwhile, before)
		}
		time.Sleep(50 * time.Millisecond) // a poll of the engine, not a wait for it
	}

	// A fake record of sandboxd serve's, for the refusal of a session of
	// another daemon.
	serveRecord := filepath.Join(os.Getenv("XDG_STATE_HOME"), "sandboxd", "docker", "daemon-elsewhere", "s-served.json")
	if err := os.MkdirAll(filepath.Dir(serveRecord), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(serveRecord, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(serveRecord)) })
	refused := func(what, want string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), sandboxdBin, append([]string{"mcp", "--backend", "docker"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("--resume of %s: %v, want it refused saying %q:\n%s", what, err, want, out)
		}
	}
	refused("an unknown session", "no session s-unknown to resume on this host", "--workspace", dir, "--resume", "s-unknown")
	refused("a session of another workspace", "it is a session of "+dir+", not of", "--workspace", t.TempDir(), "--resume", session)
	refused("a session of sandboxd serve", `it is a session of the daemon "elsewhere" (sandboxd serve)`, "--workspace", dir, "--resume", "s-served")
	if got := containers(); len(got) != 1 {
		t.Fatalf("a refused --resume removed the killed run's container: %q", got)
	}

	second := stderrOf("2")
	c = startRawTo(t, dockerRunTimeout, second, append(args, "--resume", session)...)
	if _, err := os.Stat(patch); err == nil {
		t.Fatal("the resumed session's work was delivered as it was resumed")
	}
	if got := sessionSaid(t, second.Name()); got != session {
		t.Fatalf("the resumed run names session %s, want %s", got, session)
	}
	refused("a session another run serves", "cannot be resumed: its run is serving it", "--workspace", dir, "--resume", session)
	if text := textOfRaw(c.callTool(100, "read", map[string]any{"path": "work.txt"})); !strings.Contains(text, "kept") {
		t.Errorf("work.txt after the resume: %q", text)
	}
	if out, _ := structured(c.callTool(101, "bash_output", map[string]any{"id": bg, "wait": 0.5}))["output"].(string); !strings.Contains(out, fmt.Sprintf("tick %d\n", meanwhile)) {
		t.Errorf("bash_output after the resume lacks tick %d, written while no run was there:\n%s", meanwhile, out)
	}
	again, _ := structured(c.callTool(102, "journal_list", map[string]any{}))["commits"].([]any)
	if len(again) != len(commits) {
		t.Fatalf("the journal after the resume holds %d commits, want %d", len(again), len(commits))
	}
	c.callTool(103, "journal_revert", map[string]any{"to": len(commits) - 1})
	if text := textOfRaw(c.callTool(104, "read", map[string]any{"path": "a.txt"})); strings.Contains(text, "BETA") || !strings.Contains(text, "beta") {
		t.Errorf("a.txt once the killed run's edit is undone: %q", text)
	}
	c.callTool(105, "write", map[string]any{"path": "resumed.txt", "content": "resumed\n"}) // workspace.edit still active
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("the resumed run at the end of its input: %v", err)
	}
	data, err := os.ReadFile(patch)
	if err != nil || !bytes.Contains(data, []byte("+++ b/work.txt\n@@ -0,0 +1 @@\n+kept\n")) || !bytes.Contains(data, []byte("+resumed\n")) || bytes.Contains(data, []byte("BETA")) {
		t.Errorf("the resumed session's patch: %v\n%s", err, data)
	}
	if got := containers(); len(got) != 0 {
		t.Errorf("the resumed session's container is left after its work was delivered: %q", got)
	}
	refused("a delivered session", "cannot be resumed: its work was delivered", "--workspace", dir, "--resume", session)

	// A plain run after it delivers its own work, and nothing more of the
	// resumed session's.
	theirs := filepath.Join(t.TempDir(), "next.patch")
	third := stderrOf("3")
	c = startRawTo(t, dockerRunTimeout, third, "--backend", "docker", "--workspace", dir, "--grant", "fs.write", "--always", "read,edit", "--patch", theirs)
	c.callTool(2, "write", map[string]any{"path": "next.txt", "content": "next\n"})
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("the plain run at the end of its input: %v", err)
	}
	if data, err := os.ReadFile(theirs); err != nil || !bytes.Contains(data, []byte("+next\n")) || bytes.Contains(data, []byte("work.txt")) {
		t.Errorf("the plain run's patch: %v\n%s", err, data)
	}
	said, _ := os.ReadFile(third.Name())
	if bytes.Contains(said, []byte("delivering the work of session "+session)) {
		t.Errorf("the plain run delivered the resumed session's work again:\n%s", said)
	}
	if _, err := os.Stat(filepath.Join(os.Getenv("XDG_STATE_HOME"), "sandboxd", "deliveries", session+".patch")); err == nil {
		t.Errorf("the resumed session's work was harvested too")
	}
	list, err := exec.CommandContext(t.Context(), sandboxdBin, "mcp", "--list").CombinedOutput()
	if err != nil || !regexp.MustCompile(regexp.QuoteMeta(session)+` +`+regexp.QuoteMeta(dir)+` +delivered at .*: patch `+regexp.QuoteMeta(patch)).Match(list) {
		t.Errorf("mcp --list: %v\n%s", err, list)
	}
}

// textOfRaw is the text of a raw tools/call result.
func textOfRaw(r map[string]any) string {
	var b strings.Builder
	content, _ := r["content"].([]any)
	for _, c := range content {
		if m, ok := c.(map[string]any); ok {
			s, _ := m["text"].(string)
			b.WriteString(s)
		}
	}
	return b.String()
}
