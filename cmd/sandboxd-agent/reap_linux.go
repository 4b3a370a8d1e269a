package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
func exitedChildren() []int {
	tasks, err := readSelfDir("task")
	if err != nil {
		return nil
	}
	var out []int
	for _, task := range tasks {
		b, _ := readSelf("task/" + task + "/children")
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

// procSelf is /proc/self, open for the life of the agent (-1 if it cannot
// be opened). Its files are read through it (openat), not by absolute
// paths: in a container the root is often a FUSE file system
// (fuse-overlayfs), which the kernel asks about every path walked through
// it, a round trip to a user-space daemon each.
var procSelf = sync.OnceValue(func() int {
	fd, err := unix.Open("/proc/self", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
})

// openSelf opens /proc/self/NAME.
func openSelf(name string, flags int) (*os.File, error) {
	fd, err := unix.Openat(procSelf(), name, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readSelf reads the file /proc/self/NAME.
func readSelf(name string) ([]byte, error) {
	f, err := openSelf(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// readSelfDir lists the directory /proc/self/NAME.
func readSelfDir(name string) ([]string, error) {
	f, err := openSelf(name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
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
	fds, err := readSelfDir("fd")
	if err != nil {
		return nil
	}
	out := map[int]bool{}
	for _, fd := range fds {
		if target, err := readlinkSelf("fd/" + fd); err != nil || target != "anon_inode:[pidfd]" {
			continue
		}
		info, err := readSelf("fdinfo/" + fd)
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

// readlinkSelf reads the symbolic link /proc/self/NAME.
func readlinkSelf(name string) (string, error) {
	buf := make([]byte, 64)
	n, err := unix.Readlinkat(procSelf(), name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
