package policy

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// TestDefaultSeccomp: the profile is an allowlist that keeps what programs
// need and refuses every denied call with EPERM, in no rule that allows it.
func TestDefaultSeccomp(t *testing.T) {
	sc, err := DefaultSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	if sc.DefaultAction != specs.ActErrno || len(sc.Architectures) == 0 {
		t.Fatalf("default action %q, architectures %v", sc.DefaultAction, sc.Architectures)
	}
	actions := func(name string) []specs.LinuxSeccompAction {
		var acts []specs.LinuxSeccompAction
		for _, r := range sc.Syscalls {
			if slices.Contains(r.Names, name) {
				acts = append(acts, r.Action)
			}
		}
		return acts
	}
	for _, name := range []string{"read", "write", "openat", "clone", "execve", "ptrace", "process_vm_readv", "inotify_init1", "prctl"} {
		if !slices.Contains(actions(name), specs.ActAllow) {
			t.Errorf("%s is not allowed: %v", name, actions(name))
		}
	}
	for _, name := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "userfaultfd", "perf_event_open",
		"keyctl", "unshare", "setns", "mount", "open_by_handle_at", "name_to_handle_at", "kexec_load"} {
		if acts := actions(name); !slices.Equal(acts, []specs.LinuxSeccompAction{specs.ActErrno}) {
			t.Errorf("%s: rules %v; want one errno rule", name, acts)
		}
	}
	last := sc.Syscalls[len(sc.Syscalls)-1]
	if last.ErrnoRet == nil || *last.ErrnoRet != uint(unix.EPERM) {
		t.Errorf("the denied calls' rule returns %v, want EPERM", last.ErrnoRet)
	}
	// Each call returns a copy of its own.
	again, _ := DefaultSeccomp()
	again.Syscalls[0].Names[0] = "changed"
	if sc.Syscalls[0].Names[0] == "changed" {
		t.Error("DefaultSeccomp returned a shared profile")
	}
}
