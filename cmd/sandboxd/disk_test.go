package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// TestServeWorkspaceDisk: a daemon configured with limits.workspaceDisk
// loop gives a Docker session a disk of limits.workspaceBytes: fallocate
// past it is "No space left on device", the write tool on the full disk
// NoSpace, and once the session is removed nothing of its disk is left in
// the daemon's state directory.
func TestServeWorkspaceDisk(t *testing.T) {
	dockertest.Image(t)
	agentHere(t)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("limits.workspaceDisk loop needs root")
		}
		t.Skip("limits.workspaceDisk loop needs root")
	}
	const token = "sbx_serve_disk"
	state := t.TempDir()
	daemon := dockertest.DaemonName("disk-e2e")
	config := filepath.Join(t.TempDir(), "sandboxd.json")
	cfg := fmt.Sprintf(`{"backend": "docker", "image": "minimal", "endSessionsOnExit": true, "stateDir": %q, "daemon": %q,
		"tenants": [{"name": "acme", "tokens": [%q]}], "limits": {"workspaceDisk": "loop", "workspaceBytes": 67108864}}`,
		state, daemon, httpapi.HashToken(token))
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _, _ := serveLogged(t, "--config", config)
	c, err := client.New(client.WithBaseURL(base), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	created, err := c.SessionCreate(ctx, client.SessionCreateOptions{Settings: runner.Settings{
		Grants: []string{tools.GrantShellExec, tools.GrantFSWrite}, Always: []string{"shell", "edit"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Session.ID
	call := func(tool string, args map[string]any) (bool, map[string]any) {
		t.Helper()
		res, err := c.ToolCall(ctx, id, client.ToolCallOptions{Tool: tool, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		sc, _ := res.StructuredContent.(map[string]any)
		return res.IsError, sc
	}
	if _, sc := call("bash", map[string]any{"command": "fallocate -l 1G big; dd if=/dev/zero of=fill bs=1M count=100"}); !strings.Contains(fmt.Sprint(sc["output"]), "No space left on device") {
		t.Errorf("past the disk: %v", sc)
	}
	if isErr, sc := call("write", map[string]any{"path": "w.txt", "content": strings.Repeat("x", 1<<20)}); !isErr || sc["error"] != "NoSpace" {
		t.Errorf("write on a full disk: %v", sc)
	}
	disks := filepath.Join(state, "docker", "daemon-"+daemon, "disks")
	if imgs, _ := filepath.Glob(filepath.Join(disks, "*.img")); len(imgs) != 1 {
		t.Errorf("disks of the session: %q, want one", imgs)
	}
	if _, err := c.SessionRemove(ctx, id, client.SessionRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		left, _ := filepath.Glob(filepath.Join(disks, "*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removed session left %q", left)
		}
	}
}
