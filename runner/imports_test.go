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
// memfs and localfs may appear among its dependencies (delivery writes
// host directories, a journal without a store keeps itself in memory), not
// as workspaces; runner itself imports neither (TestImportGraph). Nor does it link an
// engine's SDK: not the moby client or its API types, not client-go (the
// Kubernetes API's types neither); images.Canonical, which it calls, asks
// no engine. github.com/moby/profiles is the one moby module it may link:
// policy takes Docker's default seccomp profile from it as data.
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
	adapters := []string{"agent", "localexec"}
	for dep := range strings.FieldsSeq(string(out)) {
		for _, sdk := range engineSDKs {
			if strings.HasPrefix(dep, sdk) && !strings.HasPrefix(dep, "github.com/moby/profiles/") {
				t.Errorf("runner links the engine SDK %s", dep)
			}
		}
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

// engineSDKs are the import path prefixes of the engines' SDKs.
var engineSDKs = []string{"github.com/moby/", "github.com/docker/", "k8s.io/client-go/", "k8s.io/api/", "github.com/testcontainers/"}
