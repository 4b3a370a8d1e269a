package adversarial

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// ceilingCase is one setting (or tool option) a tenant may send: requests
// that widen what the operator gives must be refused (403 or 400, naming
// the setting, nothing started), and requests that narrow it accepted.
type ceilingCase struct {
	widen, narrow []any
	// absent are requests for what the tenant may not even learn exists
	// (another tenant's snapshot): answered 404 naming the setting, as one
	// that never was, nothing started.
	absent []any
	// setup makes what a case's values name before they are judged; it
	// returns them.
	setup func(t *testing.T) ceilingCase
}

// jsonName is a struct field's JSON name.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// TestCeilings: the operator's word is a ceiling for every setting and
// every tool option. Each field of runner.Settings and of tools.Config is
// walked by reflection, so one added without a case here fails; a session
// that asks for more than the operator gives is refused naming the
// setting, and one that asks for less gets its session.
func TestCeilings(t *testing.T) {
	op := tools.DefaultConfig()
	op.Tools = []string{"read", "ls", "find", "grep", "write", "edit"}
	op.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
	op.ReadImages, op.FuzzyEdit = false, false
	op.BashEnv = map[string]string{"HTTPS_PROXY": "http://proxy.invalid:3128"}
	op.Sources = sources.Decls{{Name: "docs", Kind: sources.KindDir, Path: t.TempDir()}}
	store, err := snapshot.Open(t.TempDir(), snapshot.WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	base := memfs.New()
	conformance.Build(t, base, "README.md: the operator's template")
	d := newDaemon(t, daemonConfig{backend: "memory", tools: &op, options: []runner.Option{
		runner.WithGrants(tools.GrantFSWrite),
		runner.WithLifetime(0, time.Hour), runner.WithIdleTimeout(0, time.Hour),
		runner.WithSnapshots(store),
		runner.WithTemplates(runner.Template{Name: "base", Source: func(ctx context.Context, w io.Writer) error {
			return snapshot.WriteTree(ctx, base, w)
		}}),
	}})
	// snapshotOf makes a session of the tenant whose token is given and
	// returns a snapshot of it.
	snapshotOf := func(t *testing.T, token string) string {
		code, answer := d.do(t, token, "POST", "/v1/sessions", map[string]any{})
		if code != http.StatusCreated {
			t.Fatalf("a session to snapshot: %d %s", code, answer)
		}
		var s struct{ ID string }
		json.Unmarshal(answer, &s)
		defer d.do(t, token, "DELETE", "/v1/sessions/"+s.ID, nil)
		code, answer = d.do(t, token, "POST", "/v1/sessions/"+s.ID+"/snapshots", nil)
		if code != http.StatusCreated {
			t.Fatalf("a snapshot: %d %s", code, answer)
		}
		var snap struct{ ID string }
		json.Unmarshal(answer, &snap)
		return snap.ID
	}

	judge := func(t *testing.T, name string, c ceilingCase, wrap func(any) any) {
		for _, w := range c.widen {
			body := wrap(w)
			code, answer := d.do(t, boltToken, "POST", "/v1/sessions", body)
			if (code != http.StatusForbidden && code != http.StatusBadRequest) || !strings.Contains(string(answer), name) {
				t.Errorf("%s: %d %s; want 403 or 400 naming %s", jsonText(t, body), code, answer, name)
			}
		}
		for _, a := range c.absent {
			body := wrap(a)
			code, answer := d.do(t, boltToken, "POST", "/v1/sessions", body)
			if code != http.StatusNotFound || !strings.Contains(string(answer), name) {
				t.Errorf("%s: %d %s; want 404 naming %s, as for one that never was", jsonText(t, body), code, answer, name)
			}
		}
		for _, n := range c.narrow {
			body := wrap(n)
			code, answer := d.do(t, boltToken, "POST", "/v1/sessions", body)
			if code != http.StatusCreated {
				t.Errorf("%s narrows the operator's, yet: %d %s", jsonText(t, body), code, answer)
				continue
			}
			var info struct{ ID string }
			json.Unmarshal(answer, &info)
			d.do(t, boltToken, "DELETE", "/v1/sessions/"+info.ID, nil)
		}
	}
	walk := func(t *testing.T, typ reflect.Type, cases map[string]ceilingCase, wrap func(string, any) any) {
		for f := range typ.Fields() {
			name := jsonName(f)
			c, ok := cases[name]
			if !ok {
				t.Errorf("%s.%s (%s) has no case here: say what widens it and make sure the operator's word bounds it", typ.Name(), f.Name, name)
				continue
			}
			delete(cases, name)
			t.Run(name, func(t *testing.T) {
				if c.setup != nil {
					c = c.setup(t)
				}
				judge(t, name, c, func(v any) any { return wrap(name, v) })
			})
		}
		for name := range cases {
			t.Errorf("a case for %s, which %s does not have", name, typ.Name())
		}
	}

	t.Run("Settings", func(t *testing.T) {
		walk(t, reflect.TypeFor[runner.Settings](), map[string]ceilingCase{
			"image":          {widen: []any{"alpine:latest", "docker.io/sandboxd/../library/alpine"}, narrow: []any{runner.DefaultImage}},
			"runtime":        {widen: []any{"runsc", "io.containerd.runc.v2"}, narrow: []any{"runc"}},
			"network":        {widen: []any{"bridge", "host"}, narrow: []any{"none"}},
			"privileged":     {widen: []any{true}, narrow: []any{false}},
			"capAdd":         {widen: []any{[]string{"NET_RAW"}}, narrow: []any{[]string{}}},
			"hostMounts":     {widen: []any{[]map[string]any{{"source": "/etc", "target": "/etc", "readOnly": true}}}, narrow: []any{[]any{}}},
			"writableRootfs": {widen: []any{true}, narrow: []any{false}},
			"rootUser":       {widen: []any{true}, narrow: []any{false}},
			"limits": {widen: []any{map[string]any{"memoryBytes": int64(1) << 40}, map[string]any{"pids": 1 << 20}, map[string]any{"nanoCpus": int64(64e9)}},
				narrow: []any{map[string]any{"memoryBytes": 256 << 20, "pids": 64, "nanoCpus": int64(5e8)}}},
			"grants":  {widen: []any{[]string{tools.GrantShellExec}}, narrow: []any{[]string{tools.GrantFSWrite}, []string{}}},
			"always":  {widen: []any{[]string{"shell"}}, narrow: []any{[]string{"read"}}}, // a skill needs its grant
			"options": {},                                                                 // walked by Options
			"sources": {widen: []any{[]string{"etc"}}, narrow: []any{[]string{"docs"}, []string{}}},
			"scope":   {narrow: []any{map[string]any{"visible": []string{"src/**"}, "commit": []string{"src/**"}}}}, // it only narrows
			"vars": {widen: []any{map[string]string{"LD_PRELOAD": "/workspace/x.so"}, map[string]string{"PATH": "/workspace/bin"}, map[string]string{"GIT_SSH_COMMAND": "sh"}},
				narrow: []any{map[string]string{"GOFLAGS": "-mod=mod"}}},
			"lifetime":    {widen: []any{"87600h"}, narrow: []any{"10m"}},
			"idleTimeout": {widen: []any{"87600h"}, narrow: []any{"10m"}},
			"egress":      {widen: []any{[]string{"proxy.golang.org:443"}, []string{"go"}, []string{"*.golang.org:443"}}, narrow: []any{[]string{}}}, // the operator allows none
			"secrets":     {widen: []any{[]string{"GITHUB_TOKEN"}}, narrow: []any{[]string{}}},                                                       // the operator declares none
			// The operator gives bolt no secrets of its own (maxSecrets 0).
			"secretValues": {widen: []any{[]map[string]any{{"name": "NPM_TOKEN", "value": "npm_x", "allow": []string{"proxy.golang.org:443"}}}}, narrow: []any{[]any{}}},
			// A tenant starts from its own snapshots only: another's, one that
			// never was, or a path to one, is 404 alike.
			"snapshot": {setup: func(t *testing.T) ceilingCase {
				acme := snapshotOf(t, acmeToken)
				return ceilingCase{absent: []any{acme, "../" + acme, "snap-0000000000000000"}, narrow: []any{snapshotOf(t, boltToken)}}
			}},
			// Templates are the operator's to declare.
			"template": {absent: []any{"undeclared", "../base"}, narrow: []any{"base"}},
		}, func(name string, v any) any { return map[string]any{name: v} })
	})

	t.Run("Options", func(t *testing.T) {
		walk(t, reflect.TypeFor[tools.Config](), map[string]ceilingCase{
			"tools":              {widen: []any{[]string{"read", "bash"}}, narrow: []any{[]string{"read"}}},
			"always":             {widen: []any{[]string{"read"}}}, // the always setting's, not an option
			"confine":            {widen: []any{false}, narrow: []any{true}},
			"protect":            {widen: []any{[]string{}, []string{".git/**"}}, narrow: []any{append(slices.Clone(workspace.DefaultProtect), "secrets/**")}},
			"exclude":            {widen: []any{[]string{}}, narrow: []any{append(slices.Clone(workspace.DefaultExclude), "vendor")}},
			"maxLines":           {widen: []any{tools.DefaultMaxLines + 1}, narrow: []any{10}},
			"maxBytes":           {widen: []any{362 << 20}, narrow: []any{1024}},
			"lsEntries":          {widen: []any{501}, narrow: []any{5}},
			"findResults":        {widen: []any{1001}, narrow: []any{5}},
			"grepMatches":        {widen: []any{101}, narrow: []any{5}},
			"grepLineChars":      {widen: []any{501}, narrow: []any{80}},
			"maxFileBytes":       {widen: []any{900 << 20}, narrow: []any{1 << 20}},
			"readImages":         {widen: []any{true}, narrow: []any{false}},
			"fuzzyEdit":          {widen: []any{true}, narrow: []any{false}},
			"bashTimeoutMs":      {widen: []any{600_001}, narrow: []any{1000}},
			"bashMaxTimeoutMs":   {widen: []any{600_001}, narrow: []any{1000}}, // under the default bashTimeoutMs, which follows it down
			"bashEnv":            {widen: []any{map[string]string{"HTTPS_PROXY": ""}, map[string]string{"LD_PRELOAD": "/workspace/x.so"}}, narrow: []any{map[string]string{"GOFLAGS": "-mod=mod"}}},
			"bashInheritEnv":     {widen: []any{true}},
			"bashEnvAllow":       {widen: []any{[]string{"*"}}},
			"bashSessionEnv":     {narrow: []any{true, false}}, // the session's own ID and root
			"bashKeepState":      {narrow: []any{true, false}}, // its own cwd and exports: a call may set them anyway
			"spillDir":           {widen: []any{".git/hooks"}, narrow: []any{tools.DefaultSpillDir}},
			"spillKeep":          {widen: []any{51}, narrow: []any{1}},
			"progressMs":         {widen: []any{3_600_000}, narrow: []any{50}},
			"environmentSection": {narrow: []any{true, false}}, // what the prompt says
			"sectionOrder":       {narrow: []any{1, 10_000}},
			"grants":             {widen: []any{[]string{tools.GrantShellExec}}}, // the grants setting's
			"maxCallsPerRun":     {widen: []any{0, 65}, narrow: []any{1}},
			"profile":            {widen: []any{"workspace-tools,workspace-shell", tools.ProfileWorkspaceTools}, narrow: []any{tools.ProfileWorkspaceShell}},
			"workspaceShell": {
				widen:  []any{map[string]any{"mode": "write", "commands": "all"}, map[string]any{"mode": "write", "commands": []string{"sh"}}, map[string]any{"timeout": 60_001}},
				narrow: []any{map[string]any{"mode": "write"}, map[string]any{"timeout": 1000}}},
			"driver":  {narrow: []any{"provider", "custom", "model"}}, // what the profile offers; workspace_exec is judged by workspaceShell
			"sources": {widen: []any{[]map[string]any{{"name": "etc", "kind": "dir", "path": "/etc"}}}},
			"visible": {widen: []any{[]string{"**"}}},
			"commit":  {widen: []any{[]string{"**"}}},

			"bashBackground":      {widen: []any{5}, narrow: []any{0, 1}},
			"bashBackgroundBytes": {widen: []any{2 << 20}, narrow: []any{1024}},
		}, func(name string, v any) any {
			// The write access and the provider driver that write mode and
			// commands need: without them the refusal would be for that.
			options := map[string]any{name: v}
			if name == "workspaceShell" {
				options["driver"] = "provider"
			}
			return map[string]any{"grants": []string{tools.GrantFSWrite}, "options": options}
		})
	})
	if n := d.m.Stats().Sessions["bolt"]; n != 0 {
		t.Errorf("bolt has %d sessions after the walk", n)
	}
}

func jsonText(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCeilingAttacks are the attacks of the issue that made the operator's
// word a ceiling: with the operator's grants ["fs.write"], a session that
// set workspace-shell options ran /bin/sh through workspace_exec, and one
// that emptied protect wrote .git/hooks/pre-commit. Both are refused now;
// a refusal that fails shows what the session could do.
func TestCeilingAttacks(t *testing.T) {
	op := tools.DefaultConfig()
	op.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
	d := newDaemon(t, daemonConfig{backend: "memory", tools: &op, options: []runner.Option{runner.WithGrants(tools.GrantFSWrite)}})
	refused := func(t *testing.T, settings any) (id string) {
		t.Helper()
		code, body := d.do(t, boltToken, "POST", "/v1/sessions", settings)
		if code == http.StatusForbidden || code == http.StatusBadRequest {
			return ""
		}
		t.Errorf("%s: %d %s; want it refused", jsonText(t, settings), code, body)
		var info struct{ ID string }
		json.Unmarshal(body, &info)
		return info.ID
	}
	t.Run("ProgramsWithoutShellExec", func(t *testing.T) {
		refused(t, map[string]any{"grants": []string{tools.GrantShellExec}})
		id := refused(t, map[string]any{"grants": []string{tools.GrantFSWrite},
			"options": map[string]any{"profile": "workspace-shell", "driver": "provider", "workspaceShell": map[string]any{"mode": "write", "commands": "all"}}})
		if id != "" {
			res := d.call(t, boltToken, id, "workspace_exec", map[string]any{"command": "/bin/sh", "args": []string{"-c", "echo a shell ran"}})
			t.Errorf("workspace_exec /bin/sh: %s", res.Content[0].Text)
		}
		refused(t, map[string]any{"grants": []string{tools.GrantFSWrite}, "vars": map[string]string{"PATH": "/workspace/bin"}})
	})
	t.Run("ProtectEmptied", func(t *testing.T) {
		for _, protect := range [][]string{{}, {".sandboxd/**"}} {
			id := refused(t, map[string]any{"grants": []string{tools.GrantFSWrite}, "always": []string{"edit"}, "options": map[string]any{"protect": protect}})
			if id != "" {
				res := d.call(t, boltToken, id, "write", map[string]any{"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\necho hook ran\n"})
				t.Errorf("write .git/hooks/pre-commit with protect %q: %s", protect, res.Content[0].Text)
			}
		}
		id := d.create(t, boltToken, map[string]any{"grants": []string{tools.GrantFSWrite}, "always": []string{"edit"}})
		for _, p := range []string{".git/hooks/pre-commit", ".sandboxd/journal/x"} {
			if res := d.call(t, boltToken, id, "write", map[string]any{"path": p, "content": "x"}); !res.IsError || !strings.Contains(res.Content[0].Text, "rotect") {
				t.Errorf("write %s under the operator's protect: %s", p, res.Content[0].Text)
			}
		}
	})
}
