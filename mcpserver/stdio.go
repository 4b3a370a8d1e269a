package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A LineTransport serves MCP over newline-delimited JSON-RPC — stdio's
// framing — on a reader and a writer, as mcp.IOTransport does, except that
// a line that is not a valid message does not end the session: it is
// answered with a JSON-RPC error and the next line is read.
//
//   - A line that is not JSON (garbage, a line cut short) is answered
//     -32700 with the null ID.
//   - JSON that is not JSON-RPC 2.0 (an object ID, no "jsonrpc", an empty
//     batch, a batch that names an ID twice) is answered -32600, with the
//     request's ID when the line names one.
//   - A batch, once the negotiated protocol version is 2025-06-18 or later
//     (which dropped batches), is answered -32600; before that it is served
//     and answered with one array.
//   - A line longer than MaxLineBytes is skipped up to its newline and
//     answered -32600 with the limit in the message, and with the request's
//     ID when it comes early in the line.
//   - An error the SDK answers without a JSON-RPC code (a request before
//     initialize, above all) gets one: -32600 for a request read before
//     initialize succeeded, -32603 otherwise.
//   - A request whose ID is that of a request not yet answered is answered
//     -32600 with that ID (the SDK drops it without a word).
//   - A request the client cancelled (notifications/cancelled) is not
//     answered, as MCP asks: its response is dropped here.
//
// Blank lines are skipped. Only a failure to read or write ends the
// session: io.EOF when the reader is done, once every request read before
// has been answered — requests piped in and followed at once by the end of
// input (printf '…' | sandboxd mcp) are answered before the session ends.
type LineTransport struct {
	Reader io.Reader
	Writer io.Writer
	// MaxLineBytes bounds one line; 0 means mcp.DefaultMaxLineLength.
	MaxLineBytes int
	// LimitHint, when set, ends the message answering a line over
	// MaxLineBytes: what sets the limit, so the client's operator can
	// raise it.
	LimitHint string
}

// Connect implements mcp.Transport. It may be called once. When ctx ends,
// the end of input no longer waits for the calls in flight.
func (t *LineTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	limit := t.MaxLineBytes
	if limit <= 0 {
		limit = mcp.DefaultMaxLineLength
	}
	c := &lineConn{
		w:         t.Writer,
		limit:     limit,
		hint:      t.LimitHint,
		lines:     make(chan line),
		closed:    make(chan struct{}),
		early:     map[jsonrpc.ID]bool{},
		batches:   map[jsonrpc.ID]*batch{},
		inflight:  map[jsonrpc.ID]bool{},
		cancelled: map[jsonrpc.ID]bool{},
		changed:   make(chan struct{}),
		serving:   ctx,
	}
	go c.readLines(bufio.NewReaderSize(t.Reader, 64<<10))
	return c, nil
}

// lineConn is a LineTransport's mcp.Connection.
type lineConn struct {
	w     io.Writer
	limit int
	hint  string

	lines  chan line     // from readLines
	closed chan struct{} // closed by Close
	once   sync.Once

	queue []jsonrpc.Message // the rest of a batch; Read is not called concurrently

	writeMu sync.Mutex // one line at a time on w

	mu      sync.Mutex
	initID  jsonrpc.ID // the initialize request's ID, until it is answered
	inited  bool       // an initialize request was answered without error
	version string     // the negotiated protocol version, once initialize is answered
	early   map[jsonrpc.ID]bool
	batches map[jsonrpc.ID]*batch // by the ID of each of a batch's calls not yet answered
	// inflight are the calls read and not yet answered; cancelled those of
	// them the client cancelled. changed is closed (and made anew) when
	// one is answered.
	inflight  map[jsonrpc.ID]bool
	cancelled map[jsonrpc.ID]bool
	changed   chan struct{}
	// serving is Connect's context: the server's run, whose end (SIGTERM
	// to sandboxd mcp) stops the wait for calls in flight.
	serving context.Context
}

// line is one line read, without its newline, or the error that ended the
// reading. A line over the limit keeps only its start, for its ID.
type line struct {
	data    []byte
	tooLong bool
	err     error
}

// batch collects the responses to a batch's calls, in the batch's order.
type batch struct {
	pending   map[jsonrpc.ID]int
	responses []*jsonrpc.Response
}

// idPrefix is how much of a line over the limit is kept to find its ID.
const idPrefix = 64 << 10

// readLines sends each line of r to c.lines until r fails or c closes. It
// is the only reader of r; a Read of r that does not return after Close
// keeps it, as with mcp.IOTransport, since stdin cannot be interrupted.
func (c *lineConn) readLines(r *bufio.Reader) {
	send := func(l line) bool {
		select {
		case c.lines <- l:
			return true
		case <-c.closed:
			return false
		}
	}
	for {
		var buf []byte
		tooLong := false
		for {
			frag, err := r.ReadSlice('\n')
			switch {
			case tooLong:
			case len(buf)+len(frag) > c.limit+2: // room for "\r\n"
				tooLong = true
				buf = append(buf, frag[:min(len(frag), idPrefix-min(len(buf), idPrefix))]...)
			default:
				buf = append(buf, frag...)
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if len(bytes.TrimSpace(buf)) > 0 || tooLong {
				if !send(line{data: buf, tooLong: tooLong}) {
					return
				}
			}
			if err != nil {
				send(line{err: err})
				return
			}
			break
		}
	}
}

// Read implements mcp.Connection: the next valid message. Lines that are
// not valid are answered here and skipped.
func (c *lineConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		if len(c.queue) > 0 {
			msg := c.queue[0]
			c.queue = c.queue[1:]
			return msg, nil
		}
		var l line
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closed:
			return nil, io.EOF
		case l = <-c.lines:
		}
		if l.err != nil {
			return nil, c.drain(ctx, l.err)
		}
		msgs, err := c.accept(l)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) {
				return nil, err
			}
			if err := c.writeLine(fe.Encode()); err != nil {
				return nil, err
			}
			continue
		}
		c.queue = msgs
	}
}

// drain waits until every call read has been answered, then returns err,
// the error that ended the reading: the SDK cancels the calls in flight
// when Read fails, and their answers would be lost.
func (c *lineConn) drain(ctx context.Context, err error) error {
	for {
		c.mu.Lock()
		n, changed := len(c.inflight), c.changed
		c.mu.Unlock()
		if n == 0 {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.serving.Done():
			return err
		case <-c.closed:
			return err
		}
	}
}

// accept returns the messages of l to pass on, or the FrameError that
// answers it.
func (c *lineConn) accept(l line) ([]jsonrpc.Message, error) {
	if l.tooLong {
		hint := ""
		if c.hint != "" {
			hint = "; " + c.hint
		}
		return nil, Refuse(idOf(l.data), jsonrpc.CodeInvalidRequest, "invalid request: the line is over the limit of %d bytes and was not read%s", c.limit, hint)
	}
	msgs, isBatch, err := Decode(l.data)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, msg := range msgs {
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() && c.inflight[req.ID] {
			return nil, Refuse(req.ID, jsonrpc.CodeInvalidRequest, "invalid request: ID %v is in use by a request not yet answered", req.ID.Raw())
		}
	}
	if isBatch {
		if c.version >= "2025-06-18" {
			return nil, Refuse(jsonrpc.ID{}, jsonrpc.CodeInvalidRequest, "invalid request: protocol version %s has no batches; send one message a line", c.version)
		}
		b := &batch{pending: map[jsonrpc.ID]int{}}
		for _, msg := range msgs {
			if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
				if c.batches[req.ID] != nil {
					return nil, Refuse(req.ID, jsonrpc.CodeInvalidRequest, "invalid request: ID %v is in use by a batch not yet answered", req.ID.Raw())
				}
				b.pending[req.ID] = len(b.responses)
				b.responses = append(b.responses, nil)
			}
		}
		for id := range b.pending {
			c.batches[id] = b
		}
	}
	for _, msg := range msgs {
		req, ok := msg.(*jsonrpc.Request)
		if ok && req.IsCall() {
			c.inflight[req.ID] = true
		}
		switch {
		case !ok:
		case !req.IsCall():
			if id, ok := cancelledID(req); ok && c.inflight[id] {
				c.cancelled[id] = true
			}
		case req.Method == "initialize":
			c.initID = req.ID
		case !c.inited:
			c.early[req.ID] = true
		}
	}
	return msgs, nil
}

// Write implements mcp.Connection. The responses to a batch's calls are
// held until the last, then written as one array.
func (c *lineConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	resp, ok := msg.(*jsonrpc.Response)
	if !ok {
		data, err := jsonrpc.EncodeMessage(msg)
		if err != nil {
			return err
		}
		return c.writeLine(data)
	}
	resp, done, drop := c.answered(resp)
	if drop {
		return nil
	}
	var data []byte
	var err error
	switch {
	case done == nil:
		data, err = encodeResponse(resp)
	case len(done) == 0:
		return nil // more of its batch to come
	default:
		raws := make([]json.RawMessage, len(done))
		for i, r := range done {
			if raws[i], err = jsonrpc.EncodeMessage(r); err != nil {
				return err
			}
		}
		data, err = json.Marshal(raws)
	}
	if err != nil {
		return err
	}
	return c.writeLine(data)
}

// answered notes resp: the negotiated version when it answers initialize,
// a JSON-RPC code for an error without one, the call no longer in flight.
// When resp answers a batch's call, done is non-nil: empty while calls of
// the batch are pending, the batch's responses once resp is its last. drop
// says resp answers a call the client cancelled, which is not answered.
func (c *lineConn) answered(resp *jsonrpc.Response) (_ *jsonrpc.Response, done []*jsonrpc.Response, drop bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[resp.ID] {
		delete(c.inflight, resp.ID)
		close(c.changed)
		c.changed = make(chan struct{})
	}
	drop = c.cancelled[resp.ID] && c.batches[resp.ID] == nil
	delete(c.cancelled, resp.ID)
	early := c.early[resp.ID]
	delete(c.early, resp.ID)
	var we *jsonrpc.Error
	if resp.Error != nil && (!errors.As(resp.Error, &we) || we.Code == 0) {
		code := int64(jsonrpc.CodeInternalError)
		if early {
			code = jsonrpc.CodeInvalidRequest
		}
		resp = &jsonrpc.Response{ID: resp.ID, Error: &jsonrpc.Error{Code: code, Message: resp.Error.Error()}}
	}
	if c.initID.IsValid() && resp.ID == c.initID {
		c.initID = jsonrpc.ID{}
		var res struct{ ProtocolVersion string }
		if resp.Error == nil && json.Unmarshal(resp.Result, &res) == nil {
			c.inited, c.version = true, res.ProtocolVersion
		}
	}
	b := c.batches[resp.ID]
	if b == nil {
		return resp, nil, drop
	}
	delete(c.batches, resp.ID)
	b.responses[b.pending[resp.ID]] = resp
	delete(b.pending, resp.ID)
	if len(b.pending) > 0 {
		return resp, []*jsonrpc.Response{}, false
	}
	return resp, b.responses, false
}

// cancelledID returns the ID a notifications/cancelled names.
func cancelledID(req *jsonrpc.Request) (jsonrpc.ID, bool) {
	if req.Method != "notifications/cancelled" {
		return jsonrpc.ID{}, false
	}
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	return id, err == nil && id.IsValid()
}

func (c *lineConn) writeLine(data []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, err := c.w.Write(append(data, '\n'))
	return err
}

// Close implements mcp.Connection. It does not close the reader or the
// writer, which belong to the caller.
func (c *lineConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// SessionID implements mcp.Connection: stdio has none.
func (c *lineConn) SessionID() string { return "" }
