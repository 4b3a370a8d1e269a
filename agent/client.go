package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/textedit"
	"github.com/sandboxd/sandboxd/workspace"
)

// Client is the host's end of an agent's stream: a workspace.FileSystem, with
// every extension interface, and a workspace.Bash. It is safe for concurrent
// use; calls share the stream and run concurrently.
type Client struct {
	rwc  io.ReadWriteCloser
	opts clientOptions
	info AgentInfo

	wmu  sync.Mutex
	wbuf []byte

	mu     sync.Mutex
	calls  map[uint32]*call
	nextID uint32
	err    error         // why the client is unusable; set once
	done   chan struct{} // closed when err is set

	hangOnce sync.Once
	hanging  bool // set, under mu, while hangup runs
}

var (
	_ workspace.FileSystem  = (*Client)(nil)
	_ workspace.SymlinkFS   = (*Client)(nil)
	_ workspace.MkdirAllFS  = (*Client)(nil)
	_ workspace.RemoveAllFS = (*Client)(nil)
	_ workspace.LockFS      = (*Client)(nil)
	_ workspace.WalkFS      = (*Client)(nil)
	_ workspace.GrepFS      = (*Client)(nil)
	_ workspace.SwapFS      = (*Client)(nil)
	_ workspace.Bash        = (*Client)(nil)
)

// AgentInfo is what the agent said about itself in the handshake.
type AgentInfo struct {
	Version int    // protocol version
	Build   string // the agent's build identifier
	Shell   string // the program that runs scripts; "" when unknown
}

// ClientOption configures NewClient.
type ClientOption func(*clientOptions)

type clientOptions struct {
	handshake   time.Duration
	maxResponse int64
	cancelGrace time.Duration
	explain     func() string
	hangGrace   time.Duration
	hangup      func() string
}

// DefaultHangGrace is how long after a call's deadline the client waits for
// the agent's answer before it takes the agent for hung (WithHangup).
const DefaultHangGrace = 30 * time.Second

// CallBound is the host's deadline of a file call whose context has none:
// no call but Run and Lock may take longer, however slow the agent.
const CallBound = 10 * time.Minute

// WithHandshakeTimeout bounds the wait for the agent's Hello; the default is
// 10 seconds.
func WithHandshakeTimeout(d time.Duration) ClientOption {
	return func(o *clientOptions) { o.handshake = d }
}

// WithMaxResponse bounds the size of a result the agent sends back for a
// ReadDir, Walk or Grep (a ReadFile is bounded by its own max); the default
// is 64 MiB.
func WithMaxResponse(n int64) ClientOption { return func(o *clientOptions) { o.maxResponse = n } }

// WithCancelGrace bounds how long Run waits, once its context has ended, for
// the agent to report that the command's process tree is gone; the default
// is 10 seconds. After it, Run returns without that report.
func WithCancelGrace(d time.Duration) ClientOption {
	return func(o *clientOptions) { o.cancelGrace = d }
}

// WithHangup sets what the client does when the agent stops answering, as
// one that a command has frozen would: hangup is called once, and may take a
// moment (dockerexec kills the container; its words go into the error), and
// then the client fails every call with workspace.ErrUnavailable, saying so.
// Without it the client only closes its stream.
//
// The agent is taken for hung when it has not answered a call grace (see
// WithHangGrace) after the call's deadline: the earliest of its context's
// deadline, a Run's Command.Timeout, and CallBound for a file call; or when
// a call given up on this side (its context ended; for a Run, the cancel
// grace passed too) is not answered within the grace. Lock, and a Run with
// no timeout in a context with no deadline, have no deadline.
func WithHangup(hangup func() string) ClientOption {
	return func(o *clientOptions) { o.hangup = hangup }
}

// WithHangGrace sets how long past a call's deadline the client waits for
// the agent's answer before it takes the agent for hung; the default is
// DefaultHangGrace.
func WithHangGrace(d time.Duration) ClientOption {
	return func(o *clientOptions) { o.hangGrace = d }
}

// WithEndExplained adds explain's words to the reason the stream ended —
// when it ended otherwise than by Close — and so to every error the client
// gives from then on. dockerexec uses it to say how the container ended
// (its exit code, an OOM kill). explain is called once, when the stream
// ends, and may take a moment.
func WithEndExplained(explain func() string) ClientOption {
	return func(o *clientOptions) { o.explain = explain }
}

// NewClient opens a session with the agent at the other end of rwc: it sends
// Hello and waits for the agent's. It fails with workspace.ErrUnavailable
// when the agent does not answer in time, answers with anything else, or
// speaks another protocol version; rwc is closed then. The Client owns rwc
// and closes it on Close.
func NewClient(rwc io.ReadWriteCloser, opts ...ClientOption) (*Client, error) {
	o := clientOptions{handshake: 10 * time.Second, maxResponse: 64 << 20, cancelGrace: 10 * time.Second, hangGrace: DefaultHangGrace}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{rwc: rwc, opts: o, calls: make(map[uint32]*call), done: make(chan struct{})}
	timer := time.AfterFunc(o.handshake, func() { rwc.Close() })
	r := bufio.NewReaderSize(rwc, 64<<10)
	info, err := c.handshake(r)
	if !timer.Stop() {
		err = fmt.Errorf("no answer in %v", o.handshake)
	}
	if err != nil {
		rwc.Close()
		return nil, unavailable("hello", "", "agent handshake: "+err.Error())
	}
	c.info = info
	go c.readLoop(r)
	return c, nil
}

func (c *Client) handshake(r *bufio.Reader) (AgentInfo, error) {
	h, _ := json.Marshal(hello{Version: ProtocolVersion})
	if err := c.send(frameHello, 0, 0, h, nil); err != nil {
		return AgentInfo{}, err
	}
	f, err := readFrame(r)
	if err != nil {
		return AgentInfo{}, err
	}
	var theirs hello
	if f.typ != frameHello || f.id != 0 || json.Unmarshal(f.header, &theirs) != nil {
		return AgentInfo{}, errors.New("the agent did not answer with hello")
	}
	if theirs.Version != ProtocolVersion {
		return AgentInfo{}, fmt.Errorf("the agent speaks protocol %d, this client %d", theirs.Version, ProtocolVersion)
	}
	return AgentInfo{Version: theirs.Version, Build: clip(theirs.Build), Shell: clip(theirs.Shell)}, nil
}

// Agent describes the agent, as it announced itself.
func (c *Client) Agent() AgentInfo { return c.info }

// Shell is the program the agent runs scripts with, as it said in the
// handshake; see workspace.ShellBash.
func (c *Client) Shell() string { return c.info.Shell }

// Done is closed when the client becomes unusable: closed, or its stream
// broken. Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the client is unusable, or is nil while it works.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the stream; the agent sees the end of its input. Calls in
// flight and later fail with workspace.ErrUnavailable.
func (c *Client) Close() error {
	c.fail(errClientClosed)
	return nil
}

var errClientClosed = errors.New("client closed")

// fail makes the client unusable and fails every call in flight; while
// the client hangs up, it leaves that to hangup, whose cause says more than
// the stream's end that the hangup brings about.
func (c *Client) fail(cause error) { c.end(cause, false) }

func (c *Client) end(cause error, hangup bool) {
	c.mu.Lock()
	later := c.hanging && !hangup && cause != errClientClosed
	c.mu.Unlock()
	if later {
		return
	}
	if c.opts.explain != nil && cause != errClientClosed && c.Err() == nil {
		if why := c.opts.explain(); why != "" {
			cause = fmt.Errorf("%w%s", cause, why)
		}
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = cause
	calls := c.calls
	c.calls = nil
	for _, call := range calls {
		call.stopWatch()
	}
	close(c.done)
	c.mu.Unlock()
	c.rwc.Close()
	for _, call := range calls {
		if !call.gone {
			call.finish(reply{err: c.unavailable(call)})
		}
	}
}

// hangup ends a client whose agent stopped answering: see WithHangup.
// The first caller hangs up; others wait until it has.
func (c *Client) hangup(call *call, late time.Duration) {
	c.hangOnce.Do(func() {
		if c.Err() != nil {
			return
		}
		msg := fmt.Sprintf("the agent did not answer %s %q within %v of its deadline", call.op, call.name, late)
		c.mu.Lock()
		c.hanging = true
		c.mu.Unlock()
		if c.opts.hangup != nil {
			if words := c.opts.hangup(); words != "" {
				msg += "; " + words
			}
		}
		c.end(errors.New(msg), true)
	})
}

func (c *Client) unavailable(call *call) error {
	return unavailable(call.op, call.name, "agent stream: "+c.Err().Error())
}

func unavailable(op, name, msg string) error {
	return &fs.PathError{Op: op, Path: name, Err: &RemoteError{Kind: workspace.ErrUnavailable, Msg: msg}}
}

// badReply is the error of a call whose answer did not pass the checks.
func badReply(op, name string, err error) error {
	return unavailable(op, name, "agent sent a bad answer: "+err.Error())
}

// send writes one frame; a failed write breaks the client.
func (c *Client) send(typ, flags byte, id uint32, header, payload []byte) error {
	c.wmu.Lock()
	c.wbuf = appendFrame(c.wbuf[:0], typ, flags, id, header, payload)
	_, err := c.rwc.Write(c.wbuf)
	if cap(c.wbuf) > 2*chunkSize {
		c.wbuf = nil
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("write: %w", err))
	}
	return err
}

func (c *Client) sendWindow(id uint32, n int) {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], uint32(n))
	c.send(frameWindow, 0, id, nil, p[:])
}

// call is one call in flight.
type call struct {
	id       uint32
	op, name string
	limit    int64  // bound on the body
	body     []byte // the body so far, when onData is nil
	// onData, when set, takes the call's Data frames in place of the body.
	// It runs on the read loop and must not block.
	onData func(f frame) error
	// onEnd, when set, runs once when the call leaves the table.
	onEnd func()
	// stdin is the credit for a command's input, when it has one.
	stdin *creditGate
	reply chan reply // receives exactly once
	// gone is set, under Client.mu, when the call was finished on this side
	// (abandoned) but stays in the table until the agent answers it, so a
	// hung agent is still noticed.
	gone bool
	// watch, when set, fires at the call's deadline on the host side.
	watch *time.Timer
}

func (call *call) stopWatch() {
	if call.watch != nil {
		call.watch.Stop()
	}
}

type reply struct {
	header replyHeader
	body   []byte
	err    error // set when the call failed on this side
}

func newCall(op, name string, limit int64) *call {
	return &call{op: op, name: name, limit: limit, reply: make(chan reply, 1)}
}

func (call *call) finish(r reply) {
	if call.onEnd != nil {
		call.onEnd()
	}
	call.reply <- r
}

// register gives call an ID and enters it in the table.
func (c *Client) register(call *call) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return unavailable(call.op, call.name, "agent stream: "+c.err.Error())
	}
	for {
		c.nextID++
		if c.nextID != 0 && c.calls[c.nextID] == nil {
			break
		}
	}
	call.id = c.nextID
	c.calls[call.id] = call
	return nil
}

// remove takes the call out of the table; only the one who removes it
// finishes it, unless it is gone (already finished).
func (c *Client) remove(id uint32) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.calls[id]
	delete(c.calls, id)
	if call != nil {
		call.stopWatch()
	}
	return call
}

// abandon ends a call on this side and tells the agent to stop it. The call
// stays in the table, gone, until the agent answers; if it does not within
// the hang grace, the agent is taken for hung.
func (c *Client) abandon(call *call, err error) {
	c.mu.Lock()
	live := c.calls[call.id] == call && !call.gone
	if live {
		call.gone = true
	}
	c.mu.Unlock()
	if live {
		c.watch(call, time.Now())
		call.finish(reply{err: err})
	}
	go c.send(frameCancel, 0, call.id, nil, nil)
}

// watch sets the call's host-side deadline: if the agent has not answered
// it the hang grace after deadline (a zero deadline: none), the agent is
// taken for hung.
func (c *Client) watch(call *call, deadline time.Time) {
	if deadline.IsZero() {
		return
	}
	late := c.opts.hangGrace
	c.mu.Lock()
	defer c.mu.Unlock()
	call.stopWatch()
	call.watch = time.AfterFunc(time.Until(deadline)+late, func() {
		c.mu.Lock()
		hung := c.calls[call.id] == call
		c.mu.Unlock()
		if hung {
			c.hangup(call, late)
		}
	})
}

// deadline is the earliest of ctx's deadline and now+bound (bound 0: none).
func deadline(ctx context.Context, bound time.Duration) time.Time {
	d, ok := ctx.Deadline()
	if bound > 0 && (!ok || time.Now().Add(bound).Before(d)) {
		return time.Now().Add(bound)
	}
	return d
}

func (c *Client) readLoop(r *bufio.Reader) {
	for {
		f, err := readFrame(r)
		if err == nil {
			err = c.dispatch(f)
		}
		if err != nil {
			if err == io.EOF {
				err = errors.New("the agent closed the stream")
			}
			c.fail(err)
			return
		}
	}
}

// dispatch routes one frame from the agent. An error breaks the client.
func (c *Client) dispatch(f frame) error {
	var call *call
	switch f.typ {
	case frameData, frameWindow:
		c.mu.Lock()
		call = c.calls[f.id]
		c.mu.Unlock()
	case frameReply:
		call = c.remove(f.id)
	default:
		return fmt.Errorf("%w: unexpected frame type %d", errFrame, f.typ)
	}
	if call == nil || call.gone {
		return nil // the answer to a call this side has abandoned
	}
	switch f.typ {
	case frameWindow:
		n, ok := credit(f)
		if !ok || call.stdin == nil || !call.stdin.grant(n) {
			return fmt.Errorf("%w: bad window for call %d", errFrame, f.id)
		}
		return nil
	case frameData:
		if call.onData != nil {
			return call.onData(f)
		}
		if len(call.body) == 0 && len(f.header) > 0 {
			var h dataHeader
			if json.Unmarshal(f.header, &h) == nil && h.Size > 0 && h.Size <= call.limit {
				call.body = make([]byte, 0, h.Size)
			}
		}
		return call.appendBody(f.payload)
	}
	// frameReply
	r := reply{}
	if call.onData == nil {
		if err := call.appendBody(f.payload); err != nil {
			call.finish(reply{err: c.unavailableErr(call, err)})
			return err
		}
		r.body = call.body
	} else {
		r.body = f.payload
	}
	if len(f.header) > 0 && json.Unmarshal(f.header, &r.header) != nil {
		r.err = badReply(call.op, call.name, errors.New("malformed reply header"))
	}
	call.finish(r)
	return nil
}

func (c *Client) unavailableErr(call *call, err error) error {
	return unavailable(call.op, call.name, "agent stream: "+err.Error())
}

func (call *call) appendBody(p []byte) error {
	if int64(len(call.body))+int64(len(p)) > call.limit {
		return fmt.Errorf("%w: the answer to %s %q is over its bound of %d bytes", errFrame, call.op, call.name, call.limit)
	}
	call.body = append(call.body, p...)
	return nil
}

// roundTrip makes one call with input and returns its body.
func (c *Client) roundTrip(ctx context.Context, req request, input []byte, limit int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	call := newCall(req.Op, req.Name, limit)
	if err := c.start(call, req, &input); err != nil {
		return nil, err
	}
	c.watch(call, deadline(ctx, CallBound))
	for len(input) > 0 && ctx.Err() == nil {
		n := min(len(input), chunkSize)
		flags := byte(0)
		if n == len(input) {
			flags = flagEnd
		}
		if c.send(frameData, flags, call.id, nil, input[:n]) != nil {
			break
		}
		input = input[n:]
	}
	var r reply
	select {
	case r = <-call.reply:
	case <-ctx.Done():
		c.abandon(call, ctx.Err())
		r = <-call.reply
	}
	switch {
	case r.err != nil && ctx.Err() != nil:
		// The caller gave up before the call failed on this side (a hang-up
		// it raced with, which still ends the client): its reason first, as
		// Run does, whichever the select saw first.
		return nil, ctx.Err()
	case r.err != nil:
		return nil, r.err
	case r.header.Err != nil:
		return nil, r.header.Err.decode(req.Op, req.Name)
	}
	return r.body, nil
}

// start registers call and sends its Call frame with the first chunk of
// *input, leaving the rest in *input.
func (c *Client) start(call *call, req request, input *[]byte) error {
	header, err := json.Marshal(req)
	if err != nil || len(header) > MaxFrame-frameFixed-chunkSize {
		return workspace.PathError(req.Op, req.Name, workspace.ErrInvalidArgument)
	}
	if err := c.register(call); err != nil {
		return err
	}
	var first []byte
	flags := flagEnd
	if input != nil {
		n := min(len(*input), chunkSize)
		first, *input = (*input)[:n], (*input)[n:]
		if len(*input) > 0 {
			flags = 0
		}
	}
	if req.Op == opRun && req.Run.Stdin || req.Op == opAccept {
		flags = 0
	}
	if err := c.send(frameCall, flags, call.id, header, first); err != nil {
		if c.remove(call.id) == call {
			return c.unavailableErr(call, err)
		}
		return (<-call.reply).err
	}
	return nil
}

// jsonCall calls roundTrip and decodes the body with decode, a check failing the
// call with workspace.ErrUnavailable.
func jsonCall[T any](c *Client, ctx context.Context, req request, decode func([]byte) (T, error)) (T, error) {
	var zero T
	body, err := c.roundTrip(ctx, req, nil, c.opts.maxResponse)
	if err != nil {
		return zero, err
	}
	v, err := decode(body)
	if err != nil {
		return zero, badReply(req.Op, req.Name, err)
	}
	return v, nil
}

func decodeInfo(body []byte) (fs.FileInfo, error) {
	var w wireInfo
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, err
	}
	if err := w.check(); err != nil {
		return nil, err
	}
	return &fileInfo{w}, nil
}

// Stat describes the named file, following links.
func (c *Client) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	return jsonCall(c, ctx, request{Op: opStat, Name: name}, decodeInfo)
}

// Lstat describes the named file; a link is described itself.
func (c *Client) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	return jsonCall(c, ctx, request{Op: opLstat, Name: name}, decodeInfo)
}

// ReadDir lists a directory. Each entry carries its information, so Info
// costs no round trip.
func (c *Client) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	return jsonCall(c, ctx, request{Op: opReadDir, Name: name}, func(b []byte) ([]fs.DirEntry, error) {
		return decodeDir(b, name)
	})
}

// ReadFile reads a regular file of at most max bytes; the agent streams it in
// chunks.
func (c *Client) ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error) {
	body, err := c.roundTrip(ctx, request{Op: opReadFile, Name: name, Max: maxBytes}, nil, max(maxBytes, 0))
	if err == nil && body == nil {
		body = []byte{}
	}
	return body, err
}

// WriteFile replaces or creates a file; the data travels in chunks.
func (c *Client) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	_, err := c.roundTrip(ctx, request{Op: opWriteFile, Name: name, Perm: uint32(perm), Size: int64(len(data))}, data, 0)
	return err
}

// Swap writes a file and returns what it replaced, in one round trip: the
// agent runs workspace.Swap, with the request's conditions and its lock,
// and applies the request's Edit when it is a textedit.Edit (another
// Editor is applied here, with SwapGeneric's several round trips). The
// result is checked: a clean name, old contents only of a regular file and
// within req.Max, a write only where the conditions hold as far as the
// answer shows, and an edit's result computed here from the old contents.
func (c *Client) Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error) {
	wreq := request{Op: opSwap, Name: req.Name, Perm: uint32(req.Perm), Size: int64(len(req.Data)), Root: req.Root, Max: req.Max,
		Real: req.Real, Sum: req.OldSum, Lock: req.Lock}
	in := req.Data
	if req.Edit != nil {
		e, ok := req.Edit.(textedit.Edit)
		if !ok || !utf8Edit(e) { // an edit the agent cannot be sent as it is: step by step
			return workspace.SwapGeneric(ctx, c, req)
		}
		// The edit travels as the input, in chunks as data would.
		var err error
		if in, err = json.Marshal(e); err != nil {
			return workspace.SwapResult{}, err
		}
		wreq.Edit, wreq.Size = true, int64(len(in))
	}
	// The old contents travel as base64 in the reply.
	body, err := c.roundTrip(ctx, wreq, in, max(c.opts.maxResponse, 2*max(req.Max, 0)+64<<10))
	if err != nil {
		return workspace.SwapResult{}, err
	}
	res, err := decodeSwap(body, req)
	if err != nil {
		return workspace.SwapResult{}, badReply(opSwap, req.Name, err)
	}
	return res, nil
}

// utf8Edit reports whether e's texts are UTF-8, which JSON carries
// unchanged (it would replace what is not, and the agent would apply
// another edit than e; the matching refuses such text anyway).
func utf8Edit(e textedit.Edit) bool {
	for _, r := range e.Replacements {
		if !utf8.ValidString(r.OldText) || !utf8.ValidString(r.NewText) {
			return false
		}
	}
	return true
}

// Mkdir creates one directory.
func (c *Client) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	_, err := c.roundTrip(ctx, request{Op: opMkdir, Name: name, Perm: uint32(perm)}, nil, 0)
	return err
}

// MkdirAll creates a directory and its missing parents, in one round trip.
func (c *Client) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	_, err := c.roundTrip(ctx, request{Op: opMkdirAll, Name: name, Perm: uint32(perm)}, nil, 0)
	return err
}

// Remove removes a file, a link or an empty directory.
func (c *Client) Remove(ctx context.Context, name string) error {
	_, err := c.roundTrip(ctx, request{Op: opRemove, Name: name}, nil, 0)
	return err
}

// RemoveAll removes a tree, in one round trip.
func (c *Client) RemoveAll(ctx context.Context, name string) error {
	_, err := c.roundTrip(ctx, request{Op: opRemoveAll, Name: name}, nil, 0)
	return err
}

// Rename moves oldname to newname.
func (c *Client) Rename(ctx context.Context, oldname, newname string) error {
	_, err := c.roundTrip(ctx, request{Op: opRename, Name: oldname, NewName: newname}, nil, 0)
	return err
}

// Symlink creates name as a link to target.
func (c *Client) Symlink(ctx context.Context, target, name string) error {
	_, err := c.roundTrip(ctx, request{Op: opSymlink, Name: name, Target: target}, nil, 0)
	return err
}

// maxLinkTarget bounds a link target the agent returns.
const maxLinkTarget = 64 << 10

// Readlink returns a link's target.
func (c *Client) Readlink(ctx context.Context, name string) (string, error) {
	body, err := c.roundTrip(ctx, request{Op: opReadlink, Name: name}, nil, maxLinkTarget)
	return string(body), err
}

// Walk lists a tree in the agent, in one round trip. The result is checked:
// every path lies under req.Dir and the limit holds.
func (c *Client) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	return jsonCall(c, ctx, request{Op: opWalk, Name: req.Dir, Walk: &req}, func(b []byte) (workspace.WalkResult, error) {
		return decodeWalk(b, req)
	})
}

// Grep searches in the agent, in one round trip. The result is checked:
// every path lies under req.Dir and the counts agree. A pattern that does
// not compile fails here, without a round trip, with the
// *workspace.PatternError the generic search returns.
func (c *Client) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	if _, err := workspace.NewLineMatcher(req.Pattern, req.Literal, req.IgnoreCase); err != nil {
		return workspace.GrepResult{}, err
	}
	return jsonCall(c, ctx, request{Op: opGrep, Name: req.Dir, Grep: &req}, func(b []byte) (workspace.GrepResult, error) {
		return decodeGrep(b, req)
	})
}

// Lock takes the agent's write lock for name, which it holds until unlock is
// called, or the stream ends.
func (c *Client) Lock(ctx context.Context, name string) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	call := newCall(opLock, name, 0)
	acquired := make(chan struct{})
	var once sync.Once
	call.onData = func(frame) error {
		once.Do(func() { close(acquired) })
		return nil
	}
	if err := c.start(call, request{Op: opLock, Name: name}, nil); err != nil {
		return nil, err
	}
	select {
	case <-acquired:
		var release sync.Once
		return func() {
			release.Do(func() { c.send(frameCancel, 0, call.id, nil, nil) })
		}, nil
	case r := <-call.reply:
		if r.err != nil {
			return nil, r.err
		}
		if r.header.Err != nil {
			return nil, r.header.Err.decode(opLock, name)
		}
		return nil, badReply(opLock, name, errors.New("lock ended before it was taken"))
	case <-ctx.Done():
		c.abandon(call, ctx.Err())
		return nil, ctx.Err()
	}
}

// Run runs a command in the agent. Its input is sent as the command reads it
// and its output is passed to cmd.Output in the order the agent sent it, one
// call at a time, under flow control: a slow Output holds up this command,
// not the stream. When ctx ends, the agent kills the command's process tree
// and Run waits for its report (at most the cancel grace, see
// WithCancelGrace) and returns the result so far with ctx's error.
//
// A Run stays blocked in nothing but the stream: when cmd.Stdin blocks, the
// goroutine reading it stays until the read returns, after Run has.
func (c *Client) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	if err := ctx.Err(); err != nil {
		return workspace.Result{}, err
	}
	req := request{Op: opRun, Name: cmd.Dir, Run: &runRequest{
		Script: cmd.Script, Argv: cmd.Argv, Dir: cmd.Dir, Env: cmd.Env, Timeout: cmd.Timeout, Stdin: cmd.Stdin != nil,
		Combined: cmd.Combined,
	}}
	call := newCall(opRun, cmd.Dir, 0)
	q := newOutQueue()
	call.onData = q.push
	call.onEnd = q.close
	pumpCtx, stopPump := context.WithCancel(context.Background())
	defer stopPump()
	if cmd.Stdin != nil {
		call.stdin = newCreditGate(pumpCtx, window)
	}
	if err := c.start(call, req, nil); err != nil {
		return workspace.Result{}, err
	}
	c.watch(call, deadline(ctx, cmd.Timeout))
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		for {
			chunk, ok := q.pop()
			if !ok {
				return
			}
			if cmd.Output != nil {
				cmd.Output(chunk.stream, chunk.p)
			}
			q.delivered(len(chunk.p))
			c.sendWindow(call.id, len(chunk.p))
		}
	}()
	if cmd.Stdin != nil {
		go c.pumpStdin(pumpCtx, call, cmd.Stdin)
	}

	var r reply
	select {
	case r = <-call.reply:
	case <-ctx.Done():
		go c.send(frameCancel, 0, call.id, nil, nil)
		grace := time.NewTimer(c.opts.cancelGrace)
		select {
		case r = <-call.reply:
		case <-grace.C:
			// The agent did not report the tree killed: return now; if it
			// does not answer within the hang grace either, it is hung and
			// the command runs on unbounded, so it is hung up.
			c.abandon(call, ctx.Err())
			r = <-call.reply
		}
		grace.Stop()
	}
	stopPump()
	<-delivered
	var res workspace.Result
	if r.err == nil && len(r.body) > 0 {
		var err error
		if res, err = decodeResult(r.body); err != nil {
			return workspace.Result{}, badReply(opRun, cmd.Dir, err)
		}
	}
	switch {
	case ctx.Err() != nil:
		return res, ctx.Err()
	case r.err != nil:
		return res, r.err
	case r.header.Err != nil:
		return workspace.Result{}, r.header.Err.decode(opRun, cmd.Dir)
	}
	return res, nil
}

// pumpStdin sends a command's input as credit allows, then its end. A read
// error other than io.EOF ends the input too.
func (c *Client) pumpStdin(ctx context.Context, call *call, stdin io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n := call.stdin.take(len(buf))
		if n == 0 {
			return // the call is over
		}
		m, err := stdin.Read(buf[:n])
		call.stdin.grant(n - m)
		if ctx.Err() != nil {
			return
		}
		if m > 0 && c.send(frameData, 0, call.id, nil, buf[:m]) != nil {
			return
		}
		if err != nil {
			c.send(frameData, flagEnd, call.id, nil, nil)
			return
		}
	}
}

// outChunk is a piece of a command's output.
type outChunk struct {
	stream workspace.Stream
	p      []byte
}

// outQueue holds a command's output between the read loop and Output; the
// agent's credit bounds it to the window.
type outQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks []outChunk
	bytes  int // queued or being delivered: credit not yet returned
	closed bool
}

func newOutQueue() *outQueue {
	q := &outQueue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *outQueue) push(f frame) error {
	s := workspace.Stdout
	if f.flags&flagStderr != 0 {
		s = workspace.Stderr
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.bytes+len(f.payload) > window {
		return fmt.Errorf("%w: output over the window", errFrame)
	}
	if len(f.payload) > 0 {
		q.chunks = append(q.chunks, outChunk{s, f.payload})
		q.bytes += len(f.payload)
		q.cond.Signal()
	}
	return nil
}

func (q *outQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Signal()
	q.mu.Unlock()
}

// pop returns the next chunk, or false once the queue is closed and empty.
func (q *outQueue) pop() (outChunk, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.chunks) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.chunks) == 0 {
		return outChunk{}, false
	}
	ch := q.chunks[0]
	q.chunks[0] = outChunk{}
	q.chunks = q.chunks[1:]
	return ch, true
}

// delivered returns n bytes of credit.
func (q *outQueue) delivered(n int) {
	q.mu.Lock()
	q.bytes -= n
	q.mu.Unlock()
}
