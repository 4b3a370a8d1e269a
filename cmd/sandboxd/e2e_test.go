package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// testTimeout bounds each run of the binary.
const testTimeout = 30 * time.Second

// newWorkspace lays out a small project on disk and returns its directory.
func newWorkspace(t *testing.T) (dir string, pngData []byte) {
	t.Helper()
	dir = t.TempDir()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, 4, 3))); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"a.txt":       "alpha\nbeta\n",
		"src/main.go": "package main\n\nfunc main() {}\n",
		"crlf.txt":    "one\r\ntwo\r\n",
		"chart.bin":   buf.String(), // an image whatever its name says
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("src", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return dir, buf.Bytes()
}

// mcpClient is a client session with sandboxd mcp, started as a user's MCP
// client would start it, recording notifications.
type mcpClient struct {
	*mcp.ClientSession
	stderr      *bytes.Buffer
	cmd         *exec.Cmd
	listChanged chan struct{}

	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
}

func startMCP(t *testing.T, args ...string) *mcpClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	c := &mcpClient{stderr: new(bytes.Buffer), listChanged: make(chan struct{}, 10)}
	c.cmd = exec.Command(sandboxdBin, append([]string{"mcp"}, args...)...)
	c.cmd.Stderr = c.stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "v0"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { c.listChanged <- struct{}{} },
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, req.Params)
			c.mu.Unlock()
		},
	})
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: c.cmd}, nil)
	if err != nil {
		t.Fatalf("connecting to sandboxd mcp %q: %v\nstderr: %s", args, err, c.stderr)
	}
	c.ClientSession = cs
	startedMCP.Store(strconv.Itoa(c.cmd.Process.Pid), true)
	t.Cleanup(func() {
		// Closing our end is how the session ends: the server must exit by
		// itself, successfully, not be signalled.
		cs.Close()
		if st := c.cmd.ProcessState; st == nil || !st.Success() {
			t.Errorf("sandboxd mcp did not exit cleanly when its input closed: %v\nstderr: %s", st, c.stderr)
		}
	})
	return c
}

func (c *mcpClient) toolNames(t *testing.T) []string {
	t.Helper()
	res, err := c.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

// call calls a tool and returns its result and its structured content.
func (c *mcpClient) call(t *testing.T, name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	res, err := c.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	sc, ok := res.StructuredContent.(map[string]any)
	if !ok {
		t.Fatalf("%s %v: structuredContent %T %v, want an object", name, args, res.StructuredContent, res.StructuredContent)
	}
	return res, sc
}

// want checks a tool's structured content against the pinned fields: every
// key in want must be present with that value (compared as JSON).
func want(t *testing.T, what string, res *mcp.CallToolResult, got map[string]any, want map[string]any) {
	t.Helper()
	if res.IsError {
		t.Errorf("%s: isError, %v", what, got)
		return
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: structuredContent has no %q: %v", what, k, got)
			continue
		}
		gj, _ := json.Marshal(g)
		wj, _ := json.Marshal(w)
		if !bytes.Equal(gj, wj) {
			t.Errorf("%s: %s = %s, want %s", what, k, gj, wj)
		}
	}
}

func wantError(t *testing.T, what string, res *mcp.CallToolResult, got map[string]any, kind string) {
	t.Helper()
	if !res.IsError || got["error"] != kind || got["message"] == "" || got["message"] == nil {
		t.Errorf("%s: isError %v, structuredContent %v; want error %s with a message", what, res.IsError, got, kind)
	}
}

func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPEveryTool runs sandboxd mcp as a new user would, on each backend,
// and calls every tool.
func TestMCPEveryTool(t *testing.T) {
	for _, tc := range []struct {
		backend string
		always  string
		tools   []string
	}{
		{"local", "read,edit,shell", []string{"bash", "bash_kill", "bash_output", "edit", "find", "grep", "journal_list", "journal_revert", "journal_show", "load_skill", "ls", "read", "write"}},
		{"memory", "read,edit,shell", []string{"bash", "bash_kill", "bash_output", "edit", "find", "grep", "journal_list", "journal_revert", "journal_show", "load_skill", "ls", "read", "write"}},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			dir, pngData := newWorkspace(t)
			c := startMCP(t, "--backend", tc.backend, "--workspace", dir,
				"--grant", "fs.write", "--grant", "shell.exec", "--always", tc.always)
			root := dir
			if tc.backend != "local" {
				root = "/workspace"
			}

			if got := c.toolNames(t); !slices.Equal(got, tc.tools) {
				t.Errorf("tools = %v, want %v", got, tc.tools)
			}
			if ins := c.InitializeResult().Instructions; !strings.Contains(ins, root) {
				t.Errorf("instructions do not name the workspace root %s:\n%s", root, ins)
			}

			res, sc := c.call(t, "read", map[string]any{"path": root + "/a.txt"})
			want(t, "read", res, sc, map[string]any{"path": "a.txt", "content": "alpha\nbeta\n",
				"startLine": 1, "endLine": 2, "totalLines": 2, "nextOffset": 0, "truncated": false})
			res, sc = c.call(t, "read", map[string]any{"path": "a.txt", "offset": 1, "limit": 1})
			want(t, "read window", res, sc, map[string]any{"content": "alpha\n", "endLine": 1, "nextOffset": 2, "truncated": true})
			if !strings.Contains(textOf(res), "offset=2") {
				t.Errorf("read window text %q has no offset notice", textOf(res))
			}

			res, sc = c.call(t, "read", map[string]any{"path": "chart.bin"})
			want(t, "read image", res, sc, map[string]any{"path": "chart.bin", "mimeType": "image/png", "bytes": len(pngData)})
			if i := slices.IndexFunc(res.Content, func(c mcp.Content) bool {
				ic, ok := c.(*mcp.ImageContent)
				return ok && ic.MIMEType == "image/png" && bytes.Equal(ic.Data, pngData)
			}); i < 0 {
				t.Errorf("read image: no image content with the file's bytes in %v", res.Content)
			}

			res, sc = c.call(t, "ls", map[string]any{})
			want(t, "ls", res, sc, map[string]any{"path": ".", "entries": []string{"a.txt", "chart.bin", "crlf.txt", "link@", "src/"}, "truncated": false})

			res, sc = c.call(t, "find", map[string]any{"pattern": "**/*.go"})
			want(t, "find", res, sc, map[string]any{"paths": []string{"src/main.go"}, "truncated": false})

			res, sc = c.call(t, "grep", map[string]any{"pattern": "func", "glob": "*.go"})
			want(t, "grep", res, sc, map[string]any{"matches": []map[string]any{{"path": "src/main.go", "line": 3, "text": "func main() {}"}}, "truncated": false})
			if !strings.Contains(textOf(res), "src/main.go:3:func main() {}") {
				t.Errorf("grep text %q", textOf(res))
			}

			res, sc = c.call(t, "write", map[string]any{"path": "new/dir/n.txt", "content": "fresh\n"})
			want(t, "write", res, sc, map[string]any{"path": "new/dir/n.txt", "bytes": 6, "created": true})
			res, sc = c.call(t, "read", map[string]any{"path": "new/dir/n.txt"})
			want(t, "read after write", res, sc, map[string]any{"content": "fresh\n"})

			res, sc = c.call(t, "edit", map[string]any{"path": "crlf.txt", "edits": []map[string]any{{"oldText": "one\ntwo", "newText": "uno\ndos"}}})
			want(t, "edit", res, sc, map[string]any{"path": "crlf.txt", "replaced": 1, "lines": []int{1}})
			if d, _ := sc["diff"].(string); !strings.Contains(d, "+uno") || !strings.Contains(d, "-one") {
				t.Errorf("edit diff %q", d)
			}

			// The local backend works on the directory itself; memory on a copy.
			disk, err := os.ReadFile(filepath.Join(dir, "crlf.txt"))
			if err != nil {
				t.Fatal(err)
			}
			_, statErr := os.Stat(filepath.Join(dir, "new/dir/n.txt"))
			if tc.backend == "local" {
				if string(disk) != "uno\r\ndos\r\n" || statErr != nil {
					t.Errorf("on disk: crlf.txt %q, new/dir/n.txt %v; want the edit with CRLF kept and the new file", disk, statErr)
				}
			} else if string(disk) != "one\r\ntwo\r\n" || statErr == nil {
				t.Errorf("the memory backend changed the directory it copied: crlf.txt %q, new file %v", disk, statErr)
			}

			res, sc = c.call(t, "edit", map[string]any{"path": "a.txt", "edits": []map[string]any{{"oldText": "gamma", "newText": "x"}}})
			wantError(t, "edit without a match", res, sc, "NoMatch")
			res, sc = c.call(t, "read", map[string]any{"path": "/etc/passwd"})
			wantError(t, "read outside", res, sc, "OutsideWorkspace")
			res, sc = c.call(t, "write", map[string]any{"path": ".git/config", "content": "x"})
			wantError(t, "write protected", res, sc, "Protected")

			res, sc = c.call(t, "load_skill", map[string]any{"skill": "workspace.read"})
			want(t, "load_skill", res, sc, map[string]any{"skill": "workspace.read"})

			// Commands run in the directory on the local backend, and in a
			// private copy of the workspace on the memory backend.
			res, sc = c.call(t, "bash", map[string]any{"command": "cat; pwd; exit 4", "stdin": "in\n"})
			want(t, "bash", res, sc, map[string]any{"exitCode": 4, "signal": "", "timedOut": false, "truncated": false, "outputPath": ""})
			out, _ := sc["output"].(string)
			pwd, ok := strings.CutPrefix(out, "in\n")
			if pwd = strings.TrimSuffix(pwd, "\n"); !ok || tc.backend == "local" && pwd != dir || tc.backend == "memory" && (pwd == dir || !filepath.IsAbs(pwd)) {
				t.Errorf("bash output %q: want the input, then the directory the command ran in", out)
			}
			if tc.backend == "memory" {
				memoryBash(t, c, dir)
			}
			res, sc = c.call(t, "bash", map[string]any{"command": "echo to-stderr >&2"})
			want(t, "bash stderr", res, sc, map[string]any{"exitCode": 0, "output": "to-stderr\n"})
			res, sc = c.call(t, "bash", map[string]any{"command": "seq 1 3000"})
			want(t, "bash long output", res, sc, map[string]any{"exitCode": 0, "truncated": true})
			spilled, _ := sc["outputPath"].(string)
			if !strings.HasPrefix(spilled, ".sandboxd/runtime/tool-output/") {
				t.Errorf("bash outputPath %q, want a path under .sandboxd/runtime/tool-output", spilled)
			}
			res, sc = c.call(t, "read", map[string]any{"path": spilled, "offset": 3000})
			want(t, "read the saved output", res, sc, map[string]any{"content": "3000\n", "totalLines": 3000})
			res, sc = c.call(t, "bash", map[string]any{"command": "sleep 5", "timeout": 0.2})
			want(t, "bash timeout", res, sc, map[string]any{"timedOut": true})
		})
	}
}

// memoryBash runs a command that creates, changes and removes files on the
// memory backend: the other tools see its changes, and the directory the
// workspace was copied from does not change.
func memoryBash(t *testing.T, c *mcpClient, dir string) {
	t.Helper()
	res, sc := c.call(t, "bash", map[string]any{"command": `cat new/dir/n.txt
printf 'alpha\nBETA\n' > a.txt; rm crlf.txt; echo made > made.txt; chmod 755 made.txt
mkdir -p gen && echo 'func generated() {}' > gen/g.go; ln -s gen glink; ls "$PWD"/glink/`})
	want(t, "bash that changes files", res, sc, map[string]any{"exitCode": 0, "output": "fresh\ng.go\n"})

	res, sc = c.call(t, "read", map[string]any{"path": "a.txt"})
	want(t, "read after bash", res, sc, map[string]any{"content": "alpha\nBETA\n"})
	res, sc = c.call(t, "read", map[string]any{"path": "/workspace/glink/g.go"})
	want(t, "read through the command's link", res, sc, map[string]any{"path": "glink/g.go", "content": "func generated() {}\n"})
	res, sc = c.call(t, "read", map[string]any{"path": "crlf.txt"})
	wantError(t, "read a file the command removed", res, sc, "NotFound")
	res, sc = c.call(t, "ls", map[string]any{})
	// The journal of the write and edit calls before is kept outside the
	// workspace, where its commands cannot write: no .sandboxd/.
	want(t, "ls after bash", res, sc, map[string]any{"entries": []string{"a.txt", "chart.bin", "gen/", "glink@", "link@", "made.txt", "new/", "src/"}})
	res, sc = c.call(t, "grep", map[string]any{"pattern": "func", "glob": "*.go"})
	want(t, "grep after bash", res, sc, map[string]any{"matches": []map[string]any{
		{"path": "gen/g.go", "line": 1, "text": "func generated() {}"},
		{"path": "src/main.go", "line": 3, "text": "func main() {}"},
	}})
	res, sc = c.call(t, "edit", map[string]any{"path": "made.txt", "edits": []map[string]any{{"oldText": "made", "newText": "edited"}}})
	want(t, "edit a file the command made", res, sc, map[string]any{"replaced": 1})
	res, sc = c.call(t, "bash", map[string]any{"command": "cat made.txt; stat -c %a made.txt; [ -e crlf.txt ] || echo no crlf"})
	want(t, "bash sees the edit", res, sc, map[string]any{"exitCode": 0, "output": "edited\n755\nno crlf\n"})

	for name, data := range map[string]string{"a.txt": "alpha\nbeta\n", "crlf.txt": "one\r\ntwo\r\n"} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != data {
			t.Errorf("the directory's %s: %q, %v; want it untouched", name, got, err)
		}
	}
	for _, name := range []string{"made.txt", "gen", "glink"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			t.Errorf("the command's %s appeared in the directory the workspace was copied from", name)
		}
	}
}

func TestMCPLoadSkillListChangedAndBashProgress(t *testing.T) {
	dir, _ := newWorkspace(t)
	config := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(config, []byte(`{"progressMs": 50}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startMCP(t, "--backend", "local", "--workspace", dir, "--config", config, "--grant", "shell.exec")
	if got, want := c.toolNames(t), []string{"find", "grep", "load_skill", "ls", "read"}; !slices.Equal(got, want) {
		t.Fatalf("tools before load_skill = %v, want %v", got, want)
	}

	res, sc := c.call(t, "load_skill", map[string]any{"skill": "workspace.edit"})
	wantError(t, "load_skill without its grant", res, sc, "capability.forbidden")
	// A tool not listed yet answers as over HTTP: a tool failure that
	// names the skill to load.
	res, sc = c.call(t, "bash", map[string]any{"command": "true"})
	wantError(t, "bash before load_skill", res, sc, "ToolUnavailable")
	if msg, _ := sc["message"].(string); !strings.Contains(msg, "load_skill") {
		t.Errorf("bash before load_skill: %q does not say to call load_skill", msg)
	}

	res, sc = c.call(t, "load_skill", map[string]any{"skill": "workspace.shell"})
	want(t, "load_skill", res, sc, map[string]any{"skill": "workspace.shell", "tools": []string{"bash", "bash_output", "bash_kill"}})
	select {
	case <-c.listChanged:
	case <-time.After(10 * time.Second):
		t.Fatal("no tools/list_changed after load_skill")
	}
	if got, want := c.toolNames(t), []string{"bash", "bash_kill", "bash_output", "find", "grep", "load_skill", "ls", "read"}; !slices.Equal(got, want) {
		t.Errorf("tools after load_skill = %v, want %v", got, want)
	}

	params := &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "echo one; sleep 0.4; echo two >&2"}}
	params.SetProgressToken("bash-1")
	res, err := c.CallTool(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("bash: %s", textOf(res))
	}
	var messages []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		c.mu.Lock()
		messages = messages[:0]
		for _, p := range c.progress {
			if p.ProgressToken == "bash-1" {
				messages = append(messages, p.Meta["sandboxd/stream"].(string)+":"+p.Message)
			}
		}
		c.mu.Unlock()
		if len(messages) >= 2 {
			break
		}
	}
	// bash's output is one stream, in the order written (see
	// workspace.Command.Combined): its progress says stdout.
	if !slices.Equal(messages, []string{"stdout:one\n", "stdout:two\n"}) {
		t.Errorf("progress = %q, want one then two, as stdout", messages)
	}
}

// rawClient speaks JSON-RPC to sandboxd mcp over its stdio, line by line.
type rawClient struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	// held keeps the answers next read past, by id: calls are answered
	// concurrently, in any order.
	held map[string]map[string]any
}

func startRaw(t *testing.T, args ...string) *rawClient {
	t.Helper()
	return startRawTo(t, testTimeout, nil, args...)
}

// startRawTo is startRaw with sandboxd's standard error going to stderr,
// and a run bounded by timeout.
func startRawTo(t *testing.T, timeout time.Duration, stderr *os.File, args ...string) *rawClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, sandboxdBin, append([]string{"mcp"}, args...)...)
	if stderr != nil {
		cmd.Stderr = stderr
		// A run past its time prints where it hangs (the Go runtime's
		// goroutine dump on SIGQUIT) to stderr, which the test shows.
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
		cmd.WaitDelay = 10 * time.Second
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	c.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"legacy","version":"1"}}}`)
	if v := c.next("1")["result"].(map[string]any)["protocolVersion"]; v != "2025-06-18" {
		t.Fatalf("protocol version %v", v)
	}
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return c
}

func (c *rawClient) send(msg string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, msg+"\n"); err != nil {
		c.t.Fatal(err)
	}
}

// next reads messages until one has the given id (as JSON) or method. An
// answer to another call read meanwhile is kept for the next that asks
// for it; a notification read meanwhile is dropped.
func (c *rawClient) next(match string) map[string]any {
	c.t.Helper()
	if m, ok := c.held[match]; ok {
		delete(c.held, match)
		return m
	}
	for c.lines.Scan() {
		var m map[string]any
		if err := json.Unmarshal(c.lines.Bytes(), &m); err != nil {
			c.t.Fatalf("%q: %v", c.lines.Text(), err)
		}
		id, _ := json.Marshal(m["id"])
		if string(id) == match || m["method"] == match {
			return m
		}
		if _, answer := m["id"]; answer && m["method"] == nil {
			if c.held == nil {
				c.held = map[string]map[string]any{}
			}
			c.held[string(id)] = m
		}
	}
	c.t.Fatalf("no %s before the end of output (%v)", match, c.lines.Err())
	return nil
}

// TestMCPLegacyClient speaks an older protocol version, as many clients do,
// and still gets tools/list_changed.
func TestMCPLegacyClient(t *testing.T) {
	dir, _ := newWorkspace(t)
	c := startRaw(t, "--backend", "memory", "--workspace", dir, "--grant", "fs.write")
	c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"load_skill","arguments":{"skill":"workspace.edit"}}}`)
	// The notification may come before the call's result or after it.
	var result map[string]any
	var changed bool
	for result == nil || !changed {
		if !c.lines.Scan() {
			t.Fatalf("output ended (%v): result %v, list_changed %v", c.lines.Err(), result, changed)
		}
		var m map[string]any
		if err := json.Unmarshal(c.lines.Bytes(), &m); err != nil {
			t.Fatalf("%q: %v", c.lines.Text(), err)
		}
		if id, _ := json.Marshal(m["id"]); string(id) == "2" {
			result, _ = m["result"].(map[string]any)
			if result == nil || result["isError"] == true {
				t.Fatalf("load_skill: %v", m)
			}
		}
		changed = changed || m["method"] == "notifications/tools/list_changed"
	}
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("sandboxd mcp after its input closed: %v", err)
	}
}

// TestMCPInputClosedEndsRunningCommand closes the input while a command
// runs, then sends SIGTERM, as MCP clients do to a server that has not
// ended: the session ends at once, and the command with it. (Input closed
// alone, the call read before it is answered first: mcpserver's
// TestRequestsInFlight.)
func TestMCPInputClosedEndsRunningCommand(t *testing.T) {
	dir, _ := newWorkspace(t)
	c := startRaw(t, "--backend", "local", "--workspace", dir, "--grant", "shell.exec", "--always", "shell")
	c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":"echo $$ > pid; exec sleep 60"}}}`)
	pidFile := filepath.Join(dir, "pid")
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		data, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	if pid == 0 {
		t.Fatal("the command did not start")
	}
	began := time.Now()
	c.stdin.Close()
	c.cmd.Process.Signal(syscall.SIGTERM)
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("sandboxd mcp after its input closed: %v", err)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("sandboxd mcp took %v to end after its input closed", d)
	}
	alive := func() bool { return syscall.Kill(pid, 0) == nil }
	for deadline := time.Now().Add(2 * time.Second); alive() && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	if alive() {
		t.Errorf("the command (pid %d) survived its session", pid)
	}
}

func TestToolsJSON(t *testing.T) {
	dir, _ := newWorkspace(t)
	code, out, errs := runBinary(t, "tools", "--json", "--backend", "local", "--workspace", dir, "--grant", "fs.write", "--always", "read,edit")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var cat struct {
		Tools []struct {
			Name         string         `json:"name"`
			Skill        *string        `json:"skill"`
			Active       *bool          `json:"active"`
			InputSchema  map[string]any `json:"inputSchema"`
			OutputSchema map[string]any `json:"outputSchema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal([]byte(out), &cat); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	wantTools := map[string]struct {
		skill  string
		active bool
	}{
		"read": {"workspace.read", true}, "ls": {"workspace.read", true}, "find": {"workspace.read", true},
		"grep": {"workspace.read", true}, "write": {"workspace.edit", true}, "edit": {"workspace.edit", true},
		"bash": {"workspace.shell", false}, "bash_output": {"workspace.shell", false}, "bash_kill": {"workspace.shell", false}, "load_skill": {"", true},
		"journal_list": {"journal", true}, "journal_show": {"journal", true}, "journal_revert": {"journal", true},
	}
	for _, tool := range cat.Tools {
		w, ok := wantTools[tool.Name]
		if !ok {
			t.Errorf("unexpected tool %q", tool.Name)
			continue
		}
		delete(wantTools, tool.Name)
		if tool.Skill == nil || *tool.Skill != w.skill || tool.Active == nil || *tool.Active != w.active {
			t.Errorf("%s: skill %v, active %v; want %q, %v", tool.Name, tool.Skill, tool.Active, w.skill, w.active)
		}
		if tool.InputSchema["type"] != "object" || tool.InputSchema["properties"] == nil {
			t.Errorf("%s: inputSchema %v", tool.Name, tool.InputSchema)
		}
		if shapes, _ := tool.OutputSchema["oneOf"].([]any); tool.OutputSchema["type"] != "object" || len(shapes) < 2 {
			t.Errorf("%s: outputSchema %v, want an object, one of the result's shapes or the error's", tool.Name, tool.OutputSchema)
		}
	}
	for name := range wantTools {
		t.Errorf("tool %s missing", name)
	}
}

func TestAlwaysWithoutGrantRefusesToStart(t *testing.T) {
	dir, _ := newWorkspace(t)
	for _, tc := range []struct {
		args  []string
		grant string
	}{
		{[]string{"--grant", "shell.exec", "--always", "read,edit,shell"}, "fs.write"},
		{[]string{"--grant", "fs.write", "--always", "read,edit,shell"}, "shell.exec"},
	} {
		args := append([]string{"mcp", "--backend", "local", "--workspace", dir}, tc.args...)
		code, out, errs := runBinary(t, args...)
		if code == 0 || out != "" || !strings.Contains(errs, "grant "+tc.grant) {
			t.Errorf("sandboxd %q: exit %d, stdout %q, stderr %q; want a refusal naming %s", args, code, out, errs, tc.grant)
		}
	}
}

// TestMCPDockerMatchesLocal makes the same calls over MCP on the local
// backend and on the docker backend (each on a fresh copy of one project)
// and wants the same structured results, the workspace root aside: the
// directory itself on local, /workspace in the container.
func TestMCPDockerMatchesLocal(t *testing.T) {
	cli := dockertest.Client(t)
	dockertest.Image(t) // build the minimal image once, before timing starts
	// Registered first, so it runs after sandboxd mcp has exited: its
	// container is gone.
	t.Cleanup(func() { wantNoCLIContainers(t, cli) })
	calls := []struct {
		tool string
		args map[string]any
	}{
		{"read", map[string]any{"path": "$ROOT/a.txt"}},
		{"read", map[string]any{"path": "a.txt", "offset": 1, "limit": 1}},
		{"read", map[string]any{"path": "chart.bin"}},
		{"ls", map[string]any{}},
		{"ls", map[string]any{"path": "link"}},
		{"find", map[string]any{"pattern": "**/*.go"}},
		{"find", map[string]any{"pattern": "**"}},
		{"grep", map[string]any{"pattern": "func", "glob": "*.go"}},
		{"grep", map[string]any{"pattern": "(?i)ALPHA|two"}},
		{"write", map[string]any{"path": "new/dir/n.txt", "content": "fresh\n"}},
		{"write", map[string]any{"path": "a.txt", "content": "alpha\nbeta\ngamma\n"}},
		{"read", map[string]any{"path": "new/dir/n.txt"}},
		{"edit", map[string]any{"path": "crlf.txt", "edits": []map[string]any{{"oldText": "one\ntwo", "newText": "uno\ndos"}}}},
		{"edit", map[string]any{"path": "a.txt", "edits": []map[string]any{{"oldText": "beta", "newText": "BETA"}, {"oldText": "gamma", "newText": "G"}}}},
		{"edit", map[string]any{"path": "a.txt", "edits": []map[string]any{{"oldText": "zeta", "newText": "x"}}}},
		{"read", map[string]any{"path": "/etc/passwd"}},
		{"read", map[string]any{"path": "missing.txt"}},
		{"read", map[string]any{"path": "src"}},
		{"write", map[string]any{"path": ".git/config", "content": "x"}},
		{"write", map[string]any{"path": "../escape.txt", "content": "x"}},
		{"load_skill", map[string]any{"skill": "workspace.read"}},
		{"bash", map[string]any{"command": "cat; pwd; exit 4", "stdin": "in\n"}},
		{"bash", map[string]any{"command": "echo to-stderr >&2; cat a.txt"}},
		{"bash", map[string]any{"command": "mkdir -p gen && echo 'func g() {}' > gen/g.go && rm crlf.txt"}},
		{"grep", map[string]any{"pattern": "func", "glob": "*.go"}},
		{"read", map[string]any{"path": "crlf.txt"}},
		{"bash", map[string]any{"command": "seq 1 3000"}},
		{"read", map[string]any{"path": "$SPILL", "offset": 3000}},
		{"bash", map[string]any{"command": "sleep 5", "timeout": 0.3}},
		{"bash", map[string]any{"command": "kill -9 $$"}},
		{"ls", map[string]any{}},
	}
	results := map[string][]string{}
	for _, backend := range []string{"local", "docker"} {
		dir, _ := newWorkspace(t)
		root := dir
		if backend == "docker" {
			root = "/workspace"
		}
		c := startMCP(t, "--backend", backend, "--workspace", dir,
			"--grant", "fs.write", "--grant", "shell.exec", "--always", "read,edit,shell")
		if ins := c.InitializeResult().Instructions; !strings.Contains(ins, root) {
			t.Errorf("%s: instructions do not name the workspace root %s", backend, root)
		}
		var spill string
		for _, call := range calls {
			args, _ := json.Marshal(call.args)
			args = bytes.ReplaceAll(bytes.ReplaceAll(args, []byte("$ROOT"), []byte(root)), []byte("$SPILL"), []byte(spill))
			var a map[string]any
			json.Unmarshal(args, &a)
			res, sc := c.call(t, call.tool, a)
			if p, _ := sc["outputPath"].(string); p != "" {
				spill = p
			}
			results[backend] = append(results[backend], normalizeResult(res.IsError, sc, root))
		}
		if backend == "docker" {
			if data, err := os.ReadFile(filepath.Join(dir, "crlf.txt")); err != nil || string(data) != "one\r\ntwo\r\n" {
				t.Errorf("the docker backend changed the directory it copied: crlf.txt %q, %v", data, err)
			}
		}
	}
	for i, call := range calls {
		if l, d := results["local"][i], results["docker"][i]; l != d {
			t.Errorf("%s %v:\n local: %s\ndocker: %s", call.tool, call.args, l, d)
		}
	}
}

// normalizeResult returns a result as JSON without what differs between
// two runs of the same calls: the workspace root (in the text, and in the
// byte count of an output that names it), durations, and the times and
// random parts of spill files' names.
func normalizeResult(isError bool, sc map[string]any, root string) string {
	delete(sc, "durationMs")
	if out, ok := sc["output"].(string); ok && sc["truncated"] == false {
		if n, ok := sc["outputBytes"].(float64); ok {
			sc["outputBytes"] = n - float64(strings.Count(out, root)*(len(root)-len("$ROOT")))
		}
	}
	got, _ := json.Marshal(map[string]any{"isError": isError, "structuredContent": sc})
	s := strings.ReplaceAll(string(got), root, "$ROOT")
	return spillName.ReplaceAllString(s, "bash-$$TIME.log")
}

var spillName = regexp.MustCompile(`bash-[0-9]{8}-[0-9.]+-[0-9a-f]{8}\.log`)

// TestToolsJSONWorkspaceShell follows the contract's "Verify the Workspace
// shell" steps with sandboxd's names.
func TestToolsJSONWorkspaceShell(t *testing.T) {
	dir, _ := newWorkspace(t)
	entry := func(args ...string) map[string]any {
		t.Helper()
		code, out, errs := runBinary(t, append([]string{"tools", "--json", "--workspace", dir}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		var cat struct {
			Tools []map[string]any `json:"tools"`
		}
		if err := json.Unmarshal([]byte(out), &cat); err != nil {
			t.Fatal(err)
		}
		for _, tool := range cat.Tools {
			if tool["name"] == "workspaceShell" {
				return tool
			}
		}
		return nil
	}
	list := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	// Step 2: the commands list, read mode and write mode.
	if e := entry("--profile", "workspace-shell"); e == nil || list(e["commands"]) != `["pwd","ls","find","rg","grep","cat","head","tail","wc"]` {
		t.Errorf("read mode: %v", e)
	}
	if e := entry("--profile", "workspace-tools,workspace-shell", "--mode", "write", "--grant", "fs.write"); e == nil ||
		list(e["commands"]) != `["pwd","ls","find","rg","grep","cat","head","tail","wc","mkdir","touch","cp","mv","rm"]` {
		t.Errorf("write mode: %v", e)
	}
	// Step 3: a provider with commands lists one workspace_exec item per
	// executable; without commands there is no entry.
	if e := entry("--mode", "write", "--grant", "fs.write", "--driver", "provider", "--commands", "git,/usr/bin/go", "--exec-timeout", "30000"); e == nil ||
		list(e["exec"]) != `["workspace_exec (git)","workspace_exec (/usr/bin/go)"]` || e["commands"] != nil {
		t.Errorf("provider: %v", e)
	}
	if e := entry("--profile", "workspace-shell", "--driver", "provider"); e != nil {
		t.Errorf("provider without commands: %v", e)
	}
	// Step 4: commands on a model-driven session fails, pointing to bash.
	code, _, errs := runBinary(t, "tools", "--json", "--workspace", dir, "--mode", "write", "--grant", "fs.write", "--commands", "git")
	if code != 1 || !strings.Contains(errs, "bash tool") || !strings.Contains(errs, "shell.exec") {
		t.Errorf("commands on a model driver: exit %d: %s", code, errs)
	}
	// The same settings from the configuration file.
	cfg := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(cfg, []byte(`{"grants":["fs.write"],"driver":"provider","workspaceShell":{"mode":"write","commands":["git"],"timeout":30000}}`), 0o644)
	if e := entry("--config", cfg); e == nil || list(e["exec"]) != `["workspace_exec (git)"]` {
		t.Errorf("config file: %v", e)
	}
}
