package docker_test

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"testing"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestConformanceFileSystem(t *testing.T) {
	conformance.TestFileSystem(t, harness(t, nil))
}

func TestConformanceBash(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	pool := dockertest.NewPool(t, 4, docker.Spec{Env: env})
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			l := pool.Get(t)
			return conformance.BashInstance{Bash: l.Bash(), FS: l.Agent(), Root: policy.WorkspaceDir, Env: env,
				Reconnect: func(t *testing.T, meanwhile func(func(string) bool)) (workspace.Bash, workspace.FileSystem) {
					l.Agent().Close() // the daemon is gone: the attach connection closes
					meanwhile(func(name string) bool {
						return docker.ExecOnce(t.Context(), dockertest.Client(t), l.ID(), "test", "-e", path.Join(policy.WorkspaceDir, name)) == nil
					})
					if err := l.Reconnect(t.Context()); err != nil {
						t.Fatal(err)
					}
					return l.Bash(), l.Agent()
				}}
		},
	})
}

// TestConformanceScoped runs the kit over the scope decorator on the agent
// with rules that allow everything: the decorator's link resolution and
// checks go through the agent, and must change nothing.
func TestConformanceScoped(t *testing.T) {
	everything := scope.Rules{Visible: []string{"**"}, Commit: []string{"**"}}
	conformance.TestFileSystem(t, harness(t, func(fsys *agent.Client) workspace.FileSystem {
		scoped, err := scope.New(fsys, policy.WorkspaceDir, everything)
		if err != nil {
			t.Fatal(err)
		}
		return scoped
	}))
}

// harness is the kit's harness over pooled containers; wrap, when set,
// decorates each one's agent client.
func harness(t *testing.T, wrap func(*agent.Client) workspace.FileSystem) conformance.FileSystemHarness {
	pool := dockertest.NewPool(t, 4, docker.Spec{})
	return conformance.FileSystemHarness{
		New: func(t *testing.T) conformance.Instance {
			l := pool.Get(t)
			fsys := l.Agent()
			var view workspace.FileSystem = fsys
			if wrap != nil {
				view = wrap(fsys)
			}
			return conformance.Instance{
				FS:      view,
				Root:    policy.WorkspaceDir,
				Outside: conformance.OutsideFS(l.Outside, dockertest.OutsideDir),
				MakeSpecial: func(name string, typ fs.FileMode) error {
					if typ != fs.ModeNamedPipe {
						return fmt.Errorf("docker test: cannot make %v", typ)
					}
					res, err := l.Bash().Run(context.Background(), workspace.Command{Argv: []string{"mkfifo", path.Join(policy.WorkspaceDir, name)}})
					if err == nil && res.ExitCode != 0 {
						err = fmt.Errorf("mkfifo %s: exit %d", name, res.ExitCode)
					}
					return err
				},
			}
		},
		Skip: map[conformance.Capability]string{
			conformance.CapSockets:   "the minimal image has no tool that binds a Unix socket",
			conformance.CapHardlinks: "the only directory outside the workspace is on /tmp, another file system than the workspace volume",
		},
	}
}
