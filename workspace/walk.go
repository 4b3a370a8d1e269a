package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/bmatcuk/doublestar/v4"
)

// WalkRequest asks for the entries of a tree.
type WalkRequest struct {
	// Dir is where the walk starts, a workspace name; "" is the root. When Dir
	// is a file the walk yields that file alone (if it matches).
	Dir string
	// Pattern selects entries by their name relative to the workspace root
	// (see GlobMatch); "" selects every entry.
	Pattern string
	// Exclude names directories and files the walk skips (the start itself is
	// never skipped).
	Exclude Exclude
	// FilesOnly leaves directories out of the result (they are still entered).
	FilesOnly bool
	// Limit stops the walk after that many entries, with Truncated set; zero
	// means no limit.
	Limit int
	// MaxDepth, when positive, lists no entry deeper than that below the
	// start: 1 lists the start's own entries and enters none of its
	// directories. Zero means no limit.
	MaxDepth int
	// Info fills each entry's Mode, Size, ModTime and Link, so a caller needs no
	// Lstat or Readlink of its own. It costs a stat of every entry (and a
	// readlink of every link), which a walk without it does not make.
	Info bool
	// ListExcluded lists the entries Exclude names all the same; an
	// excluded directory is still not entered (as ls -R shows node_modules
	// but not what it holds).
	ListExcluded bool
	// Errors reports each directory below the start that the walk could
	// not read, as fs.WalkDir does by calling its function a second time for
	// it: one more entry for the directory, right after its own, with Err
	// set. Without it such a directory is skipped in silence. Error entries
	// are not selected by Pattern or FilesOnly and do not count against
	// Limit.
	Errors bool
}

// WalkEntry is one entry a walk found.
type WalkEntry struct {
	// Path is the entry's workspace name.
	Path string
	// Type is the entry's type bits (fs.ModeDir, fs.ModeSymlink, …; 0 for a
	// regular file), as fs.DirEntry.Type reports them.
	Type fs.FileMode
	// Mode, Size, ModTime and Link are set when the request asks for Info:
	// the entry's mode (type and permission bits), size and modification
	// time (in UTC) as Lstat reports them, and a link's target as Readlink
	// reports it. An entry that vanished before it could be described keeps
	// Type alone.
	Mode    fs.FileMode `json:",omitempty"`
	Size    int64       `json:",omitempty"`
	ModTime time.Time   `json:",omitzero"`
	Link    string      `json:",omitempty"`
	// Err is set on the second entry of a directory the walk could not
	// read, when the request asks for Errors: the *fs.PathError of its
	// ReadDir. It crosses a process boundary as its Kind and message
	// (see MarshalJSON), so errors.Is still matches the Kind.
	Err error `json:"-"`
}

// FileInfo is the entry as an fs.FileInfo, from what Info described (Sys
// is nil); ok is false when the entry was not described — the request did
// not ask for Info, or the entry changed between its listing and its stat.
func (e WalkEntry) FileInfo() (info fs.FileInfo, ok bool) {
	if e.Err != nil || e.Mode.Type() != e.Type || (e.Mode == 0 && e.Size == 0 && e.ModTime.IsZero()) {
		return nil, false
	}
	return walkInfo{e}, true
}

type walkInfo struct{ e WalkEntry }

func (i walkInfo) Name() string       { return path.Base(i.e.Path) }
func (i walkInfo) Size() int64        { return i.e.Size }
func (i walkInfo) Mode() fs.FileMode  { return i.e.Mode }
func (i walkInfo) ModTime() time.Time { return i.e.ModTime }
func (i walkInfo) IsDir() bool        { return i.e.Type.IsDir() }
func (i walkInfo) Sys() any           { return nil }

// walkEntryJSON is a WalkEntry on the wire: Err as its Kind's name and its
// message.
type walkEntryJSON struct {
	walkEntryFields
	ErrKind string `json:",omitempty"`
	ErrMsg  string `json:",omitempty"`
}

// walkEntryFields is WalkEntry without its methods.
type walkEntryFields WalkEntry

// MarshalJSON encodes the entry, an Err as the name of its Kind
// (ErrUnavailable's when it has none) and its message.
func (e WalkEntry) MarshalJSON() ([]byte, error) {
	w := walkEntryJSON{walkEntryFields: walkEntryFields(e)}
	if e.Err != nil {
		k := KindOf(e.Err)
		if k == nil {
			k = ErrUnavailable
		}
		w.ErrKind, w.ErrMsg = k.Name(), e.Err.Error()
		var pe *fs.PathError
		if errors.As(e.Err, &pe) {
			w.ErrMsg = pe.Err.Error()
		}
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes what MarshalJSON encodes; an error becomes an
// *fs.PathError (op "readdir", the entry's path) carrying a *Error of its
// Kind, or of ErrUnavailable when the name is unknown.
func (e *WalkEntry) UnmarshalJSON(data []byte) error {
	var w walkEntryJSON
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*e = WalkEntry(w.walkEntryFields)
	e.Err = nil
	if w.ErrKind != "" || w.ErrMsg != "" {
		k := KindByName(w.ErrKind)
		if k == nil {
			k = ErrUnavailable
		}
		e.Err = &fs.PathError{Op: "readdir", Path: w.Path, Err: &Error{Kind: k, Msg: w.ErrMsg}}
	}
	return nil
}

// WalkResult is what a walk found, in walk order: depth first, each
// directory's entries sorted by name (the order of fs.WalkDir).
type WalkResult struct {
	Entries []WalkEntry
	// Truncated says the walk stopped at the request's Limit with more to go.
	Truncated bool
}

// Walk lists a tree: through the adapter's WalkFS when it has one, otherwise
// with WalkGeneric. A walk never follows a symbolic link into a directory and
// never enters an excluded name. Directories it cannot read below the start
// are skipped (or reported, see WalkRequest.Errors); a start that cannot be
// read fails the walk.
func Walk(ctx context.Context, fsys FileSystem, req WalkRequest) (WalkResult, error) {
	if w, ok := fsys.(WalkFS); ok {
		return w.Walk(ctx, req)
	}
	return WalkGeneric(ctx, fsys, req)
}

// WalkGeneric is Walk over the core FileSystem methods alone. Adapters that
// implement WalkFS may call it; the conformance kit compares the two.
func WalkGeneric(ctx context.Context, fsys FileSystem, req WalkRequest) (WalkResult, error) {
	start := req.Dir
	if start == "" {
		start = "."
	}
	if req.Pattern != "" && !doublestar.ValidatePattern(req.Pattern) {
		return WalkResult{}, PathError("walk", req.Pattern, ErrInvalidArgument)
	}
	w := walker{ctx: ctx, fsys: fsys, req: req}
	return w.walk(start)
}

// WalkGenericEach is WalkGeneric handing each entry to fn as the walk
// finds it, in walk order, rather than gathering them: an error of fn ends
// the walk and is returned. A Limit ends the walk as it ends WalkGeneric's,
// without an error.
func WalkGenericEach(ctx context.Context, fsys FileSystem, req WalkRequest, fn func(WalkEntry) error) error {
	start := req.Dir
	if start == "" {
		start = "."
	}
	if req.Pattern != "" && !doublestar.ValidatePattern(req.Pattern) {
		return PathError("walk", req.Pattern, ErrInvalidArgument)
	}
	w := walker{ctx: ctx, fsys: fsys, req: req, each: fn}
	_, err := w.walk(start)
	return err
}

// walkEach is the walk of req over fsys, entry by entry: the adapter's
// WalkEach where it has one, its Walk gone through where it has only that,
// and WalkGenericEach otherwise.
func walkEach(ctx context.Context, fsys FileSystem, req WalkRequest, fn func(WalkEntry) error) error {
	switch w := fsys.(type) {
	case WalkEachFS:
		return w.WalkEach(ctx, req, fn)
	case WalkFS:
		res, err := w.Walk(ctx, req)
		if err != nil {
			return err
		}
		for _, e := range res.Entries {
			if err := fn(e); err != nil {
				return err
			}
		}
		return nil
	}
	return WalkGenericEach(ctx, fsys, req, fn)
}

// walk walks from start, a valid name.
func (w *walker) walk(start string) (WalkResult, error) {
	ctx, fsys := w.ctx, w.fsys
	info, err := fsys.Lstat(ctx, start)
	if err != nil {
		return WalkResult{}, err
	}
	if !info.IsDir() {
		if info.Mode()&fs.ModeSymlink != 0 {
			// A link named as the start is followed once, as a user would expect.
			if ti, err := fsys.Stat(ctx, start); err == nil && ti.IsDir() {
				return w.result(w.dir(start, 1))
			}
		}
		return w.result(w.visit(start, info.Mode().Type(), func() (fs.FileInfo, error) { return info, nil }))
	}
	return w.result(w.dir(start, 1))
}

type walker struct {
	ctx  context.Context
	fsys FileSystem
	req  WalkRequest
	out  WalkResult
	n    int                   // entries found, error entries left out
	each func(WalkEntry) error // when set, gets each entry in place of out
}

var errWalkDone = errors.New("walk limit reached")

// eachError is an error of walker.each, which ends the walk.
type eachError struct{ err error }

func (e *eachError) Error() string { return e.err.Error() }

func (w *walker) result(err error) (WalkResult, error) {
	var ee *eachError
	switch {
	case errors.As(err, &ee):
		return WalkResult{}, ee.err
	case err != nil && err != errWalkDone:
		return WalkResult{}, err
	}
	return w.out, nil
}

// emit records e, or hands it to each.
func (w *walker) emit(e WalkEntry) error {
	if w.each == nil {
		w.out.Entries = append(w.out.Entries, e)
		return nil
	}
	if err := w.each(e); err != nil {
		return &eachError{err}
	}
	return nil
}

// visit records an entry, described by info when the request asks for
// Info; it returns errWalkDone when the limit is passed.
func (w *walker) visit(name string, typ fs.FileMode, info func() (fs.FileInfo, error)) error {
	if w.req.FilesOnly && typ.IsDir() {
		return nil
	}
	if w.req.Pattern != "" && !GlobMatch(w.req.Pattern, name) {
		return nil
	}
	if w.req.Limit > 0 && w.n >= w.req.Limit {
		w.out.Truncated = true
		return errWalkDone
	}
	w.n++
	e := WalkEntry{Path: name, Type: typ}
	if w.req.Info {
		if fi, err := info(); err == nil && fi.Mode().Type() == typ {
			e.Mode, e.Size, e.ModTime = fi.Mode(), fi.Size(), fi.ModTime().UTC() // UTC: the same on both sides of the wire
			if sl, ok := w.fsys.(SymlinkFS); ok && typ == fs.ModeSymlink {
				e.Link, _ = sl.Readlink(w.ctx, name)
			}
		}
	}
	return w.emit(e)
}

// dir lists name, whose entries lie at depth below the start.
func (w *walker) dir(name string, depth int) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	entries, err := w.fsys.ReadDir(w.ctx, name)
	if err != nil {
		return err
	}
	for _, e := range entries {
		child := path.Join(name, e.Name())
		excluded := w.req.Exclude.Skip(child)
		if excluded && !w.req.ListExcluded {
			continue
		}
		if err := w.visit(child, e.Type(), e.Info); err != nil {
			return err
		}
		if e.IsDir() && !excluded && (w.req.MaxDepth <= 0 || depth < w.req.MaxDepth) { // a link to a directory is not IsDir: never entered
			if err := w.dir(child, depth+1); err != nil {
				var ee *eachError
				if err == errWalkDone || errors.As(err, &ee) || w.ctx.Err() != nil {
					return err
				}
				// An unreadable directory below the start is skipped, or
				// reported when the request asks for errors.
				if w.req.Errors {
					if err := w.emit(WalkEntry{Path: child, Type: fs.ModeDir, Err: err}); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// GlobMatch reports whether a workspace name matches a doublestar pattern
// written relative to the workspace root. A pattern without a slash matches
// the base name at any depth ("*.go" matches "a/b/c.go"); a leading "./" or
// "/" is ignored. An invalid pattern matches nothing.
func GlobMatch(pattern, name string) bool {
	pattern = strings.TrimPrefix(strings.TrimPrefix(pattern, "./"), "/")
	if !strings.Contains(pattern, "/") {
		name = path.Base(name)
	}
	ok, _ := doublestar.Match(pattern, name)
	return ok
}
