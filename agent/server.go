package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"
	"sync"

	"golang.org/x/sync/semaphore"

	"github.com/sandboxd/sandboxd/textedit"
	"github.com/sandboxd/sandboxd/workspace"
)

// Server serves a FileSystem and a Bash over a stream. It is safe to Serve
// several streams at once.
type Server struct {
	fsys    workspace.FileSystem
	bash    workspace.Bash
	opts    serverOptions
	reading *semaphore.Weighted // bytes of files being read and sent, all streams together
	// jobs are the background commands, the server's and not any
	// stream's: they outlive the connection that started them. Nil
	// without a bash.
	jobs *workspace.Jobs
	// boot names this server in its Hello (hello.Boot).
	boot string
}

// ServerOption configures NewServer.
type ServerOption func(*serverOptions)

type serverOptions struct {
	build    string
	maxCalls int
	maxWrite int64
	maxRead  int64
	log      *slog.Logger
}

// WithBuild sets the build identifier the server announces in its Hello.
func WithBuild(id string) ServerOption { return func(o *serverOptions) { o.build = id } }

// WithMaxCalls bounds the calls in flight on one stream; a call over the bound
// fails with workspace.ErrUnavailable. The default is 1024.
func WithMaxCalls(n int) ServerOption { return func(o *serverOptions) { o.maxCalls = n } }

// WithMaxWrite bounds the size of one WriteFile; the default is 1 GiB.
func WithMaxWrite(n int64) ServerOption { return func(o *serverOptions) { o.maxWrite = n } }

// WithReadBudget bounds the bytes of files that ReadFile calls hold while
// they are read and sent, all streams together; the default is 256 MiB. A
// call waits until its file's size is free (a file over the budget waits
// for all of it), so concurrent reads of large files — a few downloads at
// once — are served in turn rather than all held at once: the agent's
// memory, which is the session container's, stays bounded.
func WithReadBudget(n int64) ServerOption { return func(o *serverOptions) { o.maxRead = n } }

// WithLogger sets where the server logs; the default discards.
func WithLogger(l *slog.Logger) ServerOption { return func(o *serverOptions) { o.log = l } }

// NewServer returns a server for fsys and bash. A nil bash refuses every
// command with workspace.ErrForbidden.
func NewServer(fsys workspace.FileSystem, bash workspace.Bash, opts ...ServerOption) *Server {
	o := serverOptions{build: "dev", maxCalls: 1024, maxWrite: 1 << 30, maxRead: 256 << 20, log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxRead <= 0 {
		o.maxRead = 256 << 20
	}
	s := &Server{fsys: fsys, bash: bash, opts: o, reading: semaphore.NewWeighted(o.maxRead), boot: strings.ToLower(rand.Text()[:16])}
	if bash != nil {
		s.jobs = workspace.NewJobs(bash)
	}
	return s
}

// Close stops the server's background commands, each one's whole process
// tree killed, and waits for them until ctx ends. Streams being served are
// not affected; a background command started after Close fails.
func (s *Server) Close(ctx context.Context) error {
	if s.jobs == nil {
		return nil
	}
	return s.jobs.Close(ctx)
}

// Serve answers the client at the other end of rw until rw reports end of
// input (a clean end: Serve returns nil), a read or write fails, the client
// breaks the protocol, or ctx ends (Serve closes rw when it is an io.Closer,
// and returns ctx's error). Before it returns, Serve cancels every call in
// flight and waits for it: a command still running is killed, as its Bash
// promises for a context that ends, and a lock still held is released.
// Background commands (the bg* operations) are the server's: they run on
// after the stream, for another to read, until Close.
func (s *Server) Serve(ctx context.Context, rw io.ReadWriter) error {
	if cl, ok := rw.(io.Closer); ok {
		stop := context.AfterFunc(ctx, func() { cl.Close() })
		defer stop()
	}
	return s.serveConn(ctx, bufio.NewReaderSize(rw, 64<<10), rw)
}

// serveConn serves one connection's frames from r, its answers to w; see
// Serve.
func (s *Server) serveConn(ctx context.Context, r *bufio.Reader, w io.Writer) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &serverConn{s: s, w: w, ctx: ctx, cancel: cancel, calls: make(map[uint32]*serverCall)}
	err := c.readLoop(r)
	cancel()
	c.wg.Wait()
	switch {
	case parent.Err() != nil:
		return parent.Err()
	case err == io.EOF:
		return nil
	}
	return err
}

// ServeShared serves the clients that follow one another on one stream
// that outlives each of them — a container's standard input and output,
// which the engine keeps when an attached client goes and hands on to the
// next — until the stream ends (a clean end: nil), a read fails, or ctx
// ends. A connection ends where the client's frames can no longer be acted
// on (a frame cut short by the client's death, the break a new client
// sends; see sealTrailer): its calls are cancelled, as at the end of
// Serve, and the next connection begins at the next resync line, which is
// answered in kind. So a client that dies leaves nothing half done, and
// the next one to attach gets the same agent, its background commands
// running on.
func (s *Server) ServeShared(ctx context.Context, r io.Reader, w io.Writer) error {
	br := bufio.NewReaderSize(r, 64<<10)
	f := &fence{w: w}
	for {
		err := s.serveConn(ctx, br, f.writer())
		f.advance() // what the ended connection's calls still send goes nowhere
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			return nil
		}
		// A frame that could not be acted on, or a client of another
		// protocol: the connection is over, the stream is not (a stream
		// that broke fails the wait for the next).
		s.opts.log.Info("agent: the connection ended; waiting for the next client", "why", err)
		nonce, err := awaitResync(br, "")
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := f.writer().Write(resyncLine(nonce)); err != nil {
			return err
		}
	}
}

// fence is the writer of a shared stream (ServeShared): each connection
// writes through a writer of its own generation, which fails once the
// connection has ended, so that nothing of it is written after the line
// that begins the next.
type fence struct {
	mu  sync.Mutex
	w   io.Writer
	gen uint64
}

// errFenced is what a write of a connection that has ended fails with.
var errFenced = errors.New("the connection has ended")

func (f *fence) writer() io.Writer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fencedWriter{f, f.gen}
}

func (f *fence) advance() {
	f.mu.Lock()
	f.gen++
	f.mu.Unlock()
}

type fencedWriter struct {
	f   *fence
	gen uint64
}

func (w fencedWriter) Write(p []byte) (int, error) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	if w.f.gen != w.gen {
		return 0, errFenced
	}
	return w.f.w.Write(p)
}

type serverConn struct {
	s      *Server
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	wmu  sync.Mutex
	w    io.Writer
	werr error
	wbuf []byte

	mu       sync.Mutex
	calls    map[uint32]*serverCall
	acceptor *acceptor // the stream's listener, from the first Accept on

	// sealed is set once the client asked for sealed frames in its Hello.
	sealed bool
}

// serverCall is one call in flight.
type serverCall struct {
	id     uint32
	req    request
	ctx    context.Context
	cancel context.CancelFunc
	in     *inbox // the call's input, for writefile and run
	out    *creditGate
	// held is what the call holds of the server's read budget until its
	// reply is sent.
	held   int64
	endOut context.CancelFunc // closes out: when the call ends, not at a cancel
	resize *workspace.Resizer // of a pty call: its terminal's size
}

// end releases the call's contexts, its output's included.
func (call *serverCall) end() {
	call.cancel()
	if call.endOut != nil {
		call.endOut()
	}
}

// send writes one frame. After a failed write it fails at once and the
// connection is being torn down.
func (c *serverConn) send(typ, flags byte, id uint32, header, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	c.wbuf = appendFrame(c.wbuf[:0], typ, flags, id, header, payload)
	if _, err := c.w.Write(c.wbuf); err != nil {
		c.werr = err
		c.cancel()
		return err
	}
	if cap(c.wbuf) > 2*chunkSize {
		c.wbuf = nil
	}
	return nil
}

func (c *serverConn) readLoop(r *bufio.Reader) error {
	f, err := readFrame(r)
	if err != nil {
		return err
	}
	var h hello
	if f.typ != frameHello || json.Unmarshal(f.header, &h) != nil {
		return fmt.Errorf("%w: the stream does not open with hello", errFrame)
	}
	mine, _ := json.Marshal(hello{Version: ProtocolVersion, Build: c.s.opts.build, Shell: workspace.ShellOf(c.s.bash),
		Seal: h.Seal, Background: c.s.jobs != nil, Boot: c.s.boot, Terminal: isTerminal(c.s.bash)})
	if err := c.send(frameHello, 0, 0, mine, nil); err != nil {
		return err
	}
	if h.Version != ProtocolVersion {
		return fmt.Errorf("client speaks protocol %d, this server %d", h.Version, ProtocolVersion)
	}
	c.sealed = h.Seal
	for {
		f, err := readFrameSealed(r, c.sealed)
		if err != nil {
			return err
		}
		if err := c.dispatch(f); err != nil {
			c.s.opts.log.Warn("agent: protocol error", "err", err)
			return err
		}
	}
}

func (c *serverConn) dispatch(f frame) error {
	switch f.typ {
	case frameCall:
		return c.start(f)
	case frameData:
		call := c.lookup(f.id)
		if f.flags&flagResize != 0 {
			return c.resized(call, f)
		}
		if call == nil || call.in == nil {
			return nil // input for a call that has already ended
		}
		return call.in.push(f.payload, f.flags&flagEnd != 0)
	case frameCancel:
		if call := c.lookup(f.id); call != nil {
			call.cancel()
		}
		return nil
	case frameWindow:
		n, ok := credit(f)
		if !ok {
			return fmt.Errorf("%w: bad window", errFrame)
		}
		if call := c.lookup(f.id); call != nil && call.out != nil && !call.out.grant(n) {
			return fmt.Errorf("%w: credit over the window", errFrame)
		}
		return nil
	}
	return fmt.Errorf("%w: unexpected frame type %d", errFrame, f.typ)
}

func (c *serverConn) lookup(id uint32) *serverCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[id]
}

func (c *serverConn) start(f frame) error {
	var req request
	if err := json.Unmarshal(f.header, &req); err != nil {
		return fmt.Errorf("%w: call %d: %v", errFrame, f.id, err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	call := &serverCall{id: f.id, req: req, ctx: ctx, cancel: cancel}
	switch {
	case (req.Op == opWriteFile || req.Op == opSwap) && req.Size >= 0 && req.Size <= c.s.opts.maxWrite:
		call.in = newInbox(ctx, int(req.Size), nil)
	case req.Op == opWriteFile || req.Op == opSwap:
		cancel()
		return c.reply(f.id, nil, workspace.PathError("write", req.Name, workspace.ErrFileTooLarge))
	case (req.Op == opRun || req.Op == opPty) && req.Run != nil && req.Run.Stdin, req.Op == opAccept, req.Op == opDial:
		call.in = newInbox(ctx, window, func(n int) { c.sendWindow(f.id, n) })
	}
	if req.Op == opPty {
		call.resize = &workspace.Resizer{}
	}
	if req.Op == opRun || req.Op == opAccept || req.Op == opDial || req.Op == opPty {
		// A cancelled command's output up to its kill is still delivered,
		// as long as the client grants credit: the gate closes when the
		// call ends, or the connection.
		outCtx, endOut := context.WithCancel(c.ctx)
		call.out, call.endOut = newCreditGate(outCtx, window), endOut
	}

	c.mu.Lock()
	_, dup := c.calls[f.id]
	full := len(c.calls) >= c.s.opts.maxCalls
	if !dup && !full {
		c.calls[f.id] = call
	}
	c.mu.Unlock()
	if dup || full {
		call.end()
	}
	if dup {
		return fmt.Errorf("%w: call %d is already in flight", errFrame, f.id)
	}
	if full {
		return c.reply(f.id, nil, &RemoteError{Kind: workspace.ErrUnavailable, Msg: "too many calls in flight"})
	}
	if call.in != nil {
		if err := call.in.push(f.payload, f.flags&flagEnd != 0); err != nil {
			return err
		}
	}
	c.wg.Add(1)
	go c.handle(call)
	return nil
}

func (c *serverConn) handle(call *serverCall) {
	defer c.wg.Done()
	body, err := c.serve(call)
	c.mu.Lock()
	delete(c.calls, call.id)
	c.mu.Unlock()
	call.end()
	if werr := c.reply(call.id, body, err); werr != nil {
		c.s.opts.log.Debug("agent: reply not sent", "id", call.id, "err", werr)
	}
	if call.held > 0 {
		c.s.reading.Release(call.held)
	}
}

// reply sends a call's body, in chunks, and its Reply frame.
func (c *serverConn) reply(id uint32, body []byte, err error) error {
	var header []byte
	if err != nil {
		header, _ = json.Marshal(replyHeader{Err: encodeError(err)})
	}
	if len(body) > chunkSize {
		h, _ := json.Marshal(dataHeader{Size: int64(len(body))})
		for len(body) > chunkSize {
			if err := c.send(frameData, 0, id, h, body[:chunkSize]); err != nil {
				return err
			}
			body, h = body[chunkSize:], nil
		}
	}
	return c.send(frameReply, 0, id, header, body)
}

func (c *serverConn) sendWindow(id uint32, n int) {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], uint32(n))
	c.send(frameWindow, 0, id, nil, p[:])
}

// hold takes size bytes of the read budget for call, until its reply is
// sent (handle gives them back).
func (c *serverConn) hold(call *serverCall, size int64) error {
	n := min(max(size, 1), c.s.opts.maxRead)
	if err := c.s.reading.Acquire(call.ctx, n); err != nil {
		return err
	}
	call.held = n
	return nil
}

// serve runs one call and returns its body.
func (c *serverConn) serve(call *serverCall) ([]byte, error) {
	ctx, req, fsys := call.ctx, call.req, c.s.fsys
	switch req.Op {
	case opStat, opLstat:
		stat := fsys.Stat
		if req.Op == opLstat {
			stat = fsys.Lstat
		}
		fi, err := stat(ctx, req.Name)
		if err != nil {
			return nil, err
		}
		return json.Marshal(encodeInfo(fi))
	case opReadDir:
		entries, err := fsys.ReadDir(ctx, req.Name)
		if err != nil {
			return nil, err
		}
		ws := make([]wireDirEntry, len(entries))
		for i, e := range entries {
			ws[i] = wireDirEntry{Name: e.Name(), Type: uint32(e.Type())}
			if fi, err := e.Info(); err == nil {
				ws[i].Info = encodeInfo(fi)
			}
		}
		return json.Marshal(ws)
	case opReadFile:
		// Hold the file's size of the read budget until the reply is sent
		// (handle gives it back); a file that grows since the Stat is
		// still bounded by req.Max.
		if fi, err := fsys.Stat(ctx, req.Name); err == nil && fi.Mode().IsRegular() && fi.Size() <= req.Max {
			if err := c.hold(call, fi.Size()); err != nil {
				return nil, err
			}
		}
		return fsys.ReadFile(ctx, req.Name, req.Max)
	case opWriteFile:
		data, err := call.in.readAll()
		if err != nil {
			return nil, err
		}
		return nil, fsys.WriteFile(ctx, req.Name, data, fs.FileMode(req.Perm))
	case opSwap:
		data, err := call.in.readAll()
		if err != nil {
			return nil, err
		}
		// The old contents are held as a read's are, twice for an edit
		// (its result).
		if fi, err := fsys.Stat(ctx, req.Name); err == nil && fi.Mode().IsRegular() && fi.Size() <= req.Max {
			held := fi.Size()
			if req.Edit {
				held *= 2
			}
			if err := c.hold(call, held); err != nil {
				return nil, err
			}
		}
		sreq := workspace.SwapRequest{Name: req.Name, Data: data, Perm: fs.FileMode(req.Perm), Root: req.Root, Max: req.Max,
			Real: req.Real, OldSum: req.Sum, Lock: req.Lock}
		if req.Edit {
			var e textedit.Edit
			if err := json.Unmarshal(data, &e); err != nil {
				return nil, workspace.Errorf(workspace.ErrInvalidArgument, "swap: the edit: %v", err)
			}
			sreq.Edit, sreq.Data = e, nil
		}
		res, err := workspace.Swap(ctx, fsys, sreq)
		if err != nil {
			return nil, err
		}
		return json.Marshal(encodeSwap(res))
	case opMkdir:
		return nil, fsys.Mkdir(ctx, req.Name, fs.FileMode(req.Perm))
	case opMkdirAll:
		return nil, workspace.MkdirAll(ctx, fsys, req.Name, fs.FileMode(req.Perm))
	case opRemove:
		return nil, fsys.Remove(ctx, req.Name)
	case opRemoveAll:
		return nil, workspace.RemoveAll(ctx, fsys, req.Name)
	case opRename:
		return nil, fsys.Rename(ctx, req.Name, req.NewName)
	case opSymlink, opReadlink:
		sl, ok := fsys.(workspace.SymlinkFS)
		if !ok {
			return nil, workspace.PathError(req.Op, req.Name, workspace.ErrForbidden)
		}
		if req.Op == opSymlink {
			return nil, sl.Symlink(ctx, req.Target, req.Name)
		}
		target, err := sl.Readlink(ctx, req.Name)
		return []byte(target), err
	case opLock:
		unlock, err := workspace.Lock(ctx, fsys, req.Name)
		if err != nil {
			return nil, err
		}
		// Held until the client cancels the call, or the stream ends.
		c.send(frameData, 0, call.id, nil, nil)
		<-ctx.Done()
		unlock()
		return nil, nil
	case opWalk:
		if req.Walk == nil {
			break
		}
		res, err := workspace.Walk(ctx, fsys, *req.Walk)
		if err != nil {
			return nil, err
		}
		return json.Marshal(res)
	case opGrep:
		if req.Grep == nil {
			break
		}
		res, err := workspace.Grep(ctx, fsys, *req.Grep)
		if err != nil {
			return nil, err
		}
		return json.Marshal(res)
	case opRun:
		if req.Run == nil {
			break
		}
		return c.run(call)
	case opPty:
		if req.Run == nil || req.Pty == nil {
			break
		}
		return c.runTerminal(call)
	case opAccept:
		return nil, c.accept(call)
	case opDial:
		return nil, c.dial(call)
	case opHandoff:
		return nil, c.handoff(call)
	case opListen:
		_, err := c.acceptorFor(call.req.Addr)
		return nil, err
	case opBgStart, opBgRead, opBgKill, opBgList:
		return c.background(call)
	}
	return nil, &RemoteError{Kind: workspace.ErrInvalidArgument, Msg: fmt.Sprintf("unknown operation %q", req.Op)}
}

// run runs a command, streaming its output under flow control.
func (c *serverConn) run(call *serverCall) ([]byte, error) {
	if c.s.bash == nil {
		return nil, &RemoteError{Kind: workspace.ErrForbidden, Msg: "this agent runs no commands"}
	}
	res, err := c.s.bash.Run(call.ctx, c.command(call))
	return encodeResult(res), err
}

func encodeResult(res workspace.Result) []byte {
	body, _ := json.Marshal(wireResult{ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, Duration: res.Duration})
	return body
}

// command is a run or pty call's command, its input the call's and its
// output sent under flow control.
func (c *serverConn) command(call *serverCall) workspace.Command {
	r := call.req.Run
	cmd := workspace.Command{Script: r.Script, Argv: r.Argv, Dir: r.Dir, Env: r.Env, Timeout: r.Timeout, Combined: r.Combined}
	if call.in != nil {
		cmd.Stdin = call.in
	}
	cmd.Output = func(s workspace.Stream, p []byte) {
		flags := byte(0)
		if s == workspace.Stderr {
			flags = flagStderr
		}
		for len(p) > 0 {
			n := call.out.take(min(len(p), chunkSize))
			if n == 0 {
				return // the call ended: the output has nowhere to go
			}
			if c.send(frameData, flags, call.id, nil, p[:n]) != nil {
				return
			}
			p = p[n:]
		}
	}
	return cmd
}

// inbox is a call's input on the server: bytes pushed by the read loop and
// read by the call. It holds at most limit bytes; when onRead is set, every
// read grants the client that much more credit.
type inbox struct {
	ctx    context.Context
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	total  int // bytes pushed in all
	limit  int
	end    bool
	onRead func(n int)
}

func newInbox(ctx context.Context, limit int, onRead func(int)) *inbox {
	in := &inbox{ctx: ctx, limit: limit, onRead: onRead}
	in.cond = sync.NewCond(&in.mu)
	context.AfterFunc(ctx, func() {
		in.mu.Lock()
		in.cond.Broadcast()
		in.mu.Unlock()
	})
	return in
}

// push adds input; it never blocks. More input than the bound is a protocol
// error.
func (in *inbox) push(p []byte, end bool) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.end {
		return fmt.Errorf("%w: input after its end", errFrame)
	}
	in.total += len(p)
	if in.onRead == nil && in.total > in.limit || in.onRead != nil && len(in.buf)+len(p) > in.limit {
		return fmt.Errorf("%w: input over its bound", errFrame)
	}
	in.buf = append(in.buf, p...)
	in.end = end
	in.cond.Broadcast()
	return nil
}

// Read reads the command's standard input.
func (in *inbox) Read(p []byte) (int, error) {
	in.mu.Lock()
	for len(in.buf) == 0 && !in.end && in.ctx.Err() == nil {
		in.cond.Wait()
	}
	if len(in.buf) == 0 {
		in.mu.Unlock()
		if in.end {
			return 0, io.EOF
		}
		return 0, in.ctx.Err()
	}
	n := copy(p, in.buf)
	in.buf = in.buf[n:]
	if len(in.buf) == 0 {
		in.buf = nil
	}
	in.mu.Unlock()
	if in.onRead != nil {
		in.onRead(n)
	}
	return n, nil
}

// readAll waits for the whole input, which must be exactly limit bytes.
func (in *inbox) readAll() ([]byte, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for !in.end && in.ctx.Err() == nil {
		in.cond.Wait()
	}
	if !in.end {
		return nil, in.ctx.Err()
	}
	if len(in.buf) != in.limit {
		return nil, &RemoteError{Kind: workspace.ErrInvalidArgument, Msg: fmt.Sprintf("got %d bytes of %d", len(in.buf), in.limit)}
	}
	return in.buf, nil
}

// creditGate is flow-control credit: bytes one side may still send.
type creditGate struct {
	ctx  context.Context
	mu   sync.Mutex
	cond *sync.Cond
	n    int
	max  int
}

func newCreditGate(ctx context.Context, n int) *creditGate {
	g := &creditGate{ctx: ctx, n: n, max: n}
	g.cond = sync.NewCond(&g.mu)
	context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	return g
}

// grant adds credit; it reports false when the total passes the window, which
// the peer must never cause.
func (g *creditGate) grant(n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n += n
	g.cond.Broadcast()
	return g.n <= g.max
}

// take waits for credit and takes up to want bytes of it; 0 means the
// gate's context ended.
func (g *creditGate) take(want int) int {
	return g.takeCtx(context.Background(), want)
}

// takeCtx is take that also gives up, with 0, when ctx ends.
func (g *creditGate) takeCtx(ctx context.Context, want int) int {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			g.mu.Lock()
			g.cond.Broadcast()
			g.mu.Unlock()
		})
		defer stop()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.n == 0 && g.ctx.Err() == nil && ctx.Err() == nil {
		g.cond.Wait()
	}
	if g.ctx.Err() != nil || ctx.Err() != nil {
		return 0
	}
	n := min(want, g.n)
	g.n -= n
	return n
}
