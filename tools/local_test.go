package tools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestLocal runs the tools over the local adapters on a temporary
// directory: a real shell, real files, the same results as over memory.
func TestLocal(t *testing.T) {
	dir := t.TempDir()
	fsys, err := localfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	sh, err := localexec.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
	cfg.Always = []string{"read", "edit", "shell"}
	cfg.BashSessionEnv = true
	cfg.MaxLines = 100
	set, err := tools.New(tools.Env{FS: fsys, Bash: sh, Session: workspace.Session{ID: "s9", RunID: "r9", Root: fsys.Dir()}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := func(tool string, args any) tools.Result {
		t.Helper()
		raw, _ := json.Marshal(args)
		return set.Call(ctx, tool, raw, tools.CallOptions{})
	}
	bash := func(args map[string]any) *tools.BashResult {
		t.Helper()
		r := call("bash", args)
		if r.IsError {
			t.Fatalf("bash %v: %s", args, r.Text)
		}
		return r.Structured.(*tools.BashResult)
	}

	if r := call("write", map[string]any{"path": "src/a.txt", "content": "one\ntwo\n"}); r.IsError {
		t.Fatal(r.Text)
	}
	if r := call("edit", map[string]any{"path": filepath.Join(dir, "src/a.txt"), "edits": []tools.Replacement{{OldText: "two", NewText: "2"}}}); r.IsError {
		t.Fatal(r.Text)
	}
	if b := bash(map[string]any{"command": "cat src/a.txt; echo $SANDBOXD_SESSION_ID $SANDBOXD_RUN_ID; pwd"}); b.Output != "one\n2\ns9 r9\n"+fsys.Dir()+"\n" && b.Output != "one\n2\ns9 r9\n"+dir+"\n" {
		t.Errorf("output %q", b.Output)
	}
	if b := bash(map[string]any{"command": "tr a-z A-Z; exit 3", "stdin": "quiet"}); b.Output != "QUIET" || b.ExitCode != 3 {
		t.Errorf("stdin and exit: %+v", b)
	}
	if b := bash(map[string]any{"command": "kill -9 $$"}); b.Signal != "SIGKILL" || b.ExitCode != -1 {
		t.Errorf("signal: %+v", b)
	}
	start := time.Now()
	if b := bash(map[string]any{"command": "sleep 30 & sleep 30", "timeout": 0.3}); !b.TimedOut || time.Since(start) > 10*time.Second {
		t.Errorf("timeout: %+v after %v", b, time.Since(start))
	}
	// The output keeps the order the command wrote stdout and stderr in.
	var want strings.Builder
	for i := range 40 {
		fmt.Fprintf(&want, "out%d\nerr%d\n", i, i)
	}
	if b := bash(map[string]any{"command": "for i in $(seq 0 39); do echo out$i; echo err$i >&2; done"}); b.Output != want.String() {
		t.Errorf("output order: %q", b.Output)
	}
	b := bash(map[string]any{"command": "seq 1 250"})
	saved, err := os.ReadFile(filepath.Join(dir, b.OutputPath))
	if !b.Truncated || !strings.HasPrefix(b.Output, "151\n") || err != nil || strings.Count(string(saved), "\n") != 250 {
		t.Errorf("spill: truncated %v, output starts %q, saved %d bytes (%v)", b.Truncated, b.Output[:8], len(saved), err)
	}
	if r := call("grep", map[string]any{"pattern": "^2$", "path": "src"}); r.Text != "src/a.txt:2:2" {
		t.Errorf("grep: %s", r.Text)
	}
	if err := os.Symlink("/etc", filepath.Join(dir, "etc")); err != nil {
		t.Fatal(err)
	}
	if r := call("read", map[string]any{"path": "etc/passwd"}); errKind(r) != "OutsideWorkspace" {
		t.Errorf("read through a link out: %s", r.Text)
	}
	if r := call("write", map[string]any{"path": "etc/evil", "content": "x"}); errKind(r) != "OutsideWorkspace" {
		t.Errorf("write through a link out: %s", r.Text)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"ls", map[string]any{"path": "etc"}},
		{"find", map[string]any{"path": "etc", "pattern": "*"}},
		{"grep", map[string]any{"path": "etc", "pattern": "root"}},
	} {
		if r := call(c.tool, c.args); errKind(r) != "OutsideWorkspace" {
			t.Errorf("%s of a link out: %s", c.tool, r.Text)
		}
	}
}
