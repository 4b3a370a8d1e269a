package runner_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoAdapter: the session host stands on the backend port alone.
// Nothing runner builds on — directly or not — is a backend implementation
// (a package under backend/) or an adapter one is made of, so a program
// picks the backends it offers and a new one is a package of its own.
// memfs and localfs may appear: the host keeps data in them (a session's
// journal store, sources' snapshots), not workspaces.
func TestImportsNoAdapter(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("the go command is not on PATH")
		}
		t.Skip("the go command is not on PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/sandboxd/sandboxd/"
	adapters := []string{"agent", "dockerexec", "dockerfs", "localexec", "memexec"}
	for dep := range strings.FieldsSeq(string(out)) {
		rel, ok := strings.CutPrefix(dep, mod)
		if !ok {
			continue
		}
		for _, a := range adapters {
			if rel == a || strings.HasPrefix(rel, a+"/") {
				t.Errorf("runner depends on the adapter %s", dep)
			}
		}
		if strings.HasPrefix(rel, "backend/") {
			t.Errorf("runner depends on the backend implementation %s", dep)
		}
	}
}
