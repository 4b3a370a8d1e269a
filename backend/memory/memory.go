// Package memory is the [backend.Backend] of workspaces held in the
// daemon's memory: each is a [memfs.FS] rooted at /workspace, and its
// commands run through a [Mirror], in a private host directory kept in step
// with the tree both ways. For development and tests: there is no isolation
// beyond the file system's confinement, and nothing survives the daemon.
//
// # Commands: the Mirror
//
// [Mirror] is the [workspace.Bash] of any [workspace.FileSystem]
// whose files are not on the host's disk: it mirrors the FileSystem to a
// private host directory, runs each command there with [localexec], and
// copies what the command changed back through the FileSystem's own
// methods. Nothing in it is particular to memory but a fast path: a
// FileSystem that reports where it changed ([memfs.FS.Changes]) is compared
// only there. Its first user is [memfs.FS] (the memory Backend).
//
//	fsys, _ := memfs.FromDir(ctx, "./repo", memfs.WithUmask(0))
//	sh, err := memory.NewMirror(fsys, memory.WithExec(localexec.WithEnv(vars)))
//	defer sh.Close()
//	res, err := sh.Run(ctx, workspace.Command{Script: "make test", Timeout: time.Minute})
//
// # How a Mirror runs a command
//
// A process needs a real directory, so each Run
//
//  1. brings a private host directory up to date with the workspace: the
//     directory (mode 0700) holds a "workspace" directory that mirrors the
//     FileSystem — directories, regular files with their permission bits and
//     modification times, and symbolic links; special files are left out;
//  2. runs the command there with the local adapter (localexec), which gives
//     it its environment, streams its output and, at the timeout or when ctx
//     ends, kills its whole process tree;
//  3. copies what the command changed back through the FileSystem's own
//     methods — files created or changed (contents and permission bits),
//     files, links and directories removed, links and directories created —
//     so the FileSystem's guardrails hold for them: a link the command made
//     is copied as a link, and whether it may be followed is the
//     FileSystem's decision.
//
// Changes are copied back after every command, including one that failed,
// timed out or whose ctx ended.
//
// # The cache
//
// The host directory stays between Runs, with a record of each entry: the
// FileSystem's (type, permission bits, size, modification time) and the
// host's (the same, the inode, a link's target, and a SHA-256 of a file's
// contents). Step 1 rewrites only entries whose FileSystem or host record
// no longer matches, and when the FileSystem says where it changed since the
// last Run (memfs.FS.Changes), it looks only there and at what the last Run
// could not copy back. Step 3 looks, on Linux, only where the command
// changed something: an inotify watch on every directory of the host
// directory, held while the command runs, names the entries written,
// closed after opening for writing, changed in metadata, created, removed
// or moved, and the files with other hard links are looked at every time;
// when the watch cannot be set up or its events do not tell it all (its
// queue overflowed, a directory moved), and elsewhere, step 3 lists the
// whole host directory. Either way it reads only host files whose metadata
// changed, or whose modification time is recent enough that a same-sized
// rewrite within the file system's timestamp granularity could hide (they
// are hashed), and writes into the FileSystem only those whose contents or
// bits really changed. A Run over an unchanged memfs workspace therefore
// costs next to nothing beyond the command (see BenchmarkFloor); over
// another FileSystem, a listing of it and two of the host directory.
//
// # Overlapping runs and conflicts
//
// Runs share the directory, as commands share a disk: steps 1 and 3 are
// serialised (a Run waits for its turn at step 1, or gives up when its ctx
// ends), while the commands themselves may run side by side — a
// background command does not hold up the next one. A Run's step 3 copies
// back what any command changed by then, so a command still running may
// have a file it is writing copied half-written; the copy is completed by
// the next step 3 after it. Other users of the FileSystem — tools writing
// and editing — are not held up, and may change the workspace while a
// command runs; a running command sees their changes only once a Run's
// step 1 has copied them in. When both changed the same entry, the
// workspace wins: the FileSystem's version is kept, the command's change to
// that entry is discarded, and a line on the command's standard error (after
// its own output) says so; the next Run gives the command the FileSystem's
// version. The check and the copy are two steps, so a change made through the
// FileSystem in between is overwritten by the command's.
//
// # Limits
//
// Commands see the workspace root as the host directory (Root), not as the
// FileSystem's root path: "/workspace" does not exist for them, pwd prints
// the host path, and an absolute link under the workspace root is given to
// them pointing into the host directory (and copied back the other way). A
// private mount namespace could put the directory at /workspace, but it
// needs root or unprivileged user namespaces, which many hosts disable; this
// package does not try. WithRootVars sets variables such as
// SANDBOXD_WORKSPACE to the path commands do see.
//
// The port cannot change a directory's permission bits or any modification
// time, so a command's chmod of a directory is undone at the next Run, and
// the FileSystem gives changed files its own times. A file whose bits change
// is recreated with them, so a FileSystem with a umask (memfs's default is
// 022) clears those bits: use memfs.WithUmask(0) for exact modes. Special
// files a command makes stay on the host, and one that replaced a file counts
// as the file's removal. Hard links are copied as separate files. A file of
// the directory that a command links to a name outside it (ln f /tmp/x)
// raises no event there: a later write through the outside name is copied
// back only by a Run that lists the whole directory (a link made the other
// way, into the directory, is seen and watched).
//
// As with localexec, this contains mistakes, not attacks: the command runs as
// the host user, may cd out of the directory and may write anywhere the host
// user can; only what it leaves inside the directory is copied back.
package memory

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/memfs"
)

// Backend is the backend of workspaces held in the daemon's memory (package
// memfs), rooted at /workspace. Commands run through a Mirror: in a private
// host directory mirrored to and from the memory tree, on the host as the
// daemon's user — no isolation beyond the file system's confinement. For
// development and tests; nothing survives the daemon.
type Backend struct {
	// TempDir is where the Mirror makes its private directories (default
	// os.TempDir()).
	TempDir string
}

var _ backend.Warmer = Backend{}

// Name returns "memory".
func (Backend) Name() string { return "memory" }

// Open returns a new workspace bounded by spec.MaxBytes: empty, or a copy
// of spec.Source. Its umask is 0, so the modes commands give files are kept
// exactly (the tools ask for 0644 and 0755 themselves).
func (m Backend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	opts := []memfs.Option{memfs.WithMaxBytes(spec.MaxBytes), memfs.WithUmask(0)}
	if spec.Source == "" {
		return m.open(memfs.New(opts...), spec)
	}
	fsys, err := memfs.FromDir(ctx, spec.Source, opts...)
	if err != nil {
		return nil, fmt.Errorf("memory backend: copying %s: %w", spec.Source, err)
	}
	return m.open(fsys, spec)
}

// Warm is Open: a memory workspace belongs to no session until claimed.
func (m Backend) Warm(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	spec.Source = ""
	return m.Open(ctx, spec)
}

func (m Backend) open(fsys *memfs.FS, spec backend.Spec) (*backend.Instance, error) {
	sh, err := NewMirror(fsys, WithTempDir(m.TempDir), WithRootVars("SANDBOXD_WORKSPACE"),
		WithExec(localexec.WithEnvAllow(spec.EnvAllow), localexec.WithInheritEnv(spec.InheritEnv)))
	if err != nil {
		return nil, fmt.Errorf("memory backend: %w", err)
	}
	return &backend.Instance{FS: fsys, Bash: sh, Root: fsys.Root(), ID: sh.Root(), Close: func(context.Context) error { return sh.Close() }}, nil
}

// Reap has nothing to do: memory does not outlive the process. (the Mirrors'
// private directories of a crashed daemon stay in TempDir.)
func (Backend) Reap(context.Context, map[string]string) (int, error) { return 0, nil }
