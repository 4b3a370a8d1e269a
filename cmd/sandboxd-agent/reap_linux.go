package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/proctree"
)

// probeEnv marks the child reapOrphans starts once to learn whether this
// process holds a pidfd for each child it starts.
const probeEnv = "SANDBOXD_AGENT_PROBE"

// reapOrphans is PID 1's duty: it reaps the zombies among the agent's
// children that no one in the agent waits for, each time a child exits.
//
// The agent's own children — the commands and proctree shims localexec
// starts, each waited for by os.Process.Wait — must be left to their
// waiters, or their exit statuses would be stolen. The Go runtime holds a
// pidfd for every child it starts, from the clone that creates it until Wait
// has reaped it, so a zombie child for which the agent holds no pidfd is an
// orphan the kernel handed to PID 1: those are reaped. The zombies are listed
// before the pidfds are, so a child started in between is never mistaken for
// an orphan. (proctree's sweep, which kills and reaps what a command left
// behind, holds a pidfd for each process it handles, so the two never take
// the other's for an orphan either; when both try, one finds it gone.)
//
// Where the runtime holds no pidfds (byPidfd false: kernels before 5.4, or a
// seccomp profile that forbids them), ownership cannot be told; a zombie is
// then reaped only once it has stayed one for a minute, which no waited-for
// child does.
func reapOrphans(ctx context.Context, log *slog.Logger, byPidfd bool) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	if !byPidfd {
		log.Warn("no pidfds: orphans are reaped after a minute as zombies")
	}
	seen := map[int]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		case <-tick.C:
		}
		for _, pid := range reapOnce(byPidfd, seen) {
			log.Debug("reaped an orphan", "pid", pid)
		}
	}
}

// reapOnce reaps the orphaned zombie children and returns their pids. seen
// records when zombies were first seen, for the case without pidfds.
func reapOnce(byPidfd bool, seen map[int]time.Time) []int {
	zombies := exitedChildren()
	if len(zombies) == 0 {
		return nil
	}
	var owned map[int]bool
	if byPidfd {
		owned = pidfdPids()
	}
	now := time.Now()
	var reaped []int
	for _, pid := range zombies {
		if byPidfd && owned[pid] {
			continue
		}
		if !byPidfd {
			first, ok := seen[pid]
			if !ok {
				seen[pid] = now
			}
			if !ok || now.Sub(first) < time.Minute {
				continue
			}
			delete(seen, pid)
		}
		var ws syscall.WaitStatus
		if got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); got == pid && err == nil {
			reaped = append(reaped, pid)
		}
	}
	return reaped
}

// exitedChildren lists this process's children that have exited and wait to
// be reaped. It reads only this process's own /proc entries (the children
// of each of its threads) and asks the kernel about each child with a wait
// that reaps nothing (WNOWAIT): reading a child's own /proc files would make
// its reaping cost more (the kernel flushes its /proc dentries then).
//
// It first asks the kernel whether any child is a zombie at all (one
// waitid(2) over every child, reaping nothing): most often none is, when
// the exit that woke the reaper has been reaped by its waiter, and the
// walk of /proc — a read of every thread's children file, under gVisor
// several milliseconds — is then spared.
func exitedChildren() []int {
	if !anyExited() {
		return nil
	}
	tasks, err := proctree.ReadProcDir("self/task")
	if err != nil {
		return nil
	}
	var out []int
	for _, task := range tasks {
		b, _ := proctree.ReadProc("self/task/" + task + "/children")
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			var info unix.Siginfo
			err = unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
			// Linux sets si_signo to SIGCHLD when it found the child
			// waitable, and to 0 when not (WNOHANG).
			if err == nil && info.Signo == int32(unix.SIGCHLD) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// anyExited reports whether a child of this process (of any thread,
// whatever its exit signal) has exited and waits to be reaped; an error
// other than ECHILD (no child at all) says yes, so that the caller looks.
func anyExited() bool {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT|unix.WALL, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.ECHILD:
			return false
		case err != nil:
			return true
		}
		// With WNOHANG the kernel leaves si_signo 0 when no child is
		// waitable (and sets it to SIGCHLD for the one it found).
		return info.Signo == int32(unix.SIGCHLD)
	}
}

// probePidfds starts this binary once and reports whether the agent then
// holds a pidfd for it.
func probePidfds() bool {
	p, err := os.StartProcess("/proc/self/exe", []string{"sandboxd-agent"}, &os.ProcAttr{
		Env: []string{probeEnv + "=1"},
	})
	if err != nil {
		return false
	}
	defer p.Wait()
	return pidfdPids()[p.Pid]
}

// pidfdPids returns the pids of the processes this process holds a pidfd
// for.
func pidfdPids() map[int]bool {
	fds, err := proctree.ReadProcDir("self/fd")
	if err != nil {
		return nil
	}
	out := map[int]bool{}
	for _, fd := range fds {
		if target, err := proctree.ReadlinkProc("self/fd/" + fd); err != nil || target != "anon_inode:[pidfd]" {
			continue
		}
		info, err := proctree.ReadProc("self/fdinfo/" + fd)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(info)) {
			if v, ok := strings.CutPrefix(line, "Pid:"); ok {
				if pid, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					out[pid] = true
				}
			}
		}
	}
	return out
}

// undumpable keeps the agent out of its commands' reach: a process that is
// not dumpable can be traced (ptrace, process_vm_readv, pidfd_getfd) and
// its /proc files read only by one with CAP_SYS_PTRACE, which no command
// has, although they run as the agent's user. execve makes a command
// dumpable again, so debuggers keep working on the command's own processes.
func undumpable() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}
