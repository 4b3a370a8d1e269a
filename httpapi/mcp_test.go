package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/httpapi"
)

// countingBackend counts the workspaces its backend opens.
type countingBackend struct {
	backend.Backend
	opens atomic.Int64
}

func (b *countingBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	b.opens.Add(1)
	return b.Backend.Open(ctx, spec)
}

// rpcAnswer is a JSON-RPC response from /mcp, sent as JSON or as the data
// of a server-sent event.
type rpcAnswer struct {
	ID     any             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *jsonrpc.Error  `json:"error"`
}

// mcpPost sends body to /mcp in session sid ("" for none), as a client
// that does not use the SDK, and returns the status, the answer and the
// session ID the answer names.
func (e *env) mcpPost(sid string, body []byte, header ...string) (int, rpcAnswer, string) {
	e.t.Helper()
	h := append([]string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream"}, header...)
	if sid != "" {
		h = append(h, "Mcp-Session-Id", sid)
	}
	status, data, hdr := e.do(acmeToken, "POST", "/mcp?grant=fs.write&always=read,edit", bytes.NewReader(body), h...)
	var a rpcAnswer
	if strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
		for line := range strings.Lines(string(data)) {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = []byte(d)
			}
		}
	}
	if len(data) > 0 && status != http.StatusAccepted {
		var keys map[string]json.RawMessage
		if json.Unmarshal(data, &a) != nil || json.Unmarshal(data, &keys) != nil || keys["id"] == nil {
			e.t.Fatalf("POST /mcp: status %d, not a JSON-RPC response with an id: %.300s", status, data)
		}
	}
	return status, a, hdr.Get("Mcp-Session-Id")
}

const initialize = `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`

// mcpSession initializes an MCP session with raw requests.
func (e *env) mcpSession() string {
	e.t.Helper()
	status, a, sid := e.mcpPost("", []byte(initialize))
	if status != http.StatusOK || a.Error != nil || sid == "" {
		e.t.Fatalf("initialize: %d %+v %q", status, a, sid)
	}
	if status, _, _ := e.mcpPost(sid, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), "Mcp-Protocol-Version", "2025-06-18"); status != http.StatusAccepted {
		e.t.Fatalf("notifications/initialized: %d", status)
	}
	return sid
}

// TestMCPWithoutSessionStartsNothing: a POST without Mcp-Session-Id that
// is not one valid initialize request — garbage included — is answered
// with a JSON-RPC error, and no workspace starts for it.
func TestMCPWithoutSessionStartsNothing(t *testing.T) {
	b := &countingBackend{Backend: &local.Backend{Dir: t.TempDir()}}
	e := start(t, config{backend: b})
	for _, tc := range []struct {
		name, body string
		header     []string
		status     int
		code       int64
		id         any
	}{
		{"garbage", "GET / HTTP/1.0", nil, 400, -32700, nil},
		{"empty", "", nil, 400, -32700, nil},
		{"cut short", `{"jsonrpc":"2.0","id":1,"method":"initia`, nil, 400, -32700, nil},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"initialize","params":{}}`, nil, 400, -32600, nil},
		{"empty object", `{}`, nil, 400, -32600, nil},
		{"before initialize", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, nil, 400, -32600, float64(2)},
		{"ping", `{"jsonrpc":"2.0","id":3,"method":"ping"}`, nil, 400, -32600, float64(3)},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil, 400, -32600, nil},
		{"batch", "[" + initialize + "]", nil, 400, -32600, nil},
		{"initialize without id", `{"jsonrpc":"2.0","method":"initialize","params":{}}`, nil, 400, -32600, nil},
		{"not JSON content", initialize, []string{"Content-Type", "text/plain"}, 400, -32600, "init"},
		{"no event stream", initialize, []string{"Accept", "application/json"}, 400, -32600, "init"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			status, a, sid := e.mcpPost("", []byte(tc.body), tc.header...)
			if status != tc.status || a.Error == nil || a.Error.Code != tc.code || a.ID != tc.id || sid != "" {
				t.Fatalf("status %d, answer %+v %+v, session %q; want %d, code %d, id %v", status, a, a.Error, sid, tc.status, tc.code, tc.id)
			}
		})
	}
	e.t = t
	if n := b.opens.Load(); n != 0 {
		t.Fatalf("%d workspaces started for POSTs that were not an initialize", n)
	}
	e.mcpSession()
	if n := b.opens.Load(); n != 1 {
		t.Fatalf("%d workspaces started for one initialize", n)
	}
}

// TestMCPSessionEgress: /mcp's egress query parameter is the session's
// egress, judged as at POST /v1/sessions: past the operator's rules the
// initialize is refused, naming the setting.
func TestMCPSessionEgress(t *testing.T) {
	e := start(t, config{})
	h := []string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream"}
	status, data, _ := e.do(acmeToken, "POST", "/mcp?egress=proxy.golang.org:443", strings.NewReader(initialize), h...)
	if status != http.StatusForbidden || !strings.Contains(string(data), "egress") {
		t.Fatalf("egress past the operator's: %d %s", status, data)
	}
}

// TestMCPBadRequestsInASession: within a session, what the SDK answers in
// plain text, or not at all, is a JSON-RPC error, and the session goes on.
func TestMCPBadRequestsInASession(t *testing.T) {
	e := start(t, config{})
	sid := e.mcpSession()
	v := []string{"Mcp-Protocol-Version", "2025-06-18"}
	for i, tc := range []struct {
		name, body string
		code       int64
		id         any
	}{
		{"garbage", "\x00\xffgarbage", -32700, nil},
		{"object id", `{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}`, -32600, nil},
		{"no version", `{"id":4,"method":"ping"}`, -32600, float64(4)},
		{"batch after 2025-03-26", `[{"jsonrpc":"2.0","id":5,"method":"ping"}]`, -32600, nil},
		{"unknown method", `{"jsonrpc":"2.0","id":6,"method":"no/such"}`, -32601, float64(6)},
		{"notification with an id", `{"jsonrpc":"2.0","id":7,"method":"notifications/initialized"}`, -32600, float64(7)},
		{"call without params", `{"jsonrpc":"2.0","id":8,"method":"tools/call"}`, -32600, float64(8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			status, a, _ := e.mcpPost(sid, []byte(tc.body), v...)
			if status != http.StatusBadRequest || a.Error == nil || a.Error.Code != tc.code || a.ID != tc.id || a.Error.Message == "" {
				t.Fatalf("status %d, answer %+v %+v; want 400, code %d, id %v", status, a, a.Error, tc.code, tc.id)
			}
			ping := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, 100+i)
			if status, a, _ := e.mcpPost(sid, []byte(ping), v...); status != http.StatusOK || a.Error != nil || a.ID != float64(100+i) {
				t.Fatalf("ping after it: %d %+v", status, a)
			}
		})
	}
	// Text that is not UTF-8 reaches the tool as sent, which refuses it.
	e.t = t
	for _, content := range []string{"\xff", `\udc80`} {
		body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"write","arguments":{"path":"u.txt","content":"` + content + `"}}}`
		status, a, _ := e.mcpPost(sid, []byte(body), v...)
		if status != http.StatusOK || a.Error != nil || !strings.Contains(string(a.Result), `"error":"InvalidArgument"`) {
			t.Fatalf("a write of %q: %d %+v %s", content, status, a.Error, a.Result)
		}
	}
}

// TestMCPBodyLimit: /mcp takes a body up to the daemon's limit, as /v1
// does — not the SDK's 4 MiB — and answers one over it with a JSON-RPC
// error that names the setting.
func TestMCPBodyLimit(t *testing.T) {
	e := start(t, config{api: []httpapi.Option{httpapi.WithMaxBodyBytes(8 << 20)}})
	sid := e.mcpSession()
	write := func(n int) []byte {
		return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":{"path":"big","content":"%s"}}}`, strings.Repeat("x", n))
	}
	status, a, _ := e.mcpPost(sid, write(6<<20), "Mcp-Protocol-Version", "2025-06-18")
	if status != http.StatusOK || a.Error != nil || strings.Contains(string(a.Result), `"isError":true`) {
		t.Fatalf("a write of 6 MiB: %d %+v %.300s", status, a.Error, a.Result)
	}
	status, a, _ = e.mcpPost(sid, write(9<<20), "Mcp-Protocol-Version", "2025-06-18")
	if status != http.StatusRequestEntityTooLarge || a.Error == nil || a.Error.Code != -32600 || !strings.Contains(a.Error.Message, "limits.maxBodyBytes") {
		t.Fatalf("a body of 9 MiB: %d %+v", status, a.Error)
	}
}
