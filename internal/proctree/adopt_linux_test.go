package proctree

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if os.Getenv(adoptEnv) != "" {
		if err := AdoptOrphans(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// adoptedTests are run again in a process that adopts orphans, where every
// command that runs alone runs directly.
var adoptedTests = []string{
	"TestExit", "TestStartErrors", "TestEnvironment", "TestWriterError",
	"TestShimKillsTreeWhenMainExits", "TestShimKillsTreeOnCancel",
	"TestShimSurvivesKillZero", "TestShimDescriptors", "TestOOMScoreAdj",
	"TestAdoptedDirectAlone", "TestAdoptedOverlap",
}

func TestAdopted(t *testing.T) {
	if os.Getenv(adoptEnv) != "" {
		t.Skip("already adopting")
	}
	args := []string{"-test.run=^(" + strings.Join(adoptedTests, "|") + ")$", "-test.v"}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), adoptEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the suite in a process that adopts orphans: %v\n%s", err, out)
	}
	for _, name := range adoptedTests {
		if !strings.Contains(string(out), "--- PASS: "+name) {
			t.Errorf("%s did not pass in adopted mode:\n%s", name, out)
		}
	}
}

// requireAdopted skips a test unless the process adopts orphans (TestAdopted
// runs it in one that does).
func requireAdopted(t *testing.T) {
	t.Helper()
	if os.Getenv(adoptEnv) == "" {
		t.Skip("runs under TestAdopted")
	}
}

// A command that runs alone runs without a shim, and its end kills every
// escape, as the shim's would.
func TestAdoptedDirectAlone(t *testing.T) {
	requireAdopted(t)
	dir := t.TempDir()
	p, err := Start(t.Context(), Spec{Argv: []string{"bash", "-c", escapes(dir) + "exit 7"}, Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.tree.(*directTree); !ok {
		t.Errorf("a command alone runs under %T, want *directTree", p.tree)
	}
	if exit, err := p.Wait(); err != nil || exit.Code != 7 {
		t.Fatalf("Wait = %+v, %v", exit, err)
	}
	checkGone(t, dir, true)
	noChildren(t)
}

// A command started while a direct one runs is under a shim, and the direct
// command's end, which kills what it left behind (a setsid'd process among
// them), leaves the shimmed command and its own escapes running.
func TestAdoptedOverlap(t *testing.T) {
	requireAdopted(t)
	ddir, sdir := t.TempDir(), t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	lines := bufio.NewReader(r)
	direct, err := Start(t.Context(), Spec{
		Argv: []string{"bash", "-c", escapes(ddir) + "until [ -e go ]; do sleep 0.01; done"},
		Env:  os.Environ(), Stdout: w,
	})
	if err != nil {
		w.Close()
		t.Fatal(err)
	}
	if line, _ := lines.ReadString('\n'); line != "started\n" {
		t.Fatalf("direct command: output %q", line)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	shimmed, err := Start(ctx, Spec{Argv: []string{"bash", "-c", escapes(sdir) + "sleep 600"}, Env: os.Environ(), Stdout: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := shimmed.tree.(*shimTree); !ok {
		t.Fatalf("a command started beside a direct one runs under %T, want *shimTree", shimmed.tree)
	}
	if line, _ := lines.ReadString('\n'); line != "started\n" {
		t.Fatalf("shimmed command: output %q", line)
	}
	writeFile(t, filepath.Join(ddir, "go"), "", 0o644)
	if exit, err := direct.Wait(); err != nil || exit.Code != 0 {
		t.Fatalf("direct command: Wait = %+v, %v", exit, err)
	}
	checkGone(t, ddir, true)
	for _, f := range escapeFiles {
		// Not alive: the process may not have executed sleep yet.
		if pid := readPid(t, filepath.Join(sdir, f)); !running(pid) {
			t.Errorf("the direct command's end killed the shimmed command's %s (%d)", f, pid)
		}
	}
	if err := shimmed.tree.(*shimTree).shim.proc.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the direct command's end killed the shim: %v", err)
	}

	runTrue(t, "*proctree.shimTree") // beside the shimmed command
	cancel()
	if exit, err := shimmed.Wait(); err != nil || !exit.Killed {
		t.Fatalf("shimmed command: Wait = %+v, %v; want it killed", exit, err)
	}
	checkGone(t, sdir, true)
	runTrue(t, "*proctree.directTree") // alone again
	noChildren(t)
}

// runTrue runs true and checks that it ran under a tree of type want.
func runTrue(t *testing.T, want string) {
	t.Helper()
	p, err := Start(t.Context(), Spec{Argv: []string{"true"}, Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%T", p.tree); got != want {
		t.Errorf("true runs under %s, want %s", got, want)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
}

// running reports whether pid is a process that has not exited.
func running(pid int) bool {
	s := procState(pid)
	return s != 0 && s != 'Z'
}

// childless, the sweep's shortcut, says no only while a child of any kind
// is there: running, or a zombie not yet reaped.
func TestChildless(t *testing.T) {
	CloseIdle()
	if !childless() {
		t.Skipf("the test process has children already: %v", childrenOfSelf())
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if childless() {
		t.Error("childless with a child running")
	}
	cmd.Process.Kill()
	for {
		var info unix.Siginfo
		// Until it is a zombie, without reaping it.
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
			break
		}
	}
	if childless() {
		t.Error("childless with a zombie child")
	}
	cmd.Wait()
	if !childless() {
		t.Errorf("not childless once the child is reaped: %v", childrenOfSelf())
	}
}
