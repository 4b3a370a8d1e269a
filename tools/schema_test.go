package tools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	jsv "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// schemaCall is one real call of TestResultsMatchSchemas.
type schemaCall struct {
	set  string // which of the sets
	tool string
	args string
	// argsValid says the arguments validate against the input schema;
	// isError says the call fails. A call whose arguments the schema
	// refuses must fail too.
	argsValid, isError bool
}

// TestResultsMatchSchemas runs every tool of the catalogue for real over a
// memory workspace, with calls that succeed and calls that fail, and checks
// with an independent JSON Schema validator (santhosh-tekuri/jsonschema,
// not the jsonschema-go that derives the schemas) that the arguments match
// the tool's inputSchema exactly when they should, and that every result's
// structured content, errors included, matches its outputSchema.
func TestResultsMatchSchemas(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New(memfs.WithUmask(0))
	for name, content := range map[string]string{
		"src/a.go": "package a\n// TODO one\n", "notes.txt": "hello\n", "img.png": pngOf(t, 3, 2),
		"bin.dat": "\x00\x01\x02binary", "old.txt": "gone soon\n",
	} {
		workspace.MkdirAll(ctx, fsys, "src", 0o755)
		if err := fsys.WriteFile(ctx, name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sh, err := memory.NewMirror(fsys, memory.WithTempDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	env := tools.Env{FS: fsys, Bash: sh, Session: workspace.Session{ID: "s", Root: "/workspace"}}
	build := func(configure func(*tools.Config)) *tools.Set {
		cfg := tools.DefaultConfig()
		cfg.MaxCallsPerRun = 0
		configure(&cfg)
		set, err := tools.New(env, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	sets := map[string]*tools.Set{
		// Both profiles, write mode, every grant and skill: all but workspace_exec.
		"all": build(func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
			c.Always = []string{"read", "edit", "shell"}
			c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write}
		}),
		"provider": build(func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite}
			c.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
			c.Driver = workspaceshell.DriverProvider
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write, Commands: workspaceshell.Commands{Names: []string{"true", "false"}}}
		}),
		"ungranted": build(func(c *tools.Config) {}),
	}
	calls := []schemaCall{
		{"all", "read", `{"path":"notes.txt"}`, true, false},
		{"all", "read", `{"path":"notes.txt","offset":1,"limit":1}`, true, false},
		{"all", "read", `{"path":"img.png"}`, true, false},
		{"all", "read", `{"path":"bin.dat"}`, true, false},
		{"all", "read", `{"path":"missing.txt"}`, true, true},
		{"all", "read", `{"path":"notes.txt","offset":0}`, false, true},
		{"all", "read", `{"path":"notes.txt","colour":"red"}`, false, true},
		{"all", "read", `{}`, false, true},
		{"all", "ls", `{}`, true, false},
		{"all", "ls", `{"path":"src","limit":1}`, true, false},
		{"all", "ls", `{"path":"missing"}`, true, true},
		{"all", "ls", `{"limit":0}`, false, true},
		{"all", "find", `{"pattern":"**/*.go"}`, true, false},
		{"all", "find", `{"pattern":"[a"}`, true, true},
		{"all", "find", `{"path":"src"}`, false, true},
		{"all", "grep", `{"pattern":"TODO","context":1}`, true, false},
		{"all", "grep", `{"pattern":"("}`, true, true},
		{"all", "grep", `{"pattern":"x","context":-1}`, false, true},
		{"all", "grep", `{"pattern":"x","ignoreCase":"yes"}`, false, true},
		{"all", "write", `{"path":"new.txt","content":"new\n"}`, true, false},
		{"all", "write", `{"path":".git/config","content":"x"}`, true, true},
		{"all", "write", `{"path":"new.txt"}`, false, true},
		{"all", "edit", `{"path":"new.txt","edits":[{"oldText":"new","newText":"newer"}]}`, true, false},
		{"all", "edit", `{"path":"new.txt","edits":[{"oldText":"absent","newText":"x"}]}`, true, true},
		{"all", "edit", `{"path":"new.txt","edits":[]}`, false, true},
		{"all", "bash", `{"command":"echo hi","timeout":5}`, true, false},
		{"all", "bash", `{"command":"exit 3","stdin":"x"}`, true, false},
		{"all", "bash", `{"command":"echo hi","timeout":100000}`, true, true},
		{"all", "bash", `{"command":"echo hi","timeout":0}`, false, true},
		{"all", "bash", `{"command":"echo started; sleep 60","background":true}`, true, false},
		{"all", "bash_output", `{"id":"bg1","wait":0}`, true, false},
		{"all", "bash_output", `{"id":"bg9"}`, true, true},
		{"all", "bash_output", `{"id":"bg1","wait":-1}`, false, true},
		{"all", "bash_kill", `{"id":"bg1"}`, true, false},
		{"all", "bash_kill", `{"id":"bg9"}`, true, true},
		{"all", "bash_kill", `{}`, false, true},
		{"all", "shell", `{"command":"ls src | head -1"}`, true, false},
		{"all", "shell", `{"command":"curl https://example.com"}`, true, true},
		{"all", "shell", `{"command":""}`, true, true},
		{"all", "shell", `{}`, false, true},
		{"all", "materialize_sources", `{}`, true, false},
		{"all", "materialize_sources", `{"sources":["nope"]}`, true, true},
		{"all", "materialize_sources", `{"sources":"nope"}`, false, true},
		{"all", "writeFile", `{"path":"w/a.txt","content":"a"}`, true, false},
		{"all", "writeFile", `{"path":".git/a","content":"a"}`, true, true},
		{"all", "writeFile", `{"path":"w/a.txt"}`, false, true},
		{"all", "appendFile", `{"path":"w/a.txt","content":"b"}`, true, false},
		{"all", "appendFile", `{"path":".sandboxd/a","content":"b"}`, true, true},
		{"all", "makeDir", `{"path":"w/d"}`, true, false},
		{"all", "makeDir", `{"path":".git/d"}`, true, true},
		{"all", "copyPath", `{"from":"w/a.txt","to":"w/b.txt"}`, true, false},
		{"all", "copyPath", `{"from":"w/missing","to":"w/c.txt"}`, true, true},
		{"all", "copyPath", `{"from":"w/a.txt"}`, false, true},
		{"all", "movePath", `{"from":"w/b.txt","to":"w/c.txt","overwrite":true}`, true, false},
		{"all", "movePath", `{"from":"w/missing","to":"w/e.txt"}`, true, true},
		{"all", "deletePath", `{"path":"old.txt"}`, true, false},
		{"all", "deletePath", `{"path":"w","recursive":false}`, true, true},
		{"all", "journal_list", `{"limit":2}`, true, false},
		{"all", "journal_list", `{"limit":0}`, false, false}, // below the schema's minimum, taken as the default
		{"all", "journal_list", `{"limit":"all"}`, false, true},
		{"all", "journal_show", `{"id":1}`, true, false},
		{"all", "journal_show", `{"id":999}`, true, true},
		{"all", "journal_revert", `{"to":999}`, true, true},
		{"all", "journal_revert", `{"to":1,"force":true}`, true, false},
		{"all", "journal_revert", `{"force":true}`, false, true},
		{"all", "load_skill", `{"skill":"workspace.edit"}`, true, false},
		{"ungranted", "load_skill", `{"skill":"workspace.shell"}`, true, true},
		{"all", "load_skill", `{"skill":"nope"}`, false, true},
		{"provider", "workspace_exec", `{"command":"true","timeout":10000}`, true, false},
		{"provider", "workspace_exec", `{"command":"false","args":["x"]}`, true, false}, // a failed command is a result: restored
		{"provider", "workspace_exec", `{"command":"rm","args":["-r","src"]}`, true, true},
		{"provider", "workspace_exec", `{"command":"true","timeout":0}`, false, true},
		{"ungranted", "nope", `{}`, true, true},
	}

	schemas := map[string]*jsv.Schema{} // "set/tool/in" and "set/tool/out"
	compile := func(set, tool, which string, schema json.RawMessage) *jsv.Schema {
		doc, err := jsv.UnmarshalJSON(bytes.NewReader(schema))
		if err != nil {
			t.Fatalf("%s %s: %v", tool, which, err)
		}
		c := jsv.NewCompiler()
		url := fmt.Sprintf("mem:///%s/%s/%s.json", set, tool, which)
		if err := c.AddResource(url, doc); err != nil {
			t.Fatal(err)
		}
		s, err := c.Compile(url)
		if err != nil {
			t.Fatalf("%s: the %s schema does not compile: %v\n%s", tool, which, err, schema)
		}
		return s
	}
	for name, set := range sets {
		for _, tool := range set.List() {
			schemas[name+"/"+tool.Name+"/in"] = compile(name, tool.Name, "in", tool.InputSchema)
			schemas[name+"/"+tool.Name+"/out"] = compile(name, tool.Name, "out", tool.OutputSchema)
		}
	}
	// Errors of a tool not served have the error shape every tool's schema allows.
	schemas["ungranted/nope/out"] = schemas["ungranted/read/out"]
	schemas["ungranted/nope/in"] = compile("ungranted", "nope", "in", json.RawMessage(`{"type":"object"}`))

	succeeded, failed := map[string]bool{}, map[string]bool{}
	for _, c := range calls {
		in, out := schemas[c.set+"/"+c.tool+"/in"], schemas[c.set+"/"+c.tool+"/out"]
		if in == nil {
			t.Fatalf("%s has no tool %s", c.set, c.tool)
		}
		args, _ := jsv.UnmarshalJSON(strings.NewReader(c.args))
		if err := in.Validate(args); (err == nil) != c.argsValid {
			t.Errorf("%s %s: input validation: %v, want valid %v", c.tool, c.args, err, c.argsValid)
		}
		res := sets[c.set].Call(ctx, c.tool, json.RawMessage(c.args), tools.CallOptions{})
		if res.IsError != c.isError {
			t.Errorf("%s %s: isError %v, want %v: %s", c.tool, c.args, res.IsError, c.isError, res.Text)
			continue
		}
		data, err := json.Marshal(res.Structured)
		if err != nil {
			t.Fatal(err)
		}
		content, _ := jsv.UnmarshalJSON(bytes.NewReader(data))
		if err := out.Validate(content); err != nil {
			t.Errorf("%s %s: structured content %s does not match the outputSchema: %v", c.tool, c.args, data, err)
		}
		if res.IsError {
			failed[c.tool] = true
		} else {
			succeeded[c.tool] = true
		}
	}
	var all []string
	for _, set := range sets {
		for _, tool := range set.List() {
			all = append(all, tool.Name)
		}
	}
	slices.Sort(all)
	for _, name := range slices.Compact(all) {
		if !succeeded[name] || !failed[name] {
			t.Errorf("tool %s: a success validated %v, a failure %v; want both", name, succeeded[name], failed[name])
		}
	}
}

// TestBoundsHold: every bound an inputSchema states (minimum, exclusive
// minimum, maximum) holds a call to it — a value past it is refused with
// InvalidArgument naming the argument, before the tool runs — but where
// the tool takes such a value as its default (journal_list's limit). The
// schema is the one place a bound is stated: no handler checks it again.
func TestBoundsHold(t *testing.T) {
	fsys := memfs.New()
	sh, err := memory.NewMirror(fsys, memory.WithTempDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	tolerated := map[string]bool{"journal_list.limit": true}
	for _, cfg := range []func(*tools.Config){
		func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
			c.Always = []string{"read", "edit", "shell"}
			c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write}
		},
		func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite}
			c.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
			c.Driver = workspaceshell.DriverProvider
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write, Commands: workspaceshell.Commands{Names: []string{"true"}}}
		},
	} {
		c := tools.DefaultConfig()
		c.MaxCallsPerRun = 0
		cfg(&c)
		set, err := tools.New(tools.Env{FS: fsys, Bash: sh, Session: workspace.Session{ID: "s", Root: "/workspace"}}, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range set.List() {
			var schema struct {
				Properties map[string]struct {
					Minimum, ExclusiveMinimum, Maximum *float64
				}
			}
			if err := json.Unmarshal(tool.InputSchema, &schema); err != nil {
				t.Fatal(err)
			}
			for name, p := range schema.Properties {
				var past []float64
				if p.Minimum != nil {
					past = append(past, *p.Minimum-1)
				}
				if p.ExclusiveMinimum != nil {
					past = append(past, *p.ExclusiveMinimum)
				}
				if p.Maximum != nil {
					past = append(past, *p.Maximum+1)
				}
				for _, v := range past {
					args, _ := json.Marshal(map[string]float64{name: v})
					res := set.Call(context.Background(), tool.Name, args, tools.CallOptions{})
					refused := res.IsError && strings.Contains(res.Text, "InvalidArgument: "+name+" must")
					if refused == tolerated[tool.Name+"."+name] {
						t.Errorf("%s %s: %s; want it refused naming %s unless the tool takes it as its default", tool.Name, args, res.Text, name)
					}
				}
			}
		}
	}
}
