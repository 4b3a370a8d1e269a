package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/mcpserver"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// scriptBash is a workspace.Bash that plays a script: each step writes to a
// stream, then waits, and the command ends with exitCode.
type scriptBash struct {
	steps    []step
	exitCode int
}

type step struct {
	stream workspace.Stream
	text   string
	pause  time.Duration
}

func (b *scriptBash) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	for _, s := range b.steps {
		if cmd.Output != nil {
			cmd.Output(s.stream, []byte(s.text))
		}
		select {
		case <-time.After(s.pause):
		case <-ctx.Done():
			return workspace.Result{ExitCode: -1, Signal: "SIGKILL"}, ctx.Err()
		}
	}
	return workspace.Result{ExitCode: b.exitCode}, nil
}

// client records what the server sends besides results.
type client struct {
	*mcp.ClientSession
	listChanged chan struct{}

	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
}

func (c *client) progressSeen() []*mcp.ProgressNotificationParams {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.progress)
}

type fixture struct {
	grants, always []string
	bash           workspace.Bash
	files          map[string]string
	configure      func(*tools.Config)
}

// start serves a tool set over in-memory transports and connects a client.
func start(t *testing.T, fx fixture) (*client, *tools.Set) {
	t.Helper()
	ctx := t.Context()
	fsys := memfs.New()
	for name, data := range fx.files {
		if err := workspace.MkdirAll(ctx, fsys, dirOf(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fsys.WriteFile(ctx, name, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := tools.DefaultConfig()
	cfg.Grants = fx.grants
	if fx.always != nil {
		cfg.Always = fx.always
	}
	cfg.ProgressMs = 20
	if fx.configure != nil {
		fx.configure(&cfg)
	}
	env := tools.Env{FS: fsys, Session: workspace.Session{ID: "s1", RunID: "s1", Root: "/workspace"}}
	if fx.bash != nil {
		env.Bash = fx.bash
	}
	set, err := tools.New(env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	srv := mcpserver.New(set, mcpserver.WithImplementation("sandboxd-test", "v0"))
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, st) }()

	c := &client{listChanged: make(chan struct{}, 10)}
	mc := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { c.listChanged <- struct{}{} },
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, req.Params)
			c.mu.Unlock()
		},
	})
	cs, err := mc.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.ClientSession = cs
	t.Cleanup(func() {
		cs.Close()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("server: %v", err)
		}
	})
	return c, set
}

func dirOf(name string) string {
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		return name[:i]
	}
	return "."
}

func toolNames(t *testing.T, c *client) []string {
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

func call(t *testing.T, c *client, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := c.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// structured decodes a result's structuredContent into v.
func structured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("structuredContent %s: %v", data, err)
	}
}

func text(res *mcp.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

func TestListServesActiveToolsWithSchemasAndInstructions(t *testing.T) {
	c, set := start(t, fixture{grants: []string{tools.GrantFSWrite}})
	if got, want := toolNames(t, c), []string{"find", "grep", "journal_list", "journal_revert", "journal_show", "load_skill", "ls", "read"}; !slices.Equal(got, want) {
		t.Errorf("tools = %v, want %v", got, want)
	}
	res, err := c.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	catalogue := map[string]tools.Tool{}
	for _, tool := range set.List() {
		catalogue[tool.Name] = tool
	}
	for _, tool := range res.Tools {
		schema, ok := tool.InputSchema.(map[string]any)
		if !ok || schema["type"] != "object" || schema["properties"] == nil {
			t.Errorf("%s: input schema %v, want an object schema with properties", tool.Name, tool.InputSchema)
		}
		// The output schema is the catalogue's: its result shapes and the error shape.
		got, _ := json.Marshal(tool.OutputSchema)
		var want any
		json.Unmarshal(catalogue[tool.Name].OutputSchema, &want)
		if wantJSON, _ := json.Marshal(want); tool.OutputSchema == nil || string(got) != string(wantJSON) {
			t.Errorf("%s: output schema %s, want %s", tool.Name, got, wantJSON)
		}
		if tool.Description == "" {
			t.Errorf("%s: no description", tool.Name)
		}
		if ro := tool.Annotations != nil && tool.Annotations.ReadOnlyHint; ro == (tool.Name == "journal_revert") {
			t.Errorf("%s: read-only hint %v", tool.Name, ro)
		}
	}
	init := c.InitializeResult()
	if init.Instructions == "" || init.Instructions != set.EnvironmentSection() {
		t.Errorf("instructions = %q, want the environment section %q", init.Instructions, set.EnvironmentSection())
	}
	if init.ServerInfo.Name != "sandboxd-test" {
		t.Errorf("server name = %q", init.ServerInfo.Name)
	}
}

func TestResultsCarryTextAndStructuredContent(t *testing.T) {
	c, _ := start(t, fixture{files: map[string]string{"a.txt": "one\ntwo\n", "d/b.go": "package b\n"}})

	res := call(t, c, "read", map[string]any{"path": "/workspace/a.txt"})
	var rd tools.ReadResult
	structured(t, res, &rd)
	if res.IsError || rd.Path != "a.txt" || rd.Content != "one\ntwo\n" || rd.TotalLines != 2 || rd.NextOffset != 0 {
		t.Errorf("read = %+v (isError %v)", rd, res.IsError)
	}
	if !strings.Contains(text(res), "one") {
		t.Errorf("read text = %q", text(res))
	}

	res = call(t, c, "grep", map[string]any{"pattern": "package"})
	var gr tools.GrepResult
	structured(t, res, &gr)
	if len(gr.Matches) != 1 || gr.Matches[0] != (tools.GrepMatch{Path: "d/b.go", Line: 1, Text: "package b"}) {
		t.Errorf("grep = %+v", gr)
	}
	if !strings.Contains(text(res), "d/b.go:1:package b") {
		t.Errorf("grep text = %q", text(res))
	}
}

func TestFailureIsErrorWithKind(t *testing.T) {
	c, _ := start(t, fixture{})
	for _, tc := range []struct {
		tool string
		args map[string]any
		kind string
		says string
	}{
		{"read", map[string]any{"path": "missing.txt"}, "NotFound", ""},
		{"read", map[string]any{"path": "../etc/passwd"}, "OutsideWorkspace", ""},
		{"read", map[string]any{"path": "a", "bogus": 1}, "InvalidArgument", ""},
		{"load_skill", map[string]any{"skill": "workspace.edit"}, tools.KindCapabilityForbidden, "fs.write"},
		// Tools the server does not list answer as over HTTP: a tool
		// failure that says what to do, not the SDK's bare "unknown tool".
		// Its grant missing, the first answer says so.
		{"write", map[string]any{"path": "a", "content": "x"}, tools.KindToolUnavailable, `skill workspace.edit, whose grant fs.write this session was not given`},
		{"no_such_tool", map[string]any{}, tools.KindToolUnavailable, `no tool named "no_such_tool"`},
	} {
		res := call(t, c, tc.tool, tc.args)
		var e tools.ErrorResult
		structured(t, res, &e)
		if !res.IsError || e.Error != tc.kind || e.Message == "" || !strings.Contains(e.Message, tc.says) {
			t.Errorf("%s %v: isError %v, structured %+v; want kind %s saying %q", tc.tool, tc.args, res.IsError, e, tc.kind, tc.says)
		}
	}
	select {
	case <-c.listChanged:
		t.Error("tools/list_changed after a refused load_skill")
	case <-time.After(50 * time.Millisecond):
	}
}

// The SDK sends tools/list_changed from a timer a few milliseconds after a
// change, one for each burst of changes: in a synctest bubble, where its
// clock moves only when every goroutine waits, the notifications a change
// makes have all arrived once the bubble has slept past that timer.
func TestLoadSkillSendsListChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := start(t, fixture{grants: []string{tools.GrantFSWrite}, files: map[string]string{"a.txt": "x\n"}})
		notified := func() int {
			time.Sleep(time.Second) // the bubble's clock: all timers due meanwhile fire
			synctest.Wait()         // and what they send has arrived
			n := 0
			for len(c.listChanged) > 0 {
				<-c.listChanged
				n++
			}
			return n
		}
		if n := notified(); n != 0 {
			t.Errorf("%d tools/list_changed before load_skill", n)
		}
		res := call(t, c, "load_skill", map[string]any{"skill": "workspace.edit"})
		if res.IsError {
			t.Fatalf("load_skill: %s", text(res))
		}
		if notified() == 0 {
			t.Fatal("no tools/list_changed after load_skill")
		}
		if got, want := toolNames(t, c), []string{"edit", "find", "grep", "journal_list", "journal_revert", "journal_show", "load_skill", "ls", "read", "write"}; !slices.Equal(got, want) {
			t.Errorf("tools after load_skill = %v, want %v", got, want)
		}
		res = call(t, c, "edit", map[string]any{"path": "a.txt", "edits": []map[string]string{{"oldText": "x", "newText": "y"}}})
		var ed tools.EditResult
		structured(t, res, &ed)
		if res.IsError || ed.Replaced != 1 || !strings.Contains(ed.Diff, "+y") {
			t.Errorf("edit after load_skill = %+v (%s)", ed, text(res))
		}
		// Loading it again changes nothing, and says so without a notification.
		call(t, c, "load_skill", map[string]any{"skill": "edit"})
		if n := notified(); n != 0 {
			t.Errorf("%d tools/list_changed for a skill already active", n)
		}
	})
}

func TestReadImageIsImageContent(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 3, 2))
	img.Set(1, 1, color.RGBA{255, 0, 0, 255})
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	c, _ := start(t, fixture{files: map[string]string{"pic.dat": buf.String()}})
	res := call(t, c, "read", map[string]any{"path": "pic.dat"})
	var ri tools.ReadImageResult
	structured(t, res, &ri)
	if res.IsError || ri.Path != "pic.dat" || ri.MIMEType != "image/png" || ri.Bytes != int64(buf.Len()) {
		t.Errorf("read image = %+v (%s)", ri, text(res))
	}
	var got *mcp.ImageContent
	for _, ct := range res.Content {
		if ic, ok := ct.(*mcp.ImageContent); ok {
			got = ic
		}
	}
	if got == nil {
		t.Fatalf("no image content in %v", res.Content)
	}
	if got.MIMEType != "image/png" || !bytes.Equal(got.Data, buf.Bytes()) {
		t.Errorf("image content %s, %d bytes; want image/png, the file's %d bytes (%s…)",
			got.MIMEType, len(got.Data), buf.Len(), base64.StdEncoding.EncodeToString(got.Data[:min(8, len(got.Data))]))
	}
}

func TestBashProgress(t *testing.T) {
	sh := &scriptBash{exitCode: 3, steps: []step{
		{workspace.Stdout, "one\n", 150 * time.Millisecond},
		{workspace.Stderr, "two\n", 150 * time.Millisecond},
	}}
	c, _ := start(t, fixture{grants: []string{tools.GrantShellExec}, always: []string{"read", "shell"}, bash: sh})

	params := &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "play"}}
	params.SetProgressToken("tok-1")
	res, err := c.CallTool(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	var br tools.BashResult
	structured(t, res, &br)
	if res.IsError || br.ExitCode != 3 || br.Output != "one\ntwo\n" || br.TimedOut || br.Signal != "" {
		t.Errorf("bash = %+v (isError %v)", br, res.IsError)
	}
	// Notifications are sent before the result; the client may handle them
	// concurrently, so allow them a moment.
	var seen []*mcp.ProgressNotificationParams
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if seen = c.progressSeen(); len(seen) >= 2 {
			break
		}
	}
	var streams, texts []string
	var last float64
	for _, p := range seen {
		if p.ProgressToken != "tok-1" {
			t.Errorf("progress token %v", p.ProgressToken)
		}
		if p.Progress <= last {
			t.Errorf("progress %v after %v: not increasing", p.Progress, last)
		}
		last = p.Progress
		s, _ := p.Meta[mcpserver.MetaStream].(string)
		streams = append(streams, s)
		texts = append(texts, p.Message)
	}
	if !slices.Equal(streams, []string{"stdout", "stderr"}) || !slices.Equal(texts, []string{"one\n", "two\n"}) {
		t.Errorf("progress: streams %q, messages %q; want stdout one, stderr two", streams, texts)
	}

	// Without a progress token, nothing is published.
	before := len(c.progressSeen())
	call(t, c, "bash", map[string]any{"command": "play"})
	time.Sleep(50 * time.Millisecond)
	if n := len(c.progressSeen()); n != before {
		t.Errorf("%d progress notifications for a call without a progress token", n-before)
	}
}

func TestLongProgressIsCutToItsEnd(t *testing.T) {
	long := strings.Repeat("é", 40) + "END"
	sh := &scriptBash{steps: []step{{workspace.Stdout, long, 0}}}
	c, _ := start(t, fixture{grants: []string{tools.GrantShellExec}, always: []string{"shell"}, bash: sh,
		configure: func(cfg *tools.Config) { cfg.MaxBytes = 10 }})
	params := &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"command": "x"}}
	params.SetProgressToken(7)
	if _, err := c.CallTool(t.Context(), params); err != nil {
		t.Fatal(err)
	}
	var seen []*mcp.ProgressNotificationParams
	for deadline := time.Now().Add(5 * time.Second); len(seen) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		seen = c.progressSeen()
	}
	if len(seen) != 1 {
		t.Fatalf("%d progress notifications, want 1", len(seen))
	}
	msg := seen[0].Message
	shown, found := strings.CutPrefix(msg, "[… 74 bytes not shown]\n")
	if !found || shown != "ééé"+"END" || seen[0].Progress != float64(len(long)) {
		t.Errorf("progress message %q (progress %v), want the last 10 bytes on a rune boundary after a notice", msg, seen[0].Progress)
	}
}

func TestRunIDFromMeta(t *testing.T) {
	c, _ := start(t, fixture{files: map[string]string{"a": "a\n"}, configure: func(cfg *tools.Config) { cfg.MaxCallsPerRun = 2 }})
	callIn := func(run string) *mcp.CallToolResult {
		p := &mcp.CallToolParams{Name: "ls", Arguments: map[string]any{}}
		if run != "" {
			p.Meta = mcp.Meta{mcpserver.MetaRunID: run}
		}
		res, err := c.CallTool(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i, run := range []string{"r1", "r1", "r2", "r2", "", ""} {
		if res := callIn(run); res.IsError {
			t.Fatalf("call %d in run %q: %s", i, run, text(res))
		}
	}
	for _, run := range []string{"r1", ""} {
		res := callIn(run)
		var e tools.ErrorResult
		structured(t, res, &e)
		if !res.IsError || e.Error != tools.KindCallLimit {
			t.Errorf("third call in run %q: %+v, want %s", run, e, tools.KindCallLimit)
		}
	}
}
