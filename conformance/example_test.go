package conformance_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
)

// An adapter's whole FileSystem test is a harness: how to make a fresh,
// empty instance, and what the adapter cannot be checked for, with why.
// This one gives the kit no hooks, so it declares the capabilities they
// stand for; the subtests that need them report the reason as a skip, and
// every other check runs, each as a parallel subtest
// ("TestConformance/Confine/ChainOut", …). A hook left nil without such a
// declaration fails instead: nothing passes silently. (memfs's own test
// gives every hook; an adapter over a host directory gets them all from
// HostInstance.)
func ExampleTestFileSystem() {
	// In the adapter's conformance_test.go:
	TestConformance := func(t *testing.T) {
		conformance.TestFileSystem(t, conformance.FileSystemHarness{
			New: func(t *testing.T) conformance.Instance {
				fsys := memfs.New()
				return conformance.Instance{FS: fsys, Root: fsys.Root()}
			},
			Skip: map[conformance.Capability]string{
				conformance.CapFIFOs:     "no special files in this example",
				conformance.CapSockets:   "no special files in this example",
				conformance.CapOutside:   "no tree outside the workspace in this example",
				conformance.CapHardlinks: "no tree outside the workspace in this example",
			},
		})
	}
	_ = TestConformance
}
