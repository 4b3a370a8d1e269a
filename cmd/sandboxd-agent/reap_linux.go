package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// probeEnv marks the child reapOrphans starts once to learn whether this
// process holds a pidfd for each child it starts.
const probeEnv = "SANDBOXD_AGENT_PROBE"

// reapOrphans is PID 1's duty: it reaps the zombies among the agent's
// children that no one in the agent waits for, each time a child exits.
//
// The agent's own children — the proctree shims localexec starts, each
// waited for by os.Process.Wait — must be left to their waiters, or their
// exit statuses would be stolen. The Go runtime holds a pidfd for every child
// it starts, from the clone that creates it until Wait has reaped it, so a
// zombie child for which the agent holds no pidfd is an orphan the kernel
// handed to PID 1: those are reaped. The zombies are listed before the
// pidfds are, so a child started in between is never mistaken for an orphan.
//
// Where the runtime holds no pidfds (kernels before 5.4, or a seccomp profile
// that forbids them), ownership cannot be told; a zombie is then reaped only
// once it has stayed one for a minute, which no waited-for child does.
func reapOrphans(ctx context.Context, log *slog.Logger) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	byPidfd := probePidfds()
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
	zombies := zombieChildren(os.Getpid())
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

// zombieChildren lists the zombie processes whose parent is ppid.
func zombieChildren(ppid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) S ppid …", where comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) >= 2 && fields[0] == "Z" && fields[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}

// pidfdPids returns the pids of the processes this process holds a pidfd
// for.
func pidfdPids() map[int]bool {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	out := map[int]bool{}
	for _, fd := range fds {
		if target, err := os.Readlink("/proc/self/fd/" + fd.Name()); err != nil || target != "anon_inode:[pidfd]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + fd.Name())
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
