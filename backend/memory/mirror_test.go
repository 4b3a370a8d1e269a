package memory_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// setup returns an empty memfs workspace (umask 0, so modes are exact) and
// a Bash over it, closed at the end of the test.
func setup(t *testing.T, fsOpts []memfs.Option, opts ...memory.MirrorOption) (*memfs.FS, *memory.Mirror) {
	t.Helper()
	fsys := memfs.New(append([]memfs.Option{memfs.WithUmask(0)}, fsOpts...)...)
	sh, err := memory.NewMirror(fsys, append([]memory.MirrorOption{memory.WithTempDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sh.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return fsys, sh
}

type ran struct {
	res            workspace.Result
	err            error
	stdout, stderr string
}

func runCmd(t *testing.T, ctx context.Context, sh *memory.Mirror, cmd workspace.Command) ran {
	t.Helper()
	var r ran
	var out, errs bytes.Buffer
	user := cmd.Output
	cmd.Output = func(s workspace.Stream, p []byte) {
		if s == workspace.Stdout {
			out.Write(p)
		} else {
			errs.Write(p)
		}
		if user != nil {
			user(s, p)
		}
	}
	r.res, r.err = sh.Run(ctx, cmd)
	r.stdout, r.stderr = out.String(), errs.String()
	return r
}

// sh runs a script that must succeed quietly and returns its output.
func sh(t *testing.T, b *memory.Mirror, script string) string {
	t.Helper()
	r := runCmd(t, t.Context(), b, workspace.Command{Script: script, Timeout: time.Minute})
	if r.err != nil || r.res.ExitCode != 0 || r.stderr != "" {
		t.Fatalf("Run(%q) = %+v, %v; stdout %q, stderr %q", script, r.res, r.err, r.stdout, r.stderr)
	}
	return r.stdout
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readMem(t *testing.T, fsys *memfs.FS, name string) string {
	t.Helper()
	data, err := fsys.ReadFile(t.Context(), name, 1<<20)
	if err != nil {
		t.Fatalf("ReadFile(%s): %v", name, err)
	}
	return string(data)
}

// tree describes the workspace one entry a line: "d/ 755", "f 644 text",
// "l@ target".
func tree(t *testing.T, fsys *memfs.FS) []string {
	t.Helper()
	ctx := t.Context()
	res, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{})
	must(t, err)
	var out []string
	for _, e := range res.Entries {
		fi, err := fsys.Lstat(ctx, e.Path)
		must(t, err)
		switch {
		case fi.IsDir():
			out = append(out, fmt.Sprintf("%s/ %o", e.Path, fi.Mode().Perm()))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := fsys.Readlink(ctx, e.Path)
			must(t, err)
			out = append(out, e.Path+"@ "+target)
		case fi.Mode().IsRegular():
			out = append(out, fmt.Sprintf("%s %o %s", e.Path, fi.Mode().Perm(), readMem(t, fsys, e.Path)))
		default:
			out = append(out, e.Path+" "+fi.Mode().Type().String())
		}
	}
	return out
}

func sameTree(t *testing.T, fsys *memfs.FS, want ...string) {
	t.Helper()
	if got := tree(t, fsys); !slices.Equal(got, want) {
		t.Errorf("workspace:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestCommandSeesWorkspace: the command sees every directory, file (with its
// bits and time) and link of the workspace, and no special file.
func TestCommandSeesWorkspace(t *testing.T) {
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	fsys, b := setup(t, []memfs.Option{memfs.WithClock(func() time.Time { return old })})
	ctx := t.Context()
	conformance.Build(t, fsys, "src/main.go: package main\n", "run.sh*: #!/bin/sh\necho ran\n",
		"rel => src/main.go", "abs => /workspace/src", "out => /etc/hostname", "pipe|")
	// Modes a layout does not say: read-only, and filled all the same.
	must(t, fsys.Mkdir(ctx, "src/ro", 0o555))
	must(t, fsys.WriteFile(ctx, "src/ro/secret", []byte("s"), 0o400))

	out := sh(t, b, `find . -path ./pipe -prune -o -print | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p -> $(readlink "$p")"; else stat -c '%n %a %Y' "$p"; fi
done; cat rel; ./run.sh; [ -e pipe ] || echo no pipe`)
	root, ts := b.Root(), old.Unix()
	want := strings.Join([]string{
		fmt.Sprintf(". 755 %d", ts), // the root keeps the workspace's bits
		"./abs -> " + root + "/src",
		"./out -> /etc/hostname",
		"./rel -> src/main.go",
		fmt.Sprintf("./run.sh 755 %d", ts),
		fmt.Sprintf("./src 755 %d", ts),
		fmt.Sprintf("./src/main.go 644 %d", ts),
		fmt.Sprintf("./src/ro 555 %d", ts),
		fmt.Sprintf("./src/ro/secret 400 %d", ts),
		"package main", "ran", "no pipe", "",
	}, "\n")
	// Directory times are the host's: the port cannot set them.
	got := out
	for _, d := range []string{".", "./src", "./src/ro"} {
		got = replaceField(got, d)
		want = replaceField(want, d)
	}
	if got != want {
		t.Errorf("the command saw:\n%s\nwant:\n%s", got, want)
	}
	if pwd := sh(t, b, "pwd"); pwd != root+"\n" {
		t.Errorf("pwd = %q, want %q", pwd, root)
	}
}

// replaceField blanks the time of the line for path p.
func replaceField(s, p string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if f := strings.Fields(l); len(f) == 3 && f[0] == p {
			lines[i] = f[0] + " " + f[1] + " T"
		}
	}
	return strings.Join(lines, "\n")
}

// TestChangesCopiedBack: what a command creates, changes and removes is in
// the workspace afterwards, and what it left alone is untouched.
func TestChangesCopiedBack(t *testing.T) {
	fsys, b := setup(t, nil)
	ctx := t.Context()
	conformance.Build(t, fsys, "keep/same: same", "edit.txt: old\n", "gone.txt: x", "script: echo",
		"dirnow: file", "tree/sub/f: f", "filenow/", "relink => edit.txt")
	before, err := fsys.Lstat(ctx, "keep/same")
	must(t, err)

	sh(t, b, `echo new > edit.txt; rm gone.txt; chmod 700 script
mkdir -p made/deep && printf data > made/deep/file && chmod 600 made/deep/file
rm -r tree; rm dirnow; mkdir dirnow; rmdir filenow; echo f > filenow
ln -s made/deep link; ln -s "$PWD/made" abslink; ln -sfn keep relink; ln -s /etc/passwd outlink
mkfifo fifo`)

	sameTree(t, fsys,
		"abslink@ /workspace/made",
		"dirnow/ 755",
		"edit.txt 644 new\n",
		"filenow 644 f\n",
		"keep/ 755",
		"keep/same 644 same",
		"link@ made/deep",
		"made/ 755",
		"made/deep/ 755",
		"made/deep/file 600 data",
		"outlink@ /etc/passwd",
		"relink@ keep",
		"script 700 echo",
	)
	if after, err := fsys.Lstat(ctx, "keep/same"); err != nil || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("a file the command did not touch was rewritten: %v", err)
	}
	// The FileSystem confines the links the command made.
	if _, err := fsys.ReadFile(ctx, "outlink", 100); !errors.Is(err, workspace.ErrOutsideWorkspace) {
		t.Errorf("ReadFile through the command's link out = %v, want OutsideWorkspace", err)
	}
	if got := readMem(t, fsys, "abslink/deep/file"); got != "data" {
		t.Errorf("through the command's absolute link: %q", got)
	}
}

// TestLinkOutIsNotFollowed: what a command writes through a link that
// leaves the directory is not copied in.
func TestLinkOutIsNotFollowed(t *testing.T) {
	fsys, b := setup(t, nil)
	outside := t.TempDir()
	sh(t, b, fmt.Sprintf("ln -s %s lo; echo x > lo/planted", outside))
	if _, err := fsys.Lstat(t.Context(), "lo/planted"); !errors.Is(err, workspace.ErrOutsideWorkspace) {
		t.Errorf("Lstat(lo/planted) = %v, want OutsideWorkspace", err)
	}
	if data, err := os.ReadFile(filepath.Join(outside, "planted")); err != nil || string(data) != "x\n" {
		t.Errorf("the command's write outside: %q, %v", data, err)
	}
}

// TestSameSizeRewriteWithOldTime: a rewrite in place that keeps the size and
// puts the old modification time back is still seen.
func TestSameSizeRewriteWithOldTime(t *testing.T) {
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC) // not recent: the file is not hashed
	fsys, b := setup(t, []memfs.Option{memfs.WithClock(func() time.Time { return old })})
	must(t, fsys.WriteFile(t.Context(), "f", []byte("aaaa"), 0o644))
	sh(t, b, `m=$(stat -c %y f); printf bbbb > f; touch -d "$m" f`)
	if got := readMem(t, fsys, "f"); got != "bbbb" {
		t.Errorf("f = %q, want the command's bbbb", got)
	}
}

// TestCacheRewritesOnlyChanges: between Runs only what changed in the
// workspace is rewritten on the host, and a file the command rewrote with
// the same bytes is not written back.
func TestCacheRewritesOnlyChanges(t *testing.T) {
	fsys, b := setup(t, nil)
	ctx := t.Context()
	conformance.Build(t, fsys, "a: a", "b: b", "c: c")
	inodes := func() []string { return strings.Fields(sh(t, b, "stat -c %i a b c")) }
	first := inodes()
	must(t, fsys.WriteFile(ctx, "b", []byte("B"), 0o644))
	must(t, fsys.Remove(ctx, "c"))
	must(t, fsys.WriteFile(ctx, "d", []byte("d"), 0o644))
	if got := sh(t, b, "cat a b d; [ -e c ] || echo no c"); got != "aBdno c\n" {
		t.Errorf("after changes through the FileSystem the command sees %q", got)
	}
	second := strings.Fields(sh(t, b, "stat -c %i a b"))
	if first[0] != second[0] || first[1] == second[1] {
		t.Errorf("inodes of a, b: %v then %v; want a kept and b rewritten", first[:2], second)
	}

	before, err := fsys.Lstat(ctx, "a")
	must(t, err)
	sh(t, b, "printf a > a; touch d")
	if after, err := fsys.Lstat(ctx, "a"); err != nil || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("a, rewritten with the same bytes, was copied back: %v", err)
	}
}

// TestConflictWorkspaceWins: an entry changed through the FileSystem while
// the command also changed it keeps the FileSystem's version, and the
// command is told.
func TestConflictWorkspaceWins(t *testing.T) {
	fsys, b := setup(t, nil)
	ctx := t.Context()
	conformance.Build(t, fsys, "both: original", "removed: original", "cmdonly: original")
	var once sync.Once
	r := runCmd(t, ctx, b, workspace.Command{
		Script: `echo ready; while [ ! -e go ]; do sleep 0.01; done
echo command > both; rm removed; echo command > created; echo command > cmdonly`,
		Timeout: time.Minute,
		Output: func(s workspace.Stream, p []byte) {
			if s == workspace.Stdout && bytes.Contains(p, []byte("ready")) {
				once.Do(func() {
					must(t, fsys.WriteFile(ctx, "both", []byte("tool"), 0o644))
					must(t, fsys.WriteFile(ctx, "removed", []byte("tool"), 0o644))
					must(t, fsys.WriteFile(ctx, "created", []byte("tool"), 0o644))
					must(t, os.WriteFile(filepath.Join(b.Root(), "go"), nil, 0o644))
				})
			}
		},
	})
	if r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("Run = %+v, %v; stderr %q", r.res, r.err, r.stderr)
	}
	for _, name := range []string{"both", "removed", "created"} {
		if got := readMem(t, fsys, name); got != "tool" {
			t.Errorf("%s = %q, want the tool's version", name, got)
		}
		if !strings.Contains(r.stderr, "memexec: "+name+" changed in the workspace while the command ran") {
			t.Errorf("stderr %q does not report the conflict on %s", r.stderr, name)
		}
	}
	if got := readMem(t, fsys, "cmdonly"); got != "command\n" {
		t.Errorf("cmdonly = %q, want the command's version", got)
	}
	if got := sh(t, b, "cat both removed created"); got != "tooltooltool" {
		t.Errorf("the next command sees %q, want the workspace's versions", got)
	}
}

// TestWorkspaceFull: a change the FileSystem refuses is reported, not
// copied, and undone on the host at the next Run.
func TestWorkspaceFull(t *testing.T) {
	fsys, b := setup(t, []memfs.Option{memfs.WithMaxBytes(100)})
	r := runCmd(t, t.Context(), b, workspace.Command{Script: "head -c 1000 /dev/zero > big; echo small > small"})
	if r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("Run = %+v, %v", r.res, r.err)
	}
	if !strings.Contains(r.stderr, "memexec: big: not copied back") || !strings.Contains(r.stderr, "workspace full") {
		t.Errorf("stderr %q does not report the refused file", r.stderr)
	}
	sameTree(t, fsys, "small 644 small\n")
	if got := sh(t, b, "ls"); got != "small\n" {
		t.Errorf("the next command sees %q", got)
	}
}

// TestChangesKeptAfterTimeout: what a command wrote before it was killed, at
// its timeout or its context's deadline, is copied back. A limit that passed
// before the command wrote (it marks the moment in a directory outside the
// workspace) proves nothing, and is doubled.
func TestChangesKeptAfterTimeout(t *testing.T) {
	fsys, b := setup(t, nil)
	marks := t.TempDir()
	for _, deadline := range []bool{false, true} {
		for i, limit := 0, 200*time.Millisecond; ; i, limit = i+1, 2*limit {
			name := fmt.Sprintf("out-%v-%d", deadline, i)
			mark := filepath.Join(marks, name)
			cmd := workspace.Command{Script: fmt.Sprintf("echo partial > %s; : > %s; sleep 600", name, mark)}
			ctx, cancel := t.Context(), context.CancelFunc(func() {})
			if deadline {
				ctx, cancel = context.WithTimeout(ctx, limit)
			} else {
				cmd.Timeout = limit
			}
			r := runCmd(t, ctx, b, cmd)
			cancel()
			if deadline && !errors.Is(r.err, context.DeadlineExceeded) || !deadline && (!r.res.TimedOut || r.err != nil) {
				t.Fatalf("Run with a limit of %v = %+v, %v; want it cut short", limit, r.res, r.err)
			}
			if _, err := os.Stat(mark); err != nil {
				if limit > 30*time.Second {
					t.Fatalf("the command never ran: %v", err)
				}
				continue
			}
			if got := readMem(t, fsys, name); got != "partial\n" {
				t.Errorf("%s = %q", name, got)
			}
			break
		}
	}
}

// TestRunsOverlap: a Run's command does not hold up another's — the
// first waits for a file the second makes — and what each changed is
// copied back; a Run whose ctx is over does not start.
func TestRunsOverlap(t *testing.T) {
	fsys, b := setup(t, nil)
	started, first := make(chan struct{}), make(chan error, 1)
	go func() {
		var once sync.Once
		res, err := b.Run(t.Context(), workspace.Command{
			Script:  "echo a > a; echo waiting; while [ ! -e b ]; do sleep 0.01; done; echo saw $(cat b) > seen",
			Timeout: time.Minute,
			Output:  func(workspace.Stream, []byte) { once.Do(func() { close(started) }) },
		})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("first: %+v", res)
		}
		first <- err
	}()
	<-started
	if res, err := b.Run(t.Context(), workspace.Command{Script: "cat a > b.new && mv b.new b"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("second Run beside the first = %+v, %v", res, err)
	}
	if got := readMem(t, fsys, "b"); got != "a\n" {
		t.Errorf("b = %q", got)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := readMem(t, fsys, "seen"); got != "saw a\n" {
		t.Errorf("seen = %q", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := b.Run(ctx, workspace.Command{Script: "true"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with its ctx over = %v", err)
	}
}

// TestRootVars: WithRootVars gives the command the root it really sees in a
// variable its environment sets, and adds none it does not set (a session
// without bashSessionEnv shows no SANDBOXD_WORKSPACE).
func TestRootVars(t *testing.T) {
	_, b := setup(t, nil, memory.WithRootVars("SANDBOXD_WORKSPACE"))
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"set", map[string]string{"SANDBOXD_WORKSPACE": "/workspace"}, b.Root() + "\n" + b.Root() + "\n"},
		{"other variables only", map[string]string{"FOO": "bar"}, "unset\n" + b.Root() + "\n"},
		{"no environment", nil, "unset\n" + b.Root() + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCmd(t, t.Context(), b, workspace.Command{
				Script: `printf '%s\n' "${SANDBOXD_WORKSPACE-unset}" "$PWD"`,
				Env:    tc.env,
			})
			if r.err != nil || r.stdout != tc.want {
				t.Errorf("Run = %v, stdout %q; want %q", r.err, r.stdout, tc.want)
			}
		})
	}
}

// TestClose: Close removes the directory, even one a command made
// unreadable, and later Runs fail.
func TestClose(t *testing.T) {
	fsys := memfs.New()
	b, err := memory.NewMirror(fsys, memory.WithTempDir(t.TempDir()))
	must(t, err)
	sh(t, b, "mkdir -p locked/in && touch locked/in/f && chmod 000 locked/in locked")
	root := b.Root()
	must(t, b.Close())
	if _, err := os.Lstat(filepath.Dir(root)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Close the directory is still there: %v", err)
	}
	if _, err := b.Run(t.Context(), workspace.Command{Script: "true"}); !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("Run after Close = %v, want Unavailable", err)
	}
	must(t, b.Close())
}

// TestPrivateDirectory: the directory holding the workspace is the owner's
// alone.
func TestPrivateDirectory(t *testing.T) {
	_, b := setup(t, nil)
	fi, err := os.Stat(filepath.Dir(b.Root()))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the private directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
}

// BenchmarkRun measures a Run of "true" over a workspace of 2000 files of
// 4 KiB: the first (which copies everything), then one with nothing
// changed, then one after a tool changed one file.
func BenchmarkRun(b *testing.B) {
	ctx := context.Background()
	fill := func(fsys *memfs.FS) {
		data := strings.Repeat("x", 4096)
		layout := make([]string, 2000)
		for i := range layout {
			layout[i] = fmt.Sprintf("d%02d/f%04d: %s", i%20, i, data)
		}
		conformance.Build(b, fsys, layout...)
	}
	run := func(b *testing.B, sh *memory.Mirror) {
		if res, err := sh.Run(ctx, workspace.Command{Script: "true"}); err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			fsys := memfs.New()
			fill(fsys)
			sh, err := memory.NewMirror(fsys, memory.WithTempDir(b.TempDir()))
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			run(b, sh)
			b.StopTimer()
			sh.Close()
			b.StartTimer()
		}
	})
	for _, tc := range []struct {
		name   string
		change bool
	}{{"unchanged", false}, {"oneChanged", true}} {
		b.Run(tc.name, func(b *testing.B) {
			fsys := memfs.New()
			fill(fsys)
			sh, err := memory.NewMirror(fsys, memory.WithTempDir(b.TempDir()))
			if err != nil {
				b.Fatal(err)
			}
			defer sh.Close()
			run(b, sh)
			i := 0
			for b.Loop() {
				if tc.change {
					i++
					if err := fsys.WriteFile(ctx, "d00/f0000", []byte(fmt.Sprint(i)), 0o644); err != nil {
						b.Fatal(err)
					}
				}
				run(b, sh)
			}
		})
	}
	b.Run("empty", func(b *testing.B) { // the floor: the same command with nothing to copy
		fsys := memfs.New()
		sh, err := memory.NewMirror(fsys, memory.WithTempDir(b.TempDir()))
		if err != nil {
			b.Fatal(err)
		}
		defer sh.Close()
		for b.Loop() {
			run(b, sh)
		}
	})
}

// BenchmarkFloor measures issue 16's target in one run: `bash true` over a
// memory workspace of 10,000 files of 1 KiB in 100 directories, unchanged
// or after a tool changed one file, against the same command through
// localexec in an empty directory, interleaved one for one. It reports the
// median wall time of each (p50-µs, floor-p50-µs), their difference
// (sync-µs: what the mirror costs) and ratio (x-floor):
//
//	go test ./backend/memory -run '^$' -bench Floor -benchtime 200x -count 5
func BenchmarkFloor(b *testing.B) {
	ctx := context.Background()
	fsys := memfs.New()
	data := strings.Repeat("x", 1024)
	layout := make([]string, 10000)
	for i := range layout {
		layout[i] = fmt.Sprintf("d%02d/f%05d: %s", i%100, i, data)
	}
	conformance.Build(b, fsys, layout...)
	sh, err := memory.NewMirror(fsys, memory.WithTempDir(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	defer sh.Close()
	floor, err := localexec.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	cmd := workspace.Command{Script: "true"}
	timed := func(sh workspace.Bash) time.Duration {
		t0 := time.Now()
		if res, err := sh.Run(ctx, cmd); err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
		return time.Since(t0)
	}
	timed(sh) // the first Run copies everything
	for _, change := range []bool{false, true} {
		b.Run(map[bool]string{false: "unchanged", true: "oneChanged"}[change], func(b *testing.B) {
			var runs, floors []time.Duration
			i := 0
			for b.Loop() {
				if change {
					i++
					if err := fsys.WriteFile(ctx, "d00/f00000", []byte(fmt.Sprint(i)), 0o644); err != nil {
						b.Fatal(err)
					}
				}
				floors = append(floors, timed(floor))
				runs = append(runs, timed(sh))
			}
			p50 := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Nanoseconds()) / 1e3
			}
			run, fl := p50(runs), p50(floors)
			b.ReportMetric(run, "p50-µs")
			b.ReportMetric(fl, "floor-p50-µs")
			b.ReportMetric(run-fl, "sync-µs")
			b.ReportMetric(run/fl, "x-floor")
			b.ReportMetric(0, "ns/op") // two commands per op: not one figure
		})
	}
}

// listing counts the directory listings of a memfs workspace, and passes on
// its Changes.
type listing struct {
	*memfs.FS
	mu    sync.Mutex
	lists int
}

func (l *listing) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	l.mu.Lock()
	l.lists++
	l.mu.Unlock()
	return l.FS.ReadDir(ctx, name)
}

func (l *listing) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.lists
	l.lists = 0
	return n
}

// TestOnlyChangesLooked: over a FileSystem that says where it changed, a Run
// lists none of it — a change a tool made between Runs, and one made while
// a command ran, reach the next command all the same — and when it no
// longer remembers that far back, the Run looks at everything.
func TestOnlyChangesLooked(t *testing.T) {
	ctx := t.Context()
	mem := memfs.New(memfs.WithUmask(0))
	var layout []string
	for i := range 20 {
		layout = append(layout, fmt.Sprintf("d%d/f: old", i))
	}
	conformance.Build(t, mem, layout...)
	fsys := &listing{FS: mem}
	b, err := memory.NewMirror(fsys, memory.WithTempDir(t.TempDir()))
	must(t, err)
	defer b.Close()
	sh(t, b, "true")
	if n := fsys.count(); n < 21 {
		t.Fatalf("the first Run listed %d directories; want all 21", n)
	}

	must(t, mem.WriteFile(ctx, "d3/f", []byte("new"), 0o644))
	must(t, mem.Rename(ctx, "d4", "moved"))
	if got := sh(t, b, "cat d3/f; echo; ls -d moved d4 2>/dev/null; true"); got != "new\nmoved\n" {
		t.Errorf("the command saw %q", got)
	}
	if n := fsys.count(); n != 1 {
		t.Errorf("the Run listed %d directories; want 1, the one renamed", n)
	}
	// Changed while a command runs: the workspace's write, not seen by the
	// command, is seen by the next.
	started := make(chan struct{})
	go func() {
		<-started
		if err := mem.WriteFile(ctx, "d5/f", []byte("during"), 0o644); err != nil {
			t.Error(err)
		}
		os.WriteFile(filepath.Join(b.Root(), "go"), nil, 0o644) // on with the command
	}()
	var once sync.Once
	r := runCmd(t, ctx, b, workspace.Command{
		Script:  "cat d5/f; echo; echo started; until [ -e go ]; do sleep 0.01; done; rm go; echo x > d7/f",
		Timeout: time.Minute,
		Output: func(s workspace.Stream, p []byte) {
			if bytes.Contains(p, []byte("started")) {
				once.Do(func() { close(started) })
			}
		},
	})
	if r.err != nil || r.res.ExitCode != 0 || r.stdout != "old\nstarted\n" {
		t.Fatalf("Run = %+v, %v, stdout %q", r.res, r.err, r.stdout)
	}
	if got := sh(t, b, "cat d5/f d7/f"); got != "duringx\n" {
		t.Errorf("the next command saw %q; want the workspace's write and the command's", got)
	}
	if n := fsys.count(); n != 0 {
		t.Errorf("Runs after files changed listed %d directories; want none", n)
	}

	for i := range 5000 { // more than the FileSystem remembers
		must(t, mem.WriteFile(ctx, "d8/f", []byte(fmt.Sprint(i)), 0o644))
	}
	if got := sh(t, b, "cat d8/f"); got != "4999" {
		t.Errorf("after many changes the command saw %q", got)
	}
	if n := fsys.count(); n < 21 {
		t.Errorf("after more changes than remembered, the Run listed %d directories; want all", n)
	}
}

// TestWatchedChanges: what a command changes is copied back when only the
// events of the watch say where to look — a rewrite that keeps the size and
// time, a new directory of files, a directory renamed, a write through a
// hard link from outside the directory in a later command — and the
// command's own hard links are kept track of.
func TestWatchedChanges(t *testing.T) {
	fsys, b := setup(t, nil)
	ctx := t.Context()
	must(t, fsys.MkdirAll(ctx, "d/e", 0o755))
	must(t, fsys.WriteFile(ctx, "d/e/f", []byte("aaaa"), 0o644))
	must(t, fsys.WriteFile(ctx, "g", []byte("gggg"), 0o644))
	sh(t, b, "true")
	outside := filepath.Join(t.TempDir(), "hardlink")
	steps := []struct {
		script string
		want   []string
	}{
		{"touch -r d/e/f /tmp/.memexec-ref-$$; printf bbbb > d/e/f; touch -r /tmp/.memexec-ref-$$ d/e/f; rm /tmp/.memexec-ref-$$",
			[]string{"d/ 755", "d/e/ 755", "d/e/f 644 bbbb", "g 644 gggg"}},
		{"mkdir -p n/m && echo x > n/m/y",
			[]string{"d/ 755", "d/e/ 755", "d/e/f 644 bbbb", "g 644 gggg", "n/ 755", "n/m/ 755", "n/m/y 644 x\n"}},
		// Rewrites only the watch sees, in directories a kept watch did
		// not have: made by the last command, renamed by it.
		{"touch -r n/m/y /tmp/.memexec-ref-$$; printf 'z\\n' > n/m/y; touch -r /tmp/.memexec-ref-$$ n/m/y; rm /tmp/.memexec-ref-$$",
			[]string{"d/ 755", "d/e/ 755", "d/e/f 644 bbbb", "g 644 gggg", "n/ 755", "n/m/ 755", "n/m/y 644 z\n"}},
		{"mv d/e d/r",
			[]string{"d/ 755", "d/r/ 755", "d/r/f 644 bbbb", "g 644 gggg", "n/ 755", "n/m/ 755", "n/m/y 644 z\n"}},
		{"touch -r d/r/f /tmp/.memexec-ref-$$; printf cccc > d/r/f; touch -r /tmp/.memexec-ref-$$ d/r/f; rm /tmp/.memexec-ref-$$",
			[]string{"d/ 755", "d/r/ 755", "d/r/f 644 cccc", "g 644 gggg", "n/ 755", "n/m/ 755", "n/m/y 644 z\n"}},
		{"printf oooo > " + outside + "; ln " + outside + " o",
			[]string{"d/ 755", "d/r/ 755", "d/r/f 644 cccc", "g 644 gggg", "n/ 755", "n/m/ 755", "n/m/y 644 z\n", "o 644 oooo"}},
		{"printf pppp > " + outside,
			[]string{"d/ 755", "d/r/ 755", "d/r/f 644 cccc", "g 644 gggg", "n/ 755", "n/m/ 755", "n/m/y 644 z\n", "o 644 pppp"}},
	}
	for _, s := range steps {
		sh(t, b, s.script)
		if got := tree(t, fsys); !slices.Equal(got, s.want) {
			t.Fatalf("after %q the workspace is\n  %s\nwant\n  %s", s.script, strings.Join(got, "\n  "), strings.Join(s.want, "\n  "))
		}
	}
	// A directory made again, by the workspace or by a command, then
	// rewritten in a way only the watch sees.
	rewrite := "touch -r n/m/y /tmp/.memexec-ref-$$; printf 'w\\n' > n/m/y; touch -r /tmp/.memexec-ref-$$ n/m/y; rm /tmp/.memexec-ref-$$"
	for _, remake := range []func(){
		func() {
			must(t, fsys.RemoveAll(ctx, "n/m"))
			must(t, fsys.MkdirAll(ctx, "n/m", 0o755))
			must(t, fsys.WriteFile(ctx, "n/m/y", []byte("q\n"), 0o644))
		},
		func() { sh(t, b, "rm -r n/m; mkdir n/m; echo q > n/m/y") },
	} {
		remake()
		sh(t, b, rewrite)
		if got, err := fsys.ReadFile(ctx, "n/m/y", 1<<10); err != nil || string(got) != "w\n" {
			t.Errorf("n/m/y = %q, %v; want the command's rewrite", got, err)
		}
	}
}
