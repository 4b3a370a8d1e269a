package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
)

// A session, a command in it, what it changed, and its end. The daemon
// here runs in-process on the memory backend; against `sandboxd serve`
// only the client part is needed, with client.FromEnv.
func Example() {
	ctx := context.Background()
	m, err := runner.New(ctx, memory.Backend{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Shutdown(ctx)
	srv, err := httpapi.New(m, httpapi.WithTenants([]httpapi.Tenant{{Name: "acme", Tokens: []string{httpapi.HashToken("acme-token")}}}))
	if err != nil {
		log.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	c, err := client.New(client.WithBaseURL(ts.URL), client.WithToken("acme-token"))
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.SessionCreate(ctx, client.SessionCreateOptions{Settings: runner.Settings{
		Grants: []string{"fs.write", "shell.exec"}, Always: []string{"read", "edit", "shell"}}})
	if err != nil {
		log.Fatal(err)
	}
	id := s.Session.ID
	res, err := c.ToolCall(ctx, id, client.ToolCallOptions{Tool: "bash",
		Arguments: map[string]any{"command": "echo hello > greeting.txt && cat greeting.txt"}, Output: os.Stdout})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("isError:", res.IsError)
	diff, err := c.SessionDiff(ctx, id, client.SessionDiffOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer diff.Patch.Close()
	io.Copy(os.Stdout, diff.Patch)
	if _, err := c.SessionRemove(ctx, id, client.SessionRemoveOptions{}); err != nil {
		log.Fatal(err)
	}
	// Output:
	// hello
	// isError: false
	// diff --git a/greeting.txt b/greeting.txt
	// new file mode 100644
	// index 0000000000000000000000000000000000000000..ce013625030ba8dba906f756967f9e9ca394464a
	// --- /dev/null
	// +++ b/greeting.txt
	// @@ -0,0 +1 @@
	// +hello
}
