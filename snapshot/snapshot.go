// Package snapshot is the daemon's store of saved workspace trees: a
// session's workspace captured at one moment (a snapshot), or a tree the
// operator declares for sessions to start from (a template).
//
// A snapshot holds exactly the tree it claims or it is refused. It is
// written as one pack (a tar stream of the tree's directories, regular
// files and symbolic links, names relative to the workspace root) beside
// its manifest, a list of every entry with its type, permission bits, size
// and SHA-256 (a link's target in place of contents). The manifest's own
// SHA-256 is the snapshot's [Info.Manifest]. When a snapshot is made, its
// pack is written to a directory of its own under a temporary name,
// flushed to stable storage, read back and checked against the manifest,
// and only then renamed into place: a snapshot that failed — the source
// broke off, the disk filled, the tenant's cap was reached — leaves
// nothing behind. Before any session is given a snapshot's tree
// ([Store.Restore]) the manifest is checked against Info.Manifest and the
// pack against the manifest, entry by entry, as it is streamed: a changed
// byte, an entry removed or added, a pack cut short or gone fails with
// [ErrCorrupt], naming what differs.
//
// The store is a directory of the daemon's own (mode 0700), outside every
// workspace, with a directory per tenant. A tenant sees only its own
// snapshots: another tenant's ID is [ErrNotFound], as one that never was.
// Each tenant's snapshots are capped in number and in bytes ([Limits]),
// counted as they are stored: every file at its full size (the holes of a
// sparse file count), with each entry's header, as the pack holds them.
//
// What a tree holds and a snapshot does not: special files (FIFOs,
// sockets, devices; named in [Info.Skipped]), owners (a restored tree
// belongs to the new session's user), the set-user-ID, set-group-ID and
// sticky bits, extended attributes, and "/.sandboxd" at the root (the
// daemon's bookkeeping of the session: spilled output, materialized
// sources). A hard link is saved as a file of its own with the same
// contents. Modification times are kept but not checked.
//
// The store imports nothing of the backends: a backend writes the tar
// stream ([Source]) and reads the one Restore writes; [WriteTree] and
// [ReadTree] do so through the [workspace.FileSystem] port for a backend
// that has no faster way.
package snapshot

import (
	"errors"
	"io/fs"
	"time"
)

// Errors of the store; match them with errors.Is.
var (
	// ErrNotFound: the tenant has no such snapshot (or template).
	ErrNotFound = errors.New("no such snapshot")
	// ErrCorrupt: the snapshot's files are not what its manifest says —
	// changed, cut short or missing. It is never restored; delete it.
	ErrCorrupt = errors.New("the snapshot is damaged")
	// ErrLimit: the tenant's snapshots are at their cap of number or
	// bytes ([Limits]).
	ErrLimit = errors.New("the tenant's snapshots are at their limit")
	// ErrNoSpace: the store's disk is full.
	ErrNoSpace = errors.New("the snapshot store's disk is full")
	// ErrInvalid: the tree cannot be saved as it stands (an entry under a
	// link, a name twice), or a template's declaration is wrong.
	ErrInvalid = errors.New("the tree cannot be saved")
)

// Info describes a snapshot or a template.
type Info struct {
	// ID names the snapshot ("snap-…"), or the template.
	ID string `json:"id"`
	// Created is when it was made.
	Created time.Time `json:"created"`
	// Bytes is the size of its regular files, each at its full size.
	Bytes int64 `json:"bytes"`
	// StoredBytes is what it holds in the store (the pack: contents and a
	// header per entry); a tenant's cap counts this.
	StoredBytes int64 `json:"storedBytes"`
	// Files, Dirs and Links count its entries.
	Files int `json:"files"`
	Dirs  int `json:"dirs"`
	Links int `json:"links"`
	// Manifest is the SHA-256 of its manifest ("sha256:…"): equal trees
	// have equal manifests.
	Manifest string `json:"manifest"`
	// Session is the session it was taken from ("" for a template).
	Session string `json:"session,omitempty"`
	// Skipped names what the tree held that the snapshot leaves out (FIFOs,
	// sockets, devices), at most maxSkipped of them.
	Skipped []string `json:"skipped,omitempty"`
}

// maxSkipped bounds Info.Skipped.
const maxSkipped = 20

// Manifest lists every entry of a snapshot, in the pack's order: parents
// before their children.
type Manifest struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// manifestVersion is the Manifest.Version this package writes and reads.
const manifestVersion = 1

// Entry is one entry of a manifest.
type Entry struct {
	// Path is slash-separated, relative to the workspace root.
	Path string `json:"path"`
	// Type is "dir", "file" or "link".
	Type string `json:"type"`
	// Mode is the permission bits (0o777 at most).
	Mode fs.FileMode `json:"mode"`
	// Size and SHA256 are a file's length and hex SHA-256.
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Target is a link's target, as it was written.
	Target string `json:"target,omitempty"`
}

// Entry types.
const (
	TypeDir  = "dir"
	TypeFile = "file"
	TypeLink = "link"
)

// Limits cap one tenant's snapshots; zero fields are no cap.
type Limits struct {
	// Count caps how many snapshots a tenant keeps.
	Count int `json:"count,omitempty"`
	// Bytes caps what they hold in the store, all together (Info.StoredBytes).
	Bytes int64 `json:"bytes,omitempty"`
}
