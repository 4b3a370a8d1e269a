package tools_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// A host program builds a tool set over its own FileSystem (here the memory
// adapter) and calls tools the way a model would, without MCP.
func Example() {
	ctx := context.Background()
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite} // the agent may change files, not run commands
	set, err := tools.New(tools.Env{FS: memfs.New(), Session: workspace.Session{Root: "/workspace"}}, cfg)
	if err != nil {
		panic(err)
	}
	call := func(tool string, args any) tools.Result {
		raw, _ := json.Marshal(args)
		return set.Call(ctx, tool, raw, tools.CallOptions{})
	}

	// write and edit belong to workspace.edit, which must be loaded first.
	fmt.Println(call("write", map[string]any{"path": "main.go", "content": "x"}).Text)
	fmt.Println(call("load_skill", map[string]any{"skill": "workspace.edit"}).Text)
	fmt.Println(call("write", map[string]any{"path": "cmd/app/main.go", "content": "package main\n// TODO: greet\nfunc main() {}\n"}).Text)

	res := call("edit", map[string]any{"path": "cmd/app/main.go", "edits": []tools.Replacement{
		{OldText: "// TODO: greet\n", NewText: "// greet says hello.\n"},
	}})
	fmt.Println(res.Text)
	fmt.Print(res.Structured.(*tools.EditResult).Diff) // for the host's UI, not the model

	fmt.Println(call("grep", map[string]any{"pattern": "hello", "glob": "*.go"}).Text)
	fmt.Println(call("read", map[string]any{"path": "/workspace/cmd/app/main.go", "limit": 1}).Text)

	bad := call("read", map[string]any{"path": "../etc/passwd"})
	fmt.Println(bad.IsError, bad.Structured.(*tools.ErrorResult).Error)
	// Output:
	// ToolUnavailable: tool write is not active: call load_skill with skill "workspace.edit" first
	// Loaded workspace.edit: write, edit now available.
	// Created cmd/app/main.go (43 bytes).
	// Replaced 1 block in cmd/app/main.go, at line 2.
	// --- a/cmd/app/main.go
	// +++ b/cmd/app/main.go
	// @@ -1,3 +1,3 @@
	//  package main
	// -// TODO: greet
	// +// greet says hello.
	//  func main() {}
	// cmd/app/main.go:2:// greet says hello.
	// package main
	//
	// [Showing lines 1-1 of 3. Use offset=2 to continue.]
	// true OutsideWorkspace
}
