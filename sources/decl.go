// Package sources gives a session its declared sources: named inputs the
// agent may read that do not live in the workspace — a host directory the
// operator allows, a tar archive, a git repository at a pinned commit, or
// an HTTP API.
//
// An HTTP ("http") source is not copied: its snapshot is its Source Request
// descriptor, requests.json, which says what requests the agent may send
// and what in them it may vary. The requests go through a Gateway in the
// daemon, which checks each against the declarations, adds the operator's
// credential (never visible in the workspace), enforces the limits and
// audits it.
//
// The operator declares them (Decl, usually from the "sources" key of the
// tools configuration); Materialize copies complete snapshots of them into
// the workspace under .sandboxd/sources/<name>/, through the FileSystem port,
// so it works the same on every backend. A snapshot is complete or absent:
// it is built under a temporary name and renamed into place, and a source
// that holds anything hostile (a link leading out of the snapshot, a device,
// a FIFO, an absolute or ".." name in a tar, more than the limits allow) is
// refused before anything is written.
//
// Snapshots are read-only to the agent because .sandboxd/** is among the
// default protect globs, which every write tool refuses; they are readable by
// read, cat, grep and find named explicitly (.sandboxd is a default exclude,
// so a search from the workspace root does not descend into them).
package sources

import (
	"fmt"
	"path/filepath"
	"regexp"

	"github.com/sandboxd/sandboxd/workspace"
)

// Kind is the kind of a source.
type Kind string

// The kinds of source.
const (
	// KindDir is a directory on the host, copied as it is.
	KindDir Kind = "dir"
	// KindTar is a tar archive on the host (optionally gzip-compressed).
	KindTar Kind = "tar"
	// KindGit is the tree of one commit of a git repository on the host.
	KindGit Kind = "git"
	// KindHTTP is an HTTP API the daemon calls on the agent's behalf,
	// request shape by request shape (see Gateway). Its snapshot is the
	// Source Request descriptor, requests.json.
	KindHTTP Kind = "http"
)

// Decl declares one source.
type Decl struct {
	// Name names the source and its snapshot directory: 1 to 64 letters,
	// digits, '.', '_' or '-', starting with a letter or digit.
	Name string `json:"name"`
	// Kind is "dir", "tar" or "git".
	Kind Kind `json:"kind"`
	// Path is the source on the host: an absolute, clean path to the
	// directory, the tar file, or the repository (its work tree or its
	// .git / bare directory). Not for kind "http".
	Path string `json:"path,omitempty"`
	// Commit pins a git source: the full hexadecimal object name of a
	// commit (40 digits, or 64 for a SHA-256 repository). Branches and
	// tags are refused: they move. Only for kind "git".
	Commit string `json:"commit,omitempty"`

	// The fields of an "http" source, with HTTPDecl's documentation.
	HTTPDecl
}

// Decls are a session's sources.
type Decls []Decl

// DeclError is a bad declaration; Field names it as the configuration
// does, e.g. "sources[1].commit". It matches workspace.ErrInvalidArgument.
type DeclError struct {
	Field  string
	Reason string
}

func (e *DeclError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes errors.Is(err, workspace.ErrInvalidArgument) hold.
func (e *DeclError) Unwrap() error { return workspace.ErrInvalidArgument }

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	commitRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)
)

// Validate reports the first bad declaration as a *DeclError naming the
// field. Names must be unique.
func (ds Decls) Validate() error {
	seen := make(map[string]int, len(ds))
	for i, d := range ds {
		field := func(f string) string { return fmt.Sprintf("sources[%d].%s", i, f) }
		bad := func(f, format string, args ...any) error {
			return &DeclError{Field: field(f), Reason: fmt.Sprintf(format, args...)}
		}
		if !nameRE.MatchString(d.Name) {
			return bad("name", "%q is not a source name (1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit)", d.Name)
		}
		if j, dup := seen[d.Name]; dup {
			return bad("name", "%q is already the name of sources[%d]", d.Name, j)
		}
		seen[d.Name] = i
		switch d.Kind {
		case KindDir, KindTar, KindGit:
			if d.URL != "" || d.Requests != nil || d.Credential != nil || d.MaxResponseBytes != 0 || d.TimeoutMs != 0 {
				return bad("url", "url, requests, credential, maxResponseBytes and timeoutMs are for an http source only")
			}
		case KindHTTP:
			if d.Path != "" || d.Commit != "" {
				return bad("path", "an http source has a url, not a path or a commit")
			}
			if err := d.HTTPDecl.validate(); err != nil {
				err.Field = field(err.Field)
				return err
			}
			continue
		default:
			return bad("kind", "unknown kind %q (kinds are dir, tar, git, http)", d.Kind)
		}
		if d.Path == "" || !filepath.IsAbs(d.Path) || filepath.Clean(d.Path) != d.Path {
			return bad("path", "%q must be an absolute, clean host path", d.Path)
		}
		switch {
		case d.Kind == KindGit && !commitRE.MatchString(d.Commit):
			return bad("commit", "%q must be a commit's full lowercase hexadecimal name (40 or 64 digits); branches and tags move, so they are refused", d.Commit)
		case d.Kind != KindGit && d.Commit != "":
			return bad("commit", "only a git source has a commit")
		}
	}
	return nil
}

// Names are the sources' names, in declaration order.
func (ds Decls) Names() []string {
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = d.Name
	}
	return names
}

// HTTP reports whether any of the sources is an http source.
func (ds Decls) HTTP() bool {
	for _, d := range ds {
		if d.Kind == KindHTTP {
			return true
		}
	}
	return false
}

// SnapshotDir is where snapshots live in the workspace.
const SnapshotDir = ".sandboxd/sources"

// SnapshotPath is the workspace name of a source's snapshot.
func SnapshotPath(name string) string { return SnapshotDir + "/" + name }
