package integration_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// floors is the module's import graph as README's "How it fits together"
// draws it, from the ground up: a package imports only packages of its own
// floor or below. Every package of the module is on exactly one floor
// (TestImportGraph says which is missing); a new package is added here, on
// the lowest floor its imports allow.
var floors = []struct {
	name     string
	packages []string
	// pickNone: its packages import none of the implementations of the
	// ports; the file systems, commands and journal stores they work on
	// come from whoever wires the session.
	pickNone bool
}{
	{"ground: the ports and what imports nothing of the project", []string{
		"workspace", "policy", "egress", "sessionca", "internal/proctree", "images",
		"e2b/envdpb", "e2b/envdpb/process", "e2b/envdpb/process/processconnect",
		"e2b/envdpb/filesystem", "e2b/envdpb/filesystem/filesystemconnect",
	}, false},
	{"adapters and data", []string{
		"textedit", "memfs", "localfs", "localexec", "scope", "sources", "journal", "delivery", "snapshot",
		"agent", "images/engine", "conformance",
	}, false},
	{"the tool layer", []string{
		"workspaceshell/interp", "workspaceshell", "tools", "mcpserver",
	}, true},
	{"the backend port", []string{"backend"}, false},
	{"the backends, one package each (imported by programs and tests only)", []string{
		"backend/docker", "backend/kubernetes", "backend/local", "backend/memory",
	}, false},
	{"the session host", []string{"runner", "httpapi", "client", "e2b"}, true},
	{"the programs", []string{"cmd/sandboxd", "cmd/sandboxd-agent"}, false},
	{"what only tests import, and test-only packages", []string{
		"testharness/agentbin", "testharness/dockertest", "testharness/k8stest",
		"workspaceshell/internal/shelltest", "adversarial", "integration",
	}, false},
}

const module = "github.com/sandboxd/sandboxd"

// implementations are the adapters that implement the ports.
var implementations = []string{"memfs", "localfs", "localexec", "agent"}

// TestImportGraph holds the module to its floors: no package imports one
// above it; the tool layer and the host import no implementation of the
// ports (pickNone); every backend is one package, backend/NAME, that only
// programs and tests import, and no package serves a backend alone (it
// would be part of it); the host's HTTP layer links no engine SDK (runner's own
// TestImportsNoAdapter holds runner to the same).
func TestImportGraph(t *testing.T) {
	imports := moduleImports(t, "{{.ImportPath}} {{join .Imports \" \"}}")
	floor := map[string]int{}
	for i, f := range floors {
		for _, p := range f.packages {
			if _, dup := floor[p]; dup {
				t.Errorf("%s is on two floors", p)
			}
			floor[p] = i
		}
	}
	for p := range floor {
		if _, ok := imports[p]; !ok {
			t.Errorf("floors name %s, which is not a package of the module: take it out", p)
		}
	}
	importers := map[string][]string{}
	for p, deps := range imports {
		fp, ok := floor[p]
		if !ok {
			t.Errorf("package %s is on no floor: add it to floors in integration/imports_test.go, on the lowest floor its imports allow", p)
			continue
		}
		for _, d := range deps {
			if fd, ok := floor[d]; ok && fd > fp {
				t.Errorf("%s (%s) imports %s, a floor above it (%s)", p, floors[fp].name, d, floors[fd].name)
			}
			importers[d] = append(importers[d], p)
		}
	}
	for p, deps := range imports {
		if f, ok := floor[p]; ok && floors[f].pickNone {
			for _, d := range deps {
				if slices.Contains(implementations, d) {
					t.Errorf("%s (%s) imports the implementation %s: take it from whoever wires the session", p, floors[f].name, d)
				}
			}
		}
	}
	for p := range imports {
		name, ok := strings.CutPrefix(p, "backend/")
		if !ok {
			continue
		}
		if strings.Contains(name, "/") {
			t.Errorf("%s: a backend is one package, backend/NAME, with no packages of its own below it", p)
		}
		for _, user := range importers[p] {
			if !strings.HasPrefix(user, "cmd/") && !strings.HasPrefix(user, "testharness/") {
				t.Errorf("%s imports the backend %s: only programs (cmd/) wire backends", user, p)
			}
		}
	}
	for p, users := range importers {
		if _, ours := floor[p]; !ours {
			continue
		}
		users = slices.DeleteFunc(slices.Clone(users), func(u string) bool { return floor[u] == len(floors)-1 })
		if len(users) == 1 && strings.HasPrefix(users[0], "backend/") {
			t.Errorf("%s serves %s alone: make it part of that backend", p, users[0])
		}
	}

	deps := moduleImports(t, "{{.ImportPath}} {{join .Deps \" \"}}", module+"/httpapi", module+"/client")
	for p, ds := range deps {
		for _, d := range ds {
			for _, sdk := range []string{"github.com/moby/", "github.com/docker/", "k8s.io/client-go/", "k8s.io/api/", "github.com/testcontainers/"} {
				if strings.HasPrefix(d, sdk) && !strings.HasPrefix(d, "github.com/moby/profiles/") {
					t.Errorf("%s links the engine SDK %s", p, d)
				}
			}
		}
	}
}

// moduleImports runs go list -f format over the module's packages (or those
// named): for each package, what format lists after its own path, the
// module's packages written relative to the module.
func moduleImports(t *testing.T, format string, pkgs ...string) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("the go command is not on PATH")
		}
		t.Skip("the go command is not on PATH")
	}
	if len(pkgs) == 0 {
		pkgs = []string{module + "/..."}
	}
	out, err := exec.Command(goTool, append([]string{"list", "-f", format}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	m := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		for i, f := range fields {
			if r, ok := strings.CutPrefix(f, module+"/"); ok {
				fields[i] = r
			}
		}
		if len(fields) > 0 {
			m[fields[0]] = fields[1:]
		}
	}
	return m
}
