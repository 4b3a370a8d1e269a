package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// What a transport checks in a frame before the SDK sees it. The SDK ends a
// stdio session at the first frame it cannot decode, and answers HTTP with
// plain text; both transports of sandboxd answer with JSON-RPC errors
// instead, built here.

// A FrameError is a frame refused before it reached the server, and the
// JSON-RPC error that answers it. ID is the request's ID when it could be
// found in the frame, or the null ID.
type FrameError struct {
	ID      jsonrpc.ID
	Code    int64 // jsonrpc.CodeParseError, CodeInvalidRequest, …
	Message string
}

// Refuse returns the FrameError answering the request id with code.
func Refuse(id jsonrpc.ID, code int64, format string, args ...any) *FrameError {
	return &FrameError{ID: id, Code: code, Message: fmt.Sprintf(format, args...)}
}

func (e *FrameError) Error() string { return e.Message }

// Encode is the JSON-RPC response that answers e, without a trailing
// newline. Unlike the SDK's encoding, it has "id": null when the ID is not
// known, as JSON-RPC 2.0 requires.
func (e *FrameError) Encode() []byte {
	data, err := json.Marshal(struct {
		JSONRPC string         `json:"jsonrpc"`
		ID      any            `json:"id"`
		Error   *jsonrpc.Error `json:"error"`
	}{"2.0", e.ID.Raw(), &jsonrpc.Error{Code: e.Code, Message: e.Message}})
	if err != nil { // an ID and two strings: cannot fail
		panic(err)
	}
	return data
}

// encodeResponse is jsonrpc.EncodeMessage(resp), byte for byte, without
// EncodeMessage's pass over a result: it compacts and checks the raw
// result, which the SDK marshaled (compact and valid) just before — twice
// the size of a file read, since a result carries the text and its
// structuredContent. A response with an error or a string ID, which are
// small, is EncodeMessage's.
func encodeResponse(resp *jsonrpc.Response) ([]byte, error) {
	id, ok := resp.ID.Raw().(int64)
	if !ok || resp.Error != nil || len(resp.Result) == 0 {
		return jsonrpc.EncodeMessage(resp)
	}
	const head, mid = `{"jsonrpc":"2.0","id":`, `,"result":`
	data := make([]byte, 0, len(head)+20+len(mid)+len(resp.Result)+1)
	data = strconv.AppendInt(append(data, head...), id, 10)
	data = append(append(append(data, mid...), resp.Result...), '}')
	return data, nil
}

// Decode reads one frame: a JSON-RPC message or, when batch, an array of
// them. Its error is a *FrameError: jsonrpc.CodeParseError (with the null
// ID) when frame is not JSON, jsonrpc.CodeInvalidRequest when it is JSON but
// not JSON-RPC 2.0 messages (an object or array ID, a missing "jsonrpc", an
// empty batch), with the request's ID when the frame names a usable one.
//
// Decode checks the form of messages only: whether a method exists, and
// whether the session may call it now, is the server's to answer.
func Decode(frame []byte) (msgs []jsonrpc.Message, batch bool, err error) {
	frame = bytes.TrimSpace(frame)
	if !json.Valid(frame) {
		return nil, false, Refuse(jsonrpc.ID{}, jsonrpc.CodeParseError, "parse error: %s", syntaxError(frame))
	}
	if frame[0] != '[' {
		msg, err := decodeMessage(frame)
		if err != nil {
			return nil, false, err
		}
		return []jsonrpc.Message{msg}, false, nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(frame, &raws); err != nil {
		return nil, true, Refuse(jsonrpc.ID{}, jsonrpc.CodeParseError, "parse error: %v", err)
	}
	if len(raws) == 0 {
		return nil, true, Refuse(jsonrpc.ID{}, jsonrpc.CodeInvalidRequest, "invalid request: an empty batch")
	}
	seen := map[jsonrpc.ID]bool{}
	for i, raw := range raws {
		msg, err := decodeMessage(raw)
		if err != nil {
			var fe *FrameError
			errors.As(err, &fe)
			fe.Message = fmt.Sprintf("batch element %d: %s", i, fe.Message)
			return nil, true, fe
		}
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			if seen[req.ID] {
				return nil, true, Refuse(req.ID, jsonrpc.CodeInvalidRequest, "invalid request: the batch uses ID %v twice", req.ID.Raw())
			}
			seen[req.ID] = true
		}
		msgs = append(msgs, msg)
	}
	return msgs, true, nil
}

// decodeMessage decodes one JSON-RPC message, which is valid JSON.
func decodeMessage(data []byte) (jsonrpc.Message, error) {
	if data[0] != '{' {
		return nil, Refuse(jsonrpc.ID{}, jsonrpc.CodeInvalidRequest, "invalid request: a message is a JSON object, not %s", kindOf(data[0]))
	}
	var m struct{ ID json.RawMessage }
	if json.Unmarshal(data, &m) == nil && len(m.ID) > 0 && (m.ID[0] == '-' || m.ID[0] >= '0' && m.ID[0] <= '9') {
		// The SDK takes 1.5 for 1: the answer would go to another request.
		if f, err := strconv.ParseFloat(string(m.ID), 64); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return nil, Refuse(jsonrpc.ID{}, jsonrpc.CodeInvalidRequest, "invalid request: the id %s is not an integer; an id is a string or an integer", m.ID)
		}
	}
	msg, err := jsonrpc.DecodeMessage(data)
	if err != nil {
		if len(m.ID) > 0 && strings.IndexByte(`{[tf`, m.ID[0]) >= 0 {
			return nil, Refuse(jsonrpc.ID{}, jsonrpc.CodeInvalidRequest, "invalid request: the id %s is not a string, a number or null", m.ID)
		}
		return nil, Refuse(idOf(data), jsonrpc.CodeInvalidRequest, "invalid request: %v", err)
	}
	return msg, nil
}

// idOf returns the ID a request names in frame — which may be cut short,
// or not valid JSON-RPC — when the ID comes before anything that stops the
// reading, and is a string or a number; otherwise the null ID. It is how a
// refusal finds the caller that waits for it.
func idOf(frame []byte) jsonrpc.ID {
	dec := json.NewDecoder(bytes.NewReader(frame))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return jsonrpc.ID{}
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return jsonrpc.ID{}
		}
		if key != "id" {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return jsonrpc.ID{}
			}
			continue
		}
		var v any
		if dec.Decode(&v) != nil {
			return jsonrpc.ID{}
		}
		id, err := jsonrpc.MakeID(v)
		if err != nil {
			return jsonrpc.ID{}
		}
		return id
	}
	return jsonrpc.ID{}
}

// syntaxError says where frame, which is not valid JSON, goes wrong.
func syntaxError(frame []byte) string {
	if len(frame) == 0 {
		return "an empty message"
	}
	var v json.RawMessage
	err := json.Unmarshal(frame, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d); send one JSON-RPC message a line", se, se.Offset)
	}
	if err == nil { // valid as a whole after all: json.Valid refused what follows it
		return "more than one JSON value; send one JSON-RPC message a line"
	}
	return err.Error() + "; send one JSON-RPC message a line"
}

func kindOf(first byte) string {
	switch first {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}
