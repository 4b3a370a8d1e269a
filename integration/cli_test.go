package integration

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSessionCLI drives `sandboxd session create|call|ls|rm` against a
// running daemon, with an actor scope given on the command line, on each
// backend.
func TestSessionCLI(t *testing.T) {
	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) { testSessionCLI(t, backend) })
	}
}

func testSessionCLI(t *testing.T, backend string) {
	d := start(t, config(t, backend, daemonName(t)))
	cli := func(args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "sandboxd"), args...)
		cmd.Env = append(cmd.Environ(), "SANDBOXD_URL="+d.url, "SANDBOXD_TOKEN="+acmeToken)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	out, err := cli("session", "create", "--grant", "fs.write", "--always", "read,edit",
		"--visible", "src/**", "--visible", "{docs,notes}/*.md", "--commit", "src/**")
	if err != nil {
		t.Fatalf("session create: %v\n%s", err, out)
	}
	id := strings.TrimSpace(out)
	if out, err := cli("session", "call", id, "write", `{"path":"src/a.txt","content":"hi"}`); err != nil {
		t.Fatalf("write in scope: %v\n%s", err, out)
	}
	for _, c := range []struct{ args, want string }{
		{`{"path":"docs/x.md","content":"x"}`, "commit scope"},
		{`{"path":"top.txt","content":"x"}`, "NotFound"},
	} {
		if out, err := cli("session", "call", id, "write", c.args); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("write %s: %v\n%s", c.args, err, out)
		}
	}
	if out, err := cli("session", "call", id, "bash", `{"command":"true"}`); err == nil || !strings.Contains(out, "bash") {
		t.Errorf("bash in a scoped session: %v\n%s", err, out)
	}
	if out, err := cli("session", "ls"); err != nil || !strings.Contains(out, id) {
		t.Fatalf("session ls: %v\n%s", err, out)
	}
	if out, err := cli("session", "rm", id); err != nil {
		t.Fatalf("session rm: %v\n%s", err, out)
	}
	if out, err := cli("session", "ls"); err != nil || strings.Contains(out, id) {
		t.Fatalf("session ls after rm: %v\n%s", err, out)
	}
	if out, err := cli("session", "create", "--visible", "src/[a"); err == nil || !strings.Contains(out, "scope") {
		t.Errorf("a bad glob: %v\n%s", err, out)
	}
}
