package tools_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// ceilingCase is one option of tools.Config under Within: from the
// operator's configuration (DefaultConfig, changed by op), a session's
// options that widen it must be refused naming it, and options that narrow
// it accepted. A free option's widen is a change the session may make.
type ceilingCase struct {
	option        string
	op            func(*tools.Config)
	widen, narrow []string // JSON objects of options
	free          bool
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ceilingCases has a case for every option of tools.Config.
func ceilingCases(t *testing.T) []ceilingCase {
	opt := func(k string, v any) string { return jsonOf(t, map[string]any{k: v}) }
	shellOp := func(c *tools.Config) {
		c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
		c.Grants = []string{tools.GrantFSWrite}
	}
	return []ceilingCase{
		{option: "tools", op: func(c *tools.Config) { c.Tools = []string{"read", "ls"} },
			widen: []string{opt("tools", []string{"read", "bash"})}, narrow: []string{opt("tools", []string{"read"})}},
		{option: "always", free: true, widen: []string{opt("always", []string{"read", "edit"})}},
		{option: "confine", widen: []string{opt("confine", false)}, narrow: []string{opt("confine", true)}},
		{option: "protect",
			widen:  []string{opt("protect", []string{}), opt("protect", []string{".git/**"})},
			narrow: []string{opt("protect", append(slices.Clone(workspace.DefaultProtect), "secrets/**"))}},
		{option: "exclude",
			widen:  []string{opt("exclude", []string{})},
			narrow: []string{opt("exclude", append(slices.Clone(workspace.DefaultExclude), "vendor"))}},
		{option: "maxLines", widen: []string{opt("maxLines", tools.DefaultMaxLines+1)}, narrow: []string{opt("maxLines", 10)}},
		{option: "maxBytes", widen: []string{opt("maxBytes", 362<<20)}, narrow: []string{opt("maxBytes", 1024)}},
		{option: "lsEntries", widen: []string{opt("lsEntries", 501)}, narrow: []string{opt("lsEntries", 5)}},
		{option: "findResults", widen: []string{opt("findResults", 1001)}, narrow: []string{opt("findResults", 5)}},
		{option: "grepMatches", widen: []string{opt("grepMatches", 101)}, narrow: []string{opt("grepMatches", 5)}},
		{option: "grepLineChars", widen: []string{opt("grepLineChars", 501)}, narrow: []string{opt("grepLineChars", 80)}},
		{option: "maxFileBytes", widen: []string{opt("maxFileBytes", 900<<20)}, narrow: []string{opt("maxFileBytes", 1<<20)}},
		{option: "readImages", op: func(c *tools.Config) { c.ReadImages = false },
			widen: []string{opt("readImages", true)}, narrow: []string{opt("readImages", false)}},
		{option: "fuzzyEdit", op: func(c *tools.Config) { c.FuzzyEdit = false },
			widen: []string{opt("fuzzyEdit", true)}, narrow: []string{opt("fuzzyEdit", false)}},
		{option: "bashTimeoutMs", widen: []string{opt("bashTimeoutMs", 600_001)}, narrow: []string{opt("bashTimeoutMs", 1000), opt("bashTimeoutMs", 600_000)}},
		{option: "bashMaxTimeoutMs", widen: []string{opt("bashMaxTimeoutMs", 600_001)}, narrow: []string{opt("bashMaxTimeoutMs", 1000)}},
		{option: "bashEnv", op: func(c *tools.Config) { c.BashEnv = map[string]string{"HTTPS_PROXY": "http://proxy:3128"} },
			widen:  []string{opt("bashEnv", map[string]string{"HTTPS_PROXY": ""}), opt("bashEnv", map[string]string{"LD_PRELOAD": "/workspace/x.so"})},
			narrow: []string{opt("bashEnv", map[string]string{"GOFLAGS": "-mod=mod"})}},
		{option: "bashInheritEnv", widen: []string{opt("bashInheritEnv", true)}, narrow: []string{opt("bashInheritEnv", false)}},
		{option: "bashEnvAllow", widen: []string{opt("bashEnvAllow", []string{"*"}), opt("bashEnvAllow", []string{"PATH", "AWS_*"})},
			narrow: []string{opt("bashEnvAllow", []string{"PATH"})}},
		{option: "bashSessionEnv", free: true, widen: []string{opt("bashSessionEnv", true)}},
		{option: "bashKeepState", free: true, widen: []string{opt("bashKeepState", true)}},
		{option: "bashBackground", widen: []string{opt("bashBackground", 5)}, narrow: []string{opt("bashBackground", 0)}},
		{option: "bashBackgroundBytes", widen: []string{opt("bashBackgroundBytes", 2<<20)}, narrow: []string{opt("bashBackgroundBytes", 1024)}},
		{option: "spillDir", widen: []string{opt("spillDir", ".git/hooks")}, narrow: []string{opt("spillDir", tools.DefaultSpillDir)}},
		{option: "spillKeep", widen: []string{opt("spillKeep", 51)}, narrow: []string{opt("spillKeep", 1)}},
		{option: "progressMs", widen: []string{opt("progressMs", 3_600_000)}, narrow: []string{opt("progressMs", 50)}},
		{option: "environmentSection", free: true, widen: []string{opt("environmentSection", false)}},
		{option: "sectionOrder", free: true, widen: []string{opt("sectionOrder", 1)}},
		{option: "grants", op: func(c *tools.Config) { c.Grants = []string{tools.GrantFSWrite} },
			widen: []string{opt("grants", tools.AllGrants)}, narrow: []string{opt("grants", []string{})}},
		{option: "maxCallsPerRun", widen: []string{opt("maxCallsPerRun", 0), opt("maxCallsPerRun", 65)}, narrow: []string{opt("maxCallsPerRun", 1)}},
		{option: "profile",
			widen:  []string{opt("profile", tools.ProfileWorkspaceShell), opt("profile", "workspace-tools,workspace-shell")},
			narrow: []string{opt("profile", tools.ProfileWorkspaceTools)}},
		{option: "workspaceShell", op: shellOp,
			widen: []string{
				// The attack: workspace_exec of any program with fs.write only.
				`{"driver":"provider","workspaceShell":{"mode":"write","commands":"all"}}`,
				`{"driver":"provider","workspaceShell":{"mode":"write","commands":["sh"]}}`,
				`{"workspaceShell":{"timeout":60001}}`,
			},
			narrow: []string{`{"workspaceShell":{"mode":"write"}}`, `{"workspaceShell":{"timeout":1000}}`}},
		{option: "driver", free: true, op: shellOp, widen: []string{opt("driver", "provider")}},
		{option: "sources", op: func(c *tools.Config) {
			c.Sources = sources.Decls{{Name: "docs", Kind: sources.KindDir, Path: "/srv/docs"}}
		},
			widen:  []string{`{"sources":[{"name":"etc","kind":"dir","path":"/etc"}]}`, `{"sources":[{"name":"docs","kind":"dir","path":"/etc"}]}`},
			narrow: []string{`{"sources":[]}`, `{"sources":[{"name":"docs","kind":"dir","path":"/srv/docs"}]}`}},
		{option: "visible", op: func(c *tools.Config) { c.Visible = []string{"src/**"} },
			widen: []string{`{"visible":null}`, `{"visible":["**"]}`}, narrow: []string{`{"visible":["src/**"]}`}},
		{option: "commit", op: func(c *tools.Config) { c.Commit = []string{"src/**"} },
			widen: []string{`{"commit":null}`}, narrow: []string{`{"commit":["src/**"]}`}},
	}
}

// TestWithin walks every option of tools.Config (by reflection, so that an
// option added without a case fails here) and checks that no session's
// options widen the operator's, and that narrowing ones pass.
func TestWithin(t *testing.T) {
	cases := map[string]ceilingCase{}
	for _, c := range ceilingCases(t) {
		cases[c.option] = c
	}
	for f := range reflect.TypeFor[tools.Config]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		c, ok := cases[name]
		if !ok {
			t.Errorf("option %s (Config.%s) has no ceiling case: add one here and its rule to tools.ceilings", name, f.Name)
			continue
		}
		delete(cases, name)
		op := tools.DefaultConfig()
		if c.op != nil {
			c.op(&op)
		}
		judge := func(options string) error {
			t.Helper()
			s, err := op.With([]byte(options))
			if err != nil {
				t.Fatalf("%s: With(%s): %v", name, options, err)
			}
			return s.Within(op)
		}
		for _, w := range c.widen {
			err := judge(w)
			var de *policy.DeniedError
			switch {
			case c.free && err != nil:
				t.Errorf("%s is free, but %s was refused: %v", name, w, err)
			case c.free:
			case !errors.As(err, &de) || de.Setting != "options."+name || de.Limit == "":
				t.Errorf("%s widened by %s: %v, want a refusal naming options.%s and the operator's value", name, w, err, name)
			case !strings.Contains(de.Error(), "operator's"):
				t.Errorf("%s: the refusal does not name the operator's value: %v", name, err)
			}
		}
		for _, n := range c.narrow {
			if err := judge(n); err != nil {
				t.Errorf("%s narrowed by %s: %v", name, n, err)
			}
		}
		if err := judge(`{}`); err != nil {
			t.Errorf("%s: the operator's own options refused: %v", name, err)
		}
	}
	for name := range cases {
		t.Errorf("a ceiling case for %s, which Config does not have", name)
	}
}

// TestWithinExec: workspace_exec runs programs, so commands beyond the
// operator's take shell.exec; an operator who configures commands grants
// them, and a session may keep to them or to fewer.
func TestWithinExec(t *testing.T) {
	op := tools.DefaultConfig()
	op.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
	op.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec} // a session may ask for both
	op.Driver = workspaceshell.DriverProvider
	op.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write, Commands: workspaceshell.Commands{Names: []string{"git", "go"}}}
	for _, tc := range []struct {
		options string
		grants  []string
		ok      bool
	}{
		{`{}`, []string{tools.GrantFSWrite}, true},
		{`{"workspaceShell":{"commands":["git"]}}`, []string{tools.GrantFSWrite}, true},
		{`{"workspaceShell":{"commands":["git","sh"]}}`, []string{tools.GrantFSWrite}, false},
		{`{"workspaceShell":{"commands":"all"}}`, []string{tools.GrantFSWrite}, false},
		{`{"workspaceShell":{"commands":"all"}}`, []string{tools.GrantFSWrite, tools.GrantShellExec}, true},
	} {
		s, err := op.With([]byte(tc.options))
		if err != nil {
			t.Fatal(err)
		}
		s.Grants = tc.grants
		err = s.Within(op)
		var de *policy.DeniedError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s with %v: %v", tc.options, tc.grants, err)
		case !tc.ok && (!errors.As(err, &de) || de.Setting != "options.workspaceShell" || !strings.Contains(err.Error(), "shell.exec")):
			t.Errorf("%s with %v: %v, want a refusal naming shell.exec", tc.options, tc.grants, err)
		}
	}
}

// TestWith: options go over the configuration without changing it, and a
// maximum timeout set alone lowers the default to it rather than failing.
func TestWith(t *testing.T) {
	base := tools.DefaultConfig()
	base.BashEnv = map[string]string{"A": "1"}
	c, err := base.With([]byte(`{"protect":["x/**"],"bashEnv":{"B":"2"},"bashMaxTimeoutMs":30000}`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Protect, []string{"x/**"}) || c.BashEnv["A"] != "1" || c.BashEnv["B"] != "2" {
		t.Errorf("With: protect %v, bashEnv %v", c.Protect, c.BashEnv)
	}
	if !slices.Equal(base.Protect, workspace.DefaultProtect) || len(base.BashEnv) != 1 {
		t.Errorf("With changed its receiver: protect %v, bashEnv %v", base.Protect, base.BashEnv)
	}
	for _, tc := range []struct {
		json    string
		timeout int64
		err     string
	}{
		{`{"bashMaxTimeoutMs": 30000}`, 30000, ""},
		{`{"bashMaxTimeoutMs": 300000}`, tools.DefaultBashTimeoutMs, ""},
		{`{"bashMaxTimeoutMs": 30000, "bashTimeoutMs": 20000}`, 20000, ""},
		{`{"bashMaxTimeoutMs": 30000, "bashTimeoutMs": 40000}`, 0, "40000 is above bashMaxTimeoutMs (30000): lower it, or leave it out"},
	} {
		c, err := tools.ParseConfig([]byte(tc.json))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want %q", tc.json, err, tc.err)
		case tc.err == "" && (err != nil || c.BashTimeoutMs != tc.timeout):
			t.Errorf("%s: bashTimeoutMs %d, %v; want %d", tc.json, c.BashTimeoutMs, err, tc.timeout)
		}
	}
}

// TestCheck: Config.Check judges a configuration against what a host gives
// without building anything, and New fails with the same message.
func TestCheck(t *testing.T) {
	withBash := tools.Caps{Bash: true}
	for _, tc := range []struct {
		name      string
		configure func(*tools.Config)
		caps      tools.Caps
		want      string // "" for none; *OptionError's option after "option "
	}{
		{"defaults", func(*tools.Config) {}, tools.Caps{}, ""},
		{"edit without its grant", func(c *tools.Config) { c.Always = []string{"read", "edit"} }, withBash,
			"always-on skill workspace.edit needs the grant fs.write, which is not given"},
		{"shell without its grant", func(c *tools.Config) { c.Grants = []string{tools.GrantFSWrite}; c.Always = []string{"shell"} }, withBash,
			"always-on skill workspace.shell needs the grant shell.exec, which is not given"},
		{"shell without a Bash", func(c *tools.Config) { c.Grants = []string{tools.GrantShellExec}; c.Always = []string{"shell"} }, tools.Caps{},
			"always-on skill workspace.shell needs a Bash (Env.Bash is nil)"},
		{"shell with a Bash", func(c *tools.Config) { c.Grants = []string{tools.GrantShellExec}; c.Always = []string{"shell"} }, withBash, ""},
		{"shell under the actor's rules", func(c *tools.Config) { c.Grants = []string{tools.GrantShellExec}; c.Always = []string{"shell"} },
			tools.Caps{Bash: true, Scope: scope.Rules{Commit: []string{"src/**"}}},
			"always-on skill workspace.shell: this session has visible/commit rules, which bind the file tools but not a command, so bash is not offered"},
		{"shell under the operator's rules", func(c *tools.Config) {
			c.Grants = []string{tools.GrantShellExec}
			c.Always = []string{"shell"}
			c.Visible = []string{"src/**"}
		}, withBash, "always-on skill workspace.shell: this session has visible/commit rules, which bind the file tools but not a command, so bash is not offered"},
		{"a bad actor's scope", func(*tools.Config) {}, tools.Caps{Scope: scope.Rules{Commit: []string{"src/[a"}}}, "commit"},
		{"a bad option", func(c *tools.Config) { c.MaxLines = 0 }, withBash, "option maxLines: must be positive, got 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tools.DefaultConfig()
			tc.configure(&cfg)
			err := cfg.Check(tc.caps)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tc.want == "":
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Check: %v, want %q", err, tc.want)
			}
			env := tools.Env{FS: memfs.New(), Scope: tc.caps.Scope}
			if tc.caps.Bash {
				env.Bash = &fakeBash{run: prints("", workspace.Result{})}
			}
			_, nerr := tools.New(env, cfg)
			if tc.want == "" && nerr == nil {
				return
			}
			if err == nil || nerr == nil || nerr.Error() != "tools: "+err.Error() {
				t.Fatalf("New: %v, want tools: %v", nerr, err)
			}
		})
	}
	var oe *tools.OptionError
	cfg := tools.DefaultConfig()
	cfg.MaxLines = 0
	if err := cfg.Check(tools.Caps{}); !errors.As(err, &oe) || oe.Option != "maxLines" {
		t.Fatalf("a bad option: %v, want an *OptionError naming maxLines", err)
	}
}
