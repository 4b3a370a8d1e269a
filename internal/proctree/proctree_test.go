package proctree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// adoptEnv makes the test binary call AdoptOrphans before it runs the tests
// (Linux): TestAdopted runs its tests, and those of the rest of the suite
// that hold for both modes, in such a process.
const adoptEnv = "PROCTREE_TEST_ADOPT"

// impls are the implementations a test runs against: the platform's own and,
// where that is the shim, the process-group one too.
func impls() map[string]bool {
	if startsShim {
		return map[string]bool{"shim": false, "group": true}
	}
	return map[string]bool{"group": true}
}

// bash runs script and returns its exit, output and Wait error.
func bash(t *testing.T, ctx context.Context, direct bool, script string) (Exit, string, error) {
	t.Helper()
	var out bytes.Buffer
	p, err := Start(ctx, Spec{
		Argv: []string{"bash", "-c", script}, Env: os.Environ(), Dir: t.TempDir(),
		Stdout: &out, Stderr: &out, WaitDelay: 500 * time.Millisecond, direct: direct,
	})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait()
	return exit, out.String(), err
}

func TestExit(t *testing.T) {
	tests := []struct {
		script string
		code   int
		signal string
	}{
		{"true", 0, ""},
		{"exit 3", 3, ""},
		{"kill -TERM $$", -1, "SIGTERM"},
		{"kill -KILL $$", -1, "SIGKILL"},
	}
	for name, direct := range impls() {
		for _, tt := range tests {
			t.Run(name+"/"+tt.script, func(t *testing.T) {
				exit, _, err := bash(t, t.Context(), direct, tt.script)
				if err != nil {
					t.Fatal(err)
				}
				if exit.Code != tt.code || exit.Signal != tt.signal || exit.Killed {
					t.Errorf("exit = %+v, want code %d signal %q", exit, tt.code, tt.signal)
				}
			})
		}
	}
	noChildren(t)
}

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "hello"), "#!/bin/sh\necho hi from $0\n", 0o755)
	writeFile(t, filepath.Join(dir, "plain"), "echo no\n", 0o644)
	env := []string{"PATH=" + dir}
	tests := []struct {
		argv0 string
		want  error
	}{
		{"no-such-program-xyz", fs.ErrNotExist},
		{"plain", fs.ErrPermission},
		{"./plain", fs.ErrPermission},
		{"./missing", fs.ErrNotExist},
	}
	for name, direct := range impls() {
		for _, tt := range tests {
			t.Run(name+"/"+tt.argv0, func(t *testing.T) {
				_, err := Start(t.Context(), Spec{Argv: []string{tt.argv0}, Env: env, Dir: dir, direct: direct})
				var pe *fs.PathError
				if !errors.As(err, &pe) || pe.Op != "exec" || !errors.Is(err, tt.want) {
					t.Fatalf("Start = %v, want an exec *fs.PathError matching %v", err, tt.want)
				}
			})
		}
		t.Run(name+"/PATH of Env", func(t *testing.T) {
			var out bytes.Buffer
			p, err := Start(t.Context(), Spec{Argv: []string{"hello"}, Env: env, Stdout: &out, direct: direct})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Wait(); err != nil || out.String() != "hi from "+dir+"/hello\n" {
				t.Fatalf("Wait = %v, output %q", err, out.String())
			}
		})
	}
	noChildren(t)
}

func TestEnvironment(t *testing.T) {
	for name, direct := range impls() {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			p, err := Start(t.Context(), Spec{
				Argv:   []string{"/usr/bin/env"},
				Env:    []string{"A=1", markerEnv + "=" + markerValue},
				Stdout: &out, direct: direct,
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Wait(); err != nil {
				t.Fatal(err)
			}
			if out.String() != "A=1\n" {
				t.Errorf("environment = %q, want only A=1", out.String())
			}
		})
	}
}

type failingWriter struct{ calls int }

func (w *failingWriter) Write(p []byte) (int, error) {
	w.calls++
	return 0, errors.New("full")
}

func TestWriterError(t *testing.T) {
	w := &failingWriter{}
	p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", "head -c 1000000 /dev/zero"}, Env: os.Environ(), Stdout: w})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait()
	if err == nil || err.Error() != "full" || exit.Code != 0 || w.calls != 1 {
		t.Fatalf("Wait = %+v, %v after %d writes; want the writer's error once and a whole run", exit, err, w.calls)
	}
}

// The process-group implementation kills the group when the main process
// exits, and, since it cannot find a process that left the group, gives up
// on the output after WaitDelay.
func TestGroupKill(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid command")
	}
	dir := t.TempDir()
	exit, _, err := bash(t, t.Context(), true, `
		cd `+dir+`
		sleep 600 & echo $! > bg
		`+untilSleep+`
		setsid bash -c 'echo $$ > escaped.tmp; mv escaped.tmp escaped; exec sleep 600' &
		# it has left the group, and is sleep (alive knows it by that)
		until [ -e escaped ] && { [ ! -e /proc/self ] || [ "$(cat /proc/$(cat escaped)/comm 2>/dev/null)" = sleep ]; }; do sleep 0.01; done
		exit 0`)
	escaped := readPid(t, filepath.Join(dir, "escaped"))
	defer syscall.Kill(escaped, syscall.SIGKILL)
	if exit.Code != 0 || !errors.Is(err, ErrOutputHeld) {
		t.Errorf("Wait = %+v, %v; want exit 0 and ErrOutputHeld", exit, err)
	}
	pidsGone(t, dir, false, "bg") // killed with the group; Wait waited for the output only
	if !alive(escaped) {
		t.Errorf("setsid escapee %d died; this test documents that the group kill misses it", escaped)
	}
}

func writeFile(t *testing.T, name, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

func readPid(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// alive reports whether pid is still a "sleep 600" (so that a reused pid is
// not mistaken for the process). A zombie has no command line: it is gone.
// Where there is /proc, a command line that cannot be read is a process
// gone too: the process ended (and was reaped) between the kill(pid, 0) and
// the read; taking it for alive made a process that ended during the check
// a survivor. Where there is none, only kill(pid, 0) tells.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	if _, err := os.Stat("/proc/self"); err != nil {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && string(b) == "sleep\x00600\x00"
}

// untilSleep, after "sleep 600 &", waits until the background job is sleep:
// alive, which knows a process by its command line (so that a reused pid is
// not taken for it), would take the forked shell for a process gone. Where
// there is no /proc, it does not wait.
const untilSleep = `until [ ! -e /proc/self ] || [ "$(cat /proc/$!/comm 2>/dev/null)" = sleep ]; do sleep 0.01; done`

// goneTimeout bounds the wait for a killed process to end: only a hang
// (a process that was never killed) outlasts it.
const goneTimeout = 60 * time.Second

// pidsGone fails the test unless the processes whose pids the files names in
// dir hold have ended. With promised, Wait has returned and promised the tree
// gone, so a process still running at the check is an error even if it ends
// later; without, the kill was sent from outside and nothing waited for it,
// so the processes are given goneTimeout to end. The failure says which it
// was: the tree survived (a process still runs after goneTimeout, with or
// without a SIGKILL pending), or the check ran before the kill had completed.
func pidsGone(t *testing.T, dir string, promised bool, names ...string) {
	t.Helper()
	pids := make([]int, len(names))
	var early []string
	for i, name := range names {
		pids[i] = readPid(t, filepath.Join(dir, name))
		if alive(pids[i]) {
			early = append(early, describePid(name, pids[i]))
		}
	}
	began := time.Now()
	deadline := began.Add(goneTimeout)
	var survivors []string
	for i, pid := range pids {
		// One answer decides: asking again after the loop could see a
		// process the loop saw end (alive is not monotonic in what it can
		// read of a process being reaped).
		live := alive(pid)
		for live && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			live = alive(pid)
		}
		if live {
			survivors = append(survivors, describePid(names[i], pid))
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	switch {
	case len(survivors) > 0:
		t.Errorf("the tree survived: still running %v after the check began: %s", time.Since(began).Round(time.Millisecond), strings.Join(survivors, ", "))
	case promised && len(early) > 0:
		t.Errorf("Wait returned before the kill completed: still running when it returned, gone later: %s", strings.Join(early, ", "))
	case len(early) > 0:
		t.Logf("still dying when checked (the kill was sent from outside; nothing waits for it): %s", strings.Join(early, ", "))
	}
}

// describePid names the process pid, recorded in the file name, with its
// state and whether a SIGKILL is pending: one that is has been killed and
// not yet run to its end, one that is not was never killed.
func describePid(name string, pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	state, killed := "?", false
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			state = v
		case "SigPnd", "ShdPnd":
			if mask, err := strconv.ParseUint(v, 16, 64); err == nil && mask&(1<<(syscall.SIGKILL-1)) != 0 {
				killed = true
			}
		}
	}
	pending := "no SIGKILL pending"
	if killed {
		pending = "SIGKILL pending"
	}
	return fmt.Sprintf("%s %d (%s, %s)", name, pid, state, pending)
}

// awaitFile waits until the file name is not empty, or fails the test after
// goneTimeout, calling cleanup first.
func awaitFile(t *testing.T, name string, cleanup func()) {
	t.Helper()
	for deadline := time.Now().Add(goneTimeout); ; time.Sleep(10 * time.Millisecond) {
		if fi, err := os.Stat(name); err == nil && fi.Size() > 0 {
			return
		}
		if time.Now().After(deadline) {
			cleanup()
			t.Fatalf("the command never wrote %s", filepath.Base(name))
		}
	}
}

// noChildren fails when the test process has children left: zombies the
// package did not reap, or shims that did not exit. The idle shims kept for
// reuse are ended first: a shim that is not idle is still there.
func noChildren(t *testing.T) {
	t.Helper()
	CloseIdle()
	if _, err := os.Stat("/proc/self/task"); err != nil {
		return
	}
	pids := childrenOfSelf()
	if len(pids) > 0 {
		t.Errorf("children left behind: %v", pids)
	}
}

func childrenOfSelf() []int {
	var out []int
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			out = append(out, pid)
		}
	}
	return out
}

// The cost of starting and reaping a command, with each implementation:
// besides Go's mean, the median wall time (p50-µs) and the CPU time per
// command (cpu-µs: this process's and its reaped children's, user and
// system), which a shared, loaded machine disturbs far less.
func benchStart(b *testing.B, direct bool, argv ...string) {
	durs := make([]time.Duration, 0, b.N)
	cpu0 := cpuTime()
	for b.Loop() {
		t0 := time.Now()
		p, err := Start(b.Context(), Spec{Argv: argv, direct: direct})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Wait(); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(t0))
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(len(durs)), "cpu-µs")
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds()), "p50-µs")
}

// cpuTime is the CPU time used so far by this process and its reaped
// descendants.
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	var ns int64
	for _, tv := range []syscall.Timeval{self.Utime, self.Stime, children.Utime, children.Stime} {
		ns += tv.Nano()
	}
	return time.Duration(ns)
}

// BenchmarkStart runs /bin/true and bash -c true with each implementation,
// or, with PROCTREE_TEST_ADOPT=1, in a process that adopts orphans (a
// command that runs alone runs directly):
//
//	go test ./internal/proctree -run '^$' -bench Start -benchtime 300x
//	PROCTREE_TEST_ADOPT=1 go test ./internal/proctree -run '^$' -bench Start -benchtime 300x
func BenchmarkStart(b *testing.B) {
	if os.Getenv(adoptEnv) != "" {
		b.Run("adopted/true", func(b *testing.B) { benchStart(b, false, "/bin/true") })
		b.Run("adopted/bash", func(b *testing.B) { benchStart(b, false, "bash", "-c", "true") })
		return
	}
	for name, direct := range impls() {
		b.Run(name+"/true", func(b *testing.B) { benchStart(b, direct, "/bin/true") })
		b.Run(name+"/bash", func(b *testing.B) { benchStart(b, direct, "bash", "-c", "true") })
	}
}
