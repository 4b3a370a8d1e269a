package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSessionFilesCLI: on each backend, a tree put with `sandboxd session
// put` is worked on by bash, comes back with `session get -C`, and `session
// diff` gives a patch that builds the tree got back (less .sandboxd/) from
// nothing, as the session began empty.
func TestSessionFilesCLI(t *testing.T) {
	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) { testSessionFilesCLI(t, backend) })
	}
}

func testSessionFilesCLI(t *testing.T, backend string) {
	d := start(t, config(t, backend, daemonName(t)))
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "sandboxd"), args...)
		cmd.Env = append(cmd.Environ(), "SANDBOXD_URL="+d.url, "SANDBOXD_TOKEN="+acmeToken)
		var out, errs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errs
		if err := cmd.Run(); err != nil {
			t.Fatalf("sandboxd %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errs.String())
		}
		return out.String()
	}
	id := strings.TrimSpace(cli("session", "create", "--grant", "fs.write", "--grant", "shell.exec", "--always", "read,edit,shell"))
	src := t.TempDir()
	for name, content := range map[string]string{"a.txt": "one\ntwo\n", "gone.txt": "bye\n", "tool.sh": "echo hi\n", "lib/b.txt": "b\n"} {
		os.MkdirAll(filepath.Join(src, filepath.Dir(name)), 0o755)
		os.WriteFile(filepath.Join(src, name), []byte(content), 0o644)
	}
	cli("session", "put", id, ".", src)
	// The session began empty, so its diff rebuilds from nothing the tree
	// put and the work done on it.
	cli("session", "call", id, "bash", `{"command":"rm gone.txt && chmod +x tool.sh && sed -i s/two/TWO/ a.txt && echo new > lib/c.txt && mkdir -p .sandboxd && echo x > .sandboxd/junk"}`)
	back := t.TempDir()
	cli("session", "get", "-C", back, id, ".")
	patch := cli("session", "diff", id)
	if strings.Contains(patch, ".sandboxd") || !strings.Contains(patch, "new file mode 100755") {
		t.Fatalf("diff:\n%s", patch)
	}
	rebuilt := t.TempDir()
	apply := exec.Command("git", "apply", "-")
	apply.Dir, apply.Stdin = rebuilt, strings.NewReader(patch)
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v: %s\n%s", err, out, patch)
	}
	for _, name := range []string{"a.txt", "tool.sh", "lib/b.txt", "lib/c.txt", "gone.txt"} {
		want, werr := os.ReadFile(filepath.Join(back, name))
		got, gerr := os.ReadFile(filepath.Join(rebuilt, name))
		if string(got) != string(want) || (werr == nil) != (gerr == nil) {
			t.Errorf("%s: the patch gives %q (%v), the session holds %q (%v)", name, got, gerr, want, werr)
		}
	}
	if info, err := os.Stat(filepath.Join(back, "tool.sh")); err != nil || info.Mode()&0o100 == 0 {
		t.Errorf("tool.sh got back: %v, %v; want executable", info, err)
	}
}
