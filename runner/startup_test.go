package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// TestBaselineOffTheStart: a session is handed out before its first tree
// is read; calls that only read are answered meanwhile, while a write (by
// the session's Call and by its tool set directly, as `sandboxd mcp`
// calls) and a command wait for the tree, and the diff then shows exactly
// what they changed.
func TestBaselineOffTheStart(t *testing.T) {
	held, waiting, release := runner.HoldBaselines(t)
	src := bigTree(t, 500)
	all := runner.Settings{Grants: []string{tools.GrantFSWrite, tools.GrantShellExec}, Always: []string{"read", "edit", "shell"}}
	m := newManager(t, memory.Backend{TempDir: t.TempDir()}, runner.WithGrants(tools.GrantFSWrite, tools.GrantShellExec))
	ctx := context.Background()
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: all, Source: src})
	if err != nil {
		t.Fatal(err)
	}
	// The first answer comes before the read begins; the read then begins,
	// and is held.
	if r, err := s.Call(ctx, "ls", json.RawMessage(`{"path":"."}`), tools.CallOptions{}); err != nil || r.IsError {
		t.Fatalf("ls: %+v, %v", r, err)
	}
	<-held
	for _, c := range []struct{ tool, args string }{
		{"read", `{"path":"d01/f00001.txt"}`},
		{"ls", `{"path":"d02"}`},
		{"find", `{"pattern":"**/f0000*.txt"}`},
		{"grep", `{"pattern":"file 7$"}`},
	} {
		done := make(chan tools.Result, 1)
		go func() {
			r, err := s.Call(ctx, c.tool, json.RawMessage(c.args), tools.CallOptions{})
			if err != nil {
				r = tools.Result{IsError: true, Text: err.Error()}
			}
			done <- r
		}()
		select {
		case r := <-done:
			if r.IsError {
				t.Fatalf("%s: %s", c.tool, r.Text)
			}
		case <-waiting:
			t.Fatalf("%s waited for the first tree", c.tool)
		}
	}
	if runner.BaselineComplete(s) {
		t.Fatal("the first tree was read while its read was held")
	}

	changes := []struct {
		name string
		call func() tools.Result
	}{
		{"write", func() tools.Result {
			r, err := s.Call(ctx, "write", json.RawMessage(`{"path":"new.txt","content":"new\n"}`), tools.CallOptions{})
			if err != nil {
				return tools.Result{IsError: true, Text: err.Error()}
			}
			return r
		}},
		{"the tool set's edit", func() tools.Result {
			return s.Tools().Call(ctx, "edit", json.RawMessage(`{"path":"d00/f00000.txt","edits":[{"oldText":"file 0","newText":"file zero"}]}`), tools.CallOptions{})
		}},
		{"bash", func() tools.Result {
			r, err := s.Call(ctx, "bash", json.RawMessage(`{"command":"rm d03/f00003.txt && echo cmd > cmd.txt"}`), tools.CallOptions{})
			if err != nil {
				return tools.Result{IsError: true, Text: err.Error()}
			}
			return r
		}},
	}
	results := make([]chan tools.Result, len(changes))
	for i, c := range changes {
		results[i] = make(chan tools.Result, 1)
		go func() { results[i] <- c.call() }()
		select {
		case <-waiting: // the call waits for the first tree
		case r := <-results[i]:
			t.Fatalf("%s ran before the first tree was read: %+v", c.name, r)
		}
	}
	for _, name := range []string{"new.txt", "cmd.txt"} {
		if _, err := s.FS().Stat(ctx, name); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s before the first tree is read: %v, want none", name, err)
		}
	}
	release()
	for i, c := range changes {
		if r := <-results[i]; r.IsError {
			t.Fatalf("%s: %s", c.name, r.Text)
		}
	}
	var got []string
	err = s.Do(ctx, "diff", func(ctx context.Context) (bool, error) {
		d, err := s.Diff(ctx, runner.DiffRequest{})
		if err != nil {
			return false, err
		}
		defer d.Close()
		for _, c := range d.Changes {
			got = append(got, fmt.Sprintf("%s %s", c.Path, kind(c)))
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"cmd.txt added", "d00/f00000.txt modified", "d03/f00003.txt deleted", "new.txt added"}
	if !slices.Equal(got, want) {
		t.Fatalf("diff: %q, want %q", got, want)
	}
}

func kind(c delivery.Change) string {
	switch {
	case c.Old == nil:
		return "added"
	case c.New == nil:
		return "deleted"
	}
	return "modified"
}

// TestCloseDuringBaseline: a session that ends while its first tree is
// being read ends the read and removes what it stored: nothing is left
// in the daemon's temporary directory, and no read still runs.
func TestCloseDuringBaseline(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // not parallel: os.MkdirTemp reads it
	held, _, _ := runner.HoldBaselines(t)
	m := newManager(t, memory.Backend{TempDir: t.TempDir()})
	src := bigTree(t, 200)
	// A session that ends before any call never reads its first tree.
	idle, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Source: src})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(context.Background(), "acme", idle.ID()); err != nil {
		t.Fatal(err)
	}
	if !runner.BaselineComplete(idle) {
		t.Fatal("the first tree's read outlived its session")
	}
	s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Source: src})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Call(context.Background(), "ls", json.RawMessage(`{"path":"."}`), tools.CallOptions{}); err != nil || r.IsError {
		t.Fatalf("ls: %+v, %v", r, err)
	}
	<-held
	if kept, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-delivery-*")); len(kept) != 1 {
		t.Fatalf("stores while the first tree is read: %q, want its own", kept)
	}
	if err := m.Delete(context.Background(), "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if !runner.BaselineComplete(s) {
		t.Fatal("the first tree's read outlived its session")
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-delivery-*")); len(left) != 0 {
		t.Fatalf("the first tree's store outlived its session: %q", left)
	}
}
