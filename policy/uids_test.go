package policy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// takeHelperEnv, in a helper process, names the range ("FIRST+COUNT") it
// takes a uid of and holds until its standard input ends.
const takeHelperEnv = "SANDBOXD_TEST_TAKE_UID"

func init() {
	spec := os.Getenv(takeHelperEnv)
	if spec == "" {
		return
	}
	var r UIDRange
	fmt.Sscanf(spec, "%d+%d", &r.First, &r.Count)
	uid, err := r.Take()
	if err == nil && strings.HasSuffix(spec, "+keep") {
		err = KeepUID(uid)
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(uid)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestTakeIsHostWide: a uid another process of the host (another daemon)
// holds is not taken, and is once that process has ended; a range all of
// whose uids are held fails, naming the setting.
func TestTakeIsHostWide(t *testing.T) {
	r := UIDRange{First: 1_900_000_000 + mathrand.IntN(100_000_000), Count: 1} // a range of this test's own
	other := exec.Command(os.Args[0], "-test.run=^TestTakeIsHostWide$")
	other.Env = append(os.Environ(), fmt.Sprintf("%s=%d+%d", takeHelperEnv, r.First, r.Count))
	stdin, _ := other.StdinPipe()
	stdout, _ := other.StdoutPipe()
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Wait()
	defer stdin.Close()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if held, _ := strconv.Atoi(strings.TrimSpace(line)); err != nil || held != r.First {
		t.Fatalf("the other process took %q, %v", line, err)
	}
	if uid, err := r.Take(); err == nil {
		ReleaseUID(uid)
		t.Fatalf("took uid %d, which another process of the host holds", uid)
	} else if !strings.Contains(err.Error(), "policy.sessionUids") {
		t.Errorf("the range spent: %v; want the setting named", err)
	}
	stdin.Close()
	other.Wait()
	uid, err := r.Take()
	if err != nil || uid != r.First {
		t.Fatalf("once the other process ended: %d, %v", uid, err)
	}
	ReleaseUID(uid)
}

// holdElsewhere has another process of the host take the uid of r (a
// range of one), keeping it (KeepUID) with keep, and returns a function
// that ends that process.
func holdElsewhere(t *testing.T, r UIDRange, keep bool) (end func()) {
	t.Helper()
	spec := fmt.Sprintf("%d+%d", r.First, r.Count)
	if keep {
		spec += "+keep"
	}
	other := exec.Command(os.Args[0], "-test.run=^TestTakeIsHostWide$")
	other.Env = append(os.Environ(), takeHelperEnv+"="+spec)
	stdin, _ := other.StdinPipe()
	stdout, _ := other.StdoutPipe()
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if held, _ := strconv.Atoi(strings.TrimSpace(line)); err != nil || held != r.First {
		stdin.Close()
		other.Wait()
		t.Fatalf("the other process took %q, %v", line, err)
	}
	return func() { stdin.Close(); other.Wait() }
}

// ownRange is a range of one uid of the test's own.
func ownRange() UIDRange {
	return UIDRange{First: 1_900_000_000 + mathrand.IntN(100_000_000), Count: 1}
}

// TestHoldUID: HoldUID takes exactly the uid asked for unless a session of
// this process or of another process holds it (ErrUIDHeld), and a held uid
// is not taken by Take until released.
func TestHoldUID(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, r UIDRange) (end func())
		held   bool
	}{
		{"free", func(*testing.T, UIDRange) func() { return func() {} }, false},
		{"taken here", func(t *testing.T, r UIDRange) func() {
			uid, err := r.Take()
			if err != nil {
				t.Fatal(err)
			}
			return func() { ReleaseUID(uid) }
		}, true},
		{"held here", func(t *testing.T, r UIDRange) func() {
			if err := HoldUID(r.First); err != nil {
				t.Fatal(err)
			}
			return func() { ReleaseUID(r.First) }
		}, true},
		{"held by another process", func(t *testing.T, r UIDRange) func() { return holdElsewhere(t, r, false) }, true},
		{"kept by a process that ended", func(t *testing.T, r UIDRange) func() {
			holdElsewhere(t, r, true)()
			return func() {}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ownRange()
			end := tc.before(t, r)
			err := HoldUID(r.First)
			end()
			if tc.held {
				if !errors.Is(err, ErrUIDHeld) {
					t.Fatalf("HoldUID of a held uid: %v, want ErrUIDHeld", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("HoldUID: %v", err)
			}
			if uid, err := r.Take(); err == nil {
				ReleaseUID(uid)
				t.Fatalf("Take gave uid %d, which HoldUID holds", uid)
			}
			ReleaseUID(r.First)
			uid, err := r.Take()
			if err != nil {
				t.Fatalf("Take once released: %v", err)
			}
			ReleaseUID(uid)
		})
	}
}

// TestKeepUID: a kept uid is taken by no Take — after LeaveUID, and after
// the end of the process that kept it — until HoldUID takes it back and
// ReleaseUID gives it up; a uid left without being kept is free at once.
func TestKeepUID(t *testing.T) {
	for _, tc := range []struct {
		name string
		// elsewhere: another process takes it and ends; else this one
		// takes it, keeps it with keep, and lets go with release
		// (ReleaseUID) or not (LeaveUID).
		elsewhere, keep, release bool
		kept                     bool
	}{
		{name: "kept, left here", keep: true, kept: true},
		{name: "kept by a process that ended", elsewhere: true, keep: true, kept: true},
		{name: "left unkept"},
		{name: "kept, released", keep: true, release: true},
	} {
		leave := func(t *testing.T, r UIDRange) {
			if tc.elsewhere {
				holdElsewhere(t, r, tc.keep)()
				return
			}
			uid, err := r.Take()
			if err != nil {
				t.Fatal(err)
			}
			if tc.keep {
				if err := KeepUID(uid); err != nil {
					t.Fatal(err)
				}
			}
			if tc.release {
				ReleaseUID(uid)
			} else {
				LeaveUID(uid)
			}
		}
		t.Run(tc.name, func(t *testing.T) {
			r := ownRange()
			leave(t, r)
			uid, err := r.Take()
			if !tc.kept {
				if err != nil {
					t.Fatalf("Take of a uid not kept: %v", err)
				}
				ReleaseUID(uid)
				return
			}
			if err == nil {
				ReleaseUID(uid)
				t.Fatalf("Take gave the kept uid %d", uid)
			}
			if err := HoldUID(r.First); err != nil {
				t.Fatalf("HoldUID of the kept uid: %v", err)
			}
			ReleaseUID(r.First)
			if uid, err = r.Take(); err != nil {
				t.Fatalf("Take once the kept uid was released: %v", err)
			}
			ReleaseUID(uid)
		})
	}
	if err := KeepUID(ownRange().First); err == nil {
		t.Error("KeepUID of a uid this process does not hold succeeded")
	}
}
