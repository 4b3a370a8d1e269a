package docker

import (
	"context"
	"path/filepath"
	"strings"
)

// PruneAgentVolumes is pruneAgentVolumes, for the tests of package
// docker_test.
var PruneAgentVolumes = pruneAgentVolumes

// RemoveVolume is removeVolume, for the tests of package docker_test.
var RemoveVolume = removeVolume

// LoopsOf is loopsOf, for the tests of package docker_test.
var LoopsOf = loopsOf

// DetachLoopsUnder detaches every loop device on a file of dir, which a
// failed test may leave.
func DetachLoopsUnder(dir string) {
	for dev, f := range loops() {
		if filepath.Dir(strings.TrimSuffix(f, deletedSuffix)) == dir {
			run(context.Background(), "losetup", "--detach", dev)
		}
	}
}
