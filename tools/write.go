package tools

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// WriteResult is the structured content of write.
type WriteResult struct {
	Path    string `json:"path"`
	Bytes   int    `json:"bytes"`
	Created bool   `json:"created"`
}

type writeArgs struct {
	Path    string  `json:"path" jsonschema:"the file to write"`
	Content *string `json:"content" jsonschema:"the whole new content"`
}

var writeTool = newTool(spec[writeArgs, *WriteResult]{
	name: "write", skill: "workspace.edit",
	describe: func(s *Set) string {
		return fmt.Sprintf("Create or replace a file with content, creating missing parent directories. Readers never see half a file. Refuses to empty a file that has content, and paths matching %s.",
			strings.Join(s.cfg.Protect, ", "))
	},
	handle:    (*Set).write,
	journaled: yes,
})

// lockForChange resolves a path write or edit is to change, asks the view
// whether it refuses the change (the guard refuses protected paths, as
// written and with their links resolved: a link into .git is refused; the
// rules refuse what is outside the commit scope), and takes the write lock
// of the file the path leads to.
func (s *Set) lockForChange(ctx context.Context, c *call, p string) (name string, unlock func(), err error) {
	if name, err = s.resolve(p); err != nil {
		return "", nil, err
	}
	if name == "." {
		return "", nil, newError(workspace.ErrNotAFile, "the workspace root is a directory, not a file")
	}
	real, err := workspace.CheckChange(ctx, c.fsys, s.root, name)
	if err != nil {
		return "", nil, err
	}
	unlock, err = workspace.Lock(ctx, c.fsys, real)
	return name, unlock, err
}

// changeName resolves a path write or edit is to change, refusing the
// workspace root and, without asking the workspace, a name the protect
// globs match as written (the guard refuses it too, and where links lead).
func (s *Set) changeName(p string) (string, error) {
	name, err := s.resolve(p)
	if err != nil {
		return "", err
	}
	if name == "." {
		return "", newError(workspace.ErrNotAFile, "the workspace root is a directory, not a file")
	}
	if workspace.Protect(s.cfg.Protect).Match(name) {
		return "", &fs.PathError{Op: "change", Path: name, Err: &workspace.ProtectedError{Name: name, Protect: s.cfg.Protect}}
	}
	return name, nil
}

// swapped reports whether write and edit change a file with one swap
// (workspace.Swap with its conditions and lock): when the session's view
// is the guard alone. Under a scope's rules they check, lock and write
// step by step, as the rules want each step asked.
func (s *Set) swapped() bool { return !s.scoped() }

// write replaces or creates a file with one swap under the file's lock:
// one round trip to an agent (the guard's check, the lock, what was there
// and the write, in one step), two when a link is to be checked, more only
// for a new directory or a failure to describe. Emptying a file takes the
// lock first, to look before it writes.
func (s *Set) write(ctx context.Context, p writeArgs, c *call) (Result, error) {
	if p.Path == "" || p.Content == nil {
		return Result{}, invalid("path and content are required")
	}
	if *p.Content == "" || !s.swapped() {
		return s.writeLocked(ctx, p, c)
	}
	name, err := s.changeName(p.Path)
	if err != nil {
		return Result{}, err
	}
	req := workspace.SwapRequest{Name: name, Data: []byte(*p.Content), Perm: 0o644, Root: s.root, Lock: true}
	res, err := workspace.Swap(ctx, c.fsys, req)
	if errors.Is(err, workspace.ErrNotFound) { // a parent is missing: make it, and swap again
		if err := workspace.MkdirAll(ctx, c.fsys, path.Dir(name), 0o755); err != nil {
			return Result{}, err
		}
		res, err = workspace.Swap(ctx, c.fsys, req)
	}
	if errors.Is(err, workspace.ErrNotAFile) { // say what is there
		if info, serr := c.fsys.Stat(ctx, name); serr == nil && !info.Mode().IsRegular() {
			return Result{}, notRegular(name, info.Mode())
		}
	}
	if err != nil {
		return Result{}, err
	}
	return writeResult(name, len(req.Data), res.Old == nil), nil
}

func notRegular(name string, m fs.FileMode) error {
	return newError(workspace.ErrNotAFile, "%s is a %s; write replaces regular files only", name, describeMode(m))
}

func writeResult(name string, n int, created bool) Result {
	verb := "Replaced"
	if created {
		verb = "Created"
	}
	return Result{
		Text:       fmt.Sprintf("%s %s (%d bytes).", verb, name, n),
		Structured: &WriteResult{Path: name, Bytes: n, Created: created},
	}
}

// writeLocked is write step by step: the check, the lock, a look at what is
// there, the write.
func (s *Set) writeLocked(ctx context.Context, p writeArgs, c *call) (Result, error) {
	name, unlock, err := s.lockForChange(ctx, c, p.Path)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	created := false
	info, err := c.fsys.Stat(ctx, name)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		created = true
		if err := workspace.MkdirAll(ctx, c.fsys, path.Dir(name), 0o755); err != nil {
			return Result{}, err
		}
	case err != nil:
		return Result{}, err
	case !info.Mode().IsRegular():
		return Result{}, notRegular(name, info.Mode())
	case info.Size() > 0 && *p.Content == "":
		return Result{}, invalid("refusing to empty %s, which has %s of content; to delete it use bash (rm), or write the content it should keep", name, kb(info.Size()))
	}
	if err := c.fsys.WriteFile(ctx, name, []byte(*p.Content), 0o644); err != nil {
		return Result{}, err
	}
	return writeResult(name, len(*p.Content), created), nil
}

func describeMode(m fs.FileMode) string {
	if m.IsDir() {
		return "directory"
	}
	return fileKind(m)
}
