package conformance

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/workspace"
)

// Capability names something an adapter or its harness may be unable to do.
// A harness that lacks one declares it in its Skip map with a reason; the
// subtests that need it then report t.Skip(reason). A capability that is
// missing and not declared fails the subtests that need it, so nothing is
// passed silently.
type Capability string

const (
	// CapSymlinks: the FileSystem is a workspace.SymlinkFS.
	CapSymlinks Capability = "symlinks"
	// CapFIFOs: Instance.MakeSpecial can make named pipes in the workspace.
	CapFIFOs Capability = "fifos"
	// CapSockets: Instance.MakeSpecial can make Unix sockets in the workspace.
	CapSockets Capability = "sockets"
	// CapOutside: Instance.Outside is a directory beside the workspace that
	// the kit can fill and inspect.
	CapOutside Capability = "outside"
	// CapHardlinks: Instance.Hardlink can link a file outside the workspace
	// into it (needs CapOutside too).
	CapHardlinks Capability = "hardlinks"
	// CapPermissions: WriteFile honours perm for a new file and keeps the
	// permission bits of an existing one.
	CapPermissions Capability = "permissions"
	// CapProcessTree: at a timeout or a cancelled context the command's whole
	// process tree dies, including nohup, setsid and double-forked daemons.
	CapProcessTree Capability = "process-tree"
	// CapConfiguredEnv: BashInstance.Env names variables the adapter was
	// configured to give every command.
	CapConfiguredEnv Capability = "configured-env"
	// CapDurable: the Bash is a workspace.BackgroundBash whose background
	// commands outlive its connection, and BashInstance.Reconnect makes a
	// new one.
	CapDurable Capability = "durable-background"
	// CapTerminal: the Bash is a workspace.TerminalBash, and runs commands
	// on a pseudo-terminal.
	CapTerminal Capability = "terminal"
)

var capabilities = []Capability{
	CapSymlinks, CapFIFOs, CapSockets, CapOutside, CapHardlinks,
	CapPermissions, CapProcessTree, CapConfiguredEnv, CapDurable, CapTerminal,
}

// FileSystemHarness tells TestFileSystem how to make the adapter under test.
type FileSystemHarness struct {
	// New returns a fresh, empty workspace for one subtest. It is called once
	// per subtest, from parallel subtests, with that subtest's t: release
	// resources with t.Cleanup and fail with t.Fatal.
	New func(t *testing.T) Instance
	// Skip declares the capabilities this adapter lacks, each with the reason
	// reported by the subtests that need it.
	Skip map[Capability]string
}

// Instance is one fresh workspace and the hooks the kit needs for what the
// FileSystem port cannot express. Only FS and Root are required; a nil hook
// must be matched by a declared Skip.
type Instance struct {
	// FS is the workspace under test, empty.
	FS workspace.FileSystem
	// Root is the workspace root as an absolute slash path, as symbolic links
	// inside the workspace name it ("/workspace", or the directory on disk).
	// The kit makes absolute links from it.
	Root string
	// MakeSpecial creates a named pipe (typ fs.ModeNamedPipe) or a Unix
	// socket (fs.ModeSocket) at the workspace name. Nil: CapFIFOs and
	// CapSockets are declared in Skip.
	MakeSpecial func(name string, typ fs.FileMode) error
	// Outside is a directory outside the workspace, empty, which the kit
	// fills with secrets, points links at, and inspects afterwards to assert
	// that nothing was written there. Nil: CapOutside is declared in Skip;
	// links out are then still tested, pointing at a path that does not exist.
	Outside Outside
	// Hardlink makes the workspace name a hard link to the file at
	// outsideName in Outside. Nil: CapHardlinks is declared in Skip.
	Hardlink func(outsideName, name string) error
}

// Outside is a directory beside the workspace, out of its reach.
type Outside interface {
	// Root is the directory's absolute path as links in the workspace would
	// name it.
	Root() string
	// Build creates the entries of a layout (see the package documentation)
	// under Root.
	Build(layout ...string) error
	// Dump describes the tree under Root as a layout, in walk order.
	Dump() ([]string, error)
}

// BashHarness tells TestBash how to make the adapter under test.
type BashHarness struct {
	// New returns a fresh Bash over an empty workspace for one subtest,
	// called as FileSystemHarness.New is. The secret variable (see
	// HostSecret) is already set in the test process's environment.
	New func(t *testing.T) BashInstance
	// HostSecret names a variable the kit sets in the test process's
	// environment (with t.Setenv) before calling New, and which no command
	// may see. Empty means "SANDBOXD_CONFORMANCE_SECRET". Since t.Setenv
	// refuses parallel tests, the test calling TestBash must not call
	// t.Parallel itself (the kit runs its other subtests in parallel).
	HostSecret string
	// Skip declares the capabilities this adapter lacks, with reasons.
	Skip map[Capability]string
}

// BashInstance is one fresh Bash and a view of the same workspace.
type BashInstance struct {
	// Bash is the adapter under test.
	Bash workspace.Bash
	// FS is the workspace the commands run in, as a FileSystem; the kit
	// prepares directories and reads files commands wrote through it.
	FS workspace.FileSystem
	// Root is the workspace root as commands see it (their $PWD for Dir "").
	Root string
	// Env holds the variables the adapter was configured to give every
	// command (and expects them to see). Empty: CapConfiguredEnv is declared
	// in Skip.
	Env map[string]string
	// Reconnect drops the connection of Bash and FS as a crash of their
	// process would (with no goodbye), calls meanwhile while no connection
	// is open — with exists, which tells whether a workspace name exists
	// by a way that needs none (the host's view of the directory, docker
	// exec) — and returns a Bash and a FileSystem over a new connection to
	// the same workspace. Nil: CapDurable is declared in Skip, or the Bash
	// is no workspace.BackgroundBash.
	Reconnect func(t *testing.T, meanwhile func(exists func(name string) bool)) (workspace.Bash, workspace.FileSystem)
}

// begin fails on a harness the kit cannot use: no New, or a Skip map with an
// unknown capability or a missing reason. It logs what the harness skips.
func begin(t *testing.T, hasNew bool, skip map[Capability]string) {
	t.Helper()
	if !hasNew {
		t.Fatal("conformance: the harness has no New")
	}
	if len(skip) > 0 {
		t.Logf("declared missing: %s", describeCaps(skip))
	}
	for c, reason := range skip {
		if !slices.Contains(capabilities, c) {
			t.Fatalf("conformance: harness skips unknown capability %q", c)
		}
		if strings.TrimSpace(reason) == "" {
			t.Fatalf("conformance: harness skips %q without a reason", c)
		}
	}
}

// require skips t when a capability is declared missing and fails it when
// the capability is missing without a declaration.
func require(t *testing.T, skip map[Capability]string, have func(Capability) bool, caps ...Capability) {
	t.Helper()
	for _, c := range caps {
		if reason, ok := skip[c]; ok {
			t.Skipf("%s: %s", c, reason)
		}
	}
	for _, c := range caps {
		if !have(c) {
			t.Fatalf("conformance: the harness lacks capability %q but does not declare it in Skip", c)
		}
	}
}

// HostDir is a directory on the machine running the tests. It implements
// Outside, and its MakeSpecial suits Instance.MakeSpecial, so a harness for
// an adapter over local directories is a few lines (see HostInstance).
type HostDir string

// Root returns the directory's path as a slash path.
func (d HostDir) Root() string { return filepath.ToSlash(string(d)) }

// Build creates the entries of a layout under the directory.
func (d HostDir) Build(layout ...string) error {
	entries, err := parseLayout(layout, map[string]string{"$ROOT": d.Root(), "$OUTSIDE": d.Root()})
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(string(d), filepath.FromSlash(e.name))
		if e.typ != fs.ModeDir {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
		}
		switch e.typ {
		case fs.ModeDir:
			err = os.MkdirAll(p, 0o755)
		case fs.ModeSymlink:
			err = os.Symlink(e.data, p)
		case 0:
			err = os.WriteFile(p, []byte(e.data), e.perm())
		default:
			err = d.MakeSpecial(e.name, e.typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Dump describes the tree under the directory as a layout.
func (d HostDir) Dump() ([]string, error) {
	return dumpTree(hostTree{os.DirFS(string(d)).(fs.ReadLinkFS)})
}

// MakeSpecial creates a named pipe (fs.ModeNamedPipe) or a Unix socket
// (fs.ModeSocket) at name, a slash path relative to the directory. It is
// supported on Unix systems only.
func (d HostDir) MakeSpecial(name string, typ fs.FileMode) error {
	return mknod(filepath.Join(string(d), filepath.FromSlash(name)), typ)
}

// OutsideFS returns an Outside kept in a FileSystem of its own whose root is
// the absolute path root: a second in-memory workspace beside the one under
// test, say, or a directory of a container reached through a second adapter.
func OutsideFS(fsys workspace.FileSystem, root string) Outside {
	return portOutside{fsys, path.Clean(root)}
}

type portOutside struct {
	fsys workspace.FileSystem
	root string
}

func (p portOutside) Root() string { return p.root }

func (p portOutside) Build(layout ...string) error {
	entries, err := parseLayout(layout, map[string]string{"$ROOT": p.root, "$OUTSIDE": p.root})
	if err != nil {
		return err
	}
	return buildTree(context.Background(), p.fsys, nil, entries)
}

func (p portOutside) Dump() ([]string, error) {
	return dumpTree(wsTree{context.Background(), p.fsys})
}

// HostInstance returns the Instance for an adapter whose workspace is the
// host directory root, with outside, another empty host directory on the
// same file system (a sibling t.TempDir() will do), as its Outside. Both
// directories are resolved with filepath.EvalSymlinks, so Root is the path
// absolute links must use.
func HostInstance(t *testing.T, fsys workspace.FileSystem, root, outside string) Instance {
	t.Helper()
	root, outside = realDir(t, root), realDir(t, outside)
	ws, out := HostDir(root), HostDir(outside)
	return Instance{
		FS:          fsys,
		Root:        ws.Root(),
		MakeSpecial: ws.MakeSpecial,
		Outside:     out,
		Hardlink: func(outsideName, name string) error {
			return os.Link(filepath.Join(outside, filepath.FromSlash(outsideName)), filepath.Join(root, filepath.FromSlash(name)))
		},
	}
}

func realDir(t *testing.T, dir string) string {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	return abs
}

// relPath returns the slash path that leads from the absolute directory from
// to the absolute path to.
func relPath(from, to string) string {
	f := strings.Split(strings.Trim(path.Clean(from), "/"), "/")
	g := strings.Split(strings.Trim(path.Clean(to), "/"), "/")
	if f[0] == "" {
		f = nil
	}
	if g[0] == "" {
		g = nil
	}
	i := 0
	for i < len(f) && i < len(g) && f[i] == g[i] {
		i++
	}
	parts := make([]string, 0, len(f)-i+len(g)-i)
	for range f[i:] {
		parts = append(parts, "..")
	}
	parts = append(parts, g[i:]...)
	if len(parts) == 0 {
		return "."
	}
	return strings.Join(parts, "/")
}

func describeCaps(skip map[Capability]string) string {
	var b strings.Builder
	for _, c := range capabilities {
		if r, ok := skip[c]; ok {
			fmt.Fprintf(&b, "%s (%s) ", c, r)
		}
	}
	return b.String()
}
