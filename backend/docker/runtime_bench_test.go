package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// BenchmarkRuntimes measures what gVisor costs a session: the same
// operations under runc and under runsc, side by side in one run on the
// gVisor engine (which has both), each a tool call as a session makes it
// except the cold start:
//
//	eval "$(bash .ci/gvisor.sh up)"   # the engine sandboxd-gvisor, the images loaded
//	go test ./backend/docker -run '^$' -bench Runtimes -benchtime 20x
//
// cold-start is docker.Start and a first `true`; bash-true the bash tool
// running `true`; read and write a small file through the tools; grep the
// grep tool over a tree of 11,500 files; go-build `go build` of a small
// module after an edit, its build cache warm (the dev image). Each line
// reports the median (p50-µs) and 99th percentile.
func BenchmarkRuntimes(b *testing.B) {
	if !dockertest.GVisor() {
		b.Skipf("needs the gVisor engine: set %s (eval \"$(bash .ci/gvisor.sh up)\")", dockertest.EnvGVisorHost)
	}
	tree := b.TempDir()
	writeTree(b, tree, func(d, f int) string {
		return fmt.Sprintf("package pkg%03d\n\n// F%02d does nothing.\nfunc F%02d() {}\n", d, f, f)
	})
	if err := os.WriteFile(filepath.Join(tree, "small.txt"), []byte("a small file\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	runtimes := []string{policy.RuntimeRunc, policy.RuntimeRunsc}
	ctx := context.Background()
	cli := dockertest.Client(b)
	specs := map[string]docker.Spec{}
	sets, devSets := map[string]*tools.Set{}, map[string]*tools.Set{}
	for _, rt := range runtimes {
		spec := dockertest.Spec(b, docker.Spec{})
		spec.Profile.Runtime = rt
		specs[rt] = spec
		withTree := spec
		withTree.WorkspaceDir = tree
		sets[rt] = toolSet(b, startOrFail(b, cli, withTree))
		dev := spec
		dev.Profile.Image = dockertest.NamedImage(b, "dev")
		devSets[rt] = toolSet(b, startOrFail(b, cli, dev))
		setup := `set -e; mkdir -p app && cd app
printf 'module app\n\ngo 1.22\n' > go.mod
printf 'package main\n\nimport "fmt"\n\nconst n = 0\n\nfunc main() { fmt.Println(n) }\n' > main.go
go build -o /tmp/app .`
		if err := callTool(ctx, devSets[rt], "bash", fmt.Sprintf(`{"command": %q, "timeout": 600}`, setup)); err != nil {
			b.Fatal(err)
		}
	}
	// Each operation under one runtime and then the other, so that the
	// two halves of a pair meet the same load.
	b.Run("cold-start", func(b *testing.B) {
		for _, rt := range runtimes {
			b.Run(rt, func(b *testing.B) { benchColdStart(b, cli, specs[rt], nil) })
		}
	})
	calls := []struct{ name, tool, args string }{
		{"bash-true", "bash", `{"command": "true"}`},
		{"read", "read", `{"path": "small.txt"}`},
		{"write", "write", `{"path": "written.txt", "content": "hello, sandbox\n"}`},
		{"grep", "grep", `{"pattern": "F4[0-9] does", "path": "."}`},
	}
	for _, call := range calls {
		b.Run(call.name, func(b *testing.B) {
			for _, rt := range runtimes {
				b.Run(rt, func(b *testing.B) {
					t := newTimer(b)
					for b.Loop() {
						t.op(func() error { return callTool(ctx, sets[rt], call.tool, call.args) })
					}
					t.report()
				})
			}
		})
	}
	b.Run("go-build", func(b *testing.B) {
		for _, rt := range runtimes {
			b.Run(rt, func(b *testing.B) {
				i := 0
				t := newTimer(b)
				for b.Loop() {
					i++
					cmd := fmt.Sprintf(`set -e; cd app; sed -i 's/^const n = .*/const n = %d/' main.go; go build -o /tmp/app .`, i)
					t.op(func() error {
						return callTool(ctx, devSets[rt], "bash", fmt.Sprintf(`{"command": %q, "timeout": 600}`, cmd))
					})
				}
				t.report()
			})
		}
	})
}

func startOrFail(b *testing.B, cli docker.Engine, spec docker.Spec) *docker.Container {
	c, err := docker.Start(context.Background(), cli, spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// toolSet is the tool set of a session on c that may write and run
// commands.
func toolSet(b *testing.B, c *docker.Container) *tools.Set {
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
	cfg.Always = []string{"read", "edit", "shell"}
	cfg.MaxCallsPerRun = 0
	set, err := tools.New(tools.Env{FS: c.Agent(), Bash: c.Bash(), Session: workspace.Session{Root: policy.WorkspaceDir}}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return set
}

func callTool(ctx context.Context, set *tools.Set, tool, args string) error {
	if !json.Valid([]byte(args)) {
		return fmt.Errorf("%s: arguments %s are not JSON", tool, args)
	}
	res := set.Call(ctx, tool, json.RawMessage(args), tools.CallOptions{})
	if res.IsError {
		return fmt.Errorf("%s: %s", tool, res.Text)
	}
	if br, ok := res.Structured.(*tools.BashResult); ok && br.ExitCode != 0 {
		return fmt.Errorf("%s: exit %d: %s", tool, br.ExitCode, br.Output)
	}
	return nil
}
