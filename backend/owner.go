package backend

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/proctree"
)

// Labels naming the process that made a workspace (Owner.Labels): its host
// and boot, its PID and when that process started. Reaping removes what a
// run left only once these say the run is gone.
const (
	LabelOwnerHost  = "sandboxd.run.host"
	LabelOwnerPID   = "sandboxd.run.pid"
	LabelOwnerStart = "sandboxd.run.start"
)

// Owner is the process that made a workspace: a daemon, or a command-line
// run. Its identity holds across PID reuse and reboots: a PID means
// something only on its host and boot, and only for the process that
// started at Start.
type Owner struct {
	// Host is the host's name and, where the kernel says
	// (/proc/sys/kernel/random/boot_id), its boot: "name/boot-id".
	Host string
	// PID is the process's ID on Host.
	PID int
	// Start is when the process started, in the kernel's clock ticks since
	// boot (/proc/PID/stat); "" where the kernel does not say.
	Start string
}

// Self is this process.
func Self() Owner { return self() }

var self = sync.OnceValue(func() Owner {
	host, _ := os.Hostname()
	if boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		host += "/" + strings.TrimSpace(string(boot))
	}
	return Owner{Host: host, PID: os.Getpid(), Start: processStart(os.Getpid())}
})

// Labels are the owner's labels.
func (o Owner) Labels() map[string]string {
	return map[string]string{LabelOwnerHost: o.Host, LabelOwnerPID: strconv.Itoa(o.PID), LabelOwnerStart: o.Start}
}

// OwnerOf reads the owner from labels; false when they name none.
func OwnerOf(labels map[string]string) (Owner, bool) {
	pid, err := strconv.Atoi(labels[LabelOwnerPID])
	if err != nil || pid <= 0 || labels[LabelOwnerHost] == "" {
		return Owner{}, false
	}
	return Owner{Host: labels[LabelOwnerHost], PID: pid, Start: labels[LabelOwnerStart]}, true
}

// String names the owner for people: "pid 42 on host h".
func (o Owner) String() string {
	host, _, _ := strings.Cut(o.Host, "/")
	return fmt.Sprintf("pid %d on host %s", o.PID, host)
}

// Gone reports whether the owner's process has certainly ended: it ran on
// this host in an earlier boot, or in this boot and no process has its PID,
// or the process that has it started at another time (the PID was reused).
// An owner on another host, or one whose process this user may not signal
// but that started when the owner did, may be alive: Gone is false, so a
// mistake leaves a workspace behind rather than removing a living one.
func (o Owner) Gone() bool {
	me := Self()
	if o.Host != me.Host {
		name, boot, _ := strings.Cut(o.Host, "/")
		myName, myBoot, _ := strings.Cut(me.Host, "/")
		return name == myName && boot != "" && myBoot != "" && boot != myBoot
	}
	if o == me {
		return false
	}
	if errors.Is(syscall.Kill(o.PID, 0), syscall.ESRCH) {
		return true
	}
	start := processStart(o.PID)
	return o.Start != "" && start != "" && start != o.Start
}

// processStart is when process pid started, in clock ticks since boot (the
// 22nd field of /proc/PID/stat), or "" when the kernel does not say.
func processStart(pid int) string {
	fields, err := proctree.StatFields(pid)
	if err != nil || len(fields) < 20 { // starttime is field 22
		return ""
	}
	return fields[19]
}
