//go:build !linux

package proctree

import "os"

const startsShim = false

// startTree starts the program in a process group of its own: without a
// subreaper, the group is all of its tree this package can find.
func startTree(path string, spec Spec, stdio [3]*os.File) (tree, error) {
	return startDirect(path, spec, stdio)
}
