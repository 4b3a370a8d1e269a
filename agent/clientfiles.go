package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"sync"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/textedit"
	"github.com/sandboxd/sandboxd/workspace"
)

// The Client's file calls: the FileSystem and every extension, each one
// round trip on the stream (roundTrip, jsonCall).

// decodeInfo decodes and checks the file description an agent answers.
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
