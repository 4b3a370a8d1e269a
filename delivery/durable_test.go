package delivery_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/snapshot"
)

// The child process of the tests that kill a delivery: with
// SANDBOXD_DELIVERY_CHILD set it delivers and is killed (SIGKILL) as the
// variable says, before the test's own code runs.
func TestMain(m *testing.M) {
	if what := os.Getenv("SANDBOXD_DELIVERY_CHILD"); what != "" {
		child(what)
	}
	os.Exit(m.Run())
}

// child carries out what names: "apply DIR KEEP" applies the work of a
// copy of DIR back into it through a baseline kept in KEEP, and is killed
// while the second file is being placed; "store" makes a temporary store,
// prints its directory and is killed.
func child(what string) {
	f := strings.Fields(what)
	die := func() { syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	switch f[0] {
	case "store":
		st, err := delivery.NewStore()
		if err != nil {
			os.Exit(3)
		}
		_ = st
		m, _ := filepath.Glob(filepath.Join(os.TempDir(), "sandboxd-delivery-*"))
		os.Stdout.WriteString(strings.Join(m, "\n") + "\n")
		die()
	case "apply":
		b, err := delivery.Begin(context.Background(), f[1], delivery.Keep(f[2]))
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(3)
		}
		fsys, err := workOn(f[1])
		if err != nil {
			os.Exit(3)
		}
		n := 0
		delivery.SetPlacingHook(func(string) {
			if n++; n == 2 {
				die()
			}
		})
		b.Deliver(context.Background(), fsys, delivery.Request{Mode: delivery.Apply, Session: "s-killed", PatchFile: filepath.Join(f[2], "..", "conflicts.patch")})
		os.Exit(4) // not killed: the test fails
	}
	os.Exit(5)
}

// runChild runs this test binary as the child doing what, and checks that
// it was killed.
func runChild(t *testing.T, what string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SANDBOXD_DELIVERY_CHILD="+what)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// TestApplyKilledIsFinished: an Apply killed halfway — one file renamed in,
// the next one's temporary file written — leaves a journal beside its
// kept baseline; the next run's Deliver finishes it from the contents kept
// (the session's workspace gone), removes the temporary file, and the
// directory holds the session's work exactly.
func TestApplyKilledIsFinished(t *testing.T) {
	dir := project(t, false)
	want := final(t, work(t, dir))
	keep := filepath.Join(t.TempDir(), "state", "delivery")
	runChild(t, "apply "+dir+" "+keep)

	if strays := temps(t, dir); len(strays) != 1 {
		t.Fatalf("temporary files after the kill: %q, want the one being placed (the kill came too early or late)", strays)
	}
	if got := tree(t, dir); maps.Equal(got, want) {
		t.Fatal("the directory is whole before the delivery is finished: the kill came too late")
	}
	b, err := delivery.Open(keep)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Interrupted() {
		t.Fatal("the kept baseline does not say a delivery was interrupted")
	}
	if _, err := os.Stat(filepath.Join(keep, "work.patch")); err != nil {
		t.Errorf("the whole work's patch was not written before the apply: %v", err)
	}
	r, err := b.Deliver(t.Context(), nil, delivery.Request{Mode: delivery.Apply, Session: "s-next"})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Resumed || r.Applied == nil || len(r.Applied.Conflicts) != 0 || len(r.Applied.Same) == 0 {
		t.Errorf("report of the finished delivery: %+v", r)
	}
	if !strings.Contains(r.String(), "a killed run began") {
		t.Errorf("the report does not say it finished a killed run's delivery:\n%s", r)
	}
	if strays := temps(t, dir); len(strays) != 0 {
		t.Errorf("temporary files left: %q", strays)
	}
	if got := tree(t, dir); !maps.Equal(got, want) {
		t.Errorf("after the finished delivery:\n got %q\nwant %q", got, want)
	}
	if err := b.Discard(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(keep); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Discard left %s: %v", keep, err)
	}
}

// temps lists the .sandboxd-* temporary files in dir.
func temps(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".sandboxd-") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestDeliverAgainIsTheSame: a delivery carried out again over a finished
// one (a run killed after delivering, before it could forget the journal)
// makes nothing twice and fails on nothing: the branch, the patch are
// found as made.
func TestDeliverAgainIsTheSame(t *testing.T) {
	for _, mode := range []delivery.Mode{delivery.Branch, delivery.Patch, delivery.Apply} {
		t.Run(string(mode), func(t *testing.T) {
			dir := project(t, true)
			keep := filepath.Join(t.TempDir(), "keep")
			b, err := delivery.Begin(t.Context(), dir, delivery.Keep(keep))
			if err != nil {
				t.Fatal(err)
			}
			fsys := work(t, dir)
			req := delivery.Request{Mode: mode, Session: "s-again", PatchFile: filepath.Join(t.TempDir(), "p.patch")}
			first, err := b.Deliver(t.Context(), fsys, req)
			if err != nil {
				t.Fatal(err)
			}
			afterFirst := tree(t, dir)
			if _, err := delivery.Open(keep); !errors.Is(err, delivery.ErrInUse) {
				t.Errorf("Open of a baseline open here: %v, want ErrInUse", err)
			}
			b.Close()
			again, err := delivery.Open(keep)
			if err != nil {
				t.Fatal(err)
			}
			second, err := again.Deliver(t.Context(), nil, req)
			if err != nil {
				t.Fatalf("delivered again: %v", err)
			}
			if !second.Resumed || second.PatchFile != first.PatchFile {
				t.Errorf("again: resumed %v, patch %q (first %q)", second.Resumed, second.PatchFile, first.PatchFile)
			}
			if mode == delivery.Branch && (second.Committed == nil || second.Committed.Commit != first.Committed.Commit) {
				t.Errorf("again: committed %+v, first %+v", second.Committed, first.Committed)
			}
			if got := tree(t, dir); !maps.Equal(got, afterFirst) {
				t.Errorf("the directory changed on the second delivery")
			}
		})
	}
}

// TestPatchNeverHalfThere: a patch is placed whole under its name, never
// over another file, and nothing of its writing is left beside it.
func TestPatchNeverHalfThere(t *testing.T) {
	dir := project(t, false)
	patch := filepath.Join(t.TempDir(), "w.patch")
	os.WriteFile(patch, []byte("someone else's\n"), 0o600)
	b := begin(t, dir)
	_, err := b.Deliver(t.Context(), work(t, dir), delivery.Request{Mode: delivery.Patch, Session: "s-x", PatchFile: patch})
	if err == nil || !strings.Contains(err.Error(), "--patch FILE") {
		t.Errorf("over another file: %v", err)
	}
	if data, _ := os.ReadFile(patch); string(data) != "someone else's\n" {
		t.Errorf("the file there was changed: %q", data)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(patch), ".*")); len(m) != 0 {
		t.Errorf("left beside the patch: %q", m)
	}
}

// TestRemoveStale: the temporary stores of dead processes go — one whose
// process was killed, one of an earlier version (no lock) a day old —
// while a living one, and a young lockless one, stay.
func TestRemoveStale(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	killed := strings.TrimSpace(runChild(t, "store"))
	if !strings.HasPrefix(killed, filepath.Join(tmp, "sandboxd-delivery-")) || strings.Contains(killed, "\n") {
		t.Fatalf("the killed child's store: %q", killed)
	}
	live, err := delivery.NewStore()
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	old := filepath.Join(tmp, "sandboxd-delivery-old")
	young := filepath.Join(tmp, "sandboxd-delivery-young")
	for _, d := range []string{old, young} {
		os.Mkdir(d, 0o700)
		os.WriteFile(filepath.Join(d, "blob"), []byte("0123456789"), 0o600)
	}
	ago := func(d string, age time.Duration) { os.Chtimes(d, time.Now().Add(-age), time.Now().Add(-age)) }
	ago(old, 25*time.Hour)
	ago(young, time.Hour)
	ago(killed, 2*time.Minute)
	m, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-delivery-*"))
	for _, d := range m {
		if d != old && d != young && d != killed {
			ago(d, 2*time.Minute) // the living one: old enough to be judged by its lock
		}
	}
	n, size, err := delivery.RemoveStale()
	if err != nil || n != 2 || size < 10 {
		t.Errorf("RemoveStale = %d, %d bytes, %v; want 2", n, size, err)
	}
	for d, stays := range map[string]bool{killed: false, old: false, young: true} {
		if _, err := os.Stat(d); (err == nil) != stays {
			t.Errorf("%s: stays %v, want %v", d, err == nil, stays)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(tmp, "sandboxd-delivery-*")); len(m) != 2 {
		t.Errorf("left: %q, want the living and the young", m)
	}
}

// TestDeliverArchive: the work read from a tar stream of the session's
// tree (a container's export) is the work read through its workspace.
func TestDeliverArchive(t *testing.T) {
	dir := project(t, false)
	fsys := work(t, dir)
	want, _ := deliverTo(t, dir, func(b *delivery.Baseline, req delivery.Request) (*delivery.Report, error) {
		return b.Deliver(t.Context(), fsys, req)
	})
	var tarball bytes.Buffer
	if err := snapshot.WriteTree(t.Context(), fsys, &tarball); err != nil {
		t.Fatal(err)
	}
	got, _ := deliverTo(t, dir, func(b *delivery.Baseline, req delivery.Request) (*delivery.Report, error) {
		return b.DeliverArchive(t.Context(), &tarball, req)
	})
	if !reflect.DeepEqual(got.Changes, want.Changes) || len(got.Changes) == 0 {
		t.Errorf("changes from the archive:\n%+v\nthrough the workspace:\n%+v", got.Changes, want.Changes)
	}
}

// deliverTo delivers a patch of the work on a baseline of dir with f.
func deliverTo(t *testing.T, dir string, f func(*delivery.Baseline, delivery.Request) (*delivery.Report, error)) (*delivery.Report, string) {
	t.Helper()
	b := begin(t, dir)
	patch := filepath.Join(t.TempDir(), "p.patch")
	r, err := f(b, delivery.Request{Mode: delivery.Patch, Session: "s-a", PatchFile: patch})
	if err != nil {
		t.Fatal(err)
	}
	return r, patch
}
