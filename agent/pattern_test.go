package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestBadPatternReachesTheModel: a regular expression that does not compile
// is a *workspace.PatternError through the agent client too, so the grep
// tool over a container words it for the model as it does over memory.
func TestBadPatternReachesTheModel(t *testing.T) {
	fsys := memfs.New()
	if err := fsys.WriteFile(context.Background(), "a.go", []byte("package a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := connect(t, fsys, nil)
	_, err := c.Grep(context.Background(), workspace.GrepRequest{Pattern: "a(b"})
	var pe *workspace.PatternError
	if !errors.As(err, &pe) || !errors.Is(err, workspace.ErrInvalidArgument) {
		t.Fatalf("Grep(a(b) over the agent = %v (%T), want a *workspace.PatternError", err, err)
	}
	set, err := tools.New(tools.Env{FS: c}, tools.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	res := set.Call(context.Background(), "grep", json.RawMessage(`{"pattern":"a(b"}`), tools.CallOptions{})
	want := `InvalidArgument: pattern "a(b" is not a valid Go (RE2) regular expression: error parsing regexp: missing closing )`
	if !res.IsError || !strings.HasPrefix(res.Text, want) {
		t.Errorf("grep a(b over the agent = %q, want it to start %q", res.Text, want)
	}
}
