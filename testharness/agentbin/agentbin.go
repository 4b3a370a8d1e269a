// Package agentbin gives tests a sandboxd-agent binary: the one $SANDBOXD_AGENT
// names, or one built from this checkout's cmd/sandboxd-agent with
// CGO_ENABLED=0, once per test binary.
package agentbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

var (
	once  sync.Once
	dir   string
	path  string
	built error
)

// Path returns the agent binary for this test binary, building it on first
// call. Call Remove when the tests are done.
func Path() (string, error) {
	once.Do(func() {
		if p := os.Getenv("SANDBOXD_AGENT"); p != "" {
			path = p
			return
		}
		_, file, _, ok := runtime.Caller(0)
		if !ok {
			built = fmt.Errorf("agentbin: cannot locate the source tree")
			return
		}
		root := filepath.Join(filepath.Dir(file), "..", "..")
		if dir, built = os.MkdirTemp("", "sandboxd-agent-"); built != nil {
			return
		}
		path = filepath.Join(dir, "sandboxd-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-o", path, "./cmd/sandboxd-agent")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			built = fmt.Errorf("agentbin: go build ./cmd/sandboxd-agent: %v\n%s", err, out)
		}
	})
	return path, built
}

// Remove deletes the binary Path built, if any.
func Remove() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}
