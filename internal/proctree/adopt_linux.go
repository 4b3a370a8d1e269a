package proctree

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Direct mode: why it is safe, and when it is used.
//
// The shim exists to be the subreaper of one command's tree: everything the
// command starts stays below it, however it detaches, so that it can be
// found and killed. A process that is already the reaper of all its orphaned
// descendants — the init of a PID namespace, as sandboxd-agent is in a
// container, or a child subreaper — can do that work itself, without
// starting a Go program (the shim) before every command. What it cannot do
// by itself is tell one command's orphans from another's: once the parent of
// a setsid'd process dies, the process is simply a child of the reaper.
//
// So a command runs directly only when it is the only command running. Its
// end (or a kill) sweeps every descendant of this process except the trees
// of live shims: with no other command running when it started, and every
// command started after it put under a shim, everything else below this
// process is the direct command's. A command that starts while a direct one
// runs is always under a shim: the choice and the shim's registration happen
// under adopt.mu, which the sweep also holds while it lists and signals, so
// no sweep sees a shim it does not know. A shim is forgotten just before it
// is reaped; a sweep that finds it then kills it, which changes nothing: its
// command has ended (or failed) and its tree was being killed anyway.
var adopt struct {
	mu     sync.Mutex
	on     bool         // AdoptOrphans was called
	active int          // commands started and not yet waited for
	shims  map[int]bool // pids of the live shims started while on
}

// AdoptOrphans declares that this process adopts every orphan among its
// descendants and reaps those of its zombie children it did not start
// itself (with os.StartProcess or os/exec, which wait for their own). It is
// the init of its PID namespace (PID 1 of a container, as sandboxd-agent
// is); otherwise AdoptOrphans makes it a child subreaper
// (PR_SET_CHILD_SUBREAPER). It also marks every inherited descriptor above
// standard error close-on-exec, as the shim does for its command.
//
// From then on, a command started while no other command of this process is
// running runs as a direct child, in its own process group, with no shim:
// when it ends or is killed, every descendant of this process outside the
// trees of live shims is killed — its background jobs, nohup, double forks
// and setsid'd processes included — and the zombies among this process's
// children are reaped, before Wait returns. A command started while another
// is running runs under a shim, as without AdoptOrphans. This saves the
// shim's start (a second Go program) on every command that runs alone.
//
// It is meant for a process whose only children are the commands it runs
// through this package, such as a container's init: a child it started some
// other way is killed by the sweep of a direct command that ends while it
// runs. Call it before starting any command. Linux only.
func AdoptOrphans() error {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("proctree: PR_SET_CHILD_SUBREAPER: %w", err)
		}
	}
	closeOnExec()
	adopt.mu.Lock()
	defer adopt.mu.Unlock()
	adopt.on = true
	if adopt.shims == nil {
		adopt.shims = map[int]bool{}
	}
	return nil
}

// startTree starts the command: directly when this process adopts orphans
// and no other command runs, under a shim otherwise.
func startTree(path string, spec Spec, stdio [3]*os.File) (tree, error) {
	adopt.mu.Lock()
	if !adopt.on {
		adopt.mu.Unlock()
		return startShim(path, spec, stdio, false)
	}
	adopt.active++
	if adopt.active == 1 {
		defer adopt.mu.Unlock()
		t, err := startDirect(path, spec, stdio)
		if err != nil {
			adopt.active--
			return nil, err
		}
		t.(*directTree).adopted = true
		return t, nil
	}
	adopt.mu.Unlock() // startShim takes it again around the shim's fork
	t, err := startShim(path, spec, stdio, true)
	if err != nil {
		adoptDone()
	}
	return t, err
}

// adoptDone ends the count of an adopted command (direct or shim).
func adoptDone() {
	adopt.mu.Lock()
	adopt.active--
	adopt.mu.Unlock()
}

// sweep kills every descendant of this process outside the trees of the
// live shims, waits for them to die and reaps those that are its children,
// and repeats until none is left, or until deadline (a process stuck in
// uninterruptible sleep dies only when the kernel lets it). Each round
// waits for what it killed to be dead: by then the kernel has handed their
// children to this process, so the next round finds them.
func sweep(deadline time.Time) {
	self := os.Getpid()
	for {
		adopt.mu.Lock()
		pids, family := descendants(self, adopt.shims)
		fds := make([]int, 0, len(pids))
		for _, pid := range pids {
			if fd := killOne(pid, family); fd >= 0 {
				fds = append(fds, fd)
			}
		}
		adopt.mu.Unlock()
		if len(pids) == 0 {
			return
		}
		awaitExit(fds, deadline)
		for _, fd := range fds {
			// Reaps it if it is a child of this process, and a zombie;
			// fails harmlessly otherwise.
			unix.Waitid(unix.P_PIDFD, fd, nil, unix.WEXITED|unix.WNOHANG, nil)
			unix.Close(fd)
		}
		if !time.Now().Before(deadline) {
			return
		}
	}
}

// sweepOnce kills, without waiting, what sweep would.
func sweepOnce() {
	self := os.Getpid()
	adopt.mu.Lock()
	defer adopt.mu.Unlock()
	killAllOf(descendants(self, adopt.shims))
}

// awaitExit waits until every process of the pidfds fds has exited, or
// until deadline. Without pidfds (fds is empty though processes were
// signalled) it pauses a millisecond, so the next round looks again.
func awaitExit(fds []int, deadline time.Time) {
	if len(fds) == 0 {
		time.Sleep(time.Millisecond)
		return
	}
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		n, err := unix.Poll(pfds, int(min(left, time.Second)/time.Millisecond)+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		if n > 0 {
			pending := pfds[:0]
			for _, p := range pfds {
				if p.Revents == 0 {
					pending = append(pending, unix.PollFd{Fd: p.Fd, Events: unix.POLLIN})
				}
			}
			if pfds = pending; len(pfds) == 0 {
				return
			}
		}
	}
}
