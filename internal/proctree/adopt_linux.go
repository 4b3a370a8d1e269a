package proctree

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
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
		// The command inherits its oom_score_adj from this process, for
		// the microseconds of its start (vfork and exec) raised to it:
		// set afterwards, what the command forks first could keep this
		// process's value, and a fork bomb of such processes would leave
		// this one the largest, so the OOM killer's choice. Nothing else
		// can start meanwhile (every start holds adopt.mu), and nothing of
		// another command runs to fill memory (none runs).
		// Where this process may not change its own value (not dumpable
		// and not root: its /proc files are root's), the command's is set
		// just after its start instead, as for a process group alone.
		restore, inherited := inheritOOMScoreAdj(spec.OOMScoreAdj)
		if inherited {
			spec.OOMScoreAdj = 0
		}
		t, err := startDirect(path, spec, stdio)
		restore()
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

// inheritOOMScoreAdj sets this process's own oom_score_adj to n, unless n
// is zero or it is n already, and returns what sets it back; inherited says
// whether a child started now gets n (false when this process may not
// write its own value). Going back is always allowed: the kernel refuses an
// unprivileged process only a value below the last one a privileged writer
// set, which the old value is not. It reads and writes through one
// descriptor of the file, opened once (ownOOMScoreAdj): three system calls
// a command, not three opens of /proc files, each several calls (under
// gVisor, 0.3 ms apiece at load).
func inheritOOMScoreAdj(n int) (restore func(), inherited bool) {
	nothing := func() {}
	if n == 0 {
		return nothing, true
	}
	f, err := ownOOMScoreAdj()
	if err != nil {
		return nothing, false
	}
	var b [16]byte
	k, err := f.ReadAt(b[:], 0)
	old := strings.TrimSpace(string(b[:k]))
	switch {
	case err != nil && err != io.EOF || old == "":
		return nothing, false
	case old == strconv.Itoa(n):
		return nothing, true
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(n)), 0); err != nil {
		return nothing, false
	}
	return func() { f.WriteAt([]byte(old), 0) }, true
}

// ownOOMScoreAdj is this process's /proc/self/oom_score_adj, open for
// reading and writing for the life of the process. The kernel parses each
// write whole, wherever it is written, and reads from the offset given.
var ownOOMScoreAdj = sync.OnceValues(func() (*os.File, error) {
	return openProc("self/oom_score_adj", unix.O_RDWR)
})

// adoptDone ends the count of an adopted command (direct or shim).
func adoptDone() {
	adopt.mu.Lock()
	adopt.active--
	adopt.mu.Unlock()
}

// sweep kills every descendant of this process outside the trees of the
// live shims, waits for them to die and reaps those that are its children,
// and repeats until none is left. Each round waits for what it killed to be
// dead: by then the kernel has handed their children to this process, so
// the next round finds them. Past deadline it gives up once a round finds
// no process it has not signalled before (a process stuck in
// uninterruptible sleep dies only when the kernel lets it); a round that
// finds new ones (a fork bomb's, forked before their parent died) goes on.
func sweep(deadline time.Time) {
	self := os.Getpid()
	signalled := map[int]bool{}
	for {
		adopt.mu.Lock()
		if childless() {
			// Nothing below this process: the walk of /proc would find
			// no one (and costs a read of every thread's children file,
			// under gVisor several milliseconds a command).
			adopt.mu.Unlock()
			return
		}
		pids, family := descendants(self, adopt.shims)
		fresh := false
		for _, pid := range pids {
			fresh = fresh || !signalled[pid]
			signalled[pid] = true
		}
		var pidfds []*os.File
		for _, pid := range pids {
			if f := killOne(pid, family); f != nil {
				pidfds = append(pidfds, f)
			}
		}
		adopt.mu.Unlock()
		if len(pids) == 0 {
			return
		}
		if len(pidfds) == 0 {
			time.Sleep(time.Millisecond) // no pidfds: look again soon
		}
		for _, f := range pidfds {
			awaitExit(f, deadline)
			if rc, err := f.SyscallConn(); err == nil {
				// Reaps it if it is a child of this process, and a
				// zombie; fails harmlessly otherwise.
				rc.Control(func(fd uintptr) {
					unix.Waitid(unix.P_PIDFD, int(fd), nil, unix.WEXITED|unix.WNOHANG, nil)
				})
			}
			f.Close()
		}
		if !fresh && !time.Now().Before(deadline) {
			return
		}
	}
}

// childless reports whether the kernel says this process has no child at
// all, running or a zombie, of any thread, whatever its exit signal
// (waitid(P_ALL) with __WALL and WNOWAIT, which reaps no one): then it has
// no descendant either. Any other answer, an error included, is false.
func childless() bool {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WSTOPPED|unix.WCONTINUED|unix.WNOHANG|unix.WNOWAIT|unix.WALL, nil)
		if err != unix.EINTR {
			return err == unix.ECHILD
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

// awaitPid waits until the process pid, a child of this process not yet
// reaped, has exited (see awaitExit), without reaping it.
func awaitPid(pid int) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return // the caller's wait blocks instead
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	awaitExit(f, time.Time{})
	f.Close()
}

// awaitExit waits until the process of pidfd has exited (the pidfd polls
// readable), or until deadline (zero: no deadline, and no wait at all if
// the pidfd is not pollable). A non-blocking pidfd is waited for through
// Go's poller, so the wait holds no thread: the sweep runs when a command
// may have used up its container's pids limit, where the Go runtime could
// not make a new thread, and dies when it cannot. Otherwise (kernels
// before 5.10) it blocks in poll.
func awaitExit(pidfd *os.File, deadline time.Time) {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return
	}
	exited := func(fd uintptr) bool {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(p, 0)
		return n > 0
	}
	pidfd.SetReadDeadline(deadline)
	err = rc.Read(exited)
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || deadline.IsZero() {
		return
	}
	rc.Control(func(fd uintptr) { // not pollable
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for left := time.Until(deadline); left > 0; left = time.Until(deadline) {
			if n, err := unix.Poll(p, int(left/time.Millisecond)+1); n > 0 || (err != nil && err != unix.EINTR) {
				return
			}
		}
	})
}
