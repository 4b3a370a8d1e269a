package proctree

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// escapes starts "sleep 600" in every way a process can try to outlive a
// command, each writing its pid to a file in dir.
func escapes(dir string) string {
	return fmt.Sprintf(`
		cd %q
		sleep 600 & echo $! > background
		nohup sleep 600 >/dev/null 2>&1 & echo $! > nohup
		setsid sleep 600 & echo $! > setsid
		(sleep 600 & echo $! > doublefork) &
		setsid bash -c 'sleep 600 & echo $! > setsid-child' &
		( trap '' TERM HUP; exec sleep 600 ) & echo $! > ignores-term
		for f in background nohup setsid doublefork setsid-child ignores-term; do
			# until it is sleep: alive does not know the forked shell
			until [ -s $f ] && [ "$(cat /proc/$(cat $f)/comm 2>/dev/null)" = sleep ]; do sleep 0.01; done
		done
		echo started
	`, dir)
}

var escapeFiles = []string{"background", "nohup", "setsid", "doublefork", "setsid-child", "ignores-term"}

// checkGone fails the test unless every escape recorded in dir has ended
// (see pidsGone).
func checkGone(t *testing.T, dir string, promised bool) {
	t.Helper()
	pidsGone(t, dir, promised, escapeFiles...)
}

func TestShimKillsTreeWhenMainExits(t *testing.T) {
	dir := t.TempDir()
	exit, out, err := bash(t, t.Context(), false, escapes(dir)+"exit 7")
	if err != nil || exit.Code != 7 || exit.Killed {
		t.Fatalf("Wait = %+v, %v (output %q); want exit 7, no error: the tree kill closes the pipes", exit, err, out)
	}
	checkGone(t, dir, true)
	noChildren(t)
}

func TestShimKillsTreeOnCancel(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, err := Start(ctx, Spec{Argv: []string{"bash", "-c", escapes(dir) + "sleep 600"}, Env: os.Environ(), Stdout: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(r).ReadString('\n')
	if line != "started\n" {
		t.Fatalf("output %q", line)
	}
	cancel()
	exit, err := p.Wait()
	if err != nil || exit.Code != -1 || exit.Signal != "SIGKILL" || !exit.Killed {
		t.Fatalf("Wait = %+v, %v; want killed by SIGKILL", exit, err)
	}
	checkGone(t, dir, true)
	noChildren(t)
}

// A command that kills its own process group does not take the shim along.
func TestShimSurvivesKillZero(t *testing.T) {
	exit, _, err := bash(t, t.Context(), false, "sleep 600 & kill -KILL 0")
	if err != nil || exit.Signal != "SIGKILL" || exit.Killed {
		t.Fatalf("Wait = %+v, %v; want the command's own SIGKILL reported", exit, err)
	}
	noChildren(t)
}

// When the process that started the shim dies, the shim kills the tree.
func TestShimKillsTreeWhenParentDies(t *testing.T) {
	if os.Getenv("PROCTREE_TEST_PARENT") != "" {
		p, err := Start(context.Background(), Spec{Argv: []string{"bash", "-c", escapes(os.Getenv("PROCTREE_TEST_PARENT")) + "echo 1 > started; sleep 600"}, Env: os.Environ()})
		if err != nil {
			os.Exit(2)
		}
		p.Wait()
		os.Exit(3)
	}
	dir := t.TempDir()
	parent := exec.Command(os.Args[0], "-test.run=^TestShimKillsTreeWhenParentDies$")
	parent.Env = append(os.Environ(), "PROCTREE_TEST_PARENT="+dir)
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	awaitFile(t, filepath.Join(dir, "started"), func() { parent.Process.Kill() })
	parent.Process.Kill()
	parent.Wait()
	checkGone(t, dir, false) // the shim's cleanup runs on its own now
}

// The shim must not leak its protocol descriptors into the command, nor
// descriptors the test process inherited without close-on-exec.
func TestShimDescriptors(t *testing.T) {
	exit, out, err := bash(t, t.Context(), false, "ls /proc/self/fd")
	if err != nil || exit.Code != 0 {
		t.Fatal(exit, err)
	}
	// ls itself opens one descriptor for the directory: 0 1 2 and 3.
	if out != "0\n1\n2\n3\n" {
		t.Errorf("descriptors of the command: %q", out)
	}
}

// A shim that dies without reporting is an error, and the program's process
// group goes with it.
func TestShimKilled(t *testing.T) {
	dir := t.TempDir()
	p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", "cd " + dir + "; sleep 600 & echo $! > background; echo $$ > main; " + untilSleep + "; exec sleep 600"}, Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	awaitFile(t, filepath.Join(dir, "main"), func() { p.KillTree(); p.Wait() })
	p.tree.(*shimTree).shim.proc.Kill()
	if exit, err := p.Wait(); err == nil || exit.Code != -1 {
		t.Errorf("Wait = %+v, %v; want an error", exit, err)
	}
	// Wait killed the group on its way out, and did not wait for it.
	pidsGone(t, dir, false, "background", "main")
}

// A program that kills its shim as its first act does not escape with its
// tree: it runs only once the shim has told the parent its process group,
// however long the shim takes to (here the report is held back 300ms).
func TestShimKilledByItsProgram(t *testing.T) {
	CloseIdle() // a shim started with the delay below
	t.Setenv(reportDelayEnv, "300ms")
	defer CloseIdle()
	dir := t.TempDir()
	p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", "cd " + dir + "; sleep 600 & echo $! > background; echo $$ > main; " + untilSleep + "; kill -9 $PPID; exec sleep 600"}, Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	if exit, err := p.Wait(); err == nil || exit.Code != -1 {
		t.Errorf("Wait = %+v, %v; want an error", exit, err)
	}
	pidsGone(t, dir, false, "background", "main")
}

// A command that stops the shim, once or again and again, does not stop the
// tree kill: the context ends once the shim has been seen stopped.
func TestShimStopped(t *testing.T) {
	for _, script := range []string{
		"kill -STOP $PPID; sleep 600",
		"(while :; do kill -STOP $PPID; done) & sleep 600",
	} {
		t.Run(script, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			p, err := Start(ctx, Spec{Argv: []string{"bash", "-c", script}, Env: os.Environ()})
			if err != nil {
				t.Fatal(err)
			}
			shim := p.tree.(*shimTree).shim.proc.Pid
			for deadline := time.Now().Add(goneTimeout); procState(shim) != 'T'; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					cancel()
					p.Wait()
					t.Fatalf("the command did not stop the shim within %v", goneTimeout)
				}
			}
			cancel()
			if exit, err := p.Wait(); err != nil || !exit.Killed {
				t.Fatalf("Wait = %+v, %v; want the tree killed", exit, err)
			}
		})
	}
	noChildren(t)
}

// A shim that does not kill its tree when told to (here: it ignores
// SIGTERM, as a shim stopped again and again by its program cannot act on
// it) does not keep the tree alive: the parent kills it from outside within
// a tick, the shim reaps it and reports the program killed. Without that the
// tree lived until the last resort, which left Wait without a report.
func TestShimDeaf(t *testing.T) {
	t.Setenv(deafEnv, "1")
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", escapes(dir) + "sleep 600"}, Env: os.Environ(), Stdout: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	st := p.tree.(*shimTree)
	if line, _ := bufio.NewReader(r).ReadString('\n'); line != "started\n" {
		st.shim.proc.Kill()
		p.Wait()
		t.Fatalf("output %q", line)
	}
	p.KillTree()
	// The last resort would kill the tree too, but only at its deadline:
	// put it where only a tree that never died by the ticks reaches it.
	st.mu.Lock()
	st.deadline = time.Now().Add(goneTimeout)
	st.mu.Unlock()
	exit, err := p.Wait()
	if err != nil || !exit.Killed || exit.Signal != "SIGKILL" {
		t.Fatalf("Wait = %+v, %v; want the tree killed", exit, err)
	}
	if st.doomed {
		t.Fatalf("the tree died by the last resort, %v after it was to, not within a tick", goneTimeout)
	}
	checkGone(t, dir, true)
	noChildren(t)
}

// procState is the state letter of pid ('R', 'S', 'T', 'Z' …), or 0 when
// there is no such process.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := bytes.LastIndexByte(b, ')') // "pid (comm) S …"
	if err != nil || i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// When the shim cannot finish (here: it is stopped and its deadline has
// passed), the parent kills what the shim would have, and then the shim.
func TestShimLastResort(t *testing.T) {
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", escapes(dir) + "sleep 600"}, Env: os.Environ(), Stdout: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(r).ReadString('\n'); line != "started\n" {
		t.Fatalf("output %q", line)
	}
	st := p.tree.(*shimTree)
	syscall.Kill(st.shim.proc.Pid, syscall.SIGSTOP)
	st.mu.Lock()
	st.deadline = time.Now()
	st.mu.Unlock()
	st.tick()
	if exit, err := p.Wait(); err == nil {
		t.Errorf("Wait = %+v, nil; want an error: the shim did not report", exit)
	}
	checkGone(t, dir, true) // killed from outside, and Wait waited for them

	noChildren(t)
}

// OOMScoreAdj reaches the command (at once under the shim, just after it
// started otherwise), and the caller keeps its own value.
func TestOOMScoreAdj(t *testing.T) {
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Skip(err)
	}
	script := `for i in $(seq 300); do [ "$(cat /proc/$$/oom_score_adj)" = 1000 ] && break; sleep 0.01; done
		cat /proc/$$/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'`
	for name, direct := range impls() {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", script}, Env: os.Environ(), Stdout: &out, OOMScoreAdj: 1000, direct: direct})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Wait(); err != nil {
				t.Fatal(err)
			}
			if out.String() != "1000\n1000\n" {
				t.Errorf("the command's and its child's oom_score_adj: %q, want 1000 twice", out.String())
			}
			if now, _ := os.ReadFile("/proc/self/oom_score_adj"); !bytes.Equal(now, own) {
				t.Errorf("the caller's oom_score_adj went from %q to %q", own, now)
			}
		})
	}
}

// The shim protocol's text forms read back as written.
func TestShimProtocol(t *testing.T) {
	for _, spec := range []shimSpec{
		{Path: "/bin/x", Dir: "/a b", OOM: -5, Argv: []string{"x", "two words", "", "line\nbreak"}, Env: []string{"A=1", "B="}},
		{Path: "/bin/bash", Dir: "/", Tty: true, Argv: []string{"bash", "-i"}, Env: []string{}},
	} {
		if got, err := decodeSpec(spec.encode()); err != nil || !reflect.DeepEqual(got, spec) {
			t.Errorf("spec: %+v, %v; want %+v", got, err, spec)
		}
	}
	for _, bad := range []string{"", "p\x00d\x000\x000\x00", "p\x00d\x000\x000\x001\x00", "p\x00d\x00x\x000\x001\x00a\x00",
		"p\x00d\x000\x000\x005\x00a\x00", "p\x00d\x000\x002\x001\x00a\x00"} {
		if _, err := decodeSpec([]byte(bad)); err == nil {
			t.Errorf("decodeSpec(%q) succeeded", bad)
		}
	}
	msgs := []shimMsg{
		{Ready: true}, {Pid: 42}, {Errno: 2, Error: "no such\nfile"}, {Error: "PR_SET_CHILD_SUBREAPER: x"},
		{Exit: &Exit{Code: -1, Signal: "SIGKILL", Killed: true, Duration: 1500 * time.Microsecond}},
		{Exit: &Exit{Code: 3, Duration: time.Second}},
	}
	var stream bytes.Buffer
	for _, m := range msgs {
		stream.Write(m.encode())
	}
	r := bufio.NewReader(&stream)
	for _, want := range msgs {
		if want.Error != "" {
			want.Error = strings.ReplaceAll(want.Error, "\n", " ")
		}
		got, err := readMsg(r)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("message: %+v (%+v), %v; want %+v (%+v)", got, got.Exit, err, want, want.Exit)
		}
	}
	if _, err := readMsg(r); err != io.EOF {
		t.Errorf("after the last message: %v", err)
	}
	for _, bad := range []string{"pid x\n", "exit 1 - 0\n", "hello\n", "ready"} {
		if _, err := readMsg(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("readMsg(%q) succeeded", bad)
		}
	}
}

// A shim serves the next command once its tree is gone, unless it was told
// to kill the tree; a shim that died idle is replaced; a command whose
// oom_score_adj differs gets a shim of its own.
func TestShimReuse(t *testing.T) {
	CloseIdle()
	defer noChildren(t)
	dir := t.TempDir()
	// shimOf runs a command that leaves a sleep behind, checks that it is
	// gone after Wait, and returns the pid of the command's shim.
	shimOf := func(oom int, also ...string) int {
		t.Helper()
		var out bytes.Buffer
		script := "cd " + dir + "; sleep 600 & echo $! > background; " + untilSleep + "; echo $PPID; " + strings.Join(also, "; ")
		p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", script}, Env: os.Environ(), Stdout: &out, OOMScoreAdj: oom})
		if err != nil {
			t.Fatal(err)
		}
		if exit, err := p.Wait(); err != nil || exit.Code != 0 {
			t.Fatalf("Wait = %+v, %v (output %q)", exit, err, out.String())
		}
		if pid := readPid(t, filepath.Join(dir, "background")); alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("the background sleep %d survived", pid)
		}
		ppid, err := strconv.Atoi(strings.TrimSpace(out.String()))
		if err != nil {
			t.Fatalf("output %q", out.String())
		}
		return ppid
	}
	first := shimOf(0)
	if again := shimOf(0); again != first {
		t.Errorf("the second command ran under shim %d, the first under %d: want the same", again, first)
	}
	if other := shimOf(500); other == first {
		t.Errorf("a command with another oom_score_adj ran under the same shim %d", other)
	}

	// A command that changes what its shim's next command would inherit
	// from it retires the shim.
	for _, change := range []string{
		"renice -n 3 -p $PPID >/dev/null",
		"prlimit --pid $PPID --nofile=200:",
		"prlimit --pid $PPID --core=0:0",
		"echo 700 > /proc/$PPID/oom_score_adj",
	} {
		if _, err := exec.LookPath(strings.Fields(change)[0]); err != nil && change[0] != 'e' {
			continue
		}
		changed := shimOf(0, change)
		if next := shimOf(0); next == changed {
			t.Errorf("after %q the shim %d served again", change, changed)
		}
	}
	first = shimOf(0)

	// Killed: the shim ends with the tree, and the next command gets another.
	p, err := Start(t.Context(), Spec{Argv: []string{"sleep", "600"}, Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	victim := p.tree.(*shimTree).shim.proc.Pid
	if victim != first {
		t.Errorf("the command ran under shim %d, not the idle %d", victim, first)
	}
	p.KillTree()
	if exit, err := p.Wait(); err != nil || !exit.Killed {
		t.Fatalf("Wait = %+v, %v; want killed", exit, err)
	}
	if next := shimOf(0); next == victim {
		t.Errorf("the shim %d of a killed tree served again", victim)
	}

	// Died idle: the next command starts a new shim and runs.
	dead := shimOf(0)
	syscall.Kill(dead, syscall.SIGKILL)
	// Until every thread of it has exited, and so its socket is closed;
	// not reaped, as it is not until it is taken from the idle shims.
	if err := unix.Waitid(unix.P_PID, dead, nil, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if next := shimOf(0); next == dead {
		t.Errorf("the command ran under the dead shim %d", next)
	}
}
