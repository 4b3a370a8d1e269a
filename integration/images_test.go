package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// TestImages runs real work on the Docker backend in sandboxd's built-in
// images: GNU bash (arrays, [[ ]]) on minimal, and on dev a Go program
// built and run, Python with a venv and pip, Node and npm, make with the C
// compiler, ripgrep and git. dev is built first with `sandboxd image build
// dev`, which a second time must be a no-op that says so. Nothing reaches
// the network: GOPROXY is off and the programs have no dependencies.
func TestImages(t *testing.T) {
	if _, err := dockertest.Connect(context.Background()); err != nil {
		dockertest.Unavailable(t, fmt.Errorf("the images need the Docker backend: %w", err))
	}
	t.Run("minimal", func(t *testing.T) {
		d := start(t, withImage(t, config(t, "docker", daemonName(t)), "minimal"))
		id := session(t, d)
		runs(t, d, id, `arr=(one two three); [[ ${#arr[@]} -eq 3 && ${arr[1]} == tw* ]] && echo "ok ${arr[2]} $BASH"`, "ok three /bin/bash\n")
	})
	t.Run("dev", func(t *testing.T) {
		// A cold build runs debootstrap against the Debian mirror: minutes.
		build := func() string {
			ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, filepath.Join(binDir, "sandboxd"), "image", "build", "dev").CombinedOutput()
			if err != nil {
				t.Fatalf("sandboxd image build dev: %v\n%s", err, out)
			}
			return string(out)
		}
		build()
		if out := build(); !strings.Contains(out, "up to date") || strings.Contains(out, "importing") {
			t.Errorf("a second build of an unchanged image is not a no-op that says so:\n%s", out)
		}
		d := start(t, withImage(t, config(t, "docker", daemonName(t)), "dev"))
		id := session(t, d)
		for _, tt := range []struct{ name, script, want string }{
			{"bash", `a=(x y); [[ ${a[1]} == y ]] && echo "bash ${BASH_VERSINFO[0]}"`, "bash 5\n"},
			{"go", `mkdir -p hello && cd hello && printf 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello from", 6*7) }\n' > main.go &&
				GOPROXY=off GOFLAGS=-mod=mod go run main.go`, "hello from 42\n"},
			{"python", `python3 -c 'print(6*7)' && python3 -m venv venv && venv/bin/python -m pip --version | cut -d' ' -f1`, "42\npip\n"},
			{"node", `node -e 'console.log(6*7)' && npm --version >/dev/null && echo npm`, "42\nnpm\n"},
			{"make and cc", `mkdir -p c && cd c && printf '#include <stdio.h>\nint main(void) { printf("cc %%d\\n", 6*7); return 0; }\n' > hi.c &&
				printf 'hi: hi.c\n\tcc -o hi hi.c\n' > Makefile && make -s && ./hi`, "cc 42\n"},
			{"git and rg", `git init -q repo && cd repo && echo needle > f.txt && git add f.txt &&
				git -c user.name=t -c user.email=t@example.com commit -qm one && git log --format=%s && rg -l needle`, "one\nf.txt\n"},
			{"tools", `for c in curl jq patch less ps sed grep find; do command -v $c >/dev/null || echo missing $c; done; echo done`, "done\n"},
			// A current Go: a project of 2026 (a go line past Debian's 1.19,
			// a toolchain line) builds, offline, with the image's toolchain;
			// its caches go to the session's home, not the work.
			{"current go", `mkdir -p modern && cd modern && printf 'module modern\n\ngo 1.26\n\ntoolchain go1.26.1\n' > go.mod &&
				printf 'package main\n\nimport "fmt"\n\nfunc main() { for i := range 2 { fmt.Print(i) }; fmt.Println() }\n' > main.go &&
				GOPROXY=off go run . && go env GOVERSION GOTOOLCHAIN && go env GOCACHE GOMODCACHE | sed "s|^$HOME|HOME|" && echo "$HOME"`,
				"01\ngo1.27.4\nauto\nHOME/.cache/go-build\nHOME/go/pkg/mod\n/workspace/.sandboxd/home\n"},
		} {
			t.Run(tt.name, func(t *testing.T) { runs(t, d, id, tt.script, tt.want) })
		}
	})
}

// withImage sets the top-level image of the configuration file.
func withImage(t *testing.T, file, image string) string {
	t.Helper()
	var cfg map[string]any
	data, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	dockertest.NamedImage(t, image) // the daemon would build a missing one: the test says to build it first
	cfg["image"] = image
	data, _ = json.Marshal(cfg)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// session creates a session of acme that may write and run commands, removed
// when the test ends.
func session(t *testing.T, d *daemon) string {
	t.Helper()
	var s struct{ ID string }
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	t.Cleanup(func() { d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil) })
	return s.ID
}

// runs runs script with the bash tool and checks it exits 0 printing want.
func runs(t *testing.T, d *daemon, id, script, want string) {
	t.Helper()
	r := d.call(acmeToken, id, "bash", map[string]any{"command": script, "timeout": 600})
	out, _ := r.StructuredContent["output"].(string)
	if code, _ := r.StructuredContent["exitCode"].(float64); r.IsError || code != 0 || out != want {
		t.Errorf("%s\nexit %v, output %q, want %q; %+v", script, r.StructuredContent["exitCode"], out, want, r.Content)
	}
}
