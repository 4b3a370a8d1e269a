package mcpserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/mcpserver"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// rawClient speaks to a LineTransport with raw bytes, as a client that gets
// the protocol wrong would.
type rawClient struct {
	t    *testing.T
	in   *io.PipeWriter
	out  *bufio.Reader
	done chan error
}

// answer is a JSON-RPC response as it arrives.
type answer struct {
	ID     any             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *jsonrpc.Error  `json:"error"`
}

func serveLines(t *testing.T, maxLine int) *rawClient { return serveBash(t, maxLine, nil) }

// serveBash serves a set whose bash runs run (none when nil), with the
// shell skill on.
func serveBash(t *testing.T, maxLine int, run func(context.Context, workspace.Command) (workspace.Result, error)) *rawClient {
	t.Helper()
	fsys := memfs.New()
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite}
	env := tools.Env{FS: fsys, Session: workspace.Session{ID: "s1", RunID: "s1", Root: "/workspace"}}
	if run != nil {
		env.Bash = bashFunc(run)
		cfg.Grants = append(cfg.Grants, tools.GrantShellExec)
		cfg.Always = []string{"read", "shell"}
		cfg.ProgressMs = 1
	}
	set, err := tools.New(env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &rawClient{t: t, in: inW, out: bufio.NewReader(outR), done: make(chan error, 1)}
	go func() {
		err := mcpserver.New(set).Run(t.Context(), &mcpserver.LineTransport{Reader: inR, Writer: outW, MaxLineBytes: maxLine, LimitHint: "raise maxFileBytes"})
		outW.Close()
		c.done <- err
	}()
	t.Cleanup(func() { inW.Close(); <-c.done })
	return c
}

func (c *rawClient) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		c.t.Fatalf("send %.60q: %v", line, err)
	}
}

// recv reads the next line the server writes.
func (c *rawClient) recv() string {
	c.t.Helper()
	line, err := c.out.ReadString('\n')
	if err != nil {
		c.t.Fatalf("the server wrote no answer: %v (it returned %v)", err, <-c.done)
	}
	return line
}

// answer reads the next response, which must have an "id", null or not,
// skipping the server's notifications.
func (c *rawClient) answer() answer {
	c.t.Helper()
	for {
		var a answer
		var keys map[string]json.RawMessage
		line := c.recv()
		if json.Unmarshal([]byte(line), &keys) == nil && keys["method"] != nil && keys["id"] == nil {
			continue
		}
		if json.Unmarshal([]byte(line), &a) != nil || keys["id"] == nil {
			c.t.Fatalf("not one JSON-RPC response with an id: %s", line)
		}
		return a
	}
}

// alive checks that the session still answers a ping.
func (c *rawClient) alive(id int) {
	c.t.Helper()
	c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, id))
	if a := c.answer(); a.ID != float64(id) || a.Error != nil {
		c.t.Fatalf("ping %d after a bad line: %+v", id, a)
	}
}

func (c *rawClient) initialize(version string) {
	c.t.Helper()
	c.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"` + version + `","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`)
	if a := c.answer(); a.ID != "init" || a.Error != nil {
		c.t.Fatalf("initialize: %+v", a)
	}
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
}

// TestBadLinesAreAnsweredAndTheSessionGoesOn: each line that is not a valid
// JSON-RPC message gets a JSON-RPC error — with the request's ID where it
// can be found — and the next line is served.
func TestBadLinesAreAnsweredAndTheSessionGoesOn(t *testing.T) {
	c := serveLines(t, 4096)

	// Before initialize: a request is refused with a JSON-RPC code (the SDK
	// gives none), a bad line with the usual one.
	c.send(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if a := c.answer(); a.ID != float64(1) || a.Error == nil || a.Error.Code != -32600 || !strings.Contains(a.Error.Message, "initialization") {
		t.Fatalf("tools/list before initialize: %+v", a.Error)
	}
	c.send(`not json`)
	if a := c.answer(); a.ID != nil || a.Error == nil || a.Error.Code != -32700 {
		t.Fatalf("garbage before initialize: %+v", a)
	}
	c.initialize("2025-06-18")

	long := `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"write","arguments":{"path":"a","content":"` + strings.Repeat("x", 5000) + `"}}}`
	for i, tc := range []struct {
		name, line string
		code       int64
		id         any
		says       string
	}{
		{"garbage", "hello there", -32700, nil, "parse error"},
		{"binary", "\x00\x01\xff", -32700, nil, "parse error"},
		{"cut short", `{"jsonrpc":"2.0","id":7,"method":"tools/li`, -32700, nil, "parse error"},
		{"two values", `{"jsonrpc":"2.0","id":8,"method":"ping"} {}`, -32700, nil, "one JSON-RPC message a line"},
		{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, -32600, nil, "invalid request"},
		{"array id", `{"jsonrpc":"2.0","id":[1],"method":"ping"}`, -32600, nil, "invalid request"},
		{"no version", `{"id":9,"method":"ping"}`, -32600, float64(9), "invalid request"},
		{"old version", `{"jsonrpc":"1.0","id":"v","method":"ping"}`, -32600, "v", "invalid request"},
		{"a number", `42`, -32600, nil, "not a number"},
		{"a string", `"ping"`, -32600, nil, "not a string"},
		{"empty batch", `[]`, -32600, nil, "empty batch"},
		{"batch after 2025-03-26", `[{"jsonrpc":"2.0","id":10,"method":"ping"}]`, -32600, nil, "2025-06-18 has no batches"},
		{"too long", long, -32600, float64(77), "over the limit of 4096 bytes"},
		{"unknown method", `{"jsonrpc":"2.0","id":11,"method":"no/such"}`, -32601, float64(11), ""},
		{"fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, -32600, nil, "not an integer"},
		{"huge id", `{"jsonrpc":"2.0","id":1e300,"method":"ping"}`, -32600, nil, "not an integer"},
		// Capabilities the server does not declare are not served.
		{"logging", `{"jsonrpc":"2.0","id":12,"method":"logging/setLevel","params":{"level":"debug"}}`, -32601, float64(12), "method not found"},
		{"resources", `{"jsonrpc":"2.0","id":13,"method":"resources/list"}`, -32601, float64(13), "method not found"},
		{"prompts", `{"jsonrpc":"2.0","id":14,"method":"prompts/list"}`, -32601, float64(14), "method not found"},
		{"completion", `{"jsonrpc":"2.0","id":15,"method":"completion/complete","params":{}}`, -32601, float64(15), "method not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			c.send(tc.line)
			a := c.answer()
			if a.Error == nil || a.Error.Code != tc.code || a.ID != tc.id || !strings.Contains(a.Error.Message, tc.says) {
				t.Fatalf("answer %+v %+v, want code %d, id %v, a message with %q", a, a.Error, tc.code, tc.id, tc.says)
			}
			c.alive(100 + i)
		})
	}
	c.t = t
	if !strings.Contains(c.lastTooLong(long), "raise maxFileBytes") {
		t.Error("the too-long answer does not say how to raise the limit")
	}
	// A line whose ID comes after more than is kept of it.
	c.send(`{"jsonrpc":"2.0","method":"ping","params":{"x":"` + strings.Repeat("x", 100<<10) + `"},"id":5}`)
	if a := c.answer(); a.ID != nil || a.Error == nil || a.Error.Code != -32600 {
		t.Fatalf("a long line without a visible ID: %+v", a)
	}
	c.alive(200)
	// Blank lines are no messages.
	c.send("")
	c.send("  \r")
	c.alive(201)
	// A response to nothing the server asked, and a notification of a
	// method there is not, are dropped.
	c.send(`{"jsonrpc":"2.0","id":99,"result":{}}`)
	c.send(`{"jsonrpc":"2.0","id":98,"error":{"code":1,"message":"x"}}`)
	c.send(`{"jsonrpc":"2.0","method":"notifications/no_such"}`)
	c.alive(202)
}

func (c *rawClient) lastTooLong(long string) string {
	c.t.Helper()
	c.send(long)
	a := c.answer()
	if a.Error == nil {
		c.t.Fatalf("a long line: %+v", a)
	}
	return a.Error.Message
}

// TestBatchBefore20250618 is served, and answered in one array.
func TestBatchBefore20250618(t *testing.T) {
	c := serveLines(t, 0)
	c.initialize("2025-03-26")
	c.send(`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"x","progress":1}},{"jsonrpc":"2.0","id":2,"method":"tools/list"}]`)
	var batch []answer
	if line := c.recv(); json.Unmarshal([]byte(line), &batch) != nil || len(batch) != 2 {
		t.Fatalf("the batch's answer: %s", line)
	}
	if batch[0].ID != float64(1) || batch[1].ID != float64(2) || batch[0].Error != nil || batch[1].Error != nil {
		t.Fatalf("the batch's answer: %+v", batch)
	}
	c.send(`[{"jsonrpc":"2.0","id":3,"method":"ping"},{"jsonrpc":"2.0","id":3,"method":"ping"}]`)
	if a := c.answer(); a.Error == nil || a.Error.Code != -32600 || !strings.Contains(a.Error.Message, "twice") {
		t.Fatalf("a batch with an ID twice: %+v", a)
	}
	c.alive(4)
}

// TestInputClosedEndsTheSession: the end of input, even in the middle of a
// line, ends Run without an error of the session's.
func TestInputClosedEndsTheSession(t *testing.T) {
	c := serveLines(t, 0)
	c.initialize("2025-06-18")
	c.send(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	c.answer()
	io.WriteString(c.in, `{"jsonrpc":"2.0","id":2,"meth`)
	c.in.Close()
	if a := c.answer(); a.Error == nil || a.Error.Code != -32700 {
		t.Fatalf("a last line cut short: %+v", a)
	}
	if _, err := c.out.ReadString('\n'); err != io.EOF {
		t.Fatalf("after input closed: %v", err)
	}
}

// TestArgumentsArriveAsSent: a line longer than the reader's buffer
// arrives whole; bytes that are not UTF-8, and lone surrogate escapes, pass
// the transport and the SDK as sent, so the tool refuses them rather than
// writing U+FFFD.
func TestArgumentsArriveAsSent(t *testing.T) {
	c := serveLines(t, 0)
	c.initialize("2025-06-18")
	c.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"load_skill","arguments":{"skill":"workspace.edit"}}}`)
	if a := c.answer(); a.Error != nil || strings.Contains(string(a.Result), `"isError":true`) {
		t.Fatalf("load_skill: %s", a.Result)
	}
	big := strings.Repeat("0123456789abcdef", 300<<10/16)
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"name":"write","arguments":{"path":"big.txt","content":"` + big + `"}}}`,
		`{"jsonrpc":"2.0","id":"read","method":"tools/call","params":{"name":"read","arguments":{"path":"big.txt"}}}`,
	} {
		c.send(line)
		if a := c.answer(); a.Error != nil || strings.Contains(string(a.Result), `"isError":true`) || (a.ID == "read" && !strings.Contains(string(a.Result), big[:1000])) {
			t.Fatalf("%v: %+v %.200s", a.ID, a.Error, a.Result)
		}
	}
	for i, content := range []string{"ab\xffcd", `x\udc80`} {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"write","arguments":{"path":"a.txt","content":"%s"}}}`, 2+i, content))
		a := c.answer()
		var res struct {
			IsError           bool
			StructuredContent tools.ErrorResult
		}
		if a.Error != nil || json.Unmarshal(a.Result, &res) != nil || !res.IsError || res.StructuredContent.Error != "InvalidArgument" {
			t.Fatalf("write of %q: %s %+v", content, a.Result, a.Error)
		}
	}
}

// FuzzDecode: any frame is decoded or refused with -32700 or -32600, and a
// refusal encodes as a JSON-RPC response with an "id".
func FuzzDecode(f *testing.F) {
	for _, s := range []string{"hello", `{"jsonrpc":"2.0","id":7,"method":"tools/li`, `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`,
		`[]`, `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":1,"method":"ping"}]`, `42`, `{"id":9,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":3,"result":{}}`, `{"jsonrpc":"2.0","method":"x","params":[1]}`, "[[]]", `{"jsonrpc":"2.0","id":true}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		msgs, batch, err := mcpserver.Decode(frame)
		if err == nil {
			if len(msgs) == 0 || !batch && len(msgs) != 1 {
				t.Fatalf("Decode(%q) = %d messages, batch %v", frame, len(msgs), batch)
			}
			return
		}
		fe, ok := err.(*mcpserver.FrameError)
		if !ok || fe.Code != -32700 && fe.Code != -32600 || fe.Message == "" {
			t.Fatalf("Decode(%q): %#v", frame, err)
		}
		var resp map[string]json.RawMessage
		if json.Unmarshal(fe.Encode(), &resp) != nil || resp["id"] == nil || resp["error"] == nil || string(resp["jsonrpc"]) != `"2.0"` {
			t.Fatalf("the refusal of %q: %s", frame, fe.Encode())
		}
	})
}

// bashFunc is a workspace.Bash that runs a Go function.
type bashFunc func(context.Context, workspace.Command) (workspace.Result, error)

func (f bashFunc) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	return f(ctx, cmd)
}

// rest reads what the server writes until it ends its output: each line,
// parsed.
func (c *rawClient) rest() []map[string]json.RawMessage {
	c.t.Helper()
	var out []map[string]json.RawMessage
	for {
		line, err := c.out.ReadString('\n')
		if err == io.EOF {
			return out
		} else if err != nil {
			c.t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(line), &m) != nil {
			c.t.Fatalf("not a JSON object: %s", line)
		}
		out = append(out, m)
	}
}

// TestProgressNeverStallsTheCommand: a client that does not read while a
// command writes much stalls the sending of progress, not the command; and
// all of a call's progress comes before its result.
func TestProgressNeverStallsTheCommand(t *testing.T) {
	finished := make(chan struct{})
	c := serveBash(t, 0, func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		chunk := []byte(strings.Repeat("x", 1023) + "\n")
		for range 4 << 10 { // 4 MiB, many times ProgressCap and the pipe's room
			cmd.Output(workspace.Stdout, chunk)
		}
		close(finished)
		return workspace.Result{}, nil
	})
	c.initialize("2025-06-18")
	c.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"bash","arguments":{"command":"spew"},"_meta":{"progressToken":"p"}}}`)
	// Nothing is read until the command has ended.
	select {
	case <-finished:
	case <-time.After(2 * time.Minute):
		t.Fatal("the command stalled while the client did not read its progress")
	}
	c.in.Close()
	var progress []float64
	answered := false
	for _, m := range c.rest() {
		switch {
		case string(m["method"]) == `"notifications/progress"`:
			if answered {
				t.Fatal("progress after the call's result")
			}
			var p struct{ Progress float64 }
			json.Unmarshal(m["params"], &p)
			progress = append(progress, p.Progress)
		case string(m["id"]) == "1":
			answered = true
		}
	}
	if !answered || len(progress) == 0 || !slices.IsSorted(progress) || progress[len(progress)-1] != 4<<20 {
		t.Fatalf("answered %v, progress %v", answered, progress)
	}
}

// TestRequestsInFlight: a cancelled call is not answered; an ID in use by a
// call not yet answered is refused with that ID; calls read before the end
// of input are answered before the session ends.
func TestRequestsInFlight(t *testing.T) {
	release := make(chan struct{})
	c := serveBash(t, 0, func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		switch cmd.Script {
		case "wait":
			<-release
		case "cancel me":
			<-ctx.Done()
			return workspace.Result{}, ctx.Err()
		}
		return workspace.Result{}, nil
	})
	c.initialize("2025-06-18")
	c.send(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"bash","arguments":{"command":"wait"}}}`)
	c.send(`{"jsonrpc":"2.0","id":7,"method":"ping"}`)
	if a := c.answer(); a.ID != float64(7) || a.Error == nil || a.Error.Code != -32600 || !strings.Contains(a.Error.Message, "in use") {
		t.Fatalf("a second request with ID 7: %+v %+v", a, a.Error)
	}
	c.send(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"bash","arguments":{"command":"cancel me"}}}`)
	c.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":8,"reason":"changed my mind"}}`)
	// Piped in, then the end of input at once: answered all the same.
	c.send(`{"jsonrpc":"2.0","id":9,"method":"ping"}`)
	c.in.Close()
	close(release)
	ids := map[string]bool{}
	for _, m := range c.rest() {
		if m["id"] != nil {
			ids[string(m["id"])] = true
		}
	}
	if !ids["7"] || !ids["9"] || ids["8"] {
		t.Fatalf("answered %v, want 7 and 9 and not the cancelled 8", ids)
	}
}

// TestEncodeResponseIsTheSDKs holds the transport's encoding of a response
// to the SDK's, byte for byte: results as the SDK marshals them (compact,
// HTML not escaped: <, >, & and U+2028 as they are), IDs of every kind, and
// errors.
func TestEncodeResponseIsTheSDKs(t *testing.T) {
	marshal := func(v any) json.RawMessage {
		var buf strings.Builder
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return json.RawMessage(strings.TrimRight(buf.String(), "\n"))
	}
	result := marshal(&mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "a <b> & c\u2028d\n\"quoted\" \\ \t"}},
		StructuredContent: map[string]any{"content": "a <b> & c", "n": 1},
	})
	id := func(v any) jsonrpc.ID {
		id, err := jsonrpc.MakeID(v)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	for _, tc := range []struct {
		name string
		resp *jsonrpc.Response
	}{
		{"a tool's result", &jsonrpc.Response{ID: id(7.0), Result: result}},
		{"ID 0", &jsonrpc.Response{ID: id(0.0), Result: marshal(map[string]any{})}},
		{"a negative ID", &jsonrpc.Response{ID: id(-12.0), Result: marshal([]int{1, 2})}},
		{"the largest ID", &jsonrpc.Response{ID: id(float64(1 << 53)), Result: marshal("x")}},
		{"a string ID", &jsonrpc.Response{ID: id("a<&>"), Result: result}},
		{"an error", &jsonrpc.Response{ID: id(3.0), Error: &jsonrpc.Error{Code: -32602, Message: "bad <params>"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := jsonrpc.EncodeMessage(tc.resp)
			if err != nil {
				t.Fatal(err)
			}
			got, err := mcpserver.EncodeResponse(tc.resp)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}
