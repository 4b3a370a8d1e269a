package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// shellBackend is a workspace with a Bash over the memory or local adapters.
type shellBackend struct {
	name string
	fs   workspace.FileSystem
	bash workspace.Bash
	root string
}

func shellBackends(t *testing.T) []shellBackend {
	t.Helper()
	dir := t.TempDir()
	lfs, err := localfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lfs.Close() })
	lsh, err := localexec.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	mfs := memfs.New(memfs.WithUmask(0))
	msh, err := memory.NewMirror(mfs, memory.WithTempDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return []shellBackend{{"local", lfs, lsh, lfs.Dir()}, {"memory", mfs, msh, "/workspace"}}
}

// profileSet builds a set of the workspace-shell profile over b, seeded
// with a small tree.
func profileSet(t *testing.T, b shellBackend, configure func(*tools.Config)) *tools.Set {
	t.Helper()
	ctx := context.Background()
	for name, content := range map[string]string{"src/a.go": "package a\n// TODO one\n", "src/b.go": "package a\n", "notes.txt": "hello\n"} {
		workspace.MkdirAll(ctx, b.fs, filepath.Dir(name), 0o755)
		if err := b.fs.WriteFile(ctx, name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite}
	cfg.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
	cfg.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write}
	if configure != nil {
		configure(&cfg)
	}
	set, err := tools.New(tools.Env{FS: b.fs, Bash: b.bash, Session: workspace.Session{ID: "s", Root: b.root}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func callJSON(t *testing.T, set *tools.Set, tool string, args any) tools.Result {
	t.Helper()
	raw, _ := json.Marshal(args)
	return set.Call(context.Background(), tool, raw, tools.CallOptions{})
}

// treeDump is the whole workspace outside .sandboxd/: path, mode, contents.
func treeDump(t *testing.T, fsys workspace.FileSystem) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	var walk func(dir string)
	walk = func(dir string) {
		entries, err := fsys.ReadDir(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			p := filepath.ToSlash(filepath.Join(dir, e.Name()))
			if p == ".sandboxd" {
				continue
			}
			info, _ := fsys.Lstat(ctx, p)
			fmt.Fprintf(&b, "%s %v", p, info.Mode())
			switch {
			case info.IsDir():
				b.WriteString("\n")
				walk(p)
			case info.Mode()&fs.ModeSymlink != 0:
				target, _ := fsys.(workspace.SymlinkFS).Readlink(ctx, p)
				fmt.Fprintf(&b, " -> %s\n", target)
			default:
				data, _ := fsys.ReadFile(ctx, p, 1<<20)
				fmt.Fprintf(&b, " %q\n", data)
			}
		}
	}
	walk(".")
	return b.String()
}

func TestShellReadModeRefuses(t *testing.T) {
	for _, b := range shellBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			set := profileSet(t, b, func(c *tools.Config) { c.WorkspaceShell.Mode = ""; c.Grants = nil })
			before := treeDump(t, b.fs)
			for line, says := range map[string]string{
				"rm x":                       "rm (at 1:1): rm changes files",
				"curl https://example.com/x": "curl (at 1:1): curl is not allowed: it reaches the network",
				"sh -c 'ls'":                 "sh (at 1:1): sh is not allowed: it runs another shell",
				"ls $(rm x)":                 "rm (at 1:6)",
				"echo x > f":                 "redirect",
				"find . -delete":             "-delete",
				"find . -exec rm {} ;":       "-exec",
			} {
				r := callJSON(t, set, "shell", map[string]any{"command": line})
				if errKind(r) != "Forbidden" || !strings.Contains(r.Text, says) {
					t.Errorf("%s: %s", line, r.Text)
				}
			}
			if got := treeDump(t, b.fs); got != before {
				t.Fatalf("read mode changed the workspace:\n%s", got)
			}
			r := callJSON(t, set, "shell", map[string]any{"command": "rg -n TODO src | wc -l; cat notes.txt"})
			sr, _ := r.Structured.(*tools.ShellResult)
			if r.IsError || sr.ExitCode != 0 || sr.Stdout != "1\nhello\n" {
				t.Fatalf("%s", r.Text)
			}
			if names := toolNames(set); !slices.Equal(names, []string{"shell", "materialize_sources"}) {
				t.Errorf("read mode without fs.write: tools %v", names)
			}
		})
	}
}

func toolNames(set *tools.Set) []string {
	var out []string
	for _, tl := range set.Active() {
		out = append(out, tl.Name)
	}
	return out
}

func TestWriteModeToolsAreJournaled(t *testing.T) {
	for _, b := range shellBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			set := profileSet(t, b, nil)
			start := treeDump(t, b.fs)
			if got := toolNames(set); !slices.Equal(got, []string{"shell", "materialize_sources", "writeFile", "appendFile", "makeDir", "copyPath", "movePath", "deletePath", "journal_list", "journal_show", "journal_revert"}) {
				t.Fatalf("tools %v", got)
			}
			r := callJSON(t, set, "materialize_sources", map[string]any{})
			if r.IsError || !strings.Contains(r.Text, "no sources") {
				t.Errorf("materialize_sources: %s", r.Text)
			}
			steps := []struct {
				tool string
				args map[string]any
				want any
			}{
				{"writeFile", map[string]any{"path": "docs/a.md", "content": "# A\n"}, &workspaceshell.WriteFileResult{Path: "docs/a.md", Bytes: 4, Created: true}},
				{"appendFile", map[string]any{"path": "docs/a.md", "content": "more\n"}, &workspaceshell.AppendFileResult{Path: "docs/a.md", Bytes: 5, Size: 9}},
				{"makeDir", map[string]any{"path": "build/out"}, &workspaceshell.MakeDirResult{Path: "build/out", Created: true}},
				{"copyPath", map[string]any{"from": "src", "to": "lib"}, &workspaceshell.CopyPathResult{From: "src", To: "lib", Entries: 3}},
				{"movePath", map[string]any{"from": "notes.txt", "to": "docs/notes.txt"}, &workspaceshell.MovePathResult{From: "notes.txt", To: "docs/notes.txt"}},
				{"deletePath", map[string]any{"path": "src", "recursive": true}, &workspaceshell.DeletePathResult{Path: "src", Removed: 3}},
				{"shell", map[string]any{"command": "mkdir -p gen && cat notes.txt > gen/x && rm -r build"}, nil},
			}
			for i, st := range steps {
				r := callJSON(t, set, st.tool, st.args)
				if r.IsError {
					t.Fatalf("%s: %s", st.tool, r.Text)
				}
				if st.want != nil && fmt.Sprint(r.Structured) != fmt.Sprint(st.want) {
					t.Errorf("%s: %+v, want %+v", st.tool, r.Structured, st.want)
				}
				if r.Commit == nil || r.Commit.ID != i+1 || !strings.HasPrefix(r.Commit.Message, st.tool+" ") {
					t.Errorf("%s: commit %+v", st.tool, r.Commit)
				}
			}
			// A failing call is no commit and changes nothing.
			if r := callJSON(t, set, "writeFile", map[string]any{"path": ".git/config", "content": "x"}); errKind(r) != "Protected" {
				t.Errorf("protected: %s", r.Text)
			}
			if r := callJSON(t, set, "writeFile", map[string]any{"content": "x"}); errKind(r) != "InvalidArgument" {
				t.Errorf("no path: %s", r.Text)
			}
			list := callJSON(t, set, "journal_list", map[string]any{}).Structured.(*tools.JournalListResult)
			if len(list.Commits) != len(steps) || list.Commits[0].Message != "shell mkdir -p gen && cat notes.txt > gen/x && rm -r build" {
				t.Fatalf("journal %+v", list.Commits)
			}
			show := callJSON(t, set, "journal_show", map[string]any{"id": 2})
			if show.IsError || !strings.Contains(show.Text, "+++ b/docs/a.md\n@@ -1 +1,2 @@\n # A\n+more\n") {
				t.Errorf("journal_show: %s", show.Text)
			}
			if r := callJSON(t, set, "journal_revert", map[string]any{"to": 0}); r.IsError {
				t.Fatal(r.Text)
			}
			if got := treeDump(t, b.fs); got != start {
				t.Fatalf("revert to the start:\n got %s\nwant %s", got, start)
			}
		})
	}
}

func TestWorkspaceExecCommitsOrRestores(t *testing.T) {
	for _, b := range shellBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			set := profileSet(t, b, func(c *tools.Config) {
				c.Driver = workspaceshell.DriverProvider
				c.WorkspaceShell.Commands = workspaceshell.Commands{Names: []string{"sh"}}
			})
			if got := toolNames(set); !slices.Equal(got, []string{"workspace_exec", "journal_list", "journal_show", "journal_revert"}) {
				t.Fatalf("provider tools %v", got)
			}
			chmodded := func(script string) {
				t.Helper()
				r := callJSON(t, set, "workspace_exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
				if r.IsError || r.Structured.(*tools.ExecResult).ExitCode != 0 {
					t.Fatalf("%s: %s", script, r.Text)
				}
			}
			chmodded("chmod 0750 src && chmod 0755 src/b.go && ln -s src/a.go link")
			before := treeDump(t, b.fs)
			r := callJSON(t, set, "workspace_exec", map[string]any{"command": "sh", "args": []string{"-c",
				"echo changed > src/a.go; chmod 0600 src/b.go; rm notes.txt link; mkdir -p new/d; echo n > new/d/f; chmod 0700 src; echo failing >&2; exit 3"}})
			er, _ := r.Structured.(*tools.ExecResult)
			if r.IsError || er.ExitCode != 3 || er.Committed || !er.Restored || er.Commit != 0 || len(er.Unrestored) > 0 || er.Output != "failing\n" {
				t.Fatalf("failing exec: %s %+v", r.Text, er)
			}
			if got := treeDump(t, b.fs); got != before {
				t.Fatalf("a failing workspace_exec changed the workspace:\n got %s\nwant %s", got, before)
			}
			r = callJSON(t, set, "workspace_exec", map[string]any{"command": "sh", "args": []string{"-c", "echo v2 > src/a.go && rm notes.txt"}, "cwd": "."})
			er, _ = r.Structured.(*tools.ExecResult)
			if r.IsError || !er.Committed || er.Commit == 0 {
				t.Fatalf("succeeding exec: %s", r.Text)
			}
			c := callJSON(t, set, "journal_list", nil).Structured.(*tools.JournalListResult).Commits[0]
			if c.Message != tools.ExecMessage || c.ID != er.Commit || !slices.Equal(c.Paths, []string{"notes.txt", "src/a.go"}) {
				t.Fatalf("commit %+v", c)
			}
			if r := callJSON(t, set, "journal_revert", map[string]any{"to": er.Commit - 1}); r.IsError {
				t.Fatal(r.Text)
			}
			if got := treeDump(t, b.fs); got != before {
				t.Fatalf("reverted:\n got %s\nwant %s", got, before)
			}
			// Validation happens before any run or snapshot.
			for args, kind := range map[string]string{
				`{"command":"git"}`:                                        "Forbidden",
				`{"command":"sh","cwd":"../x"}`:                            "OutsideWorkspace",
				`{"command":"sh","env":{"LD_PRELOAD":"x"}}`:                "Forbidden",
				`{"command":"sh","env":{"GIT_CONFIG_COUNT":"1"}}`:          "Forbidden",
				`{"command":"sh","timeout":0}`:                             "InvalidArgument",
				`{"command":"sh","timeout":2147483648}`:                    "InvalidArgument",
				`{"command":"sh","shell":true}`:                            "InvalidArgument",
				`{"command":"sh","args":["-c","exit 0"],"env":{"OK":"1"}}`: "",
			} {
				r := set.Call(context.Background(), "workspace_exec", json.RawMessage(args), tools.CallOptions{})
				if got := errKind(r); got != kind {
					t.Errorf("%s: %q, want %q: %s", args, got, kind, r.Text)
				}
			}
		})
	}
}

func TestWorkspaceExecWithoutProcesses(t *testing.T) {
	b := shellBackends(t)[1]
	b.bash = nil
	set := profileSet(t, b, func(c *tools.Config) {
		c.Driver = workspaceshell.DriverProvider
		c.WorkspaceShell.Commands = workspaceshell.Commands{All: true}
	})
	r := callJSON(t, set, "workspace_exec", map[string]any{"command": "/bin/true"})
	if errKind(r) != "Forbidden" || !strings.Contains(r.Text, "permits no processes") {
		t.Fatal(r.Text)
	}
}

func TestProviderSessionHoldsExecChanges(t *testing.T) {
	b := shellBackends(t)[0]
	set := profileSet(t, b, func(c *tools.Config) {
		c.Driver = workspaceshell.DriverProvider
		c.WorkspaceShell.Commands = workspaceshell.Commands{Names: []string{"sh"}}
	})
	ctx := context.Background()
	j, err := set.Journal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := j.Begin(ctx, "provider run")
	if err != nil {
		t.Fatal(err)
	}
	r := callJSON(t, set, "workspace_exec", map[string]any{"command": "sh", "args": []string{"-c", "echo x > made; exit 1"}})
	if er := r.Structured.(*tools.ExecResult); !er.InSession || er.Restored || er.Committed {
		t.Fatalf("%+v", er)
	}
	out, err := sess.End(ctx, true)
	if err != nil || out.Commit == nil || out.Commit.Changes[0].Path != "made" {
		t.Fatalf("%+v %v", out, err)
	}
}

func TestProfileConfig(t *testing.T) {
	for _, tc := range []struct {
		name, json, want string
	}{
		{"default", `{}`, ""},
		{"both profiles", `{"profile":"workspace-tools,workspace-shell"}`, ""},
		{"options select the profile", `{"workspaceShell":{"mode":"read"}}`, ""},
		{"unknown profile", `{"profile":["shell"]}`, `option profile: unknown profile "shell"`},
		{"options without the profile", `{"profile":"workspace-tools","workspaceShell":{}}`, "does not include workspace-shell"},
		{"write mode needs fs.write", `{"workspaceShell":{"mode":"write"}}`, "option workspaceShell.mode: write mode needs write access"},
		{"bad mode", `{"workspaceShell":{"mode":"rw"}}`, `"rw" is not a mode`},
		{"commands need fs.write and write mode", `{"driver":"provider","workspaceShell":{"commands":["git"]}}`, `commands needs write access to the workspace (the session's fs.write grant); workspaceShell.commands: commands needs mode "write"`},
		{"commands on a model driver point to bash", `{"grants":["fs.write"],"workspaceShell":{"mode":"write","commands":["git"]}}`, "provider drivers only; a model-driven session runs programs with the bash tool instead (grant shell.exec)"},
		{"commands on a custom driver point to bash", `{"grants":["fs.write"],"driver":"custom","workspaceShell":{"mode":"write","commands":"all"}}`, "custom-driven session runs programs with the bash tool"},
		{"whitespace", `{"grants":["fs.write"],"driver":"provider","workspaceShell":{"mode":"write","commands":["git status"]}}`, "commands[0]: \"git status\" is not an executable name or absolute path: it contains whitespace"},
		{"control character", `{"grants":["fs.write"],"driver":"provider","workspaceShell":{"mode":"write","commands":["gi\u0007t"]}}`, "control character"},
		{"relative path", `{"grants":["fs.write"],"driver":"provider","workspaceShell":{"mode":"write","commands":["bin/x"]}}`, "a path must be absolute"},
		{"dot dot", `{"grants":["fs.write"],"driver":"provider","workspaceShell":{"mode":"write","commands":["/usr/../bin/x"]}}`, "must be clean"},
		{"commands not a list", `{"workspaceShell":{"commands":"git"}}`, "neither a list of executables nor \"all\""},
		{"timeout zero", `{"workspaceShell":{"timeout":0}}`, "option workspaceShell.timeout: 0 ms is out of range"},
		{"timeout too big", `{"workspaceShell":{"timeout":2147483648}}`, "no greater than 2147483647"},
		{"timeout max", `{"workspaceShell":{"timeout":2147483647}}`, ""},
		{"bad driver", `{"driver":"robot","workspaceShell":{}}`, `option driver: "robot" is not a driver`},
		{"provider with commands", `{"grants":["fs.write"],"driver":"provider","workspaceShell":{"mode":"write","commands":["git","/usr/bin/go"],"timeout":30000}}`, ""},
	} {
		_, err := tools.ParseConfig([]byte(tc.json))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		var oe *tools.OptionError
		if err != nil && !strings.Contains(tc.want, "neither") && !errors.As(err, &oe) {
			t.Errorf("%s: %T is not an *OptionError", tc.name, err)
		}
	}
}

func TestCatalogueJSON(t *testing.T) {
	b := shellBackends(t)[1]
	for _, tc := range []struct {
		name      string
		configure func(*tools.Config)
		entry     string
	}{
		{"read", func(c *tools.Config) { c.WorkspaceShell.Mode = "" },
			`{"name":"workspaceShell","mode":"read","tools":["shell","materialize_sources"],"commands":["pwd","ls","find","rg","grep","cat","head","tail","wc"],"kind":"capability","active":true}`},
		{"write", nil,
			`{"name":"workspaceShell","mode":"write","tools":["shell","materialize_sources","writeFile","appendFile","makeDir","copyPath","movePath","deletePath"],"commands":["pwd","ls","find","rg","grep","cat","head","tail","wc","mkdir","touch","cp","mv","rm"],"kind":"capability","active":true}`},
		{"provider", func(c *tools.Config) {
			c.Driver = "provider"
			c.WorkspaceShell.Commands = workspaceshell.Commands{Names: []string{"git", "/usr/bin/go"}}
		}, `{"name":"workspaceShell","mode":"write","tools":["workspace_exec"],"exec":["workspace_exec (git)","workspace_exec (/usr/bin/go)"],"kind":"capability","active":true}`},
		{"provider without commands", func(c *tools.Config) { c.Driver = "provider" }, ""},
	} {
		set := profileSet(t, b, tc.configure)
		data, err := json.Marshal(set.Catalogue())
		if err != nil {
			t.Fatal(err)
		}
		var cat struct {
			Tools []json.RawMessage `json:"tools"`
		}
		json.Unmarshal(data, &cat)
		var entry string
		for _, raw := range cat.Tools {
			if strings.Contains(string(raw), `"kind":"capability"`) {
				entry = string(raw)
			}
		}
		if entry != tc.entry {
			t.Errorf("%s: entry %s\nwant %s", tc.name, entry, tc.entry)
		}
	}
}
