package journal_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// backend is a workspace under test and a way to change it behind the port,
// as a process would.
type backend struct {
	name string
	fs   workspace.FileSystem
	// behind runs a change that bypasses the port (a process).
	behind func(t *testing.T, op string, args ...string)
}

func backends(t *testing.T) []backend {
	t.Helper()
	dir := t.TempDir()
	lfs, err := localfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lfs.Close() })
	mfs := memfs.New(memfs.WithUmask(0))
	afs := memfs.New(memfs.WithUmask(0))
	return []backend{
		{"local", lfs, func(t *testing.T, op string, args ...string) {
			t.Helper()
			p := filepath.Join(dir, filepath.FromSlash(args[0]))
			var err error
			switch op {
			case "write":
				err = os.WriteFile(p, []byte(args[1]), 0o644)
			case "chmod":
				var m uint32
				fmt.Sscanf(args[1], "%o", &m)
				err = os.Chmod(p, fs.FileMode(m))
			case "rm":
				err = os.RemoveAll(p)
			case "mkdir":
				err = os.MkdirAll(p, 0o755)
			case "symlink":
				err = os.Symlink(args[1], p)
			}
			if err != nil {
				t.Fatal(err)
			}
		}},
		{"memory", mfs, behindMemory(mfs)},
		// The agent client is a workspace.SwapFS: a journaled write takes
		// its fast path, over the agent's protocol.
		{"agent", agentClient(t, afs), behindMemory(afs)},
	}
}

// behindMemory changes a memfs workspace as a process would.
func behindMemory(mfs *memfs.FS) func(t *testing.T, op string, args ...string) {
	ctx := context.Background()
	return func(t *testing.T, op string, args ...string) {
		t.Helper()
		var err error
		switch op {
		case "write":
			err = mfs.WriteFile(ctx, args[0], []byte(args[1]), 0o644)
		case "chmod": // memfs has no chmod: recreate, as memory.Mirror does
			var m uint32
			fmt.Sscanf(args[1], "%o", &m)
			data, _ := mfs.ReadFile(ctx, args[0], 1<<20)
			if err = mfs.Remove(ctx, args[0]); err == nil {
				err = mfs.WriteFile(ctx, args[0], data, fs.FileMode(m))
			}
		case "rm":
			err = mfs.RemoveAll(ctx, args[0])
		case "mkdir":
			err = mfs.MkdirAll(ctx, args[0], 0o755)
		case "symlink":
			err = mfs.Symlink(ctx, args[1], args[0])
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// agentClient serves fsys with an agent over an in-memory pipe and returns
// the client, as the Docker backend has it.
func agentClient(t *testing.T, fsys workspace.FileSystem) *agent.Client {
	t.Helper()
	a, b := net.Pipe()
	served := make(chan error, 1)
	go func() { served <- agent.NewServer(fsys, nil).Serve(context.Background(), b) }()
	c, err := agent.NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		<-served
	})
	return c
}

// seed fills a workspace with a small tree of every kind, through the port
// (no journal is open yet).
func seed(t *testing.T, b backend) {
	t.Helper()
	conformance.Build(t, b.fs, "src/pkg/", "src/a.go: package a\n\nfunc A() {}\n", "src/pkg/b.go: package pkg\n",
		"run.sh*: #!/bin/sh\necho hi\n", "bin.dat: \x00\x01\x02", "link => src/a.go", "empty/")
}

// dump is the whole tree, outside .sandboxd/: path, type, mode, contents.
func dump(t *testing.T, fsys workspace.FileSystem) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	var walk func(dir string)
	walk = func(dir string) {
		entries, err := fsys.ReadDir(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			p := e.Name()
			if dir != "." {
				p = dir + "/" + p
			}
			if p == ".sandboxd" {
				continue
			}
			info, err := fsys.Lstat(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %v", p, info.Mode())
			switch {
			case info.IsDir():
				b.WriteString("\n")
				walk(p)
			case info.Mode()&fs.ModeSymlink != 0:
				target, _ := fsys.(workspace.SymlinkFS).Readlink(ctx, p)
				fmt.Fprintf(&b, " -> %s\n", target)
			default:
				data, err := fsys.ReadFile(ctx, p, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, " %q\n", data)
			}
		}
	}
	walk(".")
	return b.String()
}

func open(t *testing.T, fsys workspace.FileSystem, opts ...journal.Option) *journal.Journal {
	t.Helper()
	j, err := journal.Open(context.Background(), fsys, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestExecFailureRestoresExactly(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			j := open(t, b.fs)
			want := dump(t, b.fs)
			out, err := j.Exec(ctx, "workspace shell command", func(context.Context) (bool, error) {
				b.behind(t, "write", "src/a.go", "clobbered")       // modified
				b.behind(t, "chmod", "run.sh", "644")               // mode only
				b.behind(t, "rm", "src/pkg")                        // deleted tree
				b.behind(t, "rm", "link")                           // deleted link
				b.behind(t, "mkdir", "new/deep")                    // new tree
				b.behind(t, "write", "new/deep/x", "x")             //
				b.behind(t, "rm", "empty")                          // type change:
				b.behind(t, "write", "empty", "now a file")         // dir → file
				b.behind(t, "chmod", "bin.dat", "600")              //
				b.behind(t, "write", "bin.dat", "\x00\x01\x02\x03") // modified too
				return false, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !out.Restored || out.Committed || out.Commit != nil || len(out.Unrestored) > 0 {
				t.Fatalf("outcome %+v", out)
			}
			if got := dump(t, b.fs); got != want {
				t.Fatalf("not restored exactly:\n got %s\nwant %s", got, want)
			}
			if len(j.List()) != 0 {
				t.Fatalf("a failed run committed: %+v", j.List())
			}
		})
	}
}

func TestExecSuccessCommitsAndReverts(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			j := open(t, b.fs)
			start := dump(t, b.fs)
			out, err := j.Exec(ctx, "workspace shell command", func(context.Context) (bool, error) {
				b.behind(t, "write", "src/a.go", "package a\n\nfunc A() { B() }\n")
				b.behind(t, "rm", "src/pkg")
				b.behind(t, "write", "notes.txt", "hello\n")
				return true, nil
			})
			if err != nil || !out.Committed || out.Commit == nil {
				t.Fatalf("outcome %+v, %v", out, err)
			}
			list := j.List()
			if len(list) != 1 || list[0].Message != "workspace shell command" || list[0].Added != 1 || list[0].Modified != 1 || list[0].Deleted != 2 {
				t.Fatalf("list %+v", list)
			}
			diff, err := j.Show(ctx, list[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{"--- a/src/a.go\n+++ b/src/a.go\n", "-func A() {}\n+func A() { B() }\n",
				"--- /dev/null\n+++ b/notes.txt\n", "+hello\n", "deleted file mode 100644", "--- a/src/pkg/b.go\n+++ /dev/null\n"} {
				if !strings.Contains(diff, s) {
					t.Errorf("diff lacks %q:\n%s", s, diff)
				}
			}
			after := dump(t, b.fs)
			res, err := j.Revert(ctx, journal.RevertRequest{To: 0})
			if err != nil {
				t.Fatal(err)
			}
			if got := dump(t, b.fs); got != start {
				t.Fatalf("revert did not bring back the start:\n got %s\nwant %s", got, start)
			}
			if res.Commit == nil || res.Commit.Message != "revert to the start" {
				t.Fatalf("revert commit %+v", res.Commit)
			}
			// The revert is a commit too: reverting to commit 1 redoes it.
			if _, err := j.Revert(ctx, journal.RevertRequest{To: 1}); err != nil {
				t.Fatal(err)
			}
			if got := dump(t, b.fs); got != after {
				t.Fatalf("revert to 1:\n got %s\nwant %s", got, after)
			}
			// A reopened journal sees the same commits.
			if got := open(t, b.fs).List(); len(got) != 3 || got[0].ID != 3 {
				t.Fatalf("reopened: %+v", got)
			}
		})
	}
}

func TestRecordCommitsTouchedPathsAndRollsBackFailures(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			j := open(t, b.fs)
			start := dump(t, b.fs)
			c, err := j.Record(ctx, "writeFile", func(fsys workspace.FileSystem) error {
				if err := workspace.MkdirAll(ctx, fsys, "docs/api", 0o755); err != nil {
					return err
				}
				if err := fsys.WriteFile(ctx, "docs/api/x.md", []byte("# x\n"), 0o644); err != nil {
					return err
				}
				if err := fsys.Rename(ctx, "src/pkg", "lib"); err != nil {
					return err
				}
				return fsys.WriteFile(ctx, "link", []byte("through the link\n"), 0o644) // writes src/a.go
			})
			if err != nil || c == nil {
				t.Fatal(c, err)
			}
			var paths []string
			for _, ch := range c.Changes {
				paths = append(paths, ch.Path+":"+ch.Kind())
			}
			want := []string{"docs:added", "docs/api:added", "docs/api/x.md:added", "lib:added", "lib/b.go:added",
				"src/a.go:modified", "src/pkg:deleted", "src/pkg/b.go:deleted"}
			if !slices.Equal(paths, want) {
				t.Fatalf("changes %v, want %v", paths, want)
			}
			// A failing call puts back what it changed before failing.
			mid := dump(t, b.fs)
			boom := errors.New("boom")
			c, err = j.Record(ctx, "copyPath", func(fsys workspace.FileSystem) error {
				fsys.WriteFile(ctx, "lib/b.go", []byte("half"), 0o644)
				fsys.Remove(ctx, "bin.dat")
				return boom
			})
			if !errors.Is(err, boom) || c != nil {
				t.Fatal(c, err)
			}
			if got := dump(t, b.fs); got != mid {
				t.Fatalf("failed call not rolled back:\n got %s\nwant %s", got, mid)
			}
			if _, err := j.Revert(ctx, journal.RevertRequest{}); err != nil {
				t.Fatal(err)
			}
			if got := dump(t, b.fs); got != start {
				t.Fatalf("revert:\n got %s\nwant %s", got, start)
			}
		})
	}
}

func TestRevertRefusesConflicts(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			j := open(t, b.fs)
			if _, err := j.Record(ctx, "write", func(fsys workspace.FileSystem) error {
				return fsys.WriteFile(ctx, "src/a.go", []byte("v2\n"), 0o644)
			}); err != nil {
				t.Fatal(err)
			}
			b.behind(t, "write", "src/a.go", "changed by bash\n")
			before := dump(t, b.fs)
			_, err := j.Revert(ctx, journal.RevertRequest{To: 0})
			if !errors.Is(err, workspace.ErrInvalidArgument) || !strings.Contains(err.Error(), "src/a.go changed since") {
				t.Fatalf("err %v", err)
			}
			if got := dump(t, b.fs); got != before {
				t.Fatal("a refused revert changed the workspace")
			}
			if _, err := j.Revert(ctx, journal.RevertRequest{To: 0, Force: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := j.Revert(ctx, journal.RevertRequest{To: 7}); !errors.Is(err, workspace.ErrNotFound) {
				t.Fatalf("unknown commit: %v", err)
			}
		})
	}
}

func TestProviderSession(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			j := open(t, b.fs)
			start := dump(t, b.fs)
			s, err := j.Begin(ctx, "provider run")
			if err != nil {
				t.Fatal(err)
			}
			out, err := j.Exec(ctx, "workspace shell command", func(context.Context) (bool, error) {
				b.behind(t, "write", "a.txt", "a")
				return false, nil // fails, but the session decides
			})
			if err != nil || !out.InSession || out.Restored {
				t.Fatalf("%+v %v", out, err)
			}
			if _, err := j.Record(ctx, "writeFile", func(fsys workspace.FileSystem) error {
				return fsys.WriteFile(ctx, "b.txt", []byte("b"), 0o644)
			}); err != nil {
				t.Fatal(err)
			}
			if len(j.List()) != 0 {
				t.Fatal("calls in a session committed on their own")
			}
			res, err := s.End(ctx, true)
			if err != nil || res.Commit == nil || len(res.Commit.Changes) != 2 || res.Commit.Message != "provider run" {
				t.Fatalf("%+v %v", res, err)
			}
			s, _ = j.Begin(ctx, "provider run 2")
			b.behind(t, "rm", "src")
			if res, err := s.End(ctx, false); err != nil || !res.Restored {
				t.Fatalf("%+v %v", res, err)
			}
			if _, err := j.Revert(ctx, journal.RevertRequest{}); err != nil {
				t.Fatal(err)
			}
			if got := dump(t, b.fs); got != start {
				t.Fatalf("got %s\nwant %s", got, start)
			}
		})
	}
}

func TestLargeFilesAreReportedNotRestored(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New(memfs.WithUmask(0))
	fsys.WriteFile(ctx, "big", []byte(strings.Repeat("x", 100)), 0o644)
	j, err := journal.Open(ctx, fsys, journal.WithMaxBlobBytes(10))
	if err != nil {
		t.Fatal(err)
	}
	out, err := j.Exec(ctx, "m", func(context.Context) (bool, error) {
		fsys.WriteFile(ctx, "big", []byte("y"), 0o644)
		return false, nil
	})
	if err != nil || len(out.Unrestored) != 1 || !strings.HasPrefix(out.Unrestored[0], "big ") {
		t.Fatalf("%+v %v", out, err)
	}
}

func TestPruneKeepsTheNewest(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	j := fourWrites(t, fsys)
	l := j.List()
	if len(l) != 2 || l[0].ID != 4 || l[1].ID != 3 {
		t.Fatalf("%+v", l)
	}
	if _, err := j.Revert(ctx, journal.RevertRequest{To: 1}); !errors.Is(err, workspace.ErrNotFound) {
		t.Fatalf("pruned commit: %v", err)
	}
	if _, err := j.Revert(ctx, journal.RevertRequest{To: 0}); !errors.Is(err, workspace.ErrNotFound) {
		t.Fatalf("start after pruning: %v", err)
	}
	// Opened again, the journal keeps the same two.
	again, err := journal.Open(ctx, fsys, journal.WithMaxCommits(2))
	if err != nil {
		t.Fatal(err)
	}
	if l := again.List(); len(l) != 2 || l[0].ID != 4 || l[1].ID != 3 {
		t.Fatalf("reopened: %+v", l)
	}
}

// TestSegments: records are appended to segments; a segment goes once
// every commit in it is pruned, a journal opened again has the commits it
// kept (and their small contents, kept in the records) and numbers on
// after them, a record cut short is no commit and is cut off before the
// next append, and a damaged one fails Open, naming the segment.
func TestSegments(t *testing.T) {
	ctx := context.Background()
	fsys, store := memfs.New(), memfs.New()
	open := func() *journal.Journal {
		t.Helper()
		j, err := journal.Open(ctx, fsys, journal.WithStore(store), journal.WithMaxCommits(70))
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	write := func(j *journal.Journal, n int) {
		t.Helper()
		for range n {
			if _, err := j.Record(ctx, "write", func(f workspace.FileSystem) error {
				data, _ := f.ReadFile(ctx, "f", 100)
				return f.WriteFile(ctx, "f", append(data, 'x'), 0o644)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	segments := func() []string {
		t.Helper()
		entries, err := store.ReadDir(ctx, "commits")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	j := open()
	write(j, 150) // segments of 64: 1-64, 65-128, 129-150; commits 81-150 kept
	if got, want := segments(), []string{"00000065.log", "00000129.log"}; !slices.Equal(got, want) {
		t.Fatalf("segments %q, want %q", got, want)
	}
	j = open()
	if l := j.List(); len(l) != 70 || l[0].ID != 150 || l[69].ID != 81 {
		t.Fatalf("reopened: %d commits, %d to %d", len(l), l[len(l)-1].ID, l[0].ID)
	}
	if _, err := j.Revert(ctx, journal.RevertRequest{To: 100}); err != nil {
		t.Fatal(err)
	}
	if data, _ := fsys.ReadFile(ctx, "f", 200); len(data) != 100 {
		t.Fatalf("reverted to commit 100: %d bytes, want 100", len(data))
	}
	// A record cut short, as a crash mid-append would leave it.
	if err := workspace.AppendFile(ctx, store, "commits/00000129.log", []byte(`{"id":152,"chan`), 0o600); err != nil {
		t.Fatal(err)
	}
	j = open()
	if l := j.List(); l[0].ID != 151 {
		t.Fatalf("after a record cut short: newest %d, want 151", l[0].ID)
	}
	write(j, 1)
	j = open()
	if l := j.List(); l[0].ID != 152 || l[1].ID != 151 {
		t.Fatalf("after the next append: %+v", l[:2])
	}
	// A damaged record.
	if err := workspace.AppendFile(ctx, store, "commits/00000129.log", []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := journal.Open(ctx, fsys, journal.WithStore(store)); err == nil || !strings.Contains(err.Error(), "commits/00000129.log is damaged") {
		t.Fatalf("a damaged record: %v, want it refused", err)
	}
}

// fourWrites opens a journal of fsys that keeps 2 commits and records 4
// writes of f, of "a" to "d".
func fourWrites(t *testing.T, fsys workspace.FileSystem) *journal.Journal {
	t.Helper()
	ctx := context.Background()
	j, err := journal.Open(ctx, fsys, journal.WithMaxCommits(2))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := j.Record(ctx, "write", func(f workspace.FileSystem) error {
			return f.WriteFile(ctx, "f", []byte{byte('a' + i)}, 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	return j
}

// TestExecCommitScope: a successful run keeps only what its commit scope
// allows; the rest is put back exactly and reported, and a second run sees
// the restored files as they are.
func TestExecCommitScope(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			goFiles := func(p string) bool { return strings.HasSuffix(p, ".go") }
			j, err := journal.Open(ctx, b.fs, journal.WithCommitScope(goFiles))
			if err != nil {
				t.Fatal(err)
			}
			before := dump(t, b.fs)
			out, err := j.Exec(ctx, "workspace shell command", func(context.Context) (bool, error) {
				b.behind(t, "write", "src/a.go", "package a // changed\n") // in scope
				b.behind(t, "mkdir", "gen/deep")                           // kept: a .go file below
				b.behind(t, "write", "gen/deep/z.go", "package deep\n")    //
				b.behind(t, "write", "run.sh", "rm -rf /\n")               // out of scope
				b.behind(t, "rm", "empty")                                 // out of scope
				b.behind(t, "mkdir", "junk")                               // out of scope, new
				b.behind(t, "write", "junk/x.txt", "x")                    //
				return true, nil
			})
			if err != nil || !out.Committed || out.Commit == nil {
				t.Fatalf("outcome %+v, %v", out, err)
			}
			if want := []string{"empty", "junk", "junk/x.txt", "run.sh"}; !slices.Equal(out.OutOfScope, want) {
				t.Fatalf("out of scope %q, want %q", out.OutOfScope, want)
			}
			var committed []string
			for _, c := range out.Commit.Changes {
				committed = append(committed, c.Path)
			}
			slices.Sort(committed)
			if want := []string{"gen", "gen/deep", "gen/deep/z.go", "src/a.go"}; !slices.Equal(committed, want) {
				t.Fatalf("committed %q, want %q", committed, want)
			}
			// What is out of scope is as it was; then a second run finds
			// it unchanged, and the revert restores the start.
			after := dump(t, b.fs)
			for _, line := range strings.Split(before, "\n") {
				if strings.HasPrefix(line, "run.sh") || strings.HasPrefix(line, "empty") {
					if !strings.Contains(after, line) {
						t.Errorf("%q not restored:\n%s", line, after)
					}
				}
			}
			if strings.Contains(after, "junk") {
				t.Errorf("junk kept:\n%s", after)
			}
			out, err = j.Exec(ctx, "workspace shell command", func(context.Context) (bool, error) { return true, nil })
			if err != nil || out.Commit != nil || len(out.OutOfScope) > 0 {
				t.Fatalf("an empty run: %+v, %v", out, err)
			}
			if _, err := j.Revert(ctx, journal.RevertRequest{To: 0}); err != nil {
				t.Fatal(err)
			}
			if got := dump(t, b.fs); got != before {
				t.Fatalf("revert:\n got %s\nwant %s", got, before)
			}
		})
	}
}

// tamper overwrites every object kept under dir in fsys with content of the
// attacker's choosing, as a session's process could inside the workspace.
func tamper(t *testing.T, fsys workspace.FileSystem, dir string) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	dir = path.Join(dir, "objects")
	shards, err := fsys.ReadDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		objs, err := fsys.ReadDir(ctx, path.Join(dir, s.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if err := fsys.WriteFile(ctx, path.Join(dir, s.Name(), o.Name()), []byte("attacker's choice"), 0o600); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	// Small contents are kept in the commits' records: altered there too.
	commits := path.Join(path.Dir(dir), "commits")
	recs, err := fsys.ReadDir(ctx, commits)
	if err != nil && !errors.Is(err, workspace.ErrNotFound) {
		t.Fatal(err)
	}
	for _, r := range recs {
		name := path.Join(commits, r.Name())
		data, err := fsys.ReadFile(ctx, name, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var out []byte
		for line := range bytes.Lines(data) { // a segment holds a record a line
			var rec map[string]any
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatal(err)
			}
			inline, _ := rec["inline"].(map[string]any)
			for h := range inline {
				inline[h] = []byte("attacker's choice")
				n++
			}
			line, _ = json.Marshal(rec)
			out = append(append(out, line...), '\n')
		}
		if err := fsys.WriteFile(ctx, name, out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// The store is not trusted: content that no longer matches its hash is
// never restored, reverted to or shown, and the outcome says so; a store of
// its own (WithStore) is out of the workspace's reach altogether.
func TestTamperedStore(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)

			t.Run("ExecFailureRestoresNothingPlanted", func(t *testing.T) {
				j := open(t, b.fs)
				out, err := j.Exec(ctx, "workspace shell command", func(context.Context) (bool, error) {
					tamper(t, b.fs, journal.Dir)
					b.behind(t, "write", "src/a.go", "clobbered")
					return false, nil
				})
				if !errors.Is(err, workspace.ErrUnavailable) || out.Restored || !strings.Contains(strings.Join(out.Unrestored, "\n"), "src/a.go (the journal's copy was altered") {
					t.Fatalf("outcome %+v, %v: want src/a.go reported unrestored and ErrUnavailable", out, err)
				}
				if data, _ := b.fs.ReadFile(ctx, "src/a.go", 1<<20); string(data) == "attacker's choice" {
					t.Fatal("the planted content was restored")
				}
				b.behind(t, "write", "src/a.go", "package a\n\nfunc A() {}\n")
			})

			t.Run("RevertAndShowRefuseAlteredCopies", func(t *testing.T) {
				j := open(t, b.fs)
				c, err := j.Record(ctx, "write", func(fsys workspace.FileSystem) error {
					return fsys.WriteFile(ctx, "src/a.go", []byte("package a // v2\n"), 0o644)
				})
				if err != nil || c == nil {
					t.Fatalf("record: %v, %v", c, err)
				}
				tamper(t, b.fs, journal.Dir)
				before := dump(t, b.fs)
				for _, force := range []bool{false, true} {
					if _, err := j.Revert(ctx, journal.RevertRequest{To: c.ID - 1, Force: force}); !errors.Is(err, workspace.ErrUnavailable) {
						t.Errorf("revert (force %v) over an altered copy: %v, want ErrUnavailable", force, err)
					}
				}
				if got := dump(t, b.fs); got != before {
					t.Fatalf("a refused revert changed the workspace:\n got %s\nwant %s", got, before)
				}
				if diff, err := j.Show(ctx, c.ID); err == nil || strings.Contains(diff, "attacker") {
					t.Fatalf("show of an altered copy: %v\n%s", err, diff)
				}
			})

			t.Run("OwnStoreOutOfReach", func(t *testing.T) {
				store := memfs.New()
				j := open(t, b.fs, journal.WithStore(store))
				want := dump(t, b.fs)
				out, err := j.Exec(ctx, "workspace shell command", func(context.Context) (bool, error) {
					// Whatever the process writes under .sandboxd/journal is
					// not the journal.
					b.behind(t, "rm", ".sandboxd")
					b.behind(t, "mkdir", ".sandboxd/journal/objects/00")
					b.behind(t, "write", "src/a.go", "clobbered")
					return false, nil
				})
				// .sandboxd/ is put back too (what the earlier journal kept
				// there, in the workspace), but for the modes of its
				// directories, which an adapter without chmod cannot give.
				if err != nil || !out.Restored || !slices.Contains(out.Protected, ".sandboxd") {
					t.Fatalf("outcome %+v, %v", out, err)
				}
				for _, u := range out.Unrestored {
					if !strings.HasPrefix(u, ".sandboxd") || !strings.HasSuffix(u, "not restored)") {
						t.Errorf("not restored: %s", u)
					}
				}
				if _, err := b.fs.Lstat(ctx, ".sandboxd/journal/objects/00"); !errors.Is(err, workspace.ErrNotFound) {
					t.Errorf("the directory the process planted: %v", err)
				}
				if got := dump(t, b.fs); got != want {
					t.Fatalf("not restored exactly:\n got %s\nwant %s", got, want)
				}
				if n := tamper(t, store, "."); n == 0 {
					t.Fatal("nothing was kept in the store")
				}
			})
		})
	}
}

// TestDamagedRecordsRefused: a record whose path or hash could lead the
// journal's reads and writes elsewhere fails Open, naming the fix.
func TestDamagedRecordsRefused(t *testing.T) {
	ctx := context.Background()
	for _, rec := range []string{
		`{"id":1,"changes":[{"path":"../x","before":{"type":"file"}}]}`,
		`{"id":1,"changes":[{"path":".sandboxd/journal/commits/00000002.json","before":{"type":"file"}}]}`,
		`{"id":1,"changes":[{"path":"a","before":{"type":"file","hash":"a"}}]}`,
		`{"id":1,"changes":[{"path":"a","before":{"type":"file","hash":"../../../../etc/passwd"}}]}`,
		`{"id":1,"changes":[{"path":"a","after":{"type":"file","hash":"` + strings.Repeat("A", 64) + `"}}]}`,
		`{"id":2,"changes":[]}`,
	} {
		store := memfs.New()
		if err := store.MkdirAll(ctx, "commits", 0o700); err != nil {
			t.Fatal(err)
		}
		if err := store.WriteFile(ctx, "commits/00000001.json", []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := journal.Open(ctx, memfs.New(), journal.WithStore(store)); err == nil || !strings.Contains(err.Error(), "move commits/00000001.json aside") {
			t.Errorf("%s: %v, want it refused", rec, err)
		}
	}
}

// TestRecordedWriteIsOneCall: on a workspace.SwapFS a journaled write costs
// the workspace one call — the swap, which reports the before-image — and
// commits what the generic path commits.
func TestRecordedWriteIsOneCall(t *testing.T) {
	ctx := context.Background()
	var commits []journal.Change
	for _, fast := range []bool{true, false} {
		mfs := memfs.New(memfs.WithUmask(0))
		if err := mfs.WriteFile(ctx, "f", []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		log := &callLog{FileSystem: mfs}
		var fsys workspace.FileSystem = log
		if fast {
			fsys = swapper{log}
		}
		j := open(t, fsys, journal.WithStore(memfs.New()))
		c, err := j.Record(ctx, "write f", func(w workspace.FileSystem) error {
			return w.WriteFile(ctx, "f", []byte("new"), 0o644)
		})
		if err != nil || c == nil || len(c.Changes) != 1 {
			t.Fatalf("fast %v: %+v, %v", fast, c, err)
		}
		if fast && !slices.Equal(log.calls, []string{"swap"}) {
			t.Errorf("a journaled write on a SwapFS made the calls %q, want one swap", log.calls)
		}
		commits = append(commits, c.Changes[0])
	}
	if commits[0] != commits[1] {
		t.Errorf("the swap committed %+v, the generic path %+v", commits[0], commits[1])
	}
	if ch := commits[0]; ch.Before.Mode != 0o600 || ch.After.Mode != 0o600 || ch.Before.Size != 3 || ch.Before.Hash == ch.After.Hash {
		t.Errorf("change %+v", ch)
	}
}

// TestRecordedWriteNeverLosesItsBeforeImage: when the before-image of a
// write cannot be kept (the store fails), the file is put back and the call
// fails, on the swap path as on the generic one.
func TestRecordedWriteNeverLosesItsBeforeImage(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			start := dump(t, b.fs)
			j := open(t, b.fs, journal.WithStore(brokenStore{memfs.New()}))
			c, err := j.Record(ctx, "write", func(w workspace.FileSystem) error {
				if err := w.WriteFile(ctx, "src/a.go", []byte("changed"), 0o644); err != nil {
					return err
				}
				return w.WriteFile(ctx, "new.go", []byte("new"), 0o644)
			})
			if err == nil || c != nil {
				t.Fatalf("Record with a broken store: %+v, %v", c, err)
			}
			if got := dump(t, b.fs); got != start {
				t.Fatalf("the workspace changed without its before-image:\n got %s\nwant %s", got, start)
			}
		})
	}
}

// callLog logs the calls made to a FileSystem.
type callLog struct {
	workspace.FileSystem
	calls []string
}

func (l *callLog) log(op string) { l.calls = append(l.calls, op) }

func (l *callLog) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	l.log("stat")
	return l.FileSystem.Stat(ctx, name)
}

func (l *callLog) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	l.log("lstat")
	return l.FileSystem.Lstat(ctx, name)
}

func (l *callLog) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	l.log("readdir")
	return l.FileSystem.ReadDir(ctx, name)
}

func (l *callLog) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	l.log("readfile")
	return l.FileSystem.ReadFile(ctx, name, max)
}

func (l *callLog) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	l.log("writefile")
	return l.FileSystem.WriteFile(ctx, name, data, perm)
}

func (l *callLog) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	l.log("mkdir")
	return l.FileSystem.Mkdir(ctx, name, perm)
}

func (l *callLog) Remove(ctx context.Context, name string) error {
	l.log("remove")
	return l.FileSystem.Remove(ctx, name)
}

func (l *callLog) Rename(ctx context.Context, oldname, newname string) error {
	l.log("rename")
	return l.FileSystem.Rename(ctx, oldname, newname)
}

// swapper is a callLog with a Swap of its own, which logs one call and
// does the work on the FileSystem underneath, unlogged.
type swapper struct{ *callLog }

func (s swapper) Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error) {
	s.log("swap")
	return workspace.SwapGeneric(ctx, s.callLog.FileSystem, req)
}

// brokenStore is a journal store whose writes fail.
type brokenStore struct{ workspace.FileSystem }

func (brokenStore) WriteFile(_ context.Context, name string, _ []byte, _ fs.FileMode) error {
	return workspace.PathError("write", name, workspace.ErrUnavailable)
}

// TestSmallContentsInRecords: a recorded write of a small file keeps its
// before- and after-images in the commit's record, with no file of their
// own; they are restored from there, after pruning and by a reopened
// journal too, and contents a revert reads outside the recorder get a file
// of their own, so pruning the records that held them loses nothing.
func TestSmallContentsInRecords(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	fourWrites(t, fsys)
	if _, err := fsys.Lstat(ctx, ".sandboxd/journal/objects"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("objects of small contents: %v, want none", err)
	}
	read := func(want string) {
		t.Helper()
		if data, err := fsys.ReadFile(ctx, "f", 10); err != nil || string(data) != want {
			t.Fatalf("f holds %q, %v; want %q", data, err, want)
		}
	}
	j2, err := journal.Open(ctx, fsys, journal.WithMaxCommits(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j2.Revert(ctx, journal.RevertRequest{To: 3}); err != nil {
		t.Fatal(err)
	}
	read("c")
	// Commits 6 and 7 drop 4 and 5, the revert: what it kept stays.
	for _, c := range []string{"x", "y"} {
		if _, err := j2.Record(ctx, "write", func(f workspace.FileSystem) error { return f.WriteFile(ctx, "f", []byte(c), 0o644) }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j2.Revert(ctx, journal.RevertRequest{To: 6}); err != nil {
		t.Fatal(err)
	}
	read("x")
	if _, err := j2.Revert(ctx, journal.RevertRequest{To: 7}); err != nil {
		t.Fatal(err)
	}
	read("y")
}

// TestPruneRemovesContentsInBatches: the contents only pruned commits
// referred to are removed from the store, a batch of pruned commits at a
// time, never those a kept commit needs.
func TestPruneRemovesContentsInBatches(t *testing.T) {
	ctx := context.Background()
	fsys, store := memfs.New(), memfs.New()
	j, err := journal.Open(ctx, fsys, journal.WithStore(store), journal.WithMaxCommits(2))
	if err != nil {
		t.Fatal(err)
	}
	objects := func() int {
		n := 0
		shards, _ := store.ReadDir(ctx, "objects")
		for _, s := range shards {
			objs, _ := store.ReadDir(ctx, path.Join("objects", s.Name()))
			n += len(objs)
		}
		return n
	}
	big := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26), byte(i)}, 4<<10) } // over the records' 4 KiB
	const writes = 70
	for i := range writes {
		if _, err := j.Record(ctx, "write", func(f workspace.FileSystem) error {
			return f.WriteFile(ctx, "f", big(i), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The three contents the two commits kept refer to, and at most a
	// batch of pruned ones' waiting.
	if n := objects(); n > 3+32 || n < 3 {
		t.Fatalf("%d objects kept after %d writes with two commits kept", n, writes)
	}
	if _, err := j.Revert(ctx, journal.RevertRequest{To: writes - 1}); err != nil {
		t.Fatal(err)
	}
	if data, _ := fsys.ReadFile(ctx, "f", 1<<20); !bytes.Equal(data, big(writes-2)) {
		t.Fatal("the kept commit's before-image was removed")
	}
}

// TestRecorderCapabilities: the FileSystem Record gives its function
// claims links exactly when the workspace has them, and every extension it
// claims works.
func TestRecorderCapabilities(t *testing.T) {
	conformance.TestWrapper(t, conformance.WrapperHarness{
		New: func(t *testing.T) (workspace.FileSystem, string) {
			fsys := memfs.New()
			return fsys, fsys.Root()
		},
		Wrap: func(t *testing.T, inner workspace.FileSystem, root string) workspace.FileSystem {
			j, err := journal.Open(t.Context(), inner, journal.InMemory(), journal.WithRoot(root))
			if err != nil {
				t.Fatal(err)
			}
			return j.Recorder()
		},
	})
}

// TestSandboxdDirIsTheDaemons: in a workspace session, a process's changes
// under .sandboxd/ — a rewritten file, planted ones, a new tree, a file of
// sandboxd's changed after sandboxd wrote it — are put back whether the run
// fails or succeeds, and named; what sandboxd wrote there meanwhile and
// said so (Own) is kept; nothing there is committed.
func TestSandboxdDirIsTheDaemons(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			seed(t, b)
			conformance.Build(t, b.fs, ".sandboxd/runtime/old.log: kept\n")
			j := open(t, b.fs, journal.WithStore(memfs.New()))
			j.Own(ctx, ".sandboxd/runtime/nothing") // outside a session: nothing
			read := func(name string) string {
				data, err := b.fs.ReadFile(ctx, name, 1<<20)
				if errors.Is(err, workspace.ErrNotFound) {
					return "absent"
				}
				if err != nil {
					t.Fatal(err)
				}
				return string(data)
			}
			attack := func(mine string) {
				if err := workspace.MkdirAll(ctx, b.fs, ".sandboxd/runtime/out", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := b.fs.WriteFile(ctx, mine, []byte("sandboxd's\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				j.Own(ctx, mine)
				b.behind(t, "write", ".sandboxd/runtime/old.log", "attacker")
				b.behind(t, "write", ".sandboxd/planted", "x")
				b.behind(t, "mkdir", ".sandboxd/tree/deep")
				b.behind(t, "write", ".sandboxd/tree/deep/x", "x")
				b.behind(t, "write", "notes.txt", "hello\n")
			}
			wantPut := []string{".sandboxd/planted", ".sandboxd/runtime/old.log", ".sandboxd/tree"}
			check := func(name string, out journal.Outcome, mine string) {
				t.Helper()
				if !slices.Equal(out.Protected, wantPut) {
					t.Errorf("%s: put back %q, want %q", name, out.Protected, wantPut)
				}
				for p, want := range map[string]string{".sandboxd/runtime/old.log": "kept\n", ".sandboxd/planted": "absent", ".sandboxd/tree/deep/x": "absent", mine: "sandboxd's\n"} {
					if got := read(p); got != want {
						t.Errorf("%s: %s holds %q, want %q", name, p, got, want)
					}
				}
			}

			out, err := j.Exec(ctx, "failing", func(context.Context) (bool, error) { attack(".sandboxd/runtime/out/1.log"); return false, nil })
			if err != nil || !out.Restored || len(out.Unrestored) > 0 || read("notes.txt") != "absent" {
				t.Fatalf("failing: %+v, %v", out, err)
			}
			check("failing", out, ".sandboxd/runtime/out/1.log")

			out, err = j.Exec(ctx, "succeeding", func(context.Context) (bool, error) { attack(".sandboxd/runtime/out/2.log"); return true, nil })
			if err != nil || !out.Committed || out.Commit == nil || len(out.Commit.Changes) != 1 || out.Commit.Changes[0].Path != "notes.txt" {
				t.Fatalf("succeeding: %+v, %v", out, err)
			}
			check("succeeding", out, ".sandboxd/runtime/out/2.log")

			// In a provider session, a process that rewrites what sandboxd
			// wrote earlier in the session: that file is removed, its
			// contents not kept, and said so.
			s, err := j.Begin(ctx, "provider")
			if err != nil {
				t.Fatal(err)
			}
			attack(".sandboxd/runtime/out/3.log")
			b.behind(t, "write", ".sandboxd/runtime/out/3.log", "attacker")
			out, err = s.End(ctx, true)
			if err != nil || !out.Committed || !slices.Equal(out.Unrestored, []string{".sandboxd/runtime/out/3.log (written by sandboxd, then changed by a process: removed)"}) {
				t.Fatalf("provider session: %+v, %v", out, err)
			}
			if got := read(".sandboxd/runtime/out/3.log"); got != "absent" {
				t.Errorf("sandboxd's file changed by a process: %q", got)
			}
			if got := read(".sandboxd/runtime/out/2.log"); got != "sandboxd's\n" {
				t.Errorf("sandboxd's file of an earlier run: %q", got)
			}
		})
	}
}
