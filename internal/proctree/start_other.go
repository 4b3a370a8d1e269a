//go:build !linux

package proctree

import (
	"errors"
	"os"
	"time"
)

const startsShim = false

// startTree starts the program in a process group of its own: without a
// subreaper, the group is all of its tree this package can find.
func startTree(path string, spec Spec, stdio [3]*os.File) (tree, error) {
	return startDirect(path, spec, stdio)
}

// AdoptOrphans fails: only Linux lets a process adopt its orphaned
// descendants.
func AdoptOrphans() error {
	return errors.New("proctree: adopting orphans needs Linux")
}

// setOOMScoreAdj does nothing: oom_score_adj is Linux's.
func setOOMScoreAdj(string, int) {}

// Never called: no tree is adopted without AdoptOrphans.
func sweep(time.Time) {}
func sweepOnce()      {}
func adoptDone()      {}
func awaitPid(int)    {}

// CloseIdle does nothing: no shim is kept where there is no shim.
func CloseIdle() {}

// StatFields fails: only Linux has /proc/PID/stat.
func StatFields(pid int) ([]string, error) {
	return nil, errors.New("proctree: no /proc/PID/stat on this system")
}
