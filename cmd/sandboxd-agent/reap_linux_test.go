package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"

	"golang.org/x/sys/unix"
)

// TestReapOnceLeavesOwnChildren starts a child that exits at once and checks
// that, while it waits to be reaped by its owner, reapOnce leaves it alone —
// and that an orphan handed to this process is reaped.
func TestReapOnceLeavesOwnChildren(t *testing.T) {
	if !probePidfds() {
		t.Skip("this kernel gives the Go runtime no pidfds")
	}
	p, err := os.StartProcess("/proc/self/exe", []string{"probe"}, &os.ProcAttr{Env: []string{probeEnv + "=1"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to become a zombie", func() bool { return slices.Contains(exitedChildren(), p.Pid) })
	if reaped := reapOnce(true, nil); slices.Contains(reaped, p.Pid) {
		t.Fatalf("reapOnce took its owner's child %d", p.Pid)
	}
	if st, err := p.Wait(); err != nil || !st.Success() {
		t.Fatalf("the owner's Wait: %v, %v", st, err)
	}

	// Become a subreaper so that a grandchild is handed to us when its
	// parent exits without waiting for it.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("no subreaper: %v", err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	if err := exec.Command("sh", "-c", "sleep 0.05 & exit 0").Run(); err != nil {
		t.Fatal(err)
	}
	var reaped []int
	waitFor(t, "the orphan to be reaped", func() bool {
		reaped = append(reaped, reapOnce(true, nil)...)
		return len(reaped) > 0
	})
}

// anyExited, the reaper's shortcut, says yes exactly while a child is a
// zombie: not while it runs, not once it is reaped.
func TestAnyExited(t *testing.T) {
	if anyExited() {
		t.Skip("the test process has a zombie child already")
	}
	p, err := os.StartProcess("/proc/self/exe", []string{"probe"}, &os.ProcAttr{Env: []string{probeEnv + "=1"}, Files: []*os.File{nil, nil, nil}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to become a zombie", anyExited)
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if anyExited() {
		t.Error("a zombie after the child was reaped")
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Wait()
	defer sleep.Process.Kill()
	if anyExited() {
		t.Error("a zombie while the only child runs")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPID1ReapsOrphansOnly runs the agent as PID 1 of a new PID namespace. It
// orphans processes to it (a command kills its own shim) and checks that
// they are reaped while the exit statuses of concurrent commands, which the
// agent's own waiters need, are never stolen.
func TestPID1ReapsOrphansOnly(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("PID namespaces are Linux's")
	}
	if err := exec.Command("unshare", "-p", "-f", "--mount-proc", "true").Run(); err != nil {
		t.Skipf("cannot make a PID namespace here: %v", err)
	}
	p, _ := startAgent(t, "unshare", "-p", "-f", "--kill-child", "--mount-proc")
	c := p.client
	if res, out := run(t, c, "echo $$ $PPID; cat /proc/1/comm"); res.ExitCode != 0 || !strings.Contains(out, "\n") {
		t.Fatalf("Run = %+v %q", res, out)
	}

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := 10 + i
			for range 5 {
				res, err := c.Run(context.Background(), workspace.Command{Script: "exit " + strconv.Itoa(code)})
				if err != nil || res.ExitCode != code {
					t.Errorf("exit %d: %+v, %v", code, res, err)
					return
				}
			}
		}()
	}
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The command's shell kills its shim: it and its child become
			// orphans of PID 1.
			c.Run(context.Background(), workspace.Command{Script: "sleep 0.2 & kill -9 $PPID; wait"})
		}()
	}
	wg.Wait()

	agentPid := agentHostPid(t, p.cmd.Process.Pid)
	deadline := time.Now().Add(time.Minute)
	for {
		z := zombieChildren(agentPid)
		if len(z) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombies left under PID 1: %v; stderr:\n%s", z, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res, _ := run(t, c, "true"); res.ExitCode != 0 {
		t.Errorf("after the orphans: %+v", res)
	}
	p.closeAndWait(t)
}

// agentHostPid finds the agent: the one child of unshare.
func agentHostPid(t *testing.T, unsharePid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(unsharePid) + "/task/" + strconv.Itoa(unsharePid) + "/children")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("children of unshare: %q", b)
	}
	return pid
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

// TestPID1RunsAloneDirectly: as PID 1, the agent runs a command that runs
// alone as its own child (no shim), kills everything it left behind when it
// ends, and makes commands the OOM killer's first choice.
func TestPID1RunsAloneDirectly(t *testing.T) {
	if err := exec.Command("unshare", "-p", "-f", "--mount-proc", "true").Run(); err != nil {
		t.Skipf("cannot make a PID namespace here: %v", err)
	}
	p, _ := startAgent(t, "unshare", "-p", "-f", "--kill-child", "--mount-proc")
	c := p.client
	if _, out := run(t, c, "echo $PPID; cat /proc/$$/oom_score_adj"); out != "1\n1000\n" {
		t.Errorf("parent and oom_score_adj of a command: %q, want 1 (the agent) and 1000", out)
	}
	res, _ := run(t, c, `sleep 600 & nohup sleep 600 >/dev/null 2>&1 & setsid sleep 600 & (sleep 600 &)
		setsid sh -c 'sleep 600 & exit 0' & sleep 0.1`)
	if res.ExitCode != 0 {
		t.Fatalf("Run = %+v", res)
	}
	if _, out := run(t, c, "cat /proc/[0-9]*/comm"); strings.Contains(out, "sleep") {
		t.Errorf("processes left behind by the last command:\n%s", out)
	}
	p.closeAndWait(t)
}
