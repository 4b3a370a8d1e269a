package e2b_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/backend/memory"
	pb "github.com/sandboxd/sandboxd/e2b/envdpb/process"
	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
)

// eventWait bounds the wait for something that should happen at once (a
// line echoed by a terminal); a loaded machine gets there well within it.
const eventWait = 30 * time.Second

// follower collects one stream of a process's events.
type follower struct {
	mu      sync.Mutex
	pty     strings.Builder
	other   bool // stdout or stderr data came: a terminal has one stream
	end     *pb.ProcessEvent_EndEvent
	changed chan struct{}
	done    chan struct{}
}

func follow(recv func() bool, msg func() *pb.ProcessEvent) *follower {
	f := &follower{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for recv() {
			f.mu.Lock()
			switch ev := msg().Event.(type) {
			case *pb.ProcessEvent_Data:
				f.pty.Write(ev.Data.GetPty())
				f.other = f.other || ev.Data.GetStdout() != nil || ev.Data.GetStderr() != nil
			case *pb.ProcessEvent_End:
				f.end = ev.End
			}
			close(f.changed)
			f.changed = make(chan struct{})
			f.mu.Unlock()
		}
	}()
	return f
}

// await waits for the terminal's output to hold text.
func (f *follower) await(t testing.TB, text string) {
	t.Helper()
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	for {
		f.mu.Lock()
		out, ch := f.pty.String(), f.changed
		f.mu.Unlock()
		if strings.Contains(out, text) {
			return
		}
		select {
		case <-ch:
		case <-f.done:
			f.mu.Lock()
			out = f.pty.String()
			f.mu.Unlock()
			if !strings.Contains(out, text) {
				t.Fatalf("the stream ended without %q: %q", text, out)
			}
			return
		case <-timer.C:
			t.Fatalf("no %q within %v: %q", text, eventWait, out)
		}
	}
}

// wait waits for the stream's end and returns the process's.
func (f *follower) wait(t *testing.T) *pb.ProcessEvent_EndEvent {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(eventWait):
		t.Fatalf("the stream did not end within %v", eventWait)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.end
}

func byPid(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

func sendPty(pc processconnect.ProcessClient, pid uint32, s string) error {
	_, err := pc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
		Process: byPid(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(s)}}}))
	return err
}

func resize(pc processconnect.ProcessClient, pid uint32, rows, cols uint32) error {
	_, err := pc.Update(context.Background(), connect.NewRequest(&pb.UpdateRequest{
		Process: byPid(pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Rows: rows, Cols: cols}}}))
	return err
}

func startPty(t testing.TB, pc processconnect.ProcessClient, rows, cols uint32) (uint32, *follower) {
	t.Helper()
	st, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"FOO": "bar"}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Rows: rows, Cols: cols}}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().Event.GetStart().GetPid()
	return pid, follow(st.Receive, func() *pb.ProcessEvent { return st.Msg().Event })
}

// TestPTY runs a shell on a terminal through envd's Process service (the
// local backend has terminals, as the docker backend's agent does): its
// size, a resize seen before the input after it, the input echoed, a
// second stream connected in the JSON codec, the terminal's one stream,
// and input and updates that do not fit the process refused.
func TestPTY(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base"}`)
	pc := processconnect.NewProcessClient(e.envd(c), e.url)
	pid, f := startPty(t, pc, 24, 80)

	if err := sendPty(pc, pid, "stty size; echo \"FOO=$FOO\"\n"); err != nil {
		t.Fatal(err)
	}
	f.await(t, "24 80")
	f.await(t, "FOO=bar")
	if err := resize(pc, pid, 30, 100); err != nil {
		t.Fatal(err)
	}
	if err := sendPty(pc, pid, "stty size\n"); err != nil {
		t.Fatal(err)
	}
	f.await(t, "30 100")

	js := processconnect.NewProcessClient(e.envd(c), e.url, connect.WithProtoJSON())
	cs, err := js.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{Process: byPid(pid)}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if !cs.Receive() || cs.Msg().Event.GetStart().GetPid() != pid {
		t.Fatalf("connect: no start event for %d: %v", pid, cs.Err())
	}
	g := follow(cs.Receive, func() *pb.ProcessEvent { return cs.Msg().Event })
	if err := sendPty(js, pid, "echo second-$((20+22))\n"); err != nil {
		t.Fatal(err)
	}
	f.await(t, "second-42")
	g.await(t, "second-42")

	for _, tc := range []struct {
		name string
		err  error
		want connect.Code
	}{
		{"stdin to a terminal", func() error {
			_, err := pc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
				Process: byPid(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
			return err
		}(), connect.CodeFailedPrecondition},
		{"no rows", resize(pc, pid, 0, 80), connect.CodeInvalidArgument},
		{"too many columns", resize(pc, pid, 24, 1<<16), connect.CodeInvalidArgument},
		{"no size", func() error {
			_, err := pc.Update(context.Background(), connect.NewRequest(&pb.UpdateRequest{Process: byPid(pid)}))
			return err
		}(), connect.CodeInvalidArgument},
		{"no such process", resize(pc, 99999, 24, 80), connect.CodeNotFound},
	} {
		if connect.CodeOf(tc.err) != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, tc.err, tc.want)
		}
	}

	if err := sendPty(pc, pid, "exit 3\n"); err != nil {
		t.Fatal(err)
	}
	for _, fl := range []*follower{f, g} {
		if end := fl.wait(t); end == nil || end.ExitCode != 3 || !end.Exited {
			t.Errorf("end %v; want exit 3", end)
		}
		if fl.other {
			t.Errorf("a terminal's output came as stdout or stderr; want pty data alone")
		}
	}
	if err := resize(pc, pid, 24, 80); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("resize after the end: %v; want not_found", err)
	}
}

// TestPTYNotForPlainProcess refuses terminal input and resizes for a
// process started without a terminal.
func TestPTYNotForPlainProcess(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base"}`)
	pc := processconnect.NewProcessClient(e.envd(c), e.url)
	stdin := true
	st, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: &stdin}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	pid := st.Msg().Event.GetStart().GetPid()
	for name, err := range map[string]error{"pty input": sendPty(pc, pid, "x"), "resize": resize(pc, pid, 24, 80)} {
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("%s to a process without a terminal: %v; want failed_precondition", name, err)
		}
	}
	// The manager's shutdown waits for the calls in flight: end it.
	if _, err := pc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: byPid(pid), Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}

// TestPTYUnsupported: a backend whose workspace has no terminal (memory's
// mirror) refuses a PTY and a resize in E2B's shape, not ignoring them.
func TestPTYUnsupported(t *testing.T) {
	e := startOn(t, memory.Backend{TempDir: t.TempDir()})
	c := e.create("acme-key", `{"templateID":"base"}`)
	pc := processconnect.NewProcessClient(e.envd(c), e.url)
	st, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh"}, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}}))
	if err == nil {
		for st.Receive() {
			t.Fatalf("a PTY started on a backend without terminals: %v", st.Msg())
		}
		err = st.Err()
		st.Close()
	}
	if connect.CodeOf(err) != connect.CodeUnimplemented || !strings.Contains(err.Error(), "not supported by this server") {
		t.Errorf("pty on memory: %v; want unimplemented, not supported by this server", err)
	}
	if err := resize(pc, 1000, 24, 80); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("resize on memory: %v; want unimplemented", err)
	}
}

// TestPTYKillTree: SIGKILL to a process on a terminal ends its whole
// tree, a background job it started included, before SendSignal answers
// (the local backend: its commands are the host's processes).
func TestPTYKillTree(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base"}`)
	pc := processconnect.NewProcessClient(e.envd(c), e.url)
	pid, f := startPty(t, pc, 24, 80)
	if err := sendPty(pc, pid, "sleep 600 & echo \"job=$!=\"\n"); err != nil {
		t.Fatal(err)
	}
	f.await(t, "=\r\n")
	f.mu.Lock()
	out := f.pty.String()
	f.mu.Unlock()
	i := strings.LastIndex(out, "job=")
	job, err := strconv.Atoi(strings.TrimSuffix(strings.Fields(out[i+len("job="):])[0], "="))
	if err != nil {
		t.Fatalf("no job pid in %q", out)
	}
	if err := syscall.Kill(job, 0); err != nil {
		t.Fatalf("the job %d does not run: %v", job, err)
	}
	if _, err := pc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: byPid(pid), Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(job, 0); err != syscall.ESRCH {
		t.Errorf("the background job %d outlived the kill: %v", job, err)
	}
	if end := f.wait(t); end == nil || end.Exited {
		t.Errorf("end %v; want killed", end)
	}
}
