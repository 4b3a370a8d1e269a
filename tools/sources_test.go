package tools_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"
)

// TestMaterializeSourcesTool materializes a declared source through the
// tool and shows that its snapshot can be read and searched but not
// changed by any write tool.
func TestMaterializeSourcesTool(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "api"), 0o755)
	os.WriteFile(filepath.Join(src, "README.md"), []byte("# docs\n"), 0o644)
	os.WriteFile(filepath.Join(src, "api/v1.md"), []byte("GET /things\n"), 0o644)

	set := profileSet(t, memoryBackend(t), func(c *tools.Config) {
		c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
		c.Always = []string{"read", "edit"}
		c.Sources = sources.Decls{{Name: "docs", Kind: sources.KindDir, Path: src}}
	})

	first := callJSON(t, set, "materialize_sources", map[string]any{})
	res, ok := first.Structured.(*tools.SourcesResult)
	if first.IsError || !ok || len(res.Sources) != 1 {
		t.Fatalf("materialize_sources: %s %+v", first.Text, first.Structured)
	}
	s := res.Sources[0]
	if s.Name != "docs" || s.Kind != sources.KindDir || s.Path != ".sandboxd/sources/docs" || s.Files != 2 || s.Bytes != 19 || !s.Changed {
		t.Errorf("first: %+v", s)
	}
	again := callJSON(t, set, "materialize_sources", map[string]any{"sources": []string{"docs"}, "path": "/workspace/.sandboxd/sources"})
	if r := again.Structured.(*tools.SourcesResult); again.IsError || r.Sources[0].Changed || r.Sources[0].Digest != s.Digest {
		t.Errorf("again: %s", again.Text)
	}
	if r := callJSON(t, set, "materialize_sources", map[string]any{"sources": []string{"nope"}}); !r.IsError || errKind(r) != "NotFound" || !strings.Contains(r.Text, "docs") {
		t.Errorf("undeclared source: %s", r.Text)
	}

	const file = ".sandboxd/sources/docs/README.md"
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"write", map[string]any{"path": file, "content": "x"}},
		{"write", map[string]any{"path": ".sandboxd/sources/docs/new", "content": "x"}},
		{"edit", map[string]any{"path": file, "edits": []map[string]string{{"oldText": "docs", "newText": "x"}}}},
		{"writeFile", map[string]any{"path": file, "content": "x"}},
		{"appendFile", map[string]any{"path": file, "content": "x"}},
		{"deletePath", map[string]any{"path": file}},
		{"deletePath", map[string]any{"path": ".sandboxd/sources/docs", "recursive": true}},
		{"movePath", map[string]any{"from": file, "to": "x.md"}},
		{"shell", map[string]any{"command": "rm -r .sandboxd/sources/docs"}},
		{"shell", map[string]any{"command": "cat notes.txt > " + file}},
	} {
		r := callJSON(t, set, c.tool, c.args)
		refused := r.IsError && errKind(r) == "Protected"
		if sr, ok := r.Structured.(*tools.ShellResult); ok { // the shell reports a refusal in its output
			refused = sr.ExitCode != 0 && strings.Contains(sr.Stderr, "protected")
		}
		if !refused {
			t.Errorf("%s %v was not refused: %s", c.tool, c.args, r.Text)
		}
	}
	again = callJSON(t, set, "materialize_sources", map[string]any{})
	if r := again.Structured.(*tools.SourcesResult); r.Sources[0].Changed {
		t.Errorf("a write tool changed the snapshot: %s", again.Text)
	}

	// Readable, and searchable when named; a search from the root skips .sandboxd.
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"read", map[string]any{"path": file}, "# docs"},
		{"grep", map[string]any{"pattern": "GET", "path": ".sandboxd/sources/docs"}, "v1.md"},
		{"find", map[string]any{"pattern": "*.md", "path": ".sandboxd/sources"}, "api/v1.md"},
		{"shell", map[string]any{"command": "cat " + file}, "# docs"},
		{"shell", map[string]any{"command": "grep -rn GET .sandboxd/sources/docs"}, "v1.md:1:GET /things"},
		{"shell", map[string]any{"command": "find .sandboxd/sources/docs -name '*.md' | wc -l"}, "2"},
	} {
		if r := callJSON(t, set, c.tool, c.args); r.IsError || !strings.Contains(r.Text, c.want) {
			t.Errorf("%s %v: %s", c.tool, c.args, r.Text)
		}
	}
	if r := callJSON(t, set, "grep", map[string]any{"pattern": "GET"}); strings.Contains(r.Text, "v1.md") {
		t.Errorf("grep from the root entered .sandboxd: %s", r.Text)
	}
}

// memoryBackend is a memory workspace with bash.
func memoryBackend(t *testing.T) shellBackend {
	mfs := memfs.New(memfs.WithUmask(0))
	msh, err := memory.NewMirror(mfs, memory.WithTempDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return shellBackend{"memory", mfs, msh, "/workspace"}
}

func TestSourcesConfig(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"sources":[{"name":"a","kind":"git","path":"/r","commit":"main"}]}`, "option sources[0].commit"},
		{`{"sources":[{"name":"a/b","kind":"dir","path":"/r"}]}`, "option sources[0].name"},
		{`{"sources":[{"name":"a","kind":"ftp","path":"/r"}]}`, "option sources[0].kind"},
		{`{"sources":[{"name":"a","kind":"dir","path":"r"}]}`, "option sources[0].path"},
		{`{"sources":[{"name":"a","kind":"dir","path":"/r","extra":1}]}`, "unknown option"},
		{`{"bashInheritEnv":true,"sources":[{"name":"a","kind":"http","url":"https://x","requests":[{"method":"GET","path":"/"}],"credential":{"header":"Authorization","env":"TOKEN"}}]}`, "option bashInheritEnv"},
		{`{"bashEnvAllow":["PATH","TOK*"],"sources":[{"name":"a","kind":"http","url":"https://x","requests":[{"method":"GET","path":"/"}],"credential":{"header":"Authorization","env":"TOKEN"}}]}`, "option bashEnvAllow"},
	} {
		_, err := tools.ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.json, err, tc.want)
		}
	}
	cfg, err := tools.ParseConfig([]byte(`{"sources":[{"name":"a","kind":"tar","path":"/r.tar"}]}`))
	if err != nil || len(cfg.Sources) != 1 || cfg.Sources[0].Kind != sources.KindTar {
		t.Errorf("%+v %v", cfg.Sources, err)
	}
}

// TestAPISourceThroughTheShell declares an API-backed source whose
// credential is in the daemon's environment, and shows that the agent
// reaches the API only through the shell's curl, with the credential added,
// and never sees the credential: not in the workspace, not in a command's
// environment, not in any tool's output.
func TestAPISourceThroughTheShell(t *testing.T) {
	const secret = "api-secret-3e9b71c0"
	t.Setenv("SANDBOXD_TEST_API_TOKEN", secret)
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+secret {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "user ok; you sent %s\n", r.Header.Get("Authorization"))
	}))
	defer srv.Close()

	set := profileSet(t, memoryBackend(t), func(c *tools.Config) {
		c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
		c.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
		c.Always = []string{"read", "edit", "shell"}
		c.Sources = sources.Decls{{Name: "api", Kind: sources.KindHTTP, HTTPDecl: sources.HTTPDecl{
			URL:        srv.URL + "/v1",
			Requests:   []sources.RequestShape{{Method: "GET", Path: "/me"}},
			Credential: &sources.Credential{Header: "Authorization", Prefix: "Bearer ", Secret: sources.Secret{Env: "SANDBOXD_TEST_API_TOKEN"}},
		}}}
	})
	var outputs []string
	call := func(tool string, args map[string]any) tools.Result {
		t.Helper()
		r := callJSON(t, set, tool, args)
		structured, _ := json.Marshal(r.Structured)
		outputs = append(outputs, r.Text, string(structured))
		return r
	}
	if e := set.WorkspaceShell(); e == nil || !slices.Contains(e.Commands, "curl") {
		t.Fatalf("the catalogue does not list curl: %+v", e)
	}
	descriptor := ".sandboxd/sources/api/requests.json"
	if r := call("materialize_sources", map[string]any{}); r.IsError || !strings.Contains(r.Text, descriptor) {
		t.Fatalf("materialize_sources: %s", r.Text)
	}
	if r := call("shell", map[string]any{"command": "cat " + descriptor}); r.IsError || !strings.Contains(r.Text, srv.URL+"/v1/me") {
		t.Fatalf("descriptor: %s", r.Text)
	}
	if r := call("shell", map[string]any{"command": "curl -s " + srv.URL + "/v1/me"}); r.IsError || !strings.Contains(r.Text, "user ok; you sent Bearer [redacted]") {
		t.Fatalf("curl: %s", r.Text)
	}
	before := hits.Load()
	if r := call("shell", map[string]any{"command": "curl -s " + srv.URL + "/v1/admin"}); !r.IsError || errKind(r) != "Forbidden" || !strings.Contains(r.Text, descriptor) {
		t.Fatalf("undeclared request: %s", r.Text)
	}
	if hits.Load() != before {
		t.Fatal("an undeclared request reached the API")
	}
	// Commands: no network, no credential in their environment.
	if r := call("bash", map[string]any{"command": "env; curl -s " + srv.URL + "/v1/me 2>&1 || true"}); r.IsError {
		t.Fatalf("bash: %s", r.Text)
	}
	call("write", map[string]any{"path": descriptor, "content": "{}"})
	call("grep", map[string]any{"pattern": secret, "path": "/workspace"})
	call("grep", map[string]any{"pattern": "api-secret", "path": ".sandboxd"})
	call("shell", map[string]any{"command": "grep -r api-secret . .sandboxd"})
	for _, out := range outputs {
		if strings.Contains(out, secret) {
			t.Fatalf("the credential reached a tool's output:\n%s", out)
		}
	}
	if r := call("materialize_sources", map[string]any{}); strings.Contains(r.Text, "updated") {
		t.Fatalf("a write tool changed the descriptor: %s", r.Text)
	}
}
