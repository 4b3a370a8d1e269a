package memory_test

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/workspace"
)

// A backend opens a workspace for a spec; its ports are all a host uses.
// Here the memory backend: files in memory, a command in a host directory
// kept in step with them.
func Example() {
	ctx := context.Background()
	var b backend.Backend = memory.Backend{}
	inst, err := b.Open(ctx, backend.Spec{Session: "s-1", MaxBytes: 1 << 20})
	if err != nil {
		panic(err)
	}
	defer inst.Close(ctx)

	if err := inst.FS.WriteFile(ctx, "hello.txt", []byte("hello\n"), 0o644); err != nil {
		panic(err)
	}
	res, err := inst.Bash.Run(ctx, workspace.Command{
		Script: "tr a-z A-Z < hello.txt > shout.txt",
	})
	if err != nil || res.ExitCode != 0 {
		panic(fmt.Sprint(res, err))
	}
	data, err := inst.FS.ReadFile(ctx, "shout.txt", 1<<10)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s at %s: %s", b.Name(), inst.Root, data)
	// Output:
	// memory at /workspace: HELLO
}
