package memory

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// Mirror is the [workspace.Bash] of any [workspace.FileSystem] whose files
// are not on the host's disk: it runs commands over the FileSystem's files
// in a private host directory kept in step with it both ways (see the
// package documentation). It is safe for concurrent use; Runs' commands may
// overlap.
type Mirror struct {
	fsys    workspace.FileSystem
	links   workspace.SymlinkFS // fsys as a SymlinkFS, or nil
	memRoot string              // the workspace root as the FileSystem's links name it
	parent  string              // the private directory (0700) holding root
	root    string              // the workspace root as commands see it
	aliases []string            // root and the paths it resolves to, for link targets
	sh      *localexec.Bash
	vars    []string // variables set to root in every command

	// sem holds one token while a Run brings the directory up to date or
	// copies changes back, or Close removes it; it guards the fields below.
	sem     chan struct{}
	snap    map[string]*entry
	closed  bool
	running sync.WaitGroup // Runs whose commands are under way; Close waits

	log     changeLog       // fsys as a changeLog, or nil
	synced  uint64          // the generation of log the directory was last brought up to
	fresh   bool            // synced is valid: a prepare has run to its end
	pending map[string]bool // names collect left different between the two sides
	shared  map[string]bool // host files with other hard links, as last seen

	kept     *watcher    // the last Run's watch, for the next (see keep)
	keptTill *time.Timer // drops kept keepWatch after the last Run

	watchOff bool // tests: collect looks at everything
}

// keepWatch is how long a Run's watch is kept for the next Run.
const keepWatch = 10 * time.Second

// keep leaves w, the watch of a Run that has collected, to the next Run,
// unless another is kept already, w is broken or the Mirror is closed: then
// it ends w. Called with sem held.
func (b *Mirror) keep(w *watcher) {
	switch {
	case w == nil:
	case w.broken || b.kept != nil || b.closed:
		w.close()
	default:
		b.kept = w
		if b.keptTill == nil {
			b.keptTill = time.AfterFunc(keepWatch, b.dropKept)
		} else {
			b.keptTill.Reset(keepWatch)
		}
	}
}

// takeKept returns the kept watch, if any, and keeps it no more. Called
// with sem held.
func (b *Mirror) takeKept() *watcher {
	w := b.kept
	b.kept = nil
	return w
}

// dropKept ends the kept watch: no Run came for it.
func (b *Mirror) dropKept() {
	b.sem <- struct{}{}
	w := b.takeKept()
	<-b.sem
	if w != nil {
		w.close()
	}
}

// changeLog is the optional interface of a FileSystem that remembers where
// it changed (memfs.FS): prepare then looks only there, not at the whole
// tree. See memfs.FS.Changes.
type changeLog interface {
	Changes(since uint64) (names []string, now uint64, ok bool)
}

var _ workspace.Bash = (*Mirror)(nil)

// MirrorOption configures a Mirror.
type MirrorOption func(*mirrorConfig)

type mirrorConfig struct {
	tempDir string
	exec    []localexec.Option
	vars    []string
	memRoot string
}

// WithTempDir sets the directory in which the private directory is made
// (default os.TempDir()).
func WithTempDir(dir string) MirrorOption { return func(c *mirrorConfig) { c.tempDir = dir } }

// WithExec passes options to the local adapter that runs the commands: its
// environment allowlist (localexec.WithEnvAllow), WithInheritEnv, the session
// variables (WithEnv) and the shell.
func WithExec(opts ...localexec.Option) MirrorOption {
	return func(c *mirrorConfig) { c.exec = append(c.exec, opts...) }
}

// WithRootVars names variables that, when a command's environment sets
// them, the command sees set to the workspace root as it is for commands
// (Root) instead: say "SANDBOXD_WORKSPACE", which a session sets (under
// bashSessionEnv) to the FileSystem's root path, a path that does not exist
// for commands. A variable the command's environment does not set is not
// added: the option translates a value, it never invents one. PWD needs no
// such help: it is always the directory the command starts in.
func WithRootVars(names ...string) MirrorOption {
	return func(c *mirrorConfig) { c.vars = append(c.vars, names...) }
}

// WithRoot sets the workspace root's absolute path as the FileSystem's
// links name it. The default is the FileSystem's Root method's answer when
// it has one (memfs.FS does), otherwise memfs.DefaultRoot.
func WithRoot(root string) MirrorOption {
	return func(c *mirrorConfig) { c.memRoot = path.Clean("/" + root) }
}

// NewMirror returns a Mirror over fsys. It makes the private directory at once (the
// workspace is copied into it at the first Run) and fails with
// ErrUnavailable when it cannot, or when no shell is found. The caller must
// Close the Mirror to remove the directory.
func NewMirror(fsys workspace.FileSystem, opts ...MirrorOption) (*Mirror, error) {
	c := mirrorConfig{memRoot: memfs.DefaultRoot}
	if r, ok := fsys.(interface{ Root() string }); ok {
		c.memRoot = r.Root()
	}
	for _, o := range opts {
		o(&c)
	}
	parent, err := os.MkdirTemp(c.tempDir, "memexec-")
	if err != nil {
		return nil, unavailable("memexec", c.tempDir, err)
	}
	if parent, err = filepath.Abs(parent); err != nil {
		os.RemoveAll(parent)
		return nil, unavailable("memexec", parent, err)
	}
	root := filepath.Join(parent, "workspace")
	if err := os.Mkdir(root, 0o755); err != nil {
		os.RemoveAll(parent)
		return nil, unavailable("memexec", root, err)
	}
	sh, err := localexec.New(root, c.exec...)
	if err != nil {
		os.RemoveAll(parent)
		return nil, err
	}
	b := &Mirror{
		fsys: fsys, memRoot: c.memRoot, parent: parent, root: root, sh: sh,
		aliases: []string{root}, vars: slices.Clone(c.vars),
		sem: make(chan struct{}, 1), snap: map[string]*entry{}, shared: map[string]bool{},
	}
	b.links, _ = fsys.(workspace.SymlinkFS)
	b.log, _ = fsys.(changeLog)
	if real, err := filepath.EvalSymlinks(root); err == nil && real != root {
		b.aliases = append(b.aliases, real) // /tmp under a link, as on macOS
	}
	return b, nil
}

// Root returns the workspace root as commands see it: the host directory
// they run in for Dir "", an absolute slash path.
func (b *Mirror) Root() string { return filepath.ToSlash(b.root) }

// Shell is the host shell that runs scripts; see workspace.ShellBash.
func (b *Mirror) Shell() string { return b.sh.Shell() }

// Run brings the host directory up to date with the FileSystem, runs cmd
// there as localexec.Bash.Run does, and copies the command's changes back;
// see workspace.Bash and the package documentation. It waits for another
// Run's copying first, giving up with ctx's error when ctx ends. The changes are
// copied back even when the command timed out or ctx ended; what could not
// be copied (a conflict, a full workspace) is reported on the command's
// standard error. After Close, Run fails with ErrUnavailable.
func (b *Mirror) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	select {
	case b.sem <- struct{}{}:
	case <-ctx.Done():
		return workspace.Result{}, ctx.Err()
	}
	if b.closed {
		<-b.sem
		return workspace.Result{}, workspace.PathError("run", cmd.Dir, workspace.ErrUnavailable)
	}
	if err := b.prepare(ctx); err != nil {
		<-b.sem
		return workspace.Result{}, err
	}
	if len(b.vars) > 0 && len(cmd.Env) > 0 {
		cmd.Env = maps.Clone(cmd.Env)
		for _, v := range b.vars {
			if _, ok := cmd.Env[v]; ok {
				cmd.Env[v] = b.root
			}
		}
	}
	var w *watcher
	if !b.watchOff {
		w = b.watch(b.takeKept(), b.dirs())
	}
	b.running.Add(1)
	defer b.running.Done()
	<-b.sem // the command runs beside others
	res, runErr := b.sh.Run(ctx, cmd)
	// The command's changes are copied back whatever became of it and of
	// ctx: they are in the directory, as they would be on a disk.
	b.sem <- struct{}{}
	notes, err := b.collect(context.WithoutCancel(ctx), w)
	b.keep(w)
	<-b.sem
	if cmd.Output != nil {
		for _, n := range notes {
			cmd.Output(workspace.Stderr, []byte("memexec: "+n+"\n"))
		}
	}
	if runErr != nil {
		return res, runErr
	}
	return res, err
}

// dirs lists the host directory's directories, as prepare left them.
func (b *Mirror) dirs() []string {
	var out []string
	for name, e := range b.snap {
		if e.host.mode.IsDir() {
			out = append(out, name)
		}
	}
	return out
}

// Close removes the host directory, waiting for the Runs in progress to
// end. Later Runs fail with ErrUnavailable. Close is idempotent.
func (b *Mirror) Close() error {
	b.sem <- struct{}{}
	closed := b.closed
	b.closed = true
	<-b.sem
	if closed {
		return nil
	}
	b.running.Wait()
	b.sem <- struct{}{}
	defer func() { <-b.sem }()
	if b.keptTill != nil {
		b.keptTill.Stop()
	}
	if w := b.takeKept(); w != nil {
		w.close()
	}
	b.snap = nil
	return removeAll(b.parent)
}

// removeAll is os.RemoveAll that first gives the owner back the right to
// list and change directories a command took it from.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// unavailable reports a failure of the host directory.
func unavailable(op, name string, err error) error {
	return &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: %v", workspace.ErrUnavailable, err)}
}
