package tools

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
)

// TestToolAnswersItsResultType: a handler whose result is not its declared
// type is a failure (Internal), not content its outputSchema does not
// describe.
func TestToolAnswersItsResultType(t *testing.T) {
	type args struct {
		Path string `json:"path" jsonschema:"a path under {{.Root}}"`
	}
	wrong := newTool(spec[args, *LsResult]{
		name: "wrong", describe: func(*Set) string { return "" },
		handle: func(_ *Set, _ context.Context, p args, _ *call) (Result, error) {
			return Result{Text: p.Path, Structured: &WriteResult{Path: p.Path}}, nil
		},
	})
	set, err := New(Env{FS: memfs.New()}, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.run(set, context.Background(), json.RawMessage(`{"path":"a"}`), &call{}); err == nil || !strings.Contains(err.Error(), "not its result type") {
		t.Fatalf("a *WriteResult from a tool of *LsResult: %v", err)
	}
	if _, err := wrong.run(set, context.Background(), json.RawMessage(`{"path":1}`), &call{}); err == nil || !strings.Contains(err.Error(), "argument path: want string") {
		t.Fatalf("arguments are decoded strictly: %v", err)
	}
	var schema struct {
		Properties map[string]struct{ Description string }
	}
	if err := json.Unmarshal(wrong.args(set), &schema); err != nil || schema.Properties["path"].Description != "a path under /workspace" {
		t.Fatalf("the description template, filled in: %+v, %v", schema, err)
	}
}
