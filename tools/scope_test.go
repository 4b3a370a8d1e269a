package tools_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// scopedSet is a session with both profiles over a workspace holding a
// secret outside its visible rules, with the actor's scope given.
func scopedSet(t *testing.T, actor scope.Rules, configure func(*tools.Config)) (*tools.Set, workspace.FileSystem) {
	t.Helper()
	b := memoryBackend(t)
	ctx := context.Background()
	for name, content := range map[string]string{"secret/key.txt": "KEY=hunter2\n", "docs/readme.md": "# docs KEY\n"} {
		workspace.MkdirAll(ctx, b.fs, "secret", 0o755)
		workspace.MkdirAll(ctx, b.fs, "docs", 0o755)
		if err := b.fs.WriteFile(ctx, name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b.fs.(*memfs.FS).Symlink(ctx, "../secret/key.txt", "src/key-link")
	set := profileSet(t, b, func(c *tools.Config) {
		c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
		c.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
		c.Always = []string{"read", "edit"}
		c.Visible = []string{"src/**", "docs/**", ".sandboxd/sources/**"}
		c.Commit = []string{"src/**"}
		if configure != nil {
			configure(c)
		}
	})
	if !actor.IsZero() {
		var err error
		if set, err = tools.New(tools.Env{FS: b.fs, Bash: b.bash, Session: workspace.Session{ID: "s", Root: b.root}, Scope: actor}, set.Config()); err != nil {
			t.Fatal(err)
		}
	}
	return set, b.fs
}

// TestRulesBindEveryTool shows that the visible and commit rules hold for
// every file tool of both profiles, that the actor's scope narrows them, and
// that a scoped session is offered no command.
func TestRulesBindEveryTool(t *testing.T) {
	set, fsys := scopedSet(t, scope.Rules{}, nil)
	for _, tl := range set.List() {
		if tl.Name == "bash" || tl.Name == "workspace_exec" {
			t.Errorf("a scoped session was offered %s", tl.Name)
		}
	}
	if sec := set.EnvironmentSection(); !strings.Contains(sec, "Only paths matching src/**, docs/**, .sandboxd/sources/** exist") ||
		!strings.Contains(sec, "Changes are allowed only to paths matching src/**") {
		t.Errorf("the environment section does not tell the rules:\n%s", sec)
	}
	// Nothing of secret/ is seen, by any tool, under any name.
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"read", map[string]any{"path": "secret/key.txt"}},
		{"read", map[string]any{"path": "src/key-link"}},
		{"read", map[string]any{"path": "notes.txt"}},
		{"ls", map[string]any{"path": "."}},
		{"ls", map[string]any{"path": "secret"}},
		{"find", map[string]any{"pattern": "**/*"}},
		{"grep", map[string]any{"pattern": "KEY|hunter"}},
		{"grep", map[string]any{"pattern": "hunter", "path": "secret"}},
		{"shell", map[string]any{"command": "cat secret/key.txt src/key-link notes.txt; ls -R; find . ; grep -rn hunter . ; rg hunter"}},
	} {
		r := callJSON(t, set, c.tool, c.args)
		shown := r.Text
		if c.tool == "shell" || c.tool == "read" { // their errors repeat the names asked for
			shown = strings.ReplaceAll(strings.ReplaceAll(shown, "secret/key.txt:", ""), "notes.txt:", "")
		}
		if strings.Contains(shown, "hunter2") || strings.Contains(shown, "key.txt") || strings.Contains(shown, "notes.txt") || strings.Contains(shown, "secret\n") {
			t.Errorf("%s %v showed what is not visible:\n%s", c.tool, c.args, r.Text)
		}
	}
	if r := callJSON(t, set, "read", map[string]any{"path": "secret/key.txt"}); errKind(r) != "NotFound" {
		t.Errorf("read of an invisible file: %s", r.Text)
	}
	if r := callJSON(t, set, "grep", map[string]any{"pattern": "KEY"}); r.IsError || !strings.Contains(r.Text, "docs/readme.md") {
		t.Errorf("grep of the visible: %s", r.Text)
	}

	// Changes only inside the commit scope.
	for _, c := range []struct {
		tool string
		args map[string]any
		kind string
	}{
		{"write", map[string]any{"path": "src/new.go", "content": "package a\n"}, ""},
		{"writeFile", map[string]any{"path": "src/other.go", "content": "package a\n"}, ""},
		{"edit", map[string]any{"path": "src/b.go", "edits": []map[string]string{{"oldText": "package a", "newText": "package b"}}}, ""},
		{"write", map[string]any{"path": "docs/readme.md", "content": "x"}, "Protected"},
		{"edit", map[string]any{"path": "docs/readme.md", "edits": []map[string]string{{"oldText": "docs", "newText": "x"}}}, "Protected"},
		{"writeFile", map[string]any{"path": "docs/new.md", "content": "x"}, "Protected"},
		{"appendFile", map[string]any{"path": "docs/readme.md", "content": "x"}, "Protected"},
		{"deletePath", map[string]any{"path": "docs/readme.md"}, "Protected"},
		{"movePath", map[string]any{"from": "src/a.go", "to": "docs/a.go"}, "Protected"},
		{"copyPath", map[string]any{"from": "docs/readme.md", "to": "src/readme.md"}, ""},
		{"write", map[string]any{"path": "secret/key.txt", "content": "x"}, "NotFound"},
		{"write", map[string]any{"path": "top.txt", "content": "x"}, "NotFound"},
		{"deletePath", map[string]any{"path": "docs", "recursive": true}, "Protected"},
	} {
		if r := callJSON(t, set, c.tool, c.args); errKind(r) != c.kind {
			t.Errorf("%s %v: %s, want %q", c.tool, c.args, r.Text, c.kind)
		}
	}
	if r := callJSON(t, set, "shell", map[string]any{"command": "touch docs/x; rm docs/readme.md; cp src/a.go docs/"}); strings.Count(r.Text, "protected") != 3 {
		t.Errorf("shell mutations outside the commit scope: %s", r.Text)
	}
	ctx := context.Background()
	if data, _ := fsys.ReadFile(ctx, "docs/readme.md", 1<<10); string(data) != "# docs KEY\n" {
		t.Errorf("docs/readme.md = %q", data)
	}
	if data, _ := fsys.ReadFile(ctx, "secret/key.txt", 1<<10); string(data) != "KEY=hunter2\n" {
		t.Errorf("secret/key.txt = %q", data)
	}
	if data, _ := fsys.ReadFile(ctx, "src/new.go", 1<<10); string(data) != "package a\n" {
		t.Errorf("src/new.go = %q", data)
	}

	// The actor's scope narrows the rules: this actor sees src/a.go only.
	narrow, _ := scopedSet(t, scope.Rules{Visible: []string{"src/a.go"}}, nil)
	if r := callJSON(t, narrow, "read", map[string]any{"path": "src/b.go"}); errKind(r) != "NotFound" {
		t.Errorf("the actor's scope did not narrow: %s", r.Text)
	}
	if r := callJSON(t, narrow, "read", map[string]any{"path": "src/a.go"}); r.IsError {
		t.Errorf("read src/a.go: %s", r.Text)
	}
	// And cannot widen them: the operator's rules still hold.
	wide, _ := scopedSet(t, scope.Rules{Visible: []string{"**"}}, nil)
	if r := callJSON(t, wide, "read", map[string]any{"path": "secret/key.txt"}); errKind(r) != "NotFound" {
		t.Errorf("the actor's scope widened the rules: %s", r.Text)
	}
}

// TestRulesAndSources: materialize_sources writes snapshots whatever the
// rules; the agent reads them when the rules show .sandboxd/sources.
func TestRulesAndSources(t *testing.T) {
	dir := t.TempDir()
	set, _ := scopedSet(t, scope.Rules{}, func(c *tools.Config) {
		c.Sources = sources.Decls{{Name: "docs", Kind: sources.KindDir, Path: dir}}
	})
	if r := callJSON(t, set, "materialize_sources", map[string]any{}); r.IsError {
		t.Fatalf("materialize_sources: %s", r.Text)
	}
	if r := callJSON(t, set, "ls", map[string]any{"path": ".sandboxd/sources/docs"}); r.IsError {
		t.Fatalf("ls of the snapshot: %s", r.Text)
	}
}

func TestRulesConfig(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"visible":["src/[a"]}`, "option visible"},
		{`{"commit":["src/[a"]}`, "option commit"},
		{`{"visible":[]}`, "option visible"},
	} {
		if _, err := tools.ParseConfig([]byte(tc.json)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.json, err, tc.want)
		}
	}
	cfg := tools.DefaultConfig()
	cfg.Visible = []string{"src/**"}
	cfg.Grants = []string{tools.GrantShellExec}
	cfg.Always = []string{"shell"}
	b := memoryBackend(t)
	if _, err := tools.New(tools.Env{FS: b.fs, Bash: b.bash}, cfg); err == nil || !strings.Contains(err.Error(), "bash is not offered") {
		t.Errorf("always-on shell with rules: %v", err)
	}
}

// TestExecUnderCommitRules: workspace_exec runs under commit rules alone;
// what its process changed outside them is put back and reported, the
// rest committed. Under visible rules it is refused.
func TestExecUnderCommitRules(t *testing.T) {
	b := shellBackends(t)[0]
	set := profileSet(t, b, func(c *tools.Config) {
		c.Driver = workspaceshell.DriverProvider
		c.WorkspaceShell.Commands = workspaceshell.Commands{Names: []string{"sh"}}
		c.Commit = []string{"src/**"}
	})
	r := callJSON(t, set, "workspace_exec", map[string]any{"command": "sh", "args": []string{"-c", "echo new > src/c.go; echo gone > notes.txt; mkdir out; echo x > out/y"}})
	er, ok := r.Structured.(*tools.ExecResult)
	if r.IsError || !ok || !er.Committed || er.Commit == 0 {
		t.Fatalf("workspace_exec: %s", r.Text)
	}
	if want := []string{"notes.txt", "out", "out/y"}; !slices.Equal(er.OutOfScope, want) || !strings.Contains(r.Text, "put back and not committed: notes.txt, out, out/y") {
		t.Fatalf("out of scope %q: %s", er.OutOfScope, r.Text)
	}
	ctx := context.Background()
	if data, _ := b.fs.ReadFile(ctx, "notes.txt", 1<<10); string(data) != "hello\n" {
		t.Errorf("notes.txt = %q", data)
	}
	if _, err := b.fs.Stat(ctx, "out"); err == nil {
		t.Error("out/ was kept")
	}
	if data, _ := b.fs.ReadFile(ctx, "src/c.go", 1<<10); string(data) != "new\n" {
		t.Errorf("src/c.go = %q", data)
	}

	hidden := profileSet(t, shellBackends(t)[0], func(c *tools.Config) {
		c.Driver = workspaceshell.DriverProvider
		c.WorkspaceShell.Commands = workspaceshell.Commands{Names: []string{"sh"}}
		c.Visible = []string{"src/**"}
	})
	if r := callJSON(t, hidden, "workspace_exec", map[string]any{"command": "sh", "args": []string{"-c", "true"}}); errKind(r) != "Forbidden" || !strings.Contains(r.Text, "visible rules") {
		t.Errorf("workspace_exec under visible rules: %s", r.Text)
	}
}
