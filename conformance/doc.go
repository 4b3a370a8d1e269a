// Package conformance checks adapters of the workspace ports against one
// behaviour, as [testing/fstest] does for [io/fs]: [TestFileSystem] for a
// [workspace.FileSystem], [TestBash] for a [workspace.Bash], [TestWrapper]
// for a decorator of a FileSystem. Each adapter's test is a few lines that
// say how to make a fresh instance; the kit does the rest.
//
// # Using it
//
// A harness gives a fresh, empty workspace per subtest, and hooks for what the
// port cannot express — special files, a place outside the workspace, hard
// links from there. For an adapter over a host directory HostInstance fills
// them all:
//
//	func TestConformance(t *testing.T) {
//		conformance.TestFileSystem(t, conformance.FileSystemHarness{
//			New: func(t *testing.T) conformance.Instance {
//				dir, outside := t.TempDir(), t.TempDir()
//				fsys, err := myfs.New(dir)
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(func() { fsys.Close() })
//				return conformance.HostInstance(t, fsys, dir, outside)
//			},
//		})
//	}
//
// An adapter that cannot do something declares it, with the reason, and the
// subtests that need it report t.Skip(reason):
//
//	Skip: map[conformance.Capability]string{
//		conformance.CapOutside: "the container has no directory beside /workspace",
//	},
//
// A hook left nil without such a declaration fails the subtests that need it:
// nothing is passed silently. Subtests run in parallel, each on its own
// instance, under names such as "ReadFile/TooLarge" and "Confine/ChainOut", so
// go test -run 'TestConformance/Confine/' runs a group.
//
// # Layouts
//
// Trees are written one entry a line, as os.Root's tests do:
//
//	"d/"            a directory
//	"f"             an empty file
//	"f: text"       a file holding text (a Go-quoted string after ": " for
//	                anything with newlines or binary)
//	"x*", "x*: t"   an executable file (0o755; other files are 0o644)
//	"l => target"   a symbolic link; $ROOT is the workspace root, $OUTSIDE
//	                the outside's root, $OUT the relative path between them
//	"p|", "s="      a named pipe, a Unix socket
//
// Parents are implied. Outside.Build and Outside.Dump speak the same
// language, and Build writes it into any FileSystem: it is how the module's
// other tests make their trees.
//
// # What TestFileSystem checks
//
//   - every FileSystem method's success and each error kind it documents
//     (NotFound, Exists, NotADirectory, NotEmpty, NotAFile, FileTooLarge,
//     InvalidArgument for names that are not fs.ValidPath), the error being an
//     *fs.PathError, and a failed call leaving the tree unchanged;
//   - ReadFile refusing a file over max before reading it (the process must
//     not allocate the file's size);
//   - ReadDir sorted, with the entries' own types (links as links);
//   - symbolic links: relative and absolute links inside followed; links out,
//     chains of links out, links up with "..", and new entries under a linked
//     directory out fail with OutsideWorkspace for every method; loops fail
//     promptly; Remove and Rename act on the link; with an Outside, nothing
//     outside is ever changed;
//   - WriteFile: replacement is atomic for concurrent readers and leaves no
//     temporary file, the permission bits of an existing file are kept, a
//     link inside is written through and stays a link, a hard link to a file
//     outside is replaced and not written through, a missing parent is
//     NotFound;
//   - named pipes and sockets refused by ReadFile and WriteFile within a
//     second, and walked past by Walk and Grep;
//   - the helpers workspace.MkdirAll, RemoveAll, Lock (no lost update among
//     goroutines incrementing a counter; waiting ends with the context), Walk,
//     Grep and RealPath over the adapter — and, where the adapter has its own
//     WalkFS or GrepFS, that its answer equals WalkGeneric's or GrepGeneric's;
//     a walk never enters a linked directory or an excluded name;
//   - workspace.Swap and SwapGeneric, each held to the same table: the real
//     name written, the old file (its contents within Max, empty for an
//     empty file) and the new one, the bits kept, the errors WriteFile gives
//     and nothing written when it fails; with an Edit (textedit), what it
//     wrote, and the matching's errors with their kind and message;
//   - workspace.AppendFile and AppendFileGeneric, held to the same trees.
//
// # What TestWrapper checks
//
// A FileSystem decorator (workspace.Guard, scope, the journal's recorder)
// over an inner file system with every extension, over the core alone and
// over the core with links: it is a SymlinkFS exactly when its inner one is
// (links have no fallback), and every other extension it claims works.
//
// # What TestBash checks
//
// Exit codes; death by signal (Signal "SIGTERM", ExitCode -1); timeouts
// (TimedOut) and cancelled contexts killing the whole process tree —
// background jobs, nohup, setsid and double forks; standard input delivered
// and then closed, nil input empty; large and binary output intact on
// separate streams; output streamed before the command ends, to a callback
// never called concurrently; Dir (a subdirectory; NotFound, NotADirectory,
// OutsideWorkspace through a link); Argv run without a shell; the
// environment (a host secret hidden, configured and per-command variables
// visible); Duration. Every timeout in the kit is short: a conforming adapter
// passes the whole kit in seconds.
package conformance
