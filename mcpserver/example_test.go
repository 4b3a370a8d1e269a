package mcpserver_test

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/mcpserver"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// Serve a tool set over MCP and call a tool from a client, both in this
// process. sandboxd mcp does the same over standard input and output.
func ExampleNew() {
	ctx := context.Background()
	fsys := memfs.New()
	if err := fsys.WriteFile(ctx, "notes.txt", []byte("TODO: ship it\n"), 0o644); err != nil {
		panic(err)
	}
	set, err := tools.New(tools.Env{FS: fsys, Session: workspace.Session{ID: "example", Root: "/workspace"}}, tools.DefaultConfig())
	if err != nil {
		panic(err)
	}

	serverEnd, clientEnd := mcp.NewInMemoryTransports()
	go mcpserver.New(set).Run(ctx, serverEnd)

	client := mcp.NewClient(&mcp.Implementation{Name: "example", Version: "v1"}, nil)
	session, err := client.Connect(ctx, clientEnd, nil)
	if err != nil {
		panic(err)
	}
	defer session.Close()

	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "grep", Arguments: map[string]any{"pattern": "TODO"}})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Content[0].(*mcp.TextContent).Text)
	fmt.Println(res.StructuredContent.(map[string]any)["matches"])
	// Output:
	// notes.txt:1:TODO: ship it
	// [map[line:1 path:notes.txt text:TODO: ship it]]
}
