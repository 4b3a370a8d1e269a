package tools_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/memexec"
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

	mfs := memfs.New(memfs.WithUmask(0))
	msh, err := memexec.New(mfs, memexec.WithTempDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	set := profileSet(t, shellBackend{"memory", mfs, msh, "/workspace"}, func(c *tools.Config) {
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

func TestSourcesConfig(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"sources":[{"name":"a","kind":"git","path":"/r","commit":"main"}]}`, "option sources[0].commit"},
		{`{"sources":[{"name":"a/b","kind":"dir","path":"/r"}]}`, "option sources[0].name"},
		{`{"sources":[{"name":"a","kind":"ftp","path":"/r"}]}`, "option sources[0].kind"},
		{`{"sources":[{"name":"a","kind":"dir","path":"r"}]}`, "option sources[0].path"},
		{`{"sources":[{"name":"a","kind":"dir","path":"/r","extra":1}]}`, "unknown option"},
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
