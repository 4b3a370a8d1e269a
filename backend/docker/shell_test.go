package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// counted is a FileSystem that counts the calls made of it, each one a round
// trip to the container's agent; it keeps the optional interfaces of
// the agent client that searches use (WalkFS, GrepFS, SymlinkFS).
type counted struct {
	inner *agent.Client
	calls atomic.Int64
}

var (
	_ workspace.WalkFS    = (*counted)(nil)
	_ workspace.GrepFS    = (*counted)(nil)
	_ workspace.SymlinkFS = (*counted)(nil)
)

func (c *counted) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	c.calls.Add(1)
	return c.inner.Stat(ctx, name)
}
func (c *counted) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	c.calls.Add(1)
	return c.inner.Lstat(ctx, name)
}
func (c *counted) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	c.calls.Add(1)
	return c.inner.ReadDir(ctx, name)
}
func (c *counted) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	c.calls.Add(1)
	return c.inner.ReadFile(ctx, name, max)
}
func (c *counted) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	c.calls.Add(1)
	return c.inner.WriteFile(ctx, name, data, perm)
}
func (c *counted) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	c.calls.Add(1)
	return c.inner.Mkdir(ctx, name, perm)
}
func (c *counted) Remove(ctx context.Context, name string) error {
	c.calls.Add(1)
	return c.inner.Remove(ctx, name)
}
func (c *counted) Rename(ctx context.Context, oldname, newname string) error {
	c.calls.Add(1)
	return c.inner.Rename(ctx, oldname, newname)
}
func (c *counted) Symlink(ctx context.Context, target, name string) error {
	c.calls.Add(1)
	return c.inner.Symlink(ctx, target, name)
}
func (c *counted) Readlink(ctx context.Context, name string) (string, error) {
	c.calls.Add(1)
	return c.inner.Readlink(ctx, name)
}
func (c *counted) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	c.calls.Add(1)
	return c.inner.Walk(ctx, req)
}
func (c *counted) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	c.calls.Add(1)
	return c.inner.Grep(ctx, req)
}

// searchTree writes dirs directories of files files each, every third file
// holding "needle" on its second line, and returns how many lines hold it.
func searchTree(tb testing.TB, fsys workspace.FileSystem, dirs, files int) int {
	tb.Helper()
	ctx := context.Background()
	n := 0
	for d := range dirs {
		dir := fmt.Sprintf("pkg%03d/sub", d)
		if err := workspace.MkdirAll(ctx, fsys, dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		for f := range files {
			body := fmt.Sprintf("package p%d\n// file %d\nfunc F%d() {}\n", d, f, f)
			if f%3 == 0 {
				body = fmt.Sprintf("package p%d\n// needle %d\nfunc F%d() {}\n", d, f, f)
				n++
			}
			if err := fsys.WriteFile(ctx, fmt.Sprintf("%s/f%03d.go", dir, f), []byte(body), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return n
}

// TestShellGrepRoundTrips: the workspace-shell's grep -rn over a tree in a
// container makes a number of calls of the agent that does not grow with
// the tree (its walk and its search are the agent's, one round trip each),
// where reading the tree itself would cost a call per file and directory;
// and so do find, ls -R and ls -l, whose walk describes every entry.
func TestShellGrepRoundTrips(t *testing.T) {
	fsys := &counted{inner: dockertest.Start(t, docker.Spec{}).Agent()}
	env := workspaceshell.Env{FS: fsys, Session: workspace.Session{Root: policy.WorkspaceDir}}
	var calls []int64
	for _, size := range []struct{ dirs, files int }{{2, 6}, {8, 30}} {
		want := searchTree(t, fsys, size.dirs, size.files)
		for _, line := range []string{"grep -rn needle .", "grep -rn -C1 needle pkg000", "rg -n needle",
			"find . -name '*.go'", "ls -R", "ls -l pkg000"} {
			fsys.calls.Store(0)
			res, err := interp.Run(context.Background(), env, line, workspaceshell.Read)
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("%s: %v, exit %d, stderr %q", line, err, res.ExitCode, res.Stderr)
			}
			if line == "grep -rn needle ." {
				if got := strings.Count(res.Stdout, ":// needle "); got != want {
					t.Errorf("%s over %d files found %d lines, want %d:\n%s", line, size.dirs*size.files, got, want, res.Stdout)
				}
				calls = append(calls, fsys.calls.Load())
			}
			if n := fsys.calls.Load(); n > 4 {
				t.Errorf("%s over %d files made %d calls of the agent, want at most 4 (a stat, a walk, a search)", line, size.dirs*size.files, n)
			}
		}
	}
	if calls[0] != calls[1] {
		t.Errorf("grep -rn made %d calls over the small tree and %d over the large one; want the same", calls[0], calls[1])
	}
}

// BenchmarkShellGrep compares the workspace-shell's grep -rn with the grep
// tool over the same tree in a container (1,000 files in 40 directories).
//
//	CI=true TESTCONTAINERS_RYUK_DISABLED=true go test -run '^$' -bench ShellGrep -benchtime 20x ./backend/docker/
func BenchmarkShellGrep(b *testing.B) {
	fsys := &counted{inner: dockertest.Start(b, docker.Spec{}).Agent()}
	searchTree(b, fsys, 40, 25)
	sess := workspace.Session{Root: policy.WorkspaceDir}
	b.Run("shell", func(b *testing.B) {
		env := workspaceshell.Env{FS: fsys, Session: sess}
		fsys.calls.Store(0)
		for b.Loop() {
			if res, err := interp.Run(context.Background(), env, "grep -rn needle .", workspaceshell.Read); err != nil || res.ExitCode != 0 {
				b.Fatalf("grep -rn: %v, exit %d, %s", err, res.ExitCode, res.Stderr)
			}
		}
		b.ReportMetric(float64(fsys.calls.Load())/float64(b.N), "calls/op")
	})
	b.Run("tool", func(b *testing.B) {
		cfg := tools.DefaultConfig()
		cfg.GrepMatches = 10000
		cfg.MaxLines, cfg.MaxBytes = 100000, 1<<24
		set, err := tools.New(tools.Env{FS: fsys, Session: sess}, cfg)
		if err != nil {
			b.Fatal(err)
		}
		fsys.calls.Store(0)
		for b.Loop() {
			if res := set.Call(context.Background(), "grep", json.RawMessage(`{"pattern":"needle"}`), tools.CallOptions{}); res.IsError {
				b.Fatal(res.Text)
			}
		}
		b.ReportMetric(float64(fsys.calls.Load())/float64(b.N), "calls/op")
	})
}
