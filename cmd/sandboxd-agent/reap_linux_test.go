package main

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

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
	waitFor(t, "the child to become a zombie", func() bool { return slices.Contains(zombieChildren(os.Getpid()), p.Pid) })
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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
