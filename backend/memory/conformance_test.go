package memory_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/memfs"
)

func TestConformance(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			fsys := memfs.New(memfs.WithUmask(0))
			sh, err := memory.NewMirror(fsys, memory.WithTempDir(t.TempDir()), memory.WithExec(localexec.WithEnv(env)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sh.Close() })
			return conformance.BashInstance{Bash: sh, FS: fsys, Root: sh.Root(), Env: env}
		},
		Skip: map[conformance.Capability]string{conformance.CapDurable: "commands run in the calling process: background commands (the workspace.Jobs fallback) end with it",
			conformance.CapTerminal: "the mirror runs commands over a copy of the files, with no terminal"},
	})
}
