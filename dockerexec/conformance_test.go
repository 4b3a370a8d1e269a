package dockerexec_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/dockerfs"
	"github.com/sandboxd/sandboxd/internal/dockertest"
)

func TestConformance(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	pool := dockertest.NewPool(t, 4, dockerexec.Spec{Env: env})
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			l := pool.Get(t)
			fsys := dockerfs.New(l.Container)
			return conformance.BashInstance{Bash: l.Bash(), FS: fsys, Root: fsys.Root(), Env: env}
		},
	})
}
