package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/dockertest"
)

// TestMCPBadLinesKeepTheSession: sandboxd mcp answers each line that is not
// a valid message with a JSON-RPC error and goes on serving the same
// session — on Docker, the same container, with the work in it.
func TestMCPBadLinesKeepTheSession(t *testing.T) {
	for _, backend := range []string{"memory", "docker"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "docker" {
				dockertest.Client(t) // fails under CI when there is no engine
				dockertest.Image(t)
			}
			dir, _ := newWorkspace(t)
			config := filepath.Join(t.TempDir(), "config.json")
			if err := os.WriteFile(config, []byte(`{"maxFileBytes": 1048576}`), 0o644); err != nil {
				t.Fatal(err)
			}
			c := startRaw(t, "--backend", backend, "--workspace", dir, "--config", config, "--grant", "fs.write", "--always", "read,edit")
			c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write","arguments":{"path":"work.txt","content":"kept\n"}}}`)
			if r := c.next("2")["result"].(map[string]any); r["isError"] == true {
				t.Fatalf("write: %v", r)
			}
			// The line limit is 16 MiB when maxFileBytes is small.
			long := `{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":"write","arguments":{"path":"big","content":"` + strings.Repeat("x", 17<<20) + `"}}}`
			for _, tc := range []struct {
				name, line, id string
				code           float64
				says           string
			}{
				{"garbage", "hello", "null", -32700, "parse error"},
				{"cut short", `{"jsonrpc":"2.0","id":3,"method":"tools/ca`, "null", -32700, "parse error"},
				{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, "null", -32600, "not a string, a number or null"},
				{"batch", `[{"jsonrpc":"2.0","id":4,"method":"ping"}]`, "null", -32600, "no batches"},
				{"too long", long, `"long"`, -32600, "maxFileBytes"},
				{"not UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"write\",\"arguments\":{\"path\":\"work.txt\",\"content\":\"\xff\"}}}", "5", 0, "UTF-8"},
			} {
				c.send(tc.line)
				m := c.next(tc.id)
				if tc.code == 0 { // a tool failure, not a JSON-RPC error
					r, _ := m["result"].(map[string]any)
					if r["isError"] != true || !strings.Contains(r["structuredContent"].(map[string]any)["message"].(string), tc.says) {
						t.Fatalf("%s: %v", tc.name, m)
					}
					continue
				}
				e, _ := m["error"].(map[string]any)
				if e["code"] != tc.code || !strings.Contains(e["message"].(string), tc.says) {
					t.Fatalf("%s: %v, want code %v saying %q", tc.name, m, tc.code, tc.says)
				}
			}
			// The same session, with its work.
			c.send(`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"read","arguments":{"path":"work.txt"}}}`)
			if r := c.next("6")["result"].(map[string]any); r["structuredContent"].(map[string]any)["content"] != "kept\n" {
				t.Fatalf("read after the bad lines: %v", r)
			}
			c.stdin.Close()
			if err := c.cmd.Wait(); err != nil {
				t.Errorf("sandboxd mcp after its input closed: %v", err)
			}
		})
	}
}
