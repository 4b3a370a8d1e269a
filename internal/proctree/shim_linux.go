package proctree

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The shim protocol. The parent starts /proc/self/exe with markerEnv set,
// /dev/null as its standard input and output, and one end of a Unix socket
// pair as fd 3. The shim writes "ready" once it handles SIGTERM (the parent
// waits for it, so no SIGTERM kills the shim instead of a tree), then serves
// commands one at a time. For each, the parent sends a frame: a header of
// two 64-bit little-endian numbers (the length of the shimSpec that follows,
// and the CLOCK_MONOTONIC time the command's duration counts from) carrying
// the command's standard input, output and error as SCM_RIGHTS, then the
// spec. The shim answers with shimMsg lines: "pid" once the program started
// (or "error" when it could not be), "exit" once the program ended, "done"
// once its whole tree is gone ("done last" when it will not serve another).
// After "done" the shim has no child left and waits for the next frame; it
// exits at end of file on the socket, or on SIGTERM once the tree it runs
// (if any) is gone. It serves no other command after a SIGTERM, nor after a
// command changed what the next would inherit from it (see inherited). The spec travels over the
// socket, not the command line, so that the command's environment is not
// visible in ps. Both are plain text, not JSON: building reflection caches
// would be a good part of a fresh shim's work.

type shimSpec struct {
	Path string
	Argv []string
	Dir  string
	Env  []string
	OOM  int  // Spec.OOMScoreAdj
	Tty  bool // Spec.Terminal
}

// encode writes the spec as NUL-terminated fields: path, dir, oom, tty
// ("0" or "1"), the number of arguments, the arguments, the environment.
func (s shimSpec) encode() []byte {
	tty := "0"
	if s.Tty {
		tty = "1"
	}
	fields := append([]string{s.Path, s.Dir, strconv.Itoa(s.OOM), tty, strconv.Itoa(len(s.Argv))}, s.Argv...)
	return []byte(strings.Join(append(fields, s.Env...), "\x00") + "\x00")
}

func decodeSpec(b []byte) (shimSpec, error) {
	f := strings.Split(string(b), "\x00")
	if len(f) < 6 || f[len(f)-1] != "" {
		return shimSpec{}, errors.New("proctree: bad shim spec")
	}
	f = f[:len(f)-1]
	oom, err1 := strconv.Atoi(f[2])
	argc, err2 := strconv.Atoi(f[4])
	if err1 != nil || err2 != nil || argc < 1 || 5+argc > len(f) || f[3] != "0" && f[3] != "1" {
		return shimSpec{}, errors.New("proctree: bad shim spec")
	}
	return shimSpec{Path: f[0], Dir: f[1], OOM: oom, Tty: f[3] == "1", Argv: f[5 : 5+argc], Env: f[5+argc:]}, nil
}

type shimMsg struct {
	Ready bool
	Done  bool // the tree is gone
	Last  bool // with Done: the shim exits now
	Pid   int
	Error string
	Errno int
	Exit  *Exit
}

// encode writes the message as one line: "ready", "done", "done last",
// "pid PID",
// "error ERRNO TEXT" or "exit CODE SIGNAL|- KILLED NANOSECONDS".
func (m shimMsg) encode() []byte {
	switch {
	case m.Ready:
		return []byte("ready\n")
	case m.Done && m.Last:
		return []byte("done last\n")
	case m.Done:
		return []byte("done\n")
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
	case len(f) == 1 && f[0] == "done":
		return shimMsg{Done: true}, nil
	case len(f) == 2 && f[0] == "done" && f[1] == "last":
		return shimMsg{Done: true, Last: true}, nil
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
	connFD = 3
	// maxSpec bounds what the shim reads as its spec (argv and environment).
	maxSpec = 64 << 20
	// maxIdle bounds the shims kept for reuse for each oom_score_adj.
	maxIdle = 4
	// idleTimeout is how long a shim is kept unused before it is ended, so
	// that a process that has stopped running commands keeps no shim.
	idleTimeout = time.Minute
	// frameHeader is the size of a frame's header: length and start time.
	frameHeader = 16
)

func init() {
	if os.Getenv(markerEnv) == markerValue {
		// syscall.Exit, not os.Exit: no exit hooks (coverage, race reports)
		// of the host binary may write to a command's output.
		syscall.Exit(shim())
	}
}

// shimProc is a running shim, idle or serving a command.
type shimProc struct {
	proc    *os.Process
	conn    *os.File // our end of the socket pair, non-blocking
	msgs    *bufio.Reader
	oom     int         // the oom_score_adj the shim took from its first command
	adopted bool        // known to sweeps (adopt.shims) until forget; never reused
	expiry  *time.Timer // while idle: ends it after idleTimeout
}

// idle holds the shims that finished a command with nothing left running
// below them, ready for the next one with the same oom_score_adj: a command
// under a reused shim costs one fork and exec, not the start of a second Go
// program. At most maxIdle are kept per oom_score_adj, each for at most
// idleTimeout. Shims of adopted commands are not kept (see adopt).
var idle struct {
	mu    sync.Mutex
	shims map[int][]*shimProc // by oom_score_adj
}

// CloseIdle ends the shims kept for reuse and waits for them to exit. A
// process need not call it: an idle shim dies with the process. It is for
// callers, tests above all, that count their child processes.
func CloseIdle() {
	idle.mu.Lock()
	var all []*shimProc
	for _, l := range idle.shims {
		all = append(all, l...)
	}
	idle.shims = nil
	idle.mu.Unlock()
	for _, s := range all {
		s.expiry.Stop()
		s.close()
	}
}

// takeIdle returns an idle shim for oom, or nil.
func takeIdle(oom int) *shimProc {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	l := idle.shims[oom]
	if len(l) == 0 {
		return nil
	}
	s := l[len(l)-1]
	idle.shims[oom] = l[:len(l)-1]
	s.expiry.Stop()
	return s
}

// putIdle keeps s for reuse, or ends it when enough are kept.
func putIdle(s *shimProc) {
	idle.mu.Lock()
	if len(idle.shims[s.oom]) < maxIdle {
		if idle.shims == nil {
			idle.shims = map[int][]*shimProc{}
		}
		idle.shims[s.oom] = append(idle.shims[s.oom], s)
		s.expiry = time.AfterFunc(idleTimeout, s.expire)
		s = nil
	}
	idle.mu.Unlock()
	if s != nil {
		s.close()
	}
}

// expire ends s if it is still idle.
func (s *shimProc) expire() {
	idle.mu.Lock()
	l := idle.shims[s.oom]
	i := slices.Index(l, s)
	if i >= 0 {
		idle.shims[s.oom] = slices.Delete(l, i, i+1)
	}
	idle.mu.Unlock()
	if i >= 0 {
		s.close()
	}
}

// close ends a shim that runs no command (at end of file on its socket it
// exits), and returns how it ended once it is reaped.
func (s *shimProc) close() *os.ProcessState {
	s.conn.Close()
	s.forget()
	state, _ := s.proc.Wait()
	return state
}

// forget removes an adopted shim from adopt.shims before it is reaped, so
// that its pid, once free, can never shelter another process from a sweep.
func (s *shimProc) forget() {
	if s.adopted {
		adopt.mu.Lock()
		delete(adopt.shims, s.proc.Pid)
		adopt.mu.Unlock()
	}
}

// spawnShim starts a shim and returns once it is ready (at most readyTimeout
// later). It forks from a goroutine of its own: the shim dies with the
// thread that forked it (PR_SET_PDEATHSIG follows threads), and a goroutine
// that is not locked to its thread runs on one the runtime never ends,
// whichever goroutine called Start. An adopted shim is known to sweeps from
// its fork on.
func spawnShim(adopted bool) (*shimProc, error) {
	type result struct {
		s   *shimProc
		err error
	}
	c := make(chan result, 1)
	go func() {
		s, err := forkShim(adopted)
		c <- result{s, err}
	}()
	r := <-c
	if r.err != nil {
		return nil, r.err
	}
	s := r.s
	ready := make(chan error, 1)
	go func() {
		m, err := readMsg(s.msgs)
		if err == nil && !m.Ready {
			err = errors.New("no ready message")
		}
		ready <- err
	}()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	var err error
	select {
	case err = <-ready:
	case <-timer.C:
		s.proc.Kill()
		<-ready
		err = fmt.Errorf("not ready after %v", readyTimeout)
	}
	if err != nil {
		s.proc.Kill()
		s.forget()
		state, _ := s.proc.Wait()
		s.conn.Close()
		return nil, fmt.Errorf("proctree: the shim failed to start (%v): %w", state, err)
	}
	return s, nil
}

// reportDelayEnv, in the parent's environment, is passed on to its shims,
// which hold the pid's report back that long (a duration): tests widen the
// window a program would need to outrun the report.
const reportDelayEnv = "SANDBOXD_PROCTREE_TEST_REPORT_DELAY"

// deafEnv, set to 1 in the parent's environment, is passed on to its shims,
// which then ignore SIGTERM: a test's stand-in for a shim kept from its work
// (stopped again and again), so that the tree must die by the parent's hand.
const deafEnv = "SANDBOXD_PROCTREE_TEST_DEAF"

// shimEnv is a shim's whole environment.
func shimEnv() []string {
	env := []string{markerEnv + "=" + markerValue, "GOMAXPROCS=1"}
	for _, k := range []string{reportDelayEnv, deafEnv} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// forkShim starts /proc/self/exe as a shim, connected by a socket pair.
func forkShim(adopted bool) (*shimProc, error) {
	null, err := devNull()
	if err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("proctree: starting the shim: %w", err)
	}
	unix.SetNonblock(fds[0], true) // ours, for Go's poller
	ours, theirs := os.NewFile(uintptr(fds[0]), "shim"), os.NewFile(uintptr(fds[1]), "shim")
	defer theirs.Close()
	if adopted {
		adopt.mu.Lock()
	}
	proc, err := os.StartProcess("/proc/self/exe", []string{"proctree-shim"}, &os.ProcAttr{
		Env:   shimEnv(),
		Files: []*os.File{null, null, null, theirs},
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
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("proctree: starting the shim: %w", err)
	}
	return &shimProc{proc: proc, conn: ours, msgs: bufio.NewReader(ours), adopted: adopted}, nil
}

// send hands the shim a command: the frame's header with the command's
// standard input, output and error, then the spec. It fails when the shim
// is gone.
func (s *shimProc) send(spec shimSpec, stdio [3]*os.File, start int64) error {
	body := spec.encode()
	var hdr [frameHeader]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(body)))
	binary.LittleEndian.PutUint64(hdr[8:], uint64(start))
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		// The header is far smaller than the socket's buffer, which is
		// empty between commands: it goes whole or not at all.
		rights := unix.UnixRights(int(stdio[0].Fd()), int(stdio[1].Fd()), int(stdio[2].Fd()))
		serr = unix.Sendmsg(int(fd), hdr[:], rights, nil, unix.MSG_NOSIGNAL)
		return serr != unix.EAGAIN
	})
	if err == nil {
		err = serr
	}
	if err == nil {
		_, err = s.conn.Write(body)
	}
	return err
}

// shimTree is the parent's handle on a shim running one command.
type shimTree struct {
	shim  *shimProc
	argv0 string
	start int64 // CLOCK_MONOTONIC, as the shim's reports count it

	mu       sync.Mutex
	pid      int        // the program's pid and process group, once reported
	termSent bool       // the shim was told to kill the tree (and so to exit)
	over     bool       // the shim reported the tree gone, or has been reaped
	doomed   bool       // the last resort killed the shim
	fromHere bool       // this process killed (some of) the tree itself
	dying    []*os.File // pidfds of what the last resort killed
	deadline time.Time
	timer    *time.Timer // the next tick, once armed
}

// startShim runs the program under a shim: an idle one when there is one
// (never for an adopted command), a new one otherwise. It does not wait for
// the program to start: the program may stop the shim (kill -STOP $PPID)
// before the shim has said so, and only kill, which the caller can reach
// once Start returns, gets past that. An adopted shim is counted in
// adopt.active (the caller has counted it).
func startShim(path string, spec Spec, stdio [3]*os.File, adopted bool) (tree, error) {
	start := monotonic()
	ss := shimSpec{Path: path, Argv: spec.Argv, Dir: spec.Dir, Env: spec.Env, OOM: spec.OOMScoreAdj, Tty: spec.Terminal}
	var s *shimProc
	if !adopted {
		s = takeIdle(spec.OOMScoreAdj)
	}
	if s != nil && s.send(ss, stdio, start) != nil {
		s.proc.Kill() // it died idle: start another
		s.close()
		s = nil
	}
	if s == nil {
		var err error
		if s, err = spawnShim(adopted); err != nil {
			return nil, err
		}
		s.oom = spec.OOMScoreAdj
		// The shim reads the spec before it starts anything, so this
		// cannot block on a stopped shim. An error means the shim died:
		// wait says so.
		s.send(ss, stdio, start)
	}
	return &shimTree{shim: s, argv0: spec.Argv[0], start: start}, nil
}

// monotonic reads CLOCK_MONOTONIC, which the shim reads too.
func monotonic() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (t *shimTree) kill() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over || t.termSent {
		return
	}
	t.termSent = true
	t.shim.proc.Signal(syscall.SIGTERM)
	t.shim.proc.Signal(syscall.SIGCONT) // in case the program stopped it
	t.armLocked()
}

// armLocked starts the countdown after which the shim is killed outright,
// and the ticks that kill the tree from here meanwhile.
func (t *shimTree) armLocked() {
	if t.timer == nil && !t.over {
		t.deadline = time.Now().Add(killGrace)
		t.timer = time.AfterFunc(contInterval, t.tick)
	}
}

// contInterval is how often an armed shimTree kills what it finds of the
// tree and sends SIGCONT to the shim.
const contInterval = 50 * time.Millisecond

// tick runs every contInterval from the moment the tree is to die until the
// shim has reported it gone. Each tick kills, from here, every descendant of
// the shim that /proc shows (while the shim lives, its descendants stay its
// own) and the program's process group, then sends the shim SIGCONT: a
// program (or any process of the shim's user) may stop the shim (kill -STOP
// $PPID, again and again, faster than SIGCONT undoes it), and a stopped shim
// kills nothing. Nothing it stops stops this process, so the tree dies within
// a tick of when it was to; the shim, continued once nothing stops it any
// more, reaps it and reports as usual. Past the deadline the shim is killed
// too (the last resort: it has not finished although its tree is dead), and
// wait waits for the processes killed then to be gone.
func (t *shimTree) tick() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over {
		return
	}
	last := !time.Now().Before(t.deadline)
	t.killFromHereLocked(last)
	if !last {
		t.shim.proc.Signal(syscall.SIGCONT)
		t.timer.Reset(contInterval)
		return
	}
	t.doomed = true
	t.shim.proc.Kill()
}

// killFromHereLocked kills every descendant of the shim it finds in /proc
// (in rounds, so that what they forked meanwhile is found too) and the
// program's process group. With keep, it keeps the pidfds of what it killed
// in t.dying, for wait to wait on.
func (t *shimTree) killFromHereLocked(keep bool) {
	for range 10 {
		pids, family := descendants(t.shim.proc.Pid, nil)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			f := killOne(pid, family)
			switch {
			case f == nil:
			case keep:
				t.dying = append(t.dying, f)
			default:
				f.Close()
			}
		}
		t.fromHere = true
	}
	if t.pid > 0 {
		t.fromHere = true
	}
	t.killGroupLocked()
}

// killGroupLocked kills the program's process group, if the program started.
func (t *shimTree) killGroupLocked() {
	if t.pid > 0 { // never -0: that is our own group
		syscall.Kill(-t.pid, syscall.SIGKILL)
	}
}

// wait reads the shim's reports until the tree is gone, then keeps the shim
// for the next command if it is fit to serve one — it said "done", was not
// told to die and was not killed, and is not adopted — and ends it
// otherwise.
func (t *shimTree) wait() (Exit, error) {
	var exit *Exit
	var failed error
	done := false
	for !done && failed == nil {
		m, err := readMsg(t.shim.msgs)
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
		case m.Exit != nil && exit == nil:
			exit = m.Exit
			t.mu.Lock()
			if t.termSent && t.fromHere && exit.Signal == "SIGKILL" {
				// Our kill, from here, came before the shim's: the
				// shim saw the program end before it saw SIGTERM.
				exit.Killed = true
			}
			t.armLocked() // the cleanup is bounded too
			t.mu.Unlock()
		case m.Done && exit != nil:
			done = !m.Last
			if m.Last {
				failed = io.EOF // the shim exits: nothing more to read
			}
		default:
			failed = errors.New("proctree: message out of order from the shim")
		}
	}
	if exit != nil && failed == io.EOF {
		failed = nil // done last, or killed after the exit report
	}
	t.mu.Lock()
	if exit == nil && t.doomed && t.termSent {
		// The last resort killed the tree, as it was asked to be: the
		// shim, kept from its work, could not say how the program ended.
		exit = &Exit{Code: -1, Signal: "SIGKILL", Killed: true, Duration: time.Duration(monotonic() - t.start)}
		failed = nil
	}
	if exit == nil {
		// The shim failed, or died: what it ran is on its own now.
		t.killGroupLocked()
		t.shim.proc.Kill()
	}
	reuse := done && !t.termSent && !t.doomed && !t.shim.adopted
	t.over = true
	if t.timer != nil {
		t.timer.Stop()
	}
	dying := t.dying
	t.dying = nil
	t.mu.Unlock()
	var state *os.ProcessState
	if reuse {
		putIdle(t.shim)
	} else {
		state = t.shim.close()
		if t.shim.adopted {
			adoptDone()
		}
	}
	awaitGone(dying, killGrace)
	switch {
	case exit != nil:
		return *exit, nil
	case failed != io.EOF:
		return Exit{Code: -1}, failed
	}
	return Exit{Code: -1}, fmt.Errorf("proctree: the shim ended without a report (%v)", state)
}

// awaitGone waits until each of the processes behind the pidfds has ended
// (the kernel makes a pidfd readable then), at most d in all, and closes
// them. Processes killed with SIGKILL end unless they are in an
// uninterruptible sleep, which d bounds.
func awaitGone(pidfds []*os.File, d time.Duration) {
	deadline := time.Now().Add(d)
	for _, f := range pidfds {
		for {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, int(left.Milliseconds())+1)
			if err != unix.EINTR && (err != nil || n > 0) {
				break
			}
		}
		f.Close()
	}
}

// shim is the shim's main function; it returns its exit status.
func shim() int {
	term := make(chan os.Signal, 1)
	if os.Getenv(deafEnv) == "1" {
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	} else {
		signal.Notify(term, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	}
	closeOnExec() // a program gets stdin, stdout and stderr, nothing else
	reportDelay, _ = time.ParseDuration(os.Getenv(reportDelayEnv))
	conn := os.NewFile(connFD, "conn")
	send := func(m shimMsg) { conn.Write(m.encode()) }
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		send(shimMsg{Error: "PR_SET_CHILD_SUBREAPER: " + err.Error()})
		return 125
	}
	send(shimMsg{Ready: true})
	frames := make(chan frame)
	go readFrames(conn, frames)
	first, termed := true, false
	var want inherited
	for {
		// SIGTERM between commands ends nothing yet: it was meant for the
		// tree of a command whose frame may be on its way (the parent
		// signals as soon as Start returns), or it came because the parent
		// died, which closes the socket too. The parent never sends
		// another frame to a shim it signalled, and closes the socket.
		var f frame
		select {
		case <-term:
			termed = true
			continue
		case f = <-frames:
		}
		if f.err != nil {
			return 0 // end of file: the parent closed the socket
		}
		if termed {
			term <- syscall.SIGTERM // for this command
		}
		s, err := decodeSpec(f.spec)
		if err != nil {
			send(shimMsg{Error: err.Error()})
			return 125
		}
		if first {
			setOOMScoreAdj("self", s.OOM) // the programs and all they start inherit it
			want = readInherited()
			first = false
		}
		if !serve(s, f, term, send, want) {
			return 0
		}
	}
}

// frame is a command as the shim received it.
type frame struct {
	stdio [3]int
	start int64 // CLOCK_MONOTONIC
	spec  []byte
	err   error
}

// readFrames reads frames from conn into c until it fails, and sends the
// failure last.
func readFrames(conn *os.File, c chan<- frame) {
	for {
		f := readFrame(conn)
		c <- f
		if f.err != nil {
			return
		}
	}
}

// readFrame reads one frame from the blocking socket conn.
func readFrame(conn *os.File) frame {
	var hdr [frameHeader]byte
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := unix.Recvmsg(connFD, hdr[:], oob, unix.MSG_CMSG_CLOEXEC)
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err != nil {
		return frame{err: err}
	}
	var fds []int
	if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, c := range cmsgs {
			if more, err := unix.ParseUnixRights(&c); err == nil {
				fds = append(fds, more...)
			}
		}
	}
	if len(fds) != 3 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return frame{err: errors.New("proctree: frame without its three descriptors")}
	}
	f := frame{stdio: [3]int{fds[0], fds[1], fds[2]}}
	if _, err := io.ReadFull(conn, hdr[n:]); err != nil {
		f.err = err
		return f
	}
	size := binary.LittleEndian.Uint64(hdr[:8])
	f.start = int64(binary.LittleEndian.Uint64(hdr[8:]))
	if size > maxSpec {
		f.err = errors.New("proctree: spec too large")
		return f
	}
	f.spec = make([]byte, size)
	_, f.err = io.ReadFull(conn, f.spec)
	return f
}

// serve runs one command and kills its tree, and reports whether the shim
// may serve another: not after SIGTERM, nor when what the next command would
// inherit is no longer want.
func serve(s shimSpec, f frame, term <-chan os.Signal, send func(shimMsg), want inherited) bool {
	pid, ended, err := startProgram(s, f, func(pid int) {
		send(shimMsg{Pid: pid}) // if the parent is gone, SIGTERM is on its way
	})
	for _, fd := range f.stdio {
		unix.Close(fd) // the program has its copies: its output ends with it
	}
	if err != nil {
		m := shimMsg{Error: err.Error()}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			m.Errno = int(errno)
		}
		send(m)
		return false
	}
	r := startReaper(pid, ended)

	killed := false
	var end mainEnd
	select {
	case end = <-r.main:
	case <-term:
		killed = true
		killAll(r)
		end = <-r.main
	}
	exit := exitOf(end.status, killed, time.Duration(end.at-f.start))
	send(shimMsg{Exit: &exit})
	killAll(r) // the program ended on its own: now the rest of its tree
	again := !killed && readInherited() == want
	send(shimMsg{Done: true, Last: !again})
	return again
}

// untraced is set once a traced start failed with EPERM and an untraced one
// did not: ptrace is not allowed here (a seccomp profile, Yama's
// ptrace_scope 3), and the shim starts its programs without it from then on.
var untraced bool

// reportDelay holds the pid's report back, to widen the window a program
// would need to escape before it: a test's knob (reportDelayEnv), zero
// otherwise.
var reportDelay time.Duration

// startProgram starts the program in a process group of its own and calls
// report with its pid before the program runs an instruction of its own:
// the program is started traced (PTRACE_TRACEME), so that it stops at its
// exec, and is let go (PTRACE_DETACH) only after report returns. A program
// that kills the shim at once (kill -9 $PPID) so cannot outrun the report
// that tells the parent which group to kill. A program the shim does not
// live to let go dies with it (PR_SET_PDEATHSIG), so no program ever runs
// that the parent was not told of. The program's own exec is the traced one
// (a set-user-ID program started directly gains no privilege from it; what
// the program starts in turn does, as usual).
//
// ended is the program's end when it ended before it could be let go
// (killed meanwhile), already reaped; nil otherwise. Where ptrace is not
// allowed it starts the program untraced and reports the pid after: the
// guarantee is then the group's kill, as far as the report got out.
func startProgram(s shimSpec, f frame, report func(pid int)) (pid int, ended *mainEnd, err error) {
	// The tracer is the thread that forked; the thread's end would be the
	// parent's death to PR_SET_PDEATHSIG. Unlocked again before return, a
	// thread the runtime never ends.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	attr := &syscall.ProcAttr{
		Dir:   s.Dir,
		Env:   s.Env,
		Files: []uintptr{uintptr(f.stdio[0]), uintptr(f.stdio[1]), uintptr(f.stdio[2])},
		Sys:   groupAttr(s.Tty),
	}
	attr.Sys.Pdeathsig, attr.Sys.Ptrace = syscall.SIGKILL, !untraced
	pid, err = syscall.ForkExec(s.Path, s.Argv, attr)
	if err == syscall.EPERM && attr.Sys.Ptrace {
		attr.Sys.Ptrace = false
		if pid, err = syscall.ForkExec(s.Path, s.Argv, attr); err == nil {
			untraced = true
		}
	}
	if err != nil {
		return 0, nil, err
	}
	if attr.Sys.Ptrace {
		// The exec stops the program with a SIGTRAP; a kill meanwhile ends it instead.
		var ws syscall.WaitStatus
		for {
			_, err = syscall.Wait4(pid, &ws, 0, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || !ws.Stopped() || ws.StopSignal() == syscall.SIGTRAP {
				break
			}
			// A signal from elsewhere came first: deliver it, and wait
			// on for the exec's stop.
			syscall.PtraceCont(pid, int(ws.StopSignal()))
		}
		if err == nil && !ws.Stopped() {
			report(pid)
			return pid, &mainEnd{ws, monotonic()}, nil
		}
	}
	time.Sleep(reportDelay)
	report(pid)
	if attr.Sys.Ptrace {
		syscall.PtraceDetach(pid) // and the SIGTRAP it stopped on is dropped
	}
	return pid, nil, nil
}

// inherited is the part of the shim's state that its programs inherit and
// that a program can change from outside, as the shim's user, with no
// privilege: resource limits (prlimit), niceness (setpriority), and
// oom_score_adj (raised through /proc). A shim whose state changed serves no
// other command, so that one command cannot lower the limits of the next.
type inherited struct {
	limits [unix.RLIMIT_RTTIME + 1]unix.Rlimit
	nice   int
	oom    string
}

func readInherited() inherited {
	var s inherited
	for r := range s.limits {
		unix.Getrlimit(r, &s.limits[r])
	}
	s.nice, _ = unix.Getpriority(unix.PRIO_PROCESS, 0)
	b, _ := ReadProc("self/oom_score_adj")
	s.oom = string(b)
	return s
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
	at     int64 // CLOCK_MONOTONIC
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
//
// ended, when not nil, is the program's end, already reaped.
func startReaper(mainPid int, ended *mainEnd) *reaper {
	r := &reaper{main: make(chan mainEnd, 1), reaped: make(chan struct{}, 1), gone: make(chan struct{})}
	go func() {
		pending := ended // the program's end, not yet reported
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
				pending = &mainEnd{ws, monotonic()}
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
	var childrenOf func(int) []int
	if haveChildrenFiles() {
		// gVisor's children files list a child's threads beside it (Linux's
		// list processes only): a thread of a skipped shim would lead into
		// the shim's tree. Only the processes /proc lists count.
		procs := processes()
		childrenOf = func(pid int) []int {
			return slices.DeleteFunc(children(pid), func(c int) bool { return !procs[c] })
		}
	} else {
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

// processes returns the pids /proc lists: the processes, not their other
// threads.
func processes() map[int]bool {
	names, _ := ReadProcDir(".")
	m := make(map[int]bool, len(names))
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil {
			m[pid] = true
		}
	}
	return m
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
	f, err := StatFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 2 {
		return 0, fmt.Errorf("proctree: bad stat for %d", pid)
	}
	return strconv.Atoi(f[1])
}

// StatFields returns the fields of /proc/PID/stat from the third on (state,
// ppid, …, so field N of proc(5) is at index N-3), read as ReadProc reads.
// It fails when the file cannot be read or names no command.
func StatFields(pid int) ([]string, error) {
	b, err := ReadProc(strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	// "pid (comm) state ppid …"; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, fmt.Errorf("proctree: bad stat for %d", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
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
