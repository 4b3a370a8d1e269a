package policy

import (
	"fmt"
	"slices"
	"sync"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DeniedSyscalls are the system calls sandboxd's seccomp profile refuses
// with EPERM, whatever capabilities a profile adds back: the kernel
// interfaces behind most container escapes and cross-tenant attacks of
// recent years (io_uring, eBPF, userfaultfd, perf events, keyrings, new
// namespaces and mounts, file handles, kexec). ptrace is not among them:
// debuggers and strace work on a command's own processes, and the agent
// keeps itself out of their reach (it is not dumpable).
var DeniedSyscalls = []string{
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"bpf", "userfaultfd", "perf_event_open",
	"keyctl", "add_key", "request_key",
	"unshare", "setns",
	"mount", "umount", "umount2", "mount_setattr", "move_mount", "open_tree",
	"fsopen", "fsconfig", "fsmount", "fspick", "pivot_root", "chroot",
	"open_by_handle_at", "name_to_handle_at",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"fanotify_init", "lookup_dcookie", "quotactl", "quotactl_fd", "acct", "swapon", "swapoff",
	"syslog", "vm86", "vm86old", "iopl", "ioperm",
}

var engineDefault = sync.OnceValues(func() (*specs.LinuxSeccomp, error) {
	return seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}})
})

// DefaultSeccomp returns sandboxd's seccomp profile: the engine's default
// allowlist (moby's, resolved for a container with no capabilities, this
// machine's architecture and kernel) with every name of DeniedSyscalls
// taken out of it and refused with EPERM by a rule of its own, so the
// refusal holds even where the engine's list would allow it. Each call
// returns a new copy.
//
// It is an allowlist: system calls it does not name fail with EPERM too.
// It does not cover syscalls reached through another one (socketcall on
// 32-bit x86 is filtered by the engine's rules as it is).
func DefaultSeccomp() (*specs.LinuxSeccomp, error) {
	base, err := engineDefault()
	if err != nil {
		return nil, fmt.Errorf("policy: the engine's default seccomp profile: %w", err)
	}
	out := *base
	out.Syscalls = nil
	for _, rule := range base.Syscalls {
		rule.Names = slices.DeleteFunc(slices.Clone(rule.Names), func(n string) bool { return slices.Contains(DeniedSyscalls, n) })
		if len(rule.Names) > 0 {
			out.Syscalls = append(out.Syscalls, rule)
		}
	}
	eperm := uint(unix.EPERM)
	out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: slices.Clone(DeniedSyscalls), Action: specs.ActErrno, ErrnoRet: &eperm})
	return &out, nil
}
