// Command probe calls the kernel directly from inside a session container,
// for the adversarial tests (no image has a tool for each of these):
//
//	probe syscalls NAME...  one line "NAME ERRNO" per call, "NAME ok" when it worked
//	probe ptrace PID|child  "attached" when PTRACE_SEIZE of PID, or of a child it starts,
//	                        worked (it then detaches), else the errno
//	probe inotify hold      opens inotify instances until the kernel refuses,
//	                        prints "holding N: ERR" and keeps them until killed
//	probe inotify N         opens N instances, prints "opened N" or "failed at I: ERR"
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// calls are harmless invocations: each either fails on its arguments or
// does nothing lasting, when seccomp lets it through.
var calls = map[string]func() error{
	"io_uring_setup": func() error { return raw(unix.SYS_IO_URING_SETUP, 1, 0) },
	"io_uring_enter": func() error { return raw(unix.SYS_IO_URING_ENTER, ^uintptr(0), 0) },
	"bpf":            func() error { return raw(unix.SYS_BPF, ^uintptr(0), 0) },
	"userfaultfd": func() error {
		return closing(unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0))
	},
	"perf_event_open":   func() error { return raw(unix.SYS_PERF_EVENT_OPEN, 0, 0) },
	"keyctl":            func() error { return raw(unix.SYS_KEYCTL, ^uintptr(0), 0) },
	"add_key":           func() error { return raw(unix.SYS_ADD_KEY, 0, 0) },
	"unshare":           func() error { return unix.Unshare(unix.CLONE_NEWUSER) },
	"setns":             func() error { return raw(unix.SYS_SETNS, ^uintptr(0), 0) },
	"mount":             func() error { return raw(unix.SYS_MOUNT, 0, 0) },
	"open_by_handle_at": func() error { return raw(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0) },
	"name_to_handle_at": func() error { return raw(unix.SYS_NAME_TO_HANDLE_AT, ^uintptr(0), 0) },
	"kexec_load":        func() error { return raw(unix.SYS_KEXEC_LOAD, 0, 0) },
	"fsopen":            func() error { return raw(unix.SYS_FSOPEN, 0, 0) },
	// getpid must work: the probe itself is not refused everything.
	"getpid": func() error { return raw(unix.SYS_GETPID, 0, 0) },
}

func raw(nr, a, b uintptr) error {
	_, _, e := unix.Syscall(nr, a, b, 0)
	if e != 0 {
		return e
	}
	return nil
}

func closing(fd, _ uintptr, e unix.Errno) error {
	if e != 0 {
		return e
	}
	unix.Close(int(fd))
	return nil
}

func errName(err error) string {
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: probe syscalls NAME... | ptrace PID | inotify hold|N")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "syscalls":
		for _, name := range os.Args[2:] {
			call, ok := calls[name]
			if !ok {
				fmt.Println(name, "unknown")
			} else if err := call(); err != nil {
				fmt.Println(name, errName(err))
			} else {
				fmt.Println(name, "ok")
			}
		}
	case "ptrace":
		pid, _ := strconv.Atoi(os.Args[2])
		if os.Args[2] == "child" { // a child of its own, which any debugger may trace
			child := exec.Command("sleep", "30")
			if err := child.Start(); err != nil {
				fmt.Println(err)
				return
			}
			defer child.Process.Kill()
			pid = child.Process.Pid
		}
		if err := unix.PtraceSeize(pid); err != nil {
			fmt.Println(errName(err))
			return
		}
		fmt.Println("attached")
		unix.PtraceDetach(pid)
	case "inotify":
		n, err := strconv.Atoi(os.Args[2])
		if os.Args[2] == "hold" {
			n, err = 1<<20, nil
		}
		if err != nil {
			os.Exit(2)
		}
		opened := 0
		for ; opened < n; opened++ {
			if _, err = unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
				break
			}
		}
		if os.Args[2] != "hold" {
			if err != nil {
				fmt.Printf("failed at %d: %s\n", opened, errName(err))
				os.Exit(1)
			}
			fmt.Println("opened", opened)
			return
		}
		fmt.Printf("holding %d: %s\n", opened, errName(err))
		time.Sleep(10 * time.Minute)
	}
}
