package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	pb "github.com/sandboxd/sandboxd/e2b/envdpb/process"
	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
	"github.com/sandboxd/sandboxd/workspace"
)

// processService is envd's Process service over a sandbox's commands: each
// process is one Session.Exec, its output fanned out to the streams that
// follow it (Start's and Connect's), its input a bounded inbox.
type processService struct{ s *Server }

var _ processconnect.ProcessHandler = (*processService)(nil)

// firstPID is the first process ID a sandbox hands out. The IDs are the
// sandbox's own names for its processes, not the kernel's.
const firstPID = 1000

// maxInbox bounds the input sent to a process that it has not read yet.
const maxInbox = 1 << 20

// maxProcs bounds the processes a sandbox keeps, running ones and those
// whose end no stream has seen.
const maxProcs = 256

// procTable is a sandbox's processes.
type procTable struct {
	box    *sandbox
	mu     sync.Mutex
	next   uint32
	procs  map[uint32]*proc
	closed bool
}

func newProcTable(b *sandbox) *procTable {
	return &procTable{box: b, next: firstPID, procs: map[uint32]*proc{}}
}

// proc is one process.
type proc struct {
	pid    uint32
	tag    *string
	cfg    *pb.ProcessConfig
	in     *inbox // nil: started without stdin
	cancel context.CancelCauseFunc
	// resize is the terminal's of a process started with one (pty); nil
	// otherwise. Its input is in, its output one stream.
	resize *workspace.Resizer

	mu   sync.Mutex
	subs map[*sub]struct{}
	end  *pb.ProcessEvent // set once it has ended
	done chan struct{}
}

// sub is one stream following a process: its events, and left, closed
// when it stops following.
type sub struct {
	ch   chan *pb.ProcessEvent
	left chan struct{}
}

// errKilled is the cause of a process ended by a signal.
type errKilled struct{ sig pb.Signal }

func (e errKilled) Error() string { return "killed by " + e.sig.String() }

// subscribe returns a follower of p's events from now on; of one that has
// ended, its end alone.
func (p *proc) subscribe() *sub {
	sb := &sub{ch: make(chan *pb.ProcessEvent, 64), left: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		sb.ch <- p.end
		close(sb.ch)
		return sb
	}
	p.subs[sb] = struct{}{}
	return sb
}

// unsubscribe stops sb following p.
func (p *proc) unsubscribe(sb *sub) {
	close(sb.left)
	p.mu.Lock()
	delete(p.subs, sb)
	p.mu.Unlock()
}

// publish sends ev to every stream following p, waiting for each (a slow
// reader slows the command, under the agent's flow control) unless it
// leaves.
func (p *proc) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := slices.Collect(maps.Keys(p.subs))
	p.mu.Unlock()
	for _, sb := range subs {
		select {
		case sb.ch <- ev:
		case <-sb.left:
		}
	}
}

// start registers a process and runs it; the caller's channel is
// subscribed before the process starts, so it misses nothing.
func (t *procTable) start(cfg *pb.ProcessConfig, tag *string, stdin bool, cmd workspace.Command, term *workspace.Terminal) (*proc, *sub, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox has ended"))
	}
	if tag != nil {
		for _, p := range t.procs {
			if p.tag != nil && *p.tag == *tag && p.running() {
				t.mu.Unlock()
				return nil, nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a process tagged %q is running", *tag))
			}
		}
	}
	if len(t.procs) >= maxProcs {
		t.forgetEnded()
	}
	if len(t.procs) >= maxProcs {
		t.mu.Unlock()
		return nil, nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox runs %d processes, the most it may", maxProcs))
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	p := &proc{pid: t.next, tag: tag, cfg: cfg, cancel: cancel, subs: map[*sub]struct{}{}, done: make(chan struct{})}
	t.next++
	if stdin || term != nil {
		p.in = newInbox(maxInbox)
		cmd.Stdin = p.in
	}
	if term != nil {
		p.resize = &workspace.Resizer{}
		term.Resize = p.resize
	}
	t.procs[p.pid] = p
	t.mu.Unlock()
	sb := p.subscribe()
	cmd.Output = func(s workspace.Stream, b []byte) {
		data := &pb.ProcessEvent_DataEvent{}
		switch {
		case term != nil:
			data.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: slices.Clone(b)}
		case s == workspace.Stderr:
			data.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: slices.Clone(b)}
		default:
			data.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: slices.Clone(b)}
		}
		p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: data}})
	}
	go func() {
		var res workspace.Result
		var err error
		if term != nil {
			res, err = t.box.sess.ExecTerminal(ctx, "e2b.process", cmd, *term)
		} else {
			res, err = t.box.sess.Exec(ctx, "e2b.process", cmd)
		}
		if p.in != nil {
			p.in.Close()
		}
		end := &pb.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode), Exited: res.Signal == "" && err == nil}
		var killed errKilled
		switch {
		case errors.As(context.Cause(ctx), &killed):
			end.ExitCode, end.Exited, end.Status = -1, false, "signal: killed"
		case err != nil:
			msg := err.Error()
			end.ExitCode, end.Error, end.Status = -1, &msg, "error"
		case res.TimedOut:
			msg := "the command ran past its timeout and was killed"
			end.ExitCode, end.Exited, end.Status, end.Error = -1, false, "signal: killed", &msg
		case res.Signal != "":
			end.ExitCode, end.Status = -1, "signal: "+res.Signal
		default:
			end.Status = "exit status " + strconv.Itoa(res.ExitCode)
		}
		cancel(nil)
		ev := &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
		p.publish(ev)
		p.mu.Lock()
		p.end = ev
		p.subs = map[*sub]struct{}{}
		p.mu.Unlock()
		close(p.done)
	}()
	return p, sb, nil
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// forgetEnded drops the processes that have ended; t.mu is held.
func (t *procTable) forgetEnded() {
	for pid, p := range t.procs {
		if !p.running() {
			delete(t.procs, pid)
		}
	}
}

// find returns the process a selector names.
func (t *procTable) find(sel *pb.ProcessSelector) (*proc, error) {
	if sel == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process: name it by pid or tag"))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.Selector.(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := t.procs[s.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range t.procs {
			if p.tag != nil && *p.tag == s.Tag && p.running() {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process: name it by pid or tag"))
}

// closeAll kills every process, as the sandbox ends.
func (t *procTable) closeAll() {
	t.mu.Lock()
	t.closed = true
	procs := slices.Collect(maps.Values(t.procs))
	t.mu.Unlock()
	for _, p := range procs {
		p.cancel(errors.New("the sandbox ended"))
	}
}

// command is the workspace command of a process's configuration.
func (svc *processService) command(ctx context.Context, b *sandbox, cfg *pb.ProcessConfig) (workspace.Command, error) {
	if cfg == nil || cfg.Cmd == "" {
		return workspace.Command{}, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	cmd := workspace.Command{Argv: append([]string{cfg.Cmd}, cfg.Args...), Env: map[string]string{}}
	maps.Copy(cmd.Env, b.envs)
	maps.Copy(cmd.Env, cfg.Envs)
	cwd := Home
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		cwd = *cfg.Cwd
	}
	name, inside := workspaceName(b, cwd)
	if inside {
		fi, err := b.sess.FS().Stat(ctx, cmpName(name))
		switch {
		case err != nil:
			return cmd, rpcError(err)
		case !fi.IsDir():
			return cmd, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %s is not a directory", cwd))
		}
		// The command starts in the directory, and knows it by its E2B
		// name where that is the same directory (the dev image links
		// /home/user to the workspace): PWD says /home/user/…, which a
		// shell's pwd keeps because it names the directory it is in, as
		// a shell that cd'd there would have set it. Where Home is
		// elsewhere, PWD is the workspace's own name (the agent's).
		// Asked once per sandbox, not wrapped in a shell per command.
		cmd.Dir = name
		same, err := b.homeIsRoot(ctx)
		if err != nil {
			return cmd, rpcError(err)
		}
		if same {
			cmd.Env["PWD"] = e2bPath(name)
		}
	} else {
		// A directory outside the workspace: the command starts there
		// through a shell, which says so when it cannot.
		cmd.Argv = append([]string{"/bin/sh", "-c", `cd -- "$0" && exec "$@"`, cwd}, cmd.Argv...)
	}
	if dl, ok := ctx.Deadline(); ok {
		cmd.Timeout = max(time.Until(dl), time.Millisecond)
	}
	return cmd, nil
}

func cmpName(name string) string {
	if name == "" {
		return "."
	}
	return name
}

func (svc *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	b := boxOf(ctx)
	m := req.Msg
	term, err := terminalOf(b, m.Pty)
	if err != nil {
		return err
	}
	cmd, err := svc.command(ctx, b, m.Process)
	if err != nil {
		return err
	}
	p, sb, err := b.procs.start(m.Process, m.Tag, m.Stdin != nil && *m.Stdin, cmd, term)
	if err != nil {
		return err
	}
	return follow(ctx, req.Header(), p, sb, func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) })
}

func (svc *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := boxOf(ctx).procs.find(req.Msg.Process)
	if err != nil {
		return err
	}
	return follow(ctx, req.Header(), p, p.subscribe(), func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) })
}

// follow streams p's events from ch: first its start, then its output as
// it comes and its end, with a keepalive at the interval the client asks
// for (Keepalive-Ping-Interval, seconds). When the client goes, the process
// runs on; when the request's deadline passes, the process was started with
// it as its timeout and ends with it, and the stream ends
// deadline_exceeded.
func follow(ctx context.Context, h http.Header, p *proc, sb *sub, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(sb)
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if secs := keepaliveSecs(h); secs > 0 {
		t := time.NewTicker(time.Duration(secs) * time.Second)
		defer t.Stop()
		tick = t.C
	}
	ended := func() error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command ran past its timeout and was killed"))
		}
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	for {
		select {
		case ev, ok := <-sb.ch:
			// Past the deadline, the process's end (it was killed at it)
			// and the deadline are both ready: the deadline is the answer,
			// whichever select took.
			if ctx.Err() != nil {
				return ended()
			}
			if !ok {
				return nil
			}
			if err := send(ev); err != nil {
				return err
			}
			if _, end := ev.Event.(*pb.ProcessEvent_End); end {
				return nil
			}
		case <-tick:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ended()
		}
	}
}

// keepaliveSecs is the keepalive interval a stream's client asks for
// (Keepalive-Ping-Interval, seconds), or 0.
func keepaliveSecs(h http.Header) int {
	secs, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || secs < 0 {
		return 0
	}
	return secs
}

func (svc *processService) List(ctx context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	t := boxOf(ctx).procs
	t.mu.Lock()
	var out []*pb.ProcessInfo
	for _, p := range t.procs {
		if p.running() {
			out = append(out, &pb.ProcessInfo{Config: p.cfg, Pid: p.pid, Tag: p.tag})
		}
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b *pb.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return connect.NewResponse(&pb.ListResponse{Processes: out}), nil
}

// write sends input to p.
func write(p *proc, in *pb.ProcessInput) error {
	if in == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input is required"))
	}
	switch v := in.Input.(type) {
	case *pb.ProcessInput_Pty:
		if p.resize == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal (start it with pty): send its input as stdin", p.pid))
		}
		if err := p.in.Write(v.Pty); err != nil {
			return connect.NewError(connect.CodeResourceExhausted, err)
		}
		return nil
	case *pb.ProcessInput_Stdin:
		if p.resize != nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has a terminal: send its input as pty", p.pid))
		}
		if p.in == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d was started without stdin (start it with stdin)", p.pid))
		}
		if err := p.in.Write(v.Stdin); err != nil {
			return connect.NewError(connect.CodeResourceExhausted, err)
		}
		return nil
	}
	return connect.NewError(connect.CodeInvalidArgument, errors.New("input: want stdin or pty"))
}

func (svc *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := boxOf(ctx).procs.find(req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if err := write(p, req.Msg.Input); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (svc *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *pb.StreamInputRequest_Start:
			if p != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the stream's start came twice"))
			}
			var err error
			if p, err = boxOf(ctx).procs.find(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the stream's first message must be its start, naming the process"))
			}
			if err := write(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("want start, data or keepalive"))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (svc *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := boxOf(ctx).procs.find(req.Msg.Process)
	if err != nil {
		return nil, err
	}
	switch sig := req.Msg.Signal; sig {
	case pb.Signal_SIGNAL_SIGKILL, pb.Signal_SIGNAL_SIGTERM:
		// Both end the process's whole tree at once: the agent kills it,
		// as at a command's cancellation.
		p.cancel(errKilled{sig})
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeDeadlineExceeded, errors.New("the process did not end in time"))
		}
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: want SIGTERM or SIGKILL", sig))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// inbox is a process's standard input: what SendInput and StreamInput
// wrote and the process has not read yet, at most max bytes.
type inbox struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	max    int
	closed bool
}

func newInbox(max int) *inbox {
	in := &inbox{max: max}
	in.cond = sync.NewCond(&in.mu)
	return in
}

// Write queues p, or fails when it would hold more than its bound.
func (in *inbox) Write(p []byte) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case in.closed:
		return errors.New("the process's input is closed (it has ended)")
	case len(in.buf)+len(p) > in.max:
		return fmt.Errorf("the process has %d bytes of input it has not read; %d more would pass the %d it may hold", len(in.buf), len(p), in.max)
	}
	in.buf = append(in.buf, p...)
	in.cond.Broadcast()
	return nil
}

// Read blocks until there is input or the inbox is closed.
func (in *inbox) Read(p []byte) (int, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for len(in.buf) == 0 && !in.closed {
		in.cond.Wait()
	}
	if len(in.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, in.buf)
	in.buf = in.buf[n:]
	return n, nil
}

// Close ends the input once what is queued is read.
func (in *inbox) Close() {
	in.mu.Lock()
	in.closed = true
	in.cond.Broadcast()
	in.mu.Unlock()
}
