package agent

import (
	"net"

	"golang.org/x/sys/unix"
)

// peerPID is the pid of the process that connected u, as this process's
// pid namespace numbers it (0 when it cannot see it).
func peerPID(u *net.UnixConn) (int, bool) {
	raw, err := u.SyscallConn()
	if err != nil {
		return 0, false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return 0, false
	}
	return int(cred.Pid), true
}
