package proctree

import (
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// directTree runs the program as our own child in a new process group and
// kills that group: the portable part of the guarantee, and all of it where
// there is no shim. A process that leaves the group escapes it.
type directTree struct {
	proc    *os.Process
	start   time.Time
	adopted bool // this process adopts orphans: kill and sweep all of them

	mu     sync.Mutex
	killed bool // kill was called before the main process was reaped
	reaped bool
}

func startDirect(path string, spec Spec, stdio [3]*os.File) (tree, error) {
	start := time.Now()
	proc, err := os.StartProcess(path, spec.Argv, &os.ProcAttr{
		Dir:   spec.Dir,
		Env:   spec.Env,
		Files: stdio[:],
		Sys:   groupAttr(spec.Terminal),
	})
	if err != nil {
		return nil, startError(spec.Argv[0], err)
	}
	setOOMScoreAdj(strconv.Itoa(proc.Pid), spec.OOMScoreAdj)
	return &directTree{proc: proc, start: start}, nil
}

// groupAttr starts a program in a process group of its own: for a
// terminal's (Spec.Terminal), in a session of its own, whose group it
// leads, with its standard input as its controlling terminal.
func groupAttr(terminal bool) *syscall.SysProcAttr {
	if terminal {
		return &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	return &syscall.SysProcAttr{Setpgid: true}
}

func (t *directTree) kill() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.reaped {
		t.killed = true
		// The group's id is the main process's pid, which cannot be reused
		// while that process is unreaped. The main process itself may have
		// moved to another group.
		syscall.Kill(-t.proc.Pid, syscall.SIGKILL)
		t.proc.Kill()
		if t.adopted {
			// The rest at once; wait sweeps to the end. Under t.mu, so
			// that this is over before wait counts the command as ended.
			sweepOnce()
		}
	}
}

func (t *directTree) wait() (Exit, error) {
	if t.adopted {
		awaitPid(t.proc.Pid) // through Go's poller: see awaitExit
	}
	state, err := t.proc.Wait()
	d := time.Since(t.start)
	t.mu.Lock()
	t.reaped = true
	killed := t.killed
	// The rest of the group: background jobs and their children, in one
	// signal that a fork in the group cannot outrun (a fork bomb's). The
	// group id stays taken while any of them lives; once all are gone
	// this finds no one (a new group of the same id within these
	// microseconds would need the pid to be reused at once).
	syscall.Kill(-t.proc.Pid, syscall.SIGKILL)
	t.mu.Unlock()
	if t.adopted {
		// Everything else the command left, wherever it went: this
		// process adopted the orphans, and no other command was running
		// when this one started (see adopt).
		sweep(time.Now().Add(killGrace))
		adoptDone()
	}
	if err != nil {
		return Exit{Code: -1}, err
	}
	ws := state.Sys().(syscall.WaitStatus)
	return exitOf(ws, killed, d), nil
}
