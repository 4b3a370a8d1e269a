package memexec_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/memexec"
	"github.com/sandboxd/sandboxd/memfs"
)

func TestConformance(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			fsys := memfs.New(memfs.WithUmask(0))
			sh, err := memexec.New(fsys, memexec.WithTempDir(t.TempDir()), memexec.WithExec(localexec.WithEnv(env)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sh.Close() })
			return conformance.BashInstance{Bash: sh, FS: fsys, Root: sh.Root(), Env: env}
		},
	})
}
