package dockerfs_test

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/dockerfs"
	"github.com/sandboxd/sandboxd/internal/dockertest"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestMain(m *testing.M) { dockertest.Main(m, "dockerfs") }

func TestConformance(t *testing.T) {
	conformance.TestFileSystem(t, harness(t, nil))
}

// TestConformanceScoped runs the kit over the scope decorator on dockerfs
// with rules that allow everything: the decorator's link resolution and
// checks go through the agent, and must change nothing.
func TestConformanceScoped(t *testing.T) {
	everything := scope.Rules{Visible: []string{"**"}, Commit: []string{"**"}}
	conformance.TestFileSystem(t, harness(t, func(fsys *dockerfs.FS) workspace.FileSystem {
		scoped, err := scope.New(fsys, fsys.Root(), everything)
		if err != nil {
			t.Fatal(err)
		}
		return scoped
	}))
}

// harness is the kit's harness over pooled containers; wrap, when set,
// decorates each one's dockerfs.
func harness(t *testing.T, wrap func(*dockerfs.FS) workspace.FileSystem) conformance.FileSystemHarness {
	pool := dockertest.NewPool(t, 4, dockerexec.Spec{})
	return conformance.FileSystemHarness{
		New: func(t *testing.T) conformance.Instance {
			l := pool.Get(t)
			fsys := dockerfs.New(l.Container)
			var view workspace.FileSystem = fsys
			if wrap != nil {
				view = wrap(fsys)
			}
			return conformance.Instance{
				FS:      view,
				Root:    fsys.Root(),
				Outside: conformance.OutsideFS(l.Outside, dockertest.OutsideDir),
				MakeSpecial: func(name string, typ fs.FileMode) error {
					if typ != fs.ModeNamedPipe {
						return fmt.Errorf("dockerfs test: cannot make %v", typ)
					}
					res, err := l.Bash().Run(context.Background(), workspace.Command{Argv: []string{"mkfifo", path.Join(fsys.Root(), name)}})
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
