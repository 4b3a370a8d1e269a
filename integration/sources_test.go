package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
)

// TestAPISources runs `sandboxd serve` with an API-backed source whose
// credential is in the daemon's environment, against a real HTTP server on
// loopback, and shows on each backend that the agent reaches the API only
// through the shell's curl, that the credential is added but never seen —
// not in the workspace, a command's environment, a tool's output or the
// daemon's log — and that every request is audited.
func TestAPISources(t *testing.T) {
	const secret = "itest-api-secret-b84d2e"
	var hits atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+secret {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/v1/issues/7":
			fmt.Fprintf(w, `{"issue":7,"auth":%q}`, r.Header.Get("Authorization"))
		case "/v1/elsewhere":
			http.Redirect(w, r, "http://203.0.113.7/collect", http.StatusFound)
		case "/v1/huge":
			w.Write(make([]byte, 64<<10))
		}
	}))
	defer api.Close()

	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) {
			cfg := map[string]any{
				"listen": "127.0.0.1:0", "backend": backend, "daemon": daemonName(t),
				"snapshots": map[string]any{"dir": "off"},
				"tenants":   []map[string]any{{"name": "acme", "tokens": []string{httpapi.HashToken(acmeToken)}}},
				"tools": map[string]any{
					"profile": "workspace-tools,workspace-shell",
					"sources": []map[string]any{{
						"name": "tracker", "kind": "http", "url": api.URL + "/v1",
						"requests": []map[string]any{
							{"method": "GET", "path": "/issues/{id}", "description": "one issue"},
							{"method": "GET", "path": "/elsewhere"},
							{"method": "GET", "path": "/huge"},
						},
						"credential":       map[string]any{"header": "Authorization", "prefix": "Bearer ", "env": "ITEST_TRACKER_TOKEN"},
						"maxResponseBytes": 16 << 10,
					}},
				},
			}
			withCluster(cfg)
			data, _ := json.Marshal(cfg)
			file := filepath.Join(t.TempDir(), "sandboxd.json")
			if err := os.WriteFile(file, data, 0o600); err != nil {
				t.Fatal(err)
			}
			d := start(t, file, "ITEST_TRACKER_TOKEN="+secret)
			var s runner.Info
			d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
			defer d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)

			var outputs []string
			call := func(tool string, args map[string]any) result {
				t.Helper()
				r := d.call(acmeToken, s.ID, tool, args)
				raw, _ := json.Marshal(r)
				outputs = append(outputs, string(raw))
				return r
			}
			text := func(r result) string {
				var b strings.Builder
				for _, c := range r.Content {
					b.WriteString(c.Text)
				}
				return b.String()
			}
			if r := call("materialize_sources", map[string]any{}); r.IsError || !strings.Contains(text(r), "requests.json") {
				t.Fatalf("materialize_sources: %+v", r)
			}
			if r := call("shell", map[string]any{"command": "curl -s " + api.URL + "/v1/issues/7"}); r.IsError || !strings.Contains(text(r), `{"issue":7,"auth":"Bearer [redacted]"}`) {
				t.Fatalf("declared request: %+v", r)
			}
			before := hits.Load()
			for _, line := range []string{
				"curl -s " + api.URL + "/v1/admin",
				"curl -s -X DELETE " + api.URL + "/v1/issues/7",
				"curl -s " + strings.Replace(api.URL, "127.0.0.1", "localhost", 1) + "/v1/issues/7",
			} {
				if r := call("shell", map[string]any{"command": line}); !r.IsError || !strings.Contains(text(r), "refused") {
					t.Errorf("%s: %+v", line, r)
				}
			}
			if hits.Load() != before {
				t.Errorf("undeclared requests reached the API")
			}
			if r := call("shell", map[string]any{"command": "curl -sL " + api.URL + "/v1/elsewhere"}); !r.IsError || !strings.Contains(text(r), "redirects to") {
				t.Errorf("redirect elsewhere: %+v", r)
			}
			if r := call("shell", map[string]any{"command": "curl -s " + api.URL + "/v1/huge"}); !strings.Contains(text(r), "(63)") {
				t.Errorf("oversized response: %+v", r)
			}
			// The sandbox's own commands: the credential is in no environment
			// and no file of the workspace.
			call("bash", map[string]any{"command": "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'; grep -r itest-api . 2>&1; true"})
			call("shell", map[string]any{"command": "grep -r itest-api . .sandboxd"})
			call("grep", map[string]any{"pattern": "itest-api", "path": ".sandboxd"})
			for _, out := range outputs {
				if strings.Contains(out, secret) {
					t.Fatalf("the credential reached a tool's output: %s", out)
				}
			}
			log := d.stderr.String()
			if !strings.Contains(log, `"msg":"source request"`) || !strings.Contains(log, `"outcome":"refused"`) {
				t.Errorf("no audit of source requests in the log:\n%s", log)
			}
			if strings.Contains(log, secret) {
				t.Errorf("the credential is in the daemon's log")
			}
		})
	}
}
