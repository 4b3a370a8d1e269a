package tools_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

var update = flag.Bool("update", false, "write testdata/catalogue/*.json anew from the tool values")

// catalogueCases are settings that, together, list every tool: both
// profiles, write mode, the journal, and a provider's workspace_exec.
func catalogueCases() []struct {
	name      string
	configure func(*tools.Config)
} {
	return []struct {
		name      string
		configure func(*tools.Config)
	}{
		{"workspace-tools", func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
		}},
		{"workspace-shell-write", func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite}
			c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write}
		}},
		{"provider", func(c *tools.Config) {
			c.Grants = []string{tools.GrantFSWrite}
			c.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
			c.Driver = workspaceshell.DriverProvider
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write, Commands: workspaceshell.Commands{Names: []string{"git", "go"}}}
		}},
	}
}

// TestCatalogueGolden holds every tool's name, skill, description and
// schemas to testdata/catalogue: the contract's argument names, required
// lists and limits do not change unnoticed (go test -run
// TestCatalogueGolden -update writes them anew, for a reviewed change).
// Schemas are compared as JSON values, with required lists as sets.
func TestCatalogueGolden(t *testing.T) {
	for _, tc := range catalogueCases() {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tools.DefaultConfig()
			tc.configure(&cfg)
			set, err := tools.New(tools.Env{FS: memfs.New(), Bash: &fakeBash{run: prints("", workspace.Result{})},
				Session: workspace.Session{ID: "s", Root: "/workspace"}}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(set.Catalogue(), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join("testdata", "catalogue", tc.name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			g, w := jsonValue(t, got), jsonValue(t, want)
			if !reflect.DeepEqual(g, w) {
				gt, wt := byName(g), byName(w)
				for name := range wt {
					if !reflect.DeepEqual(gt[name], wt[name]) {
						t.Errorf("tool %s:\n got %s\nwant %s", name, jsonOf(t, gt[name]), jsonOf(t, wt[name]))
					}
				}
				for name := range gt {
					if _, ok := wt[name]; !ok {
						t.Errorf("tool %s is new: %s", name, jsonOf(t, gt[name]))
					}
				}
				t.Errorf("the catalogue is not %s (run with -update after reviewing the change)", file)
			}
		})
	}
}

// jsonValue decodes data, with every "required" list sorted and an empty
// one dropped: a set, however written.
func jsonValue(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	var norm func(v any) any
	norm = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if l, ok := e.([]any); ok && k == "required" {
					if len(l) == 0 {
						delete(v, k)
						continue
					}
					slices.SortFunc(l, func(a, b any) int { return strings.Compare(a.(string), b.(string)) })
				}
				v[k] = norm(e)
			}
		case []any:
			for i := range v {
				v[i] = norm(v[i])
			}
		}
		return v
	}
	return norm(v)
}

// byName indexes a catalogue's tools by name.
func byName(cat any) map[string]any {
	out := map[string]any{}
	for _, t := range cat.(map[string]any)["tools"].([]any) {
		m := t.(map[string]any)
		out[m["name"].(string)] = m
	}
	return out
}
