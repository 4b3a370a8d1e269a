package conformance

import (
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// TestFileSystem checks a workspace.FileSystem adapter against the port's
// contract. Every subtest runs in parallel on a fresh Instance from h.New;
// see the package documentation for what is checked.
func TestFileSystem(t *testing.T, h FileSystemHarness) {
	t.Helper()
	begin(t, h.New != nil, h.Skip)
	for _, c := range fsCases {
		h.runCase(t, c)
	}
	for _, c := range invalidNameCases() {
		h.runCase(t, c)
	}
	for _, c := range longNameCases() {
		h.runCase(t, c)
	}
	for _, c := range swapFSCases() {
		h.runCase(t, c)
	}
	for _, c := range appendFSCases() {
		h.runCase(t, c)
	}
	for _, c := range walkCases {
		h.runWalk(t, c)
	}
	for _, c := range grepCases {
		h.runGrep(t, c)
	}
	for _, s := range fsSpecials {
		h.runSpecial(t, s)
	}
}

// fsCase is one call on a tree: the error it must give and the tree it must
// leave. A case that fails must leave the tree as it was.
type fsCase struct {
	name   string
	needs  []Capability
	layout []string
	op     op
	err    errs     // nil: the call succeeds
	after  []string // the tree afterwards; nil: unchanged
}

// layoutNeeds lists the capabilities building a layout takes.
func layoutNeeds(layout []string) []Capability {
	var caps []Capability
	for _, l := range layout {
		e, err := parseLine(l)
		if err != nil {
			continue // reported when the layout is built
		}
		switch e.typ {
		case fs.ModeSymlink:
			caps = append(caps, CapSymlinks)
		case fs.ModeNamedPipe:
			caps = append(caps, CapFIFOs)
		case fs.ModeSocket:
			caps = append(caps, CapSockets)
		}
	}
	return caps
}

// timeoutFor is how long a call on a layout may take: special files must be
// refused at once; anything else only must not hang.
func timeoutFor(caps []Capability) time.Duration {
	if slices.Contains(caps, CapFIFOs) || slices.Contains(caps, CapSockets) {
		return eventTimeout
	}
	return hangTimeout
}

func (h FileSystemHarness) runCase(t *testing.T, c fsCase) {
	t.Run(c.name, func(t *testing.T) {
		t.Parallel()
		needs := slices.Concat(c.needs, c.op.needs, layoutNeeds(c.layout), layoutNeeds(c.after))
		x := h.fixture(t, needs)
		x.build(c.layout...)
		before := x.dump()
		got := within(t, timeoutFor(needs), c.op.desc, func() result[string] {
			wrong, err := c.op.run(x.ctx, x)
			return result[string]{wrong, err}
		})
		if msg := c.err.check(got.err); msg != "" {
			t.Errorf("%s: %s", c.op.desc, msg)
		} else if msg := notPathError(got.err); msg != "" {
			t.Errorf("%s: %s", c.op.desc, msg)
		} else if got.err == nil && got.v != "" {
			t.Errorf("%s: %s", c.op.desc, got.v)
		}
		if c.after == nil {
			if after := x.dump(); !slices.Equal(after, before) {
				t.Errorf("%s changed the workspace from\n\t%s\nto\n\t%s", c.op.desc, lines(before), lines(after))
			}
		} else {
			x.expectTree(c.op.desc, c.after...)
		}
		x.expectOutside(c.op.desc)
	})
}

// fsSpecial is a subtest that does not fit the table.
type fsSpecial struct {
	name   string
	needs  []Capability
	serial bool // run alone: it measures the process
	run    func(x *fixture)
}

func (h FileSystemHarness) runSpecial(t *testing.T, s fsSpecial) {
	t.Run(s.name, func(t *testing.T) {
		if !s.serial {
			t.Parallel()
		}
		s.run(h.fixture(t, s.needs))
	})
}

// Shorthands for the tables.
var (
	notFound  = is(workspace.ErrNotFound)
	outside   = is(workspace.ErrOutsideWorkspace)
	notAFile  = is(workspace.ErrNotAFile)
	notADir   = is(workspace.ErrNotADirectory)
	exists    = is(workspace.ErrExists)
	invalid   = is(workspace.ErrInvalidArgument)
	notEmpty  = is(workspace.ErrNotEmpty)
	tooLarge  = is(workspace.ErrFileTooLarge)
	underFile = is(workspace.ErrNotADirectory, workspace.ErrNotFound) // a name below a regular file
	empty     = []string{}
)

func l(lines ...string) []string { return lines }

var quote = strconv.Quote

// binary is every byte value, for contents that must survive unchanged.
var binary = func() string {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return string(b)
}()

var fsCases = []fsCase{
	// Stat and Lstat.
	{name: "Stat/File", layout: l("f: abc"), op: stat("f", 0, 3)},
	{name: "Stat/Dir", layout: l("d/"), op: stat("d", fs.ModeDir, -1)},
	{name: "Stat/Root", op: stat(".", fs.ModeDir, -1)},
	{name: "Stat/Nested", layout: l("a/b/c: xy"), op: stat("a/b/c", 0, 2)},
	{name: "Stat/NotFound", op: stat("nothere", 0, -1), err: notFound},
	{name: "Stat/ParentNotFound", op: stat("no/there", 0, -1), err: notFound},
	{name: "Stat/UnderFile", layout: l("f"), op: stat("f/x", 0, -1), err: underFile},
	{name: "Stat/FollowsLink", layout: l("f: abc", "l => f"), op: stat("l", 0, 3)},
	{name: "Stat/FollowsLinkToDir", layout: l("d/", "l => d"), op: stat("l", fs.ModeDir, -1)},
	{name: "Stat/FollowsAbsoluteLink", layout: l("d/f: abc", "l => $ROOT/d/f"), op: stat("l", 0, 3)},
	{name: "Stat/DanglingLink", layout: l("l => nothere"), op: stat("l", 0, -1), err: notFound},
	{name: "Stat/FIFO", layout: l("p|"), op: stat("p", fs.ModeNamedPipe, -1)},
	{name: "Lstat/File", layout: l("f: abc"), op: lstat("f", 0)},
	{name: "Lstat/Link", layout: l("f", "l => f"), op: lstat("l", fs.ModeSymlink)},
	{name: "Lstat/DanglingLink", layout: l("l => nothere"), op: lstat("l", fs.ModeSymlink)},
	{name: "Lstat/ThroughLinkedDir", layout: l("d/f", "ld => d"), op: lstat("ld/f", 0)},
	{name: "Lstat/NotFound", op: lstat("nothere", 0), err: notFound},

	// ReadDir.
	{name: "ReadDir/Sorted", layout: l("b", "a.b", "c/", "a", "B", "a-b"), op: readDir(".", "B", "a", "a-b", "a.b", "b", "c/")},
	{name: "ReadDir/Empty", layout: l("d/"), op: readDir("d")},
	{name: "ReadDir/EmptyRoot", op: readDir(".")},
	{name: "ReadDir/Nested", layout: l("a/b/z", "a/b/y/"), op: readDir("a/b", "y/", "z")},
	{name: "ReadDir/LinkTypes", layout: l("d/", "f", "ld => d", "lf => f", "dangling => nothere"),
		op: readDir(".", "d/", "dangling@", "f", "ld@", "lf@")},
	{name: "ReadDir/ThroughLink", layout: l("d/x", "ld => d"), op: readDir("ld", "x")},
	{name: "ReadDir/FIFOType", layout: l("f", "p|"), op: readDir(".", "f", "p|")},
	{name: "ReadDir/SocketType", layout: l("f", "s="), op: readDir(".", "f", "s=")},
	{name: "ReadDir/NotFound", op: readDir("nothere"), err: notFound},
	{name: "ReadDir/File", layout: l("f: x"), op: readDir("f"), err: notADir},

	// ReadFile.
	{name: "ReadFile/Content", layout: l("f: hello"), op: readFile("f", 100, "hello")},
	{name: "ReadFile/Binary", layout: l("f: " + quote(binary)), op: readFile("f", 1000, binary)},
	{name: "ReadFile/Empty", layout: l("f"), op: readFile("f", 0, "")},
	{name: "ReadFile/ExactlyMax", layout: l("f: 12345"), op: readFile("f", 5, "12345")},
	{name: "ReadFile/TooLarge", layout: l("f: 123456"), op: readFile("f", 5, ""), err: tooLarge},
	{name: "ReadFile/NotFound", op: readFile("nothere", 100, ""), err: notFound},
	{name: "ReadFile/Directory", layout: l("d/"), op: readFile("d", 100, ""), err: notAFile},
	{name: "ReadFile/Root", op: readFile(".", 100, ""), err: notAFile},
	{name: "ReadFile/UnderFile", layout: l("f"), op: readFile("f/x", 100, ""), err: underFile},
	{name: "ReadFile/ThroughLink", layout: l("f: abc", "l => f"), op: readFile("l", 100, "abc")},
	{name: "ReadFile/ThroughAbsoluteLink", layout: l("d/f: abc", "l => $ROOT/d/f"), op: readFile("l", 100, "abc")},
	{name: "ReadFile/ThroughLinkedDir", layout: l("d/f: abc", "ld => d"), op: readFile("ld/f", 100, "abc")},
	{name: "ReadFile/ThroughLinkUpAndDown", layout: l("a/f: abc", "b/l => ../a/f"), op: readFile("b/l", 100, "abc")},
	{name: "ReadFile/LinkToRoot", layout: l("f: abc", "d/l => .."), op: readFile("d/l/f", 100, "abc")},
	// ".." after a link leaves the directory the link led to, as the kernel
	// walks it — in relative and absolute targets alike; a lexical reading
	// would open the top-level f.
	{name: "ReadFile/DotDotAfterLinkedDir", layout: l("deep/dir/", "deep/f: deep", "f: top", "x => deep/dir", "l => x/../f"), op: readFile("l", 100, "deep")},
	{name: "ReadFile/AbsoluteDotDotAfterLinkedDir", layout: l("deep/dir/", "deep/f: deep", "f: top", "x => deep/dir", "l => $ROOT/x/../f"), op: readFile("l", 100, "deep")},
	{name: "ReadFile/DanglingLink", layout: l("l => nothere"), op: readFile("l", 100, ""), err: notFound},
	{name: "ReadFile/FIFO", layout: l("p|"), op: readFile("p", 100, ""), err: notAFile},
	{name: "ReadFile/LinkToFIFO", layout: l("p|", "l => p"), op: readFile("l", 100, ""), err: notAFile},
	{name: "ReadFile/Socket", layout: l("s="), op: readFile("s", 100, ""), err: notAFile},

	// WriteFile.
	{name: "WriteFile/Create", op: writeFile("f", "new"), after: l("f: new")},
	{name: "WriteFile/CreateNested", layout: l("a/b/"), op: writeFile("a/b/f", "new"), after: l("a/b/f: new")},
	{name: "WriteFile/Replace", layout: l("f: old contents"), op: writeFile("f", "new"), after: l("f: new")},
	{name: "WriteFile/Truncate", layout: l("f: old"), op: writeFile("f", ""), after: l("f")},
	{name: "WriteFile/Binary", op: writeFile("f", binary), after: l("f: " + quote(binary))},
	{name: "WriteFile/ParentMissing", op: writeFile("no/f", "x"), err: notFound},
	{name: "WriteFile/UnderFile", layout: l("f: x"), op: writeFile("f/g", "x"), err: underFile},
	{name: "WriteFile/Directory", layout: l("d/x"), op: writeFile("d", "x"), err: notAFile},
	{name: "WriteFile/Root", op: writeFile(".", "x"), err: notAFile},
	{name: "WriteFile/ThroughLinkKeepsLink", layout: l("f: old", "l => f"), op: writeFile("l", "new"), after: l("f: new", "l => f")},
	{name: "WriteFile/ThroughAbsoluteLinkKeepsLink", layout: l("d/f: old", "l => $ROOT/d/f"), op: writeFile("l", "new"),
		after: l("d/f: new", "l => $ROOT/d/f")},
	{name: "WriteFile/ThroughLinkedDir", layout: l("d/", "ld => d"), op: writeFile("ld/f", "new"), after: l("d/f: new", "ld => d")},
	{name: "WriteFile/FIFO", layout: l("p|"), op: writeFile("p", "x"), err: notAFile},
	{name: "WriteFile/LinkToFIFO", layout: l("p|", "l => p"), op: writeFile("l", "x"), err: notAFile},
	{name: "WriteFile/Socket", layout: l("s="), op: writeFile("s", "x"), err: notAFile},

	// Mkdir.
	{name: "Mkdir/Create", op: mkdir("d"), after: l("d/")},
	{name: "Mkdir/Nested", layout: l("a/"), op: mkdir("a/b"), after: l("a/b/")},
	{name: "Mkdir/ExistsDir", layout: l("d/x"), op: mkdir("d"), err: exists},
	{name: "Mkdir/ExistsFile", layout: l("f: x"), op: mkdir("f"), err: exists},
	{name: "Mkdir/ExistsLink", layout: l("l => nothere"), op: mkdir("l"), err: exists},
	{name: "Mkdir/Root", op: mkdir("."), err: exists},
	{name: "Mkdir/ParentMissing", op: mkdir("a/b"), err: notFound},
	{name: "Mkdir/UnderFile", layout: l("f"), op: mkdir("f/d"), err: underFile},
	{name: "Mkdir/ThroughLinkedDir", layout: l("d/", "ld => d"), op: mkdir("ld/x"), after: l("d/x/", "ld => d")},

	// Remove.
	{name: "Remove/File", layout: l("f: x", "g"), op: remove("f"), after: l("g")},
	{name: "Remove/EmptyDir", layout: l("d/"), op: remove("d"), after: empty},
	{name: "Remove/NotEmpty", layout: l("d/f"), op: remove("d"), err: notEmpty},
	{name: "Remove/NotFound", op: remove("nothere"), err: notFound},
	{name: "Remove/Root", layout: l("f"), op: remove("."), err: anyError},
	{name: "Remove/LinkNotTarget", layout: l("f: x", "l => f"), op: remove("l"), after: l("f: x")},
	{name: "Remove/LinkToDir", layout: l("d/f: x", "ld => d"), op: remove("ld"), after: l("d/f: x")},
	{name: "Remove/DanglingLink", layout: l("l => nothere"), op: remove("l"), after: empty},
	{name: "Remove/ThroughLinkedDir", layout: l("d/f: x", "ld => d"), op: remove("ld/f"), after: l("d/", "ld => d")},
	{name: "Remove/FIFO", layout: l("p|"), op: remove("p"), after: empty},

	// Rename.
	{name: "Rename/File", layout: l("f: x"), op: rename("f", "g"), after: l("g: x")},
	{name: "Rename/IntoDir", layout: l("f: x", "d/"), op: rename("f", "d/f"), after: l("d/f: x")},
	{name: "Rename/ReplaceFile", layout: l("f: new", "g: old"), op: rename("f", "g"), after: l("g: new")},
	{name: "Rename/Dir", layout: l("d/a: 1", "d/b/c: 2"), op: rename("d", "e"), after: l("e/a: 1", "e/b/c: 2")},
	{name: "Rename/NotFound", layout: l("g"), op: rename("nothere", "f"), err: notFound},
	{name: "Rename/TargetParentMissing", layout: l("f: x"), op: rename("f", "no/f"), err: notFound},
	{name: "Rename/FileOntoDir", layout: l("f: x", "d/g"), op: rename("f", "d"), err: anyError},
	{name: "Rename/DirIntoItself", layout: l("d/f"), op: rename("d", "d/e"), err: anyError},
	{name: "Rename/Root", layout: l("f"), op: rename(".", "x"), err: anyError},
	{name: "Rename/MovesLink", layout: l("f: x", "l => f"), op: rename("l", "m"), after: l("f: x", "m => f")},
	{name: "Rename/MovesLinkToDir", layout: l("d/x", "ld => d"), op: rename("ld", "le"), after: l("d/x", "le => d")},
	{name: "Rename/OverLink", layout: l("f: x", "g: y", "l => g"), op: rename("f", "l"), after: l("g: y", "l: x")},
	{name: "Rename/IntoLinkedDir", layout: l("f: x", "d/", "ld => d"), op: rename("f", "ld/f"), after: l("d/f: x", "ld => d")},

	// Symlink and Readlink.
	{name: "Symlink/Create", layout: l("f: x"), op: symlink("f", "l"), after: l("f: x", "l => f")},
	{name: "Symlink/Dangling", op: symlink("nothere", "l"), after: l("l => nothere")},
	{name: "Symlink/TargetStoredAsGiven", op: symlink("../../../etc/passwd", "l"), after: l("l => ../../../etc/passwd")},
	{name: "Symlink/Absolute", layout: l("f"), op: symlink("$ROOT/f", "l"), after: l("f", "l => $ROOT/f")},
	{name: "Symlink/ExistsFile", layout: l("f"), op: symlink("x", "f"), err: exists},
	{name: "Symlink/ExistsLink", layout: l("l => a"), op: symlink("b", "l"), err: exists},
	{name: "Symlink/ParentMissing", op: symlink("x", "no/l"), err: notFound},
	{name: "Readlink/Link", layout: l("l => some/where"), op: readlink("l", "some/where")},
	{name: "Readlink/LinkInLinkedDir", layout: l("d/l => x", "ld => d"), op: readlink("ld/l", "x")},
	{name: "Readlink/File", layout: l("f"), op: readlink("f", ""), err: invalid},
	{name: "Readlink/Dir", layout: l("d/"), op: readlink("d", ""), err: invalid},
	{name: "Readlink/NotFound", op: readlink("nothere", ""), err: notFound},

	// Confinement: every way of leaving the root by a link.
	{name: "Confine/ReadFileAbsoluteLinkOut", layout: l("l => $OUTSIDE/secret"), op: readFile("l", 100, ""), err: outside},
	{name: "Confine/ReadFileRelativeLinkOut", layout: l("l => $OUT/secret"), op: readFile("l", 100, ""), err: outside},
	{name: "Confine/ReadFileLinkToSystem", layout: l("l => /etc/passwd"), op: readFile("l", 1<<20, ""), err: outside},
	{name: "Confine/ReadFileUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: readFile("ld/f", 100, ""), err: outside},
	{name: "Confine/ReadFileChainOut", layout: l("a => b", "b => c", "c => $OUTSIDE/secret"), op: readFile("a", 100, ""), err: outside},
	{name: "Confine/ReadFileChainThroughDirs", layout: l("d/l => ../e/l", "e/l => ../$OUT/secret"), op: readFile("d/l", 100, ""), err: outside},
	{name: "Confine/ReadFileDotDotLink", layout: l("d/up => ../..", "f: x"), op: readFile("d/up/f", 100, ""), err: outside},
	{name: "Confine/StatLinkOut", layout: l("l => $OUTSIDE/secret"), op: stat("l", 0, -1), err: outside},
	{name: "Confine/LstatLinkOut", layout: l("l => $OUTSIDE/secret"), op: lstat("l", fs.ModeSymlink)},
	{name: "Confine/LstatUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: lstat("ld/f", 0), err: outside},
	{name: "Confine/ReadDirLinkOut", layout: l("ld => $OUTSIDE/sd"), op: readDir("ld"), err: outside},
	{name: "Confine/ReadDirLinkToSlash", layout: l("ld => /"), op: readDir("ld"), err: outside},
	{name: "Confine/WriteFileLinkOut", layout: l("l => $OUTSIDE/secret"), op: writeFile("l", "pwned"), err: outside},
	{name: "Confine/WriteFileDanglingLinkOut", layout: l("l => $OUTSIDE/new"), op: writeFile("l", "pwned"), err: outside},
	{name: "Confine/WriteFileUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: writeFile("ld/f", "pwned"), err: outside},
	{name: "Confine/WriteFileNewUnderLinkedDirOut", layout: l("ld => $OUT/sd"), op: writeFile("ld/new", "pwned"), err: outside},
	{name: "Confine/MkdirUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: mkdir("ld/new"), err: outside},
	{name: "Confine/MkdirAllUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: mkdirAll("ld/new/deeper"), err: outside},
	{name: "Confine/RemoveUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: remove("ld/f"), err: outside},
	{name: "Confine/RemoveAllUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: removeAll("ld/f"), err: outside},
	{name: "Confine/RenameFromLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: rename("ld/f", "stolen"), err: outside},
	{name: "Confine/RenameIntoLinkedDirOut", layout: l("f: x", "ld => $OUTSIDE/sd"), op: rename("f", "ld/f"), err: outside},
	{name: "Confine/SymlinkUnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), op: symlink("x", "ld/l"), err: outside},
	{name: "Confine/RemoveLinkOut", layout: l("l => $OUTSIDE/secret"), op: remove("l"), after: empty},
	{name: "Confine/RenameLinkOut", layout: l("l => $OUTSIDE/sd"), op: rename("l", "m"), after: l("m => $OUTSIDE/sd")},
	{name: "Confine/RemoveAllKeepsLinkedDirOut", layout: l("d/ld => $OUTSIDE/sd", "d/f"), op: removeAll("d"), after: empty},
	{name: "Confine/ReadlinkLinkOut", layout: l("l => $OUTSIDE/secret"), op: readlink("l", "$OUTSIDE/secret")},

	// Loops fail, and fail at once.
	{name: "Loop/ReadFileSelf", layout: l("a => a"), op: readFile("a", 100, ""), err: anyError},
	{name: "Loop/ReadFilePair", layout: l("a => b", "b => a"), op: readFile("a", 100, ""), err: anyError},
	{name: "Loop/StatPair", layout: l("a => b", "b => a"), op: stat("a", 0, -1), err: anyError},
	{name: "Loop/ReadDirSelf", layout: l("d/l => ../d/l"), op: readDir("d/l"), err: anyError},
	{name: "Loop/WriteFilePair", layout: l("a => b", "b => a"), op: writeFile("a", "x"), err: anyError},
	{name: "Loop/WriteFileUnderLoop", layout: l("a => a"), op: writeFile("a/f", "x"), err: anyError},
	{name: "Loop/MkdirUnderLoop", layout: l("a => b", "b => a"), op: mkdir("a/d"), err: anyError},
	{name: "Loop/RemoveLoop", layout: l("a => a"), op: remove("a"), after: empty},

	// The extension helpers.
	{name: "MkdirAll/Create", op: mkdirAll("a/b/c"), after: l("a/b/c/")},
	{name: "MkdirAll/Exists", layout: l("a/b/"), op: mkdirAll("a/b")},
	{name: "MkdirAll/Partial", layout: l("a/f"), op: mkdirAll("a/b/c"), after: l("a/f", "a/b/c/")},
	{name: "MkdirAll/Root", op: mkdirAll(".")},
	{name: "MkdirAll/FileInPath", layout: l("a/f"), op: mkdirAll("a/f/c"), err: notADir},
	{name: "MkdirAll/FileAtEnd", layout: l("f"), op: mkdirAll("f"), err: notADir},
	{name: "MkdirAll/ThroughLinkedDir", layout: l("d/", "ld => d"), op: mkdirAll("ld/x/y"), after: l("d/x/y/", "ld => d")},
	{name: "RemoveAll/Tree", layout: l("d/a: 1", "d/b/c: 2", "d/b/e/", "f"), op: removeAll("d"), after: l("f")},
	{name: "RemoveAll/File", layout: l("f", "g"), op: removeAll("f"), after: l("g")},
	{name: "RemoveAll/Missing", op: removeAll("nothere")},
	{name: "RemoveAll/Root", layout: l("f"), op: removeAll("."), err: anyError},
	{name: "RemoveAll/KeepsLinkTargets", layout: l("d/f: x", "e/ld => ../d", "e/lf => ../d/f"), op: removeAll("e"), after: l("d/f: x")},
	{name: "RealPath/NoLinks", layout: l("a/"), op: realPath("a/b/c", "a/b/c")},
	{name: "RealPath/LinkedDir", layout: l("d/", "ld => d"), op: realPath("ld/f", "d/f")},
	{name: "RealPath/AbsoluteLink", layout: l("d/", "ld => $ROOT/d"), op: realPath("ld/f", "d/f")},
	{name: "RealPath/Chain", layout: l("x/y/", "a => b", "b => x/y"), op: realPath("a/f", "x/y/f")},
	{name: "RealPath/DotDotAfterLinkedDir", layout: l("deep/dir/", "x => deep/dir", "l => x/../f"), op: realPath("l", "deep/f")},
	{name: "RealPath/AbsoluteDotDotAfterLinkedDir", layout: l("deep/dir/", "x => deep/dir", "l => $ROOT/x/../f"), op: realPath("l", "deep/f")},
	{name: "RealPath/LinkOut", layout: l("ld => $OUTSIDE/sd"), op: realPath("ld/f", ""), err: outside},
	{name: "RealPath/RelativeLinkOut", layout: l("d/ld => ../$OUT"), op: realPath("d/ld/secret", ""), err: outside},
	{name: "RealPath/Loop", layout: l("a => b", "b => a"), op: realPath("a/f", ""), err: anyError},
}

// longNameCases: a name element over NAME_MAX bytes is refused by every
// method that makes a name, and nothing is made (a FileSystem that could
// hold it would leave a name no command can use); one of NAME_MAX bytes is
// a name like any other. See also the special PathMax.
func longNameCases() []fsCase {
	long, most := strings.Repeat("n", workspace.NameMax+1), strings.Repeat("m", workspace.NameMax)
	return []fsCase{
		{name: "LongName/WriteFile", layout: l("f: x"), op: writeFile(long, "x"), err: invalid},
		{name: "LongName/WriteFileBelow", layout: l("f: x", "d/"), op: writeFile("d/"+long, "x"), err: invalid},
		{name: "LongName/Mkdir", layout: l("f: x"), op: mkdir(long), err: invalid},
		{name: "LongName/RenameTo", layout: l("f: x"), op: rename("f", long), err: invalid},
		{name: "LongName/Symlink", needs: needs(CapSymlinks), layout: l("f: x"), op: symlink("f", long), err: invalid},
		{name: "LongName/NameMax", layout: l("f: x"), op: writeFile(most, "y"), after: l("f: x", most+": y")},
	}
}

// badNames are names no FileSystem method accepts.
var badNames = []string{"", "/", "/abs", "../x", "..", "a/../b", "./a", "a/", "a//b", "a/./b"}

// invalidNameCases makes one case per method and bad name.
func invalidNameCases() []fsCase {
	type method struct {
		name string
		op   func(string) op
	}
	methods := []method{
		{"Stat", func(n string) op { return stat(n, 0, -1) }},
		{"Lstat", func(n string) op { return lstat(n, 0) }},
		{"ReadDir", func(n string) op { return readDir(n) }},
		{"ReadFile", func(n string) op { return readFile(n, 100, "") }},
		{"WriteFile", func(n string) op { return writeFile(n, "x") }},
		{"Mkdir", mkdir},
		{"Remove", remove},
		{"RenameFrom", func(n string) op { return rename(n, "g") }},
		{"RenameTo", func(n string) op { return rename("f", n) }},
		{"Symlink", func(n string) op { return symlink("f", n) }},
		{"Readlink", func(n string) op { return readlink(n, "") }},
	}
	var cases []fsCase
	for _, m := range methods {
		for i, n := range badNames {
			cases = append(cases, fsCase{
				name:   fmt.Sprintf("InvalidName/%s/%d", m.name, i),
				layout: l("f: x", "a/b: y"),
				op:     m.op(n),
				err:    invalid,
			})
		}
	}
	return cases
}
