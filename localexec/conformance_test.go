package localexec_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
)

func TestConformance(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			dir := t.TempDir()
			sh, err := localexec.New(dir, localexec.WithEnv(env))
			if err != nil {
				t.Fatal(err)
			}
			fsys, err := localfs.New(dir, localfs.WithLockDir(t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fsys.Close() })
			return conformance.BashInstance{Bash: sh, FS: fsys, Root: dir, Env: env}
		},
		Skip: map[conformance.Capability]string{conformance.CapDurable: "commands run in the calling process: background commands (the workspace.Jobs fallback) end with it"},
	})
}
