package proctree

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The shim protocol. The parent starts /proc/self/exe with markerEnv set and
// two extra descriptors: fd 3, from which the shim reads one shimSpec, and fd
// 4, on which it writes shimMsg lines: "ready" once it handles SIGTERM (Start
// waits for it, so no SIGTERM kills the shim instead of the tree), "pid" once
// the program started (or "error" when it could not be), "exit" once the
// program ended. The shim exits when the program's tree is gone. The spec
// travels over a pipe, not the command line, so that the command's
// environment is not visible in ps. Both are plain text, not JSON: the
// shim is a fresh program per command, and building reflection caches
// would be a good part of its own work.

type shimSpec struct {
	Path string
	Argv []string
	Dir  string
	Env  []string
	OOM  int // Spec.OOMScoreAdj
}

// encode writes the spec as NUL-terminated fields: path, dir, oom, the
// number of arguments, the arguments, the environment.
func (s shimSpec) encode() []byte {
	fields := append([]string{s.Path, s.Dir, strconv.Itoa(s.OOM), strconv.Itoa(len(s.Argv))}, s.Argv...)
	return []byte(strings.Join(append(fields, s.Env...), "\x00") + "\x00")
}

func decodeSpec(b []byte) (shimSpec, error) {
	f := strings.Split(string(b), "\x00")
	if len(f) < 5 || f[len(f)-1] != "" {
		return shimSpec{}, errors.New("proctree: bad shim spec")
	}
	f = f[:len(f)-1]
	oom, err1 := strconv.Atoi(f[2])
	argc, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil || argc < 1 || 4+argc > len(f) {
		return shimSpec{}, errors.New("proctree: bad shim spec")
	}
	return shimSpec{Path: f[0], Dir: f[1], OOM: oom, Argv: f[4 : 4+argc], Env: f[4+argc:]}, nil
}

type shimMsg struct {
	Ready bool
	Pid   int
	Error string
	Errno int
	Exit  *Exit
}

// encode writes the message as one line: "ready", "pid PID",
// "error ERRNO TEXT" or "exit CODE SIGNAL|- KILLED NANOSECONDS".
func (m shimMsg) encode() []byte {
	switch {
	case m.Ready:
		return []byte("ready\n")
	case m.Pid > 0:
		return []byte("pid " + strconv.Itoa(m.Pid) + "\n")
	case m.Exit != nil:
		sig := cmp.Or(m.Exit.Signal, "-")
		killed := map[bool]string{true: "1", false: "0"}[m.Exit.Killed]
		return []byte(fmt.Sprintf("exit %d %s %s %d\n", m.Exit.Code, sig, killed, m.Exit.Duration))
	}
	return []byte("error " + strconv.Itoa(m.Errno) + " " + strings.ReplaceAll(m.Error, "\n", " ") + "\n")
}

// readMsg reads the next message from r.
func readMsg(r *bufio.Reader) (shimMsg, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if err == io.EOF && line != "" {
			err = io.ErrUnexpectedEOF
		}
		return shimMsg{}, err
	}
	f := strings.Fields(line)
	bad := fmt.Errorf("proctree: bad message from the shim: %q", line)
	switch {
	case len(f) == 1 && f[0] == "ready":
		return shimMsg{Ready: true}, nil
	case len(f) == 2 && f[0] == "pid":
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			return shimMsg{}, bad
		}
		return shimMsg{Pid: pid}, nil
	case len(f) >= 2 && f[0] == "error":
		errno, err := strconv.Atoi(f[1])
		if err != nil {
			return shimMsg{}, bad
		}
		text := strings.TrimSuffix(strings.SplitN(line, " ", 3)[2], "\n")
		return shimMsg{Errno: errno, Error: cmp.Or(text, "failed")}, nil
	case len(f) == 5 && f[0] == "exit":
		code, err1 := strconv.Atoi(f[1])
		d, err2 := strconv.ParseInt(f[4], 10, 64)
		if err1 != nil || err2 != nil {
			return shimMsg{}, bad
		}
		e := &Exit{Code: code, Killed: f[3] == "1", Duration: time.Duration(d)}
		if f[2] != "-" {
			e.Signal = f[2]
		}
		return shimMsg{Exit: e}, nil
	}
	return shimMsg{}, bad
}

// startsShim tells tests which implementation startTree uses.
const startsShim = true

const (
	specFD   = 3
	statusFD = 4
	// maxSpec bounds what the shim reads as its spec (argv and environment).
	maxSpec = 64 << 20
)

func init() {
	if os.Getenv(markerEnv) == markerValue {
		// syscall.Exit, not os.Exit: no exit hooks (coverage, race reports)
		// of the host binary may write to the command's output.
		syscall.Exit(shim())
	}
}

// shimTree is the parent's handle on a running shim.
type shimTree struct {
	proc    *os.Process // the shim
	argv0   string
	adopted bool // known to sweeps (adopt.shims) until forget
	status  *os.File
	msgs    *bufio.Reader

	mu       sync.Mutex
	pid      int // the program's pid and process group, once reported
	termSent bool
	exited   bool        // the shim has been reaped
	deadline time.Time   // of the last resort, once armed
	timer    *time.Timer // the next tick
}

// startShim starts the shim, hands it the program, and returns once the
// shim is ready (at most readyTimeout later). It does not wait for the program
// to start: the program may stop the shim (kill -STOP $PPID) before the
// shim has said so, and only kill, which the caller can reach once Start
// returns, gets past that. An adopted shim is counted in adopt.active (the
// caller has counted it) and known to sweeps from its fork on.
func startShim(path string, spec Spec, stdio [3]*os.File, adopted bool) (tree, error) {
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	statR, statW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return nil, err
	}
	if adopted {
		adopt.mu.Lock()
	}
	proc, err := os.StartProcess("/proc/self/exe", []string{"proctree-shim"}, &os.ProcAttr{
		Env:   []string{markerEnv + "=" + markerValue, "GOMAXPROCS=1"},
		Files: []*os.File{stdio[0], stdio[1], stdio[2], specR, statW},
		// Own group: signals meant for the program's group (kill 0) miss
		// it. SIGTERM when we die: the shim kills the tree, then itself.
		Sys: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM},
	})
	if adopted {
		if err == nil {
			adopt.shims[proc.Pid] = true
		}
		adopt.mu.Unlock()
	}
	specR.Close()
	statW.Close()
	if err != nil {
		specW.Close()
		statR.Close()
		return nil, fmt.Errorf("proctree: starting the shim: %w", err)
	}
	// The shim reads the spec before it starts anything, so this cannot
	// block on a stopped shim. An error means the shim died: wait says so.
	specW.Write(shimSpec{Path: path, Argv: spec.Argv, Dir: spec.Dir, Env: spec.Env, OOM: spec.OOMScoreAdj}.encode())
	specW.Close()
	t := &shimTree{proc: proc, argv0: spec.Argv[0], status: statR, msgs: bufio.NewReader(io.LimitReader(statR, 1<<20)), adopted: adopted}

	ready := make(chan error, 1)
	go func() {
		m, err := readMsg(t.msgs)
		if err == nil && !m.Ready {
			err = errors.New("no ready message")
		}
		ready <- err
	}()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-timer.C:
		proc.Kill()
		<-ready
		err = fmt.Errorf("not ready after %v", readyTimeout)
	}
	if err != nil {
		proc.Kill()
		t.forget()
		state, _ := proc.Wait()
		statR.Close()
		return nil, fmt.Errorf("proctree: the shim failed to start (%v): %w", state, err)
	}
	return t, nil
}

func (t *shimTree) kill() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exited || t.termSent {
		return
	}
	t.termSent = true
	t.proc.Signal(syscall.SIGTERM)
	t.proc.Signal(syscall.SIGCONT) // in case the program stopped it
	t.armLocked()
}

// armLocked starts the countdown after which the shim is killed outright.
func (t *shimTree) armLocked() {
	if t.timer == nil && !t.exited {
		t.deadline = time.Now().Add(killGrace)
		t.timer = time.AfterFunc(contInterval, t.tick)
	}
}

// contInterval is how often an armed shimTree sends SIGCONT to the shim.
const contInterval = 50 * time.Millisecond

// tick keeps the shim going until its deadline — the program or one of its
// descendants may stop it (SIGSTOP) just after a SIGCONT — and then does the
// shim's work itself, as well as it can from outside: it kills every
// descendant of the shim it finds in /proc (while the shim lives, its
// descendants stay its own), the program's process group, and the shim.
func (t *shimTree) tick() {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.exited:
	case time.Now().Before(t.deadline):
		t.proc.Signal(syscall.SIGCONT)
		t.timer.Reset(contInterval)
	default:
		for range 10 {
			pids, family := descendants(t.proc.Pid, nil)
			if len(pids) == 0 {
				break
			}
			killAllOf(pids, family)
		}
		t.killGroupLocked()
		t.proc.Kill()
	}
}

// killGroupLocked kills the program's process group, if the program started.
func (t *shimTree) killGroupLocked() {
	if t.pid > 0 { // never -0: that is our own group
		syscall.Kill(-t.pid, syscall.SIGKILL)
	}
}

func (t *shimTree) wait() (Exit, error) {
	var exit *Exit
	var failed error
	for exit == nil && failed == nil {
		m, err := readMsg(t.msgs)
		if err != nil {
			failed = err
			break
		}
		switch {
		case m.Pid > 0:
			t.mu.Lock()
			t.pid = m.Pid
			t.mu.Unlock()
		case m.Errno != 0:
			failed = startError(t.argv0, syscall.Errno(m.Errno))
		case m.Error != "":
			failed = errors.New("proctree: shim: " + m.Error)
		case m.Exit != nil:
			exit = m.Exit
			t.mu.Lock()
			t.armLocked() // the cleanup is bounded too
			t.mu.Unlock()
		}
	}
	if exit == nil {
		// The shim failed, or died: what it ran is on its own now.
		t.mu.Lock()
		t.killGroupLocked()
		t.proc.Kill()
		t.mu.Unlock()
	}
	t.forget()
	state, werr := t.proc.Wait()
	t.mu.Lock()
	t.exited = true
	if t.timer != nil {
		t.timer.Stop()
	}
	t.mu.Unlock()
	t.status.Close()
	if t.adopted {
		adoptDone()
	}
	switch {
	case exit != nil:
		return *exit, nil
	case failed != io.EOF:
		return Exit{Code: -1}, failed
	case werr != nil:
		return Exit{Code: -1}, fmt.Errorf("proctree: the shim ended without a report: %w", werr)
	}
	return Exit{Code: -1}, fmt.Errorf("proctree: the shim ended without a report (%v)", state)
}

// forget removes an adopted shim from adopt.shims before it is reaped, so
// that its pid, once free, can never shelter another process from a sweep.
func (t *shimTree) forget() {
	if t.adopted {
		adopt.mu.Lock()
		delete(adopt.shims, t.proc.Pid)
		adopt.mu.Unlock()
	}
}

// shim is the shim's main function; it returns its exit status.
func shim() int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	closeOnExec() // the program gets stdin, stdout and stderr, nothing else
	specF, statF := os.NewFile(specFD, "spec"), os.NewFile(statusFD, "status")
	send := func(m shimMsg) { statF.Write(m.encode()) }
	// The program's duration counts from here, before Start returns in the
	// parent (on ready): a timeout the caller arms then never finds it
	// shorter than the time it allowed.
	start := time.Now()
	send(shimMsg{Ready: true})
	b, err := io.ReadAll(io.LimitReader(specF, maxSpec))
	if err != nil {
		return 125
	}
	specF.Close()
	s, err := decodeSpec(b)
	if err != nil {
		return 125
	}

	setOOMScoreAdj("self", s.OOM) // the program and all it starts inherit it
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		send(shimMsg{Error: "PR_SET_CHILD_SUBREAPER: " + err.Error()})
		return 125
	}
	pid, err := syscall.ForkExec(s.Path, s.Argv, &syscall.ProcAttr{
		Dir:   s.Dir,
		Env:   s.Env,
		Files: []uintptr{0, 1, 2},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		m := shimMsg{Error: err.Error()}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			m.Errno = int(errno)
		}
		send(m)
		return 125
	}
	send(shimMsg{Pid: pid}) // if the parent is gone, SIGTERM is on its way
	r := startReaper(pid)

	killed := false
	var end mainEnd
	select {
	case end = <-r.main:
	case <-term:
		killed = true
		killAll(r)
		end = <-r.main
	}
	exit := exitOf(end.status, killed, end.at.Sub(start))
	send(shimMsg{Exit: &exit})
	killAll(r) // the program ended on its own: now the rest of its tree
	return 0
}

// closeOnExec marks every descriptor above stderr close-on-exec: the
// protocol's, and any the host process inherited without the flag and so
// passed on to the shim.
func closeOnExec() {
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	ents, _ := os.ReadDir("/proc/self/fd") // kernels before 5.11
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

type mainEnd struct {
	status syscall.WaitStatus
	at     time.Time
}

// reaper reaps every child of the shim: the program, and every orphan of its
// tree, which the kernel hands to the shim as their subreaper.
type reaper struct {
	main   chan mainEnd  // the program's end, once
	reaped chan struct{} // a token after any reap
	gone   chan struct{} // closed when the shim has no child left
}

// startReaper reaps the shim's children until it has none. When the program
// has ended it asks at once whether any other child is left (WNOHANG), and
// closes gone before it reports the program's end if none is: a command that
// leaves nothing behind then costs no look at /proc.
func startReaper(mainPid int) *reaper {
	r := &reaper{main: make(chan mainEnd, 1), reaped: make(chan struct{}, 1), gone: make(chan struct{})}
	go func() {
		var pending *mainEnd // the program's end, not yet reported
		defer func() {
			close(r.gone)
			if pending != nil {
				r.main <- *pending
			}
		}()
		for {
			opts := 0
			if pending != nil {
				opts = syscall.WNOHANG
			}
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, opts, nil)
			switch {
			case err == syscall.EINTR:
				continue
			case err != nil:
				// ECHILD. With no child there is no descendant either:
				// a process's orphans go to the shim before it dies.
				return
			case pid == 0: // children left, none has ended yet
				r.main <- *pending
				pending = nil
				continue
			case pid == mainPid:
				pending = &mainEnd{ws, time.Now()}
			}
			select {
			case r.reaped <- struct{}{}:
			default:
			}
		}
	}()
	return r
}

// killAll sends SIGKILL to every descendant, again and again, until the
// reaper has reaped the last child. Each round kills all that /proc shows;
// what is forked meanwhile is found in the next, which comes as soon as
// anything is reaped.
func killAll(r *reaper) {
	pause := time.Millisecond
	for {
		select {
		case <-r.gone:
			return
		default:
		}
		killAllOf(descendants(os.Getpid(), nil))
		select {
		case <-r.gone:
			return
		case <-r.reaped:
		case <-time.After(pause):
			pause = min(2*pause, 100*time.Millisecond)
		}
	}
}

// killAllOf sends SIGKILL to each of pids (see killOne).
func killAllOf(pids []int, family map[int]bool) {
	for _, pid := range pids {
		if f := killOne(pid, family); f != nil {
			f.Close()
		}
	}
}

// killOne sends SIGKILL to pid, unless pid is no longer the process that was
// listed: through a pidfd, and only after checking that the process it pins
// still has its parent in family (the root of the walk or a descendant) — a
// pid reused by a stranger fails that test. It returns the pidfd of a
// process it signalled (or found dead), non-blocking where the kernel allows
// (5.10), for the caller to close; nil when it has none.
func killOne(pid int, family map[int]bool) *os.File {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.EINVAL {
		fd, err = unix.PidfdOpen(pid, 0)
	}
	if err == unix.ENOSYS {
		syscall.Kill(pid, syscall.SIGKILL) // kernels before 5.3
		return nil
	}
	if err != nil {
		return nil // gone
	}
	if ppid, err := parentOf(pid); err == nil && !family[ppid] {
		unix.Close(fd)
		return nil
	}
	unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	return os.NewFile(uintptr(fd), "pidfd")
}

// descendants lists root's descendants, parents first, leaving out the
// processes in skip and their own descendants, and returns them with root
// itself as a set.
func descendants(root int, skip map[int]bool) ([]int, map[int]bool) {
	childrenOf := children
	if !haveChildrenFiles() {
		byParent := parentMap() // a kernel without CONFIG_PROC_CHILDREN
		childrenOf = func(pid int) []int { return byParent[pid] }
	}
	family := map[int]bool{root: true}
	var pids []int
	for queue := []int{root}; len(queue) > 0; queue = queue[1:] {
		for _, c := range childrenOf(queue[0]) {
			if !family[c] && !skip[c] {
				family[c] = true
				pids = append(pids, c)
				queue = append(queue, c)
			}
		}
	}
	return pids, family
}

// haveChildrenFiles reports whether the kernel has /proc/PID/task/TID/children
// (CONFIG_PROC_CHILDREN).
var haveChildrenFiles = sync.OnceValue(func() bool {
	_, err := ReadProc("self/task/" + strconv.Itoa(os.Getpid()) + "/children")
	return err == nil
})

// children lists pid's children from /proc/PID/task/*/children.
func children(pid int) []int {
	dir := strconv.Itoa(pid) + "/task/"
	tasks, _ := ReadProcDir(dir)
	var out []int
	for _, t := range tasks {
		b, _ := ReadProc(dir + t + "/children")
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// parentMap maps every process's parent to its children, from /proc/*/stat.
func parentMap() map[int][]int {
	m := map[int][]int{}
	names, _ := ReadProcDir(".")
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if ppid, err := parentOf(pid); err == nil {
			m[ppid] = append(m[ppid], pid)
		}
	}
	return m
}

// parentOf reads pid's parent from /proc/PID/stat.
func parentOf(pid int) (int, error) {
	b, err := ReadProc(strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid …"; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 2 {
		return 0, fmt.Errorf("proctree: bad stat for %d", pid)
	}
	return strconv.Atoi(f[1])
}

// procFD is /proc, open for the life of the process (-1 if it cannot be
// opened). Names under /proc are resolved from it rather than from the
// root directory: in a container the root is often a FUSE file system
// (fuse-overlayfs), which the kernel asks about every path walked through
// it — a round trip to a user-space daemon for each /proc file read.
var procFD = sync.OnceValue(func() int {
	fd, err := unix.Open("/proc", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
})

// openProc opens /proc/NAME.
func openProc(name string, flags int) (*os.File, error) {
	dir := procFD()
	if dir < 0 {
		return os.OpenFile("/proc/"+name, flags, 0)
	}
	fd, err := unix.Openat(dir, name, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: "/proc/" + name, Err: err}
	}
	return os.NewFile(uintptr(fd), "/proc/"+name), nil
}

// ReadProc reads the file /proc/NAME ("self/status", "42/stat") through a
// descriptor of /proc held open for the life of the process, so no path is
// walked from the root (see procFD).
func ReadProc(name string) ([]byte, error) {
	f, err := openProc(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// ReadProcDir lists the directory /proc/NAME, as ReadProc reads.
func ReadProcDir(name string) ([]string, error) {
	f, err := openProc(name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// ReadlinkProc reads the link /proc/NAME ("self/fd/3"), as ReadProc reads.
func ReadlinkProc(name string) (string, error) {
	dir := procFD()
	if dir < 0 {
		return os.Readlink("/proc/" + name)
	}
	buf := make([]byte, 256)
	n, err := unix.Readlinkat(dir, name, buf)
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: "/proc/" + name, Err: err}
	}
	return string(buf[:n]), nil
}

// setOOMScoreAdj writes n to the oom_score_adj of pid ("self" or a
// number), unless n is zero. Errors are ignored: see Spec.OOMScoreAdj.
func setOOMScoreAdj(pid string, n int) {
	if n != 0 {
		writeOOMScoreAdj(pid, strconv.Itoa(n))
	}
}

// writeOOMScoreAdj writes value to the oom_score_adj of pid.
func writeOOMScoreAdj(pid, value string) error {
	f, err := openProc(pid+"/oom_score_adj", unix.O_WRONLY)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
