package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
)

// Kind is a class of failure, defined once and matched with errors.Is. Adapters
// wrap a Kind in an *fs.PathError naming the operation and the workspace path:
//
//	return &fs.PathError{Op: "read", Path: name, Err: workspace.ErrNotAFile}
//
// and callers test for it with errors.Is(err, workspace.ErrNotAFile). Kind names
// are the error names of the contract (NotFound, OutsideWorkspace, …) and travel
// unchanged to tool results, MCP and the HTTP API.
type Kind struct {
	name string
	text string
	std  error // the io/fs sentinel this kind also matches, if any
}

// Name is the kind's stable name as tool results report it, e.g. "NotFound".
func (k *Kind) Name() string { return k.name }

// Error describes the kind in words, e.g. "no such file or directory".
func (k *Kind) Error() string { return k.text }

// Is lets a Kind match its io/fs counterpart: errors.Is(err, fs.ErrNotExist)
// holds for an error carrying ErrNotFound.
func (k *Kind) Is(target error) bool { return k.std != nil && target == k.std }

// The kinds. Their names are part of the wire contract; never rename one.
var (
	ErrNotFound         = &Kind{"NotFound", "no such file or directory", fs.ErrNotExist}
	ErrExists           = &Kind{"Exists", "file already exists", fs.ErrExist}
	ErrOutsideWorkspace = &Kind{"OutsideWorkspace", "path leads outside the workspace", nil}
	ErrProtected        = &Kind{"Protected", "path is protected", nil}
	ErrNotAFile         = &Kind{"NotAFile", "not a regular file", nil}
	ErrNotADirectory    = &Kind{"NotADirectory", "not a directory", nil}
	ErrNotEmpty         = &Kind{"NotEmpty", "directory not empty", nil}
	ErrNotUTF8          = &Kind{"NotUtf8", "file is not valid UTF-8", nil}
	ErrFileTooLarge     = &Kind{"FileTooLarge", "file too large", nil}
	ErrImageRejected    = &Kind{"ImageRejected", "image rejected", nil}
	ErrNoMatch          = &Kind{"NoMatch", "text not found", nil}
	ErrAmbiguous        = &Kind{"Ambiguous", "text matches more than once", nil}
	ErrForbidden        = &Kind{"Forbidden", "operation not permitted", fs.ErrPermission}
	ErrInvalidArgument  = &Kind{"InvalidArgument", "invalid argument", fs.ErrInvalid}
	ErrTimeout          = &Kind{"Timeout", "timed out", nil}
	ErrUnavailable      = &Kind{"Unavailable", "workspace backend unavailable", nil}
	// ErrNoSpace: the workspace is full — its disk (ENOSPC, EDQUOT) or a
	// memory workspace's byte cap.
	ErrNoSpace = &Kind{"NoSpace", "no space left in the workspace", nil}
)

// Kinds lists every kind, for documentation, decoding and tests.
var Kinds = []*Kind{
	ErrNotFound, ErrExists, ErrOutsideWorkspace, ErrProtected, ErrNotAFile,
	ErrNotADirectory, ErrNotEmpty, ErrNotUTF8, ErrFileTooLarge, ErrImageRejected,
	ErrNoMatch, ErrAmbiguous, ErrForbidden, ErrInvalidArgument, ErrTimeout,
	ErrUnavailable, ErrNoSpace,
}

// KindByName returns the kind with that name, or nil. Decoders of errors that
// crossed a process boundary use it to restore errors.Is matching.
func KindByName(name string) *Kind {
	for _, k := range Kinds {
		if k.name == name {
			return k
		}
	}
	return nil
}

// KindOf classifies err: the Kind it carries, or the Kind of the io/fs or
// context sentinel it wraps. An error of no known class is ErrUnavailable's
// cousin in spirit but is reported as nil, so callers can tell "unclassified"
// from a deliberate kind.
func KindOf(err error) *Kind {
	if err == nil {
		return nil
	}
	var k *Kind
	if errors.As(err, &k) {
		return k
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ErrNotFound
	case errors.Is(err, fs.ErrExist):
		return ErrExists
	case errors.Is(err, fs.ErrPermission):
		return ErrForbidden
	case errors.Is(err, fs.ErrInvalid):
		return ErrInvalidArgument
	case errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ErrNoSpace
	}
	return nil
}

// PathError returns an *fs.PathError carrying kind; a convenience for adapters.
func PathError(op, name string, kind *Kind) error {
	return &fs.PathError{Op: op, Path: name, Err: kind}
}

// Error is a failure of a Kind with a message of its own, written for whoever
// reads it (an agent, a person) where the kind's words would not say enough.
// errors.Is matches its Kind (and, through it, the io/fs counterpart) and its
// cause, when it has one; errors.As finds either.
type Error struct {
	Kind *Kind
	Msg  string
	// Err is what caused the failure, if anything (a syscall.Errno, say).
	Err error
}

// Errorf returns an *Error of kind whose message is formatted as fmt.Sprintf
// formats it. It is the one way this module makes an error of a kind with a
// message; wrap it in an *fs.PathError to name the operation and the path.
func Errorf(kind *Kind, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Error returns the message, or the kind's words when there is none.
func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Kind.Error()
	}
	return e.Msg
}

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}
