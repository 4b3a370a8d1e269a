package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"time"

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
	// sealed is set, before any call, once the agent agreed to sealed
	// frames (hello.Seal).
	sealed bool

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
	// Background says the agent keeps background commands itself
	// (workspace.BackgroundBash), beyond this client's connection.
	Background bool
	// Boot names the agent's run: it changes when the agent starts again
	// (its container did), and its background commands are then gone.
	Boot string
	// Terminal says the agent runs commands on a pseudo-terminal
	// (workspace.TerminalBash).
	Terminal bool
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
	stall       func() string
	resync      bool
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
// moment (the Docker backend kills the container; its words go into the error), and
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

// WithStall sets how the client tells an agent that is kept from
// answering from one that is hung: before it hangs up (WithHangup) it asks
// stall, and when stall gives words (the Docker backend: the container is
// paused, or the engine carrying the stream does not answer) it does not
// hang up: the late call alone fails with workspace.ErrUnavailable, those
// words in its error, and the client stays usable — its later calls are
// answered once the agent answers again. stall may take a moment.
func WithStall(stall func() string) ClientOption {
	return func(o *clientOptions) { o.stall = stall }
}

// WithHangGrace sets how long past a call's deadline the client waits for
// the agent's answer before it takes the agent for hung; the default is
// DefaultHangGrace.
func WithHangGrace(d time.Duration) ClientOption {
	return func(o *clientOptions) { o.hangGrace = d }
}

// WithResync makes the client a new one on a stream that an earlier client
// used and may have left in mid-frame — a container's standard input,
// which the engine keeps open when an attached client goes: the client
// sends the resync break and line before its Hello, so that the agent
// ends what the earlier connection left (its calls are cancelled) and
// serves this one from a clean start, and skips what the agent sent before
// answering it (see sealTrailer). It needs an agent serving that stream
// with Server.ServeShared.
func WithResync() ClientOption { return func(o *clientOptions) { o.resync = true } }

// WithEndExplained adds explain's words to the reason the stream ended —
// when it ended otherwise than by Close — and so to every error the client
// gives from then on. The Docker backend uses it to say how the container ended
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
	var nonce string
	if c.opts.resync {
		var raw [resyncNonce / 2]byte
		rand.Read(raw[:])
		nonce = hex.EncodeToString(raw[:])
		if _, err := c.rwc.Write(append(make([]byte, resyncBreak), resyncLine(nonce)...)); err != nil {
			return AgentInfo{}, err
		}
	}
	h, _ := json.Marshal(hello{Version: ProtocolVersion, Seal: true})
	if err := c.send(frameHello, 0, 0, h, nil); err != nil {
		return AgentInfo{}, err
	}
	if nonce != "" {
		// What the agent sent before its answer — the former connection's
		// output — is skipped.
		if _, err := awaitResync(r, nonce); err != nil {
			return AgentInfo{}, fmt.Errorf("waiting for the agent to take the stream over: %w", err)
		}
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
	c.sealed = theirs.Seal
	return AgentInfo{Version: theirs.Version, Build: clip(theirs.Build), Shell: clip(theirs.Shell),
		Background: theirs.Background, Boot: clip(theirs.Boot), Terminal: theirs.Terminal}, nil
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
	if c.opts.stall != nil && c.Err() == nil {
		if words := c.opts.stall(); words != "" {
			c.stalled(call, late, words)
			return
		}
	}
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

// stalled fails call, late by late, with words saying why the agent did
// not answer (WithStall), and leaves the client as it is: the call stays
// in the table, given up, so that a late answer finds it.
func (c *Client) stalled(call *call, late time.Duration, words string) {
	if c.giveUp(call) {
		call.finish(reply{err: unavailable(call.op, call.name, fmt.Sprintf("the agent did not answer within %v of the deadline: %s", late, words))})
	}
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
	if c.sealed {
		c.wbuf = sealFrame(c.wbuf, 0)
	}
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

// giveUp marks call gone — finished on this side, its answer awaited —
// and reports whether it was live before.
func (c *Client) giveUp(call *call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := c.calls[call.id] == call && !call.gone
	if live {
		call.gone = true
	}
	return live
}

// abandon ends a call on this side and tells the agent to stop it. The call
// stays in the table, gone, until the agent answers; if it does not within
// the hang grace, the agent is taken for hung.
func (c *Client) abandon(call *call, err error) {
	if c.giveUp(call) {
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
	if (req.Op == opRun || req.Op == opPty) && req.Run.Stdin || req.Op == opAccept || req.Op == opDial {
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
