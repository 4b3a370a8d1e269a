package conformance_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// A mutant is a conforming adapter with one bug planted. TestKitCatches
// runs the kit's subtest named in want against each, in a child process
// (a failing kit cannot be observed from inside), and checks that the
// subtest fails — or, for skip, that it is skipped with the reason.
type mutant struct {
	name string
	run  string // the subtests to run, as for -run below TestMutant
	want string // "FAIL" or "SKIP"
	text string // what the child's output must contain
	fs   func(*memfs.FS) workspace.FileSystem
	skip map[conformance.Capability]string
	sh   func(t *testing.T, dir string) workspace.Bash
}

var mutants = []mutant{
	{name: "unsorted", run: "ReadDir/Sorted", want: "FAIL", text: "entries",
		fs: func(f *memfs.FS) workspace.FileSystem { return unsorted{f} }},
	{name: "torn", run: "WriteFile/Atomic", want: "FAIL", text: "partial file",
		fs: func(f *memfs.FS) workspace.FileSystem { return torn{f} }},
	{name: "nolock", run: "Lock/Context", want: "FAIL", text: "took a lock that was held",
		fs: func(f *memfs.FS) workspace.FileSystem { return noLock{f} }},
	{name: "eager", run: "ReadFile/TooLargeNotRead", want: "FAIL", text: "read the file before checking",
		fs: func(f *memfs.FS) workspace.FileSystem { return eager{f} }},
	{name: "hides-outside", run: "Confine/ReadFileChainOut", want: "FAIL", text: "want OutsideWorkspace",
		fs: func(f *memfs.FS) workspace.FileSystem { return hidesOutside{f} }},
	{name: "fifo-hang", run: "ReadFile/FIFO", want: "FAIL", text: "did not return within 20s",
		fs: func(f *memfs.FS) workspace.FileSystem { return fifoHang{f} }},
	{name: "bad-walk", run: "Walk/All", want: "FAIL", text: "differs from the generic helper",
		fs: func(f *memfs.FS) workspace.FileSystem { return badWalk{f} }},
	{name: "undeclared", run: "ReadFile/FIFO", want: "FAIL", text: "does not declare it"},
	{name: "declared", run: "ReadFile/FIFO", want: "SKIP", text: "fifos: no pipes here",
		skip: map[conformance.Capability]string{conformance.CapFIFOs: "no pipes here", conformance.CapSockets: "none"}},
	{name: "buffered", run: "Output/Streamed", want: "FAIL", text: "not streamed",
		sh: func(t *testing.T, dir string) workspace.Bash { return buffered{newBash(t, dir)} }},
	{name: "inherit", run: "Env/HostSecretHidden", want: "FAIL", text: "reached the command",
		sh: func(t *testing.T, dir string) workspace.Bash {
			b, err := localexec.New(dir, localexec.WithInheritEnv(true))
			if err != nil {
				t.Fatal(err)
			}
			return b
		}},
	{name: "naive", run: "Timeout/TreeDies", want: "FAIL", text: "outlived it",
		sh: func(t *testing.T, dir string) workspace.Bash { return naive{dir} }},
}

func TestKitCatches(t *testing.T) {
	if os.Getenv("CONFORMANCE_MUTANT") != "" {
		t.Skip("in a child")
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMutant$/"+m.run, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "CONFORMANCE_MUTANT="+m.name)
			out, err := cmd.CombinedOutput()
			failed := err != nil
			marker := "--- " + m.want + ": TestMutant/" + m.run
			if !bytes.Contains(out, []byte(marker)) || !bytes.Contains(out, []byte(m.text)) || failed != (m.want == "FAIL") {
				t.Errorf("the kit did not %s %s with %q (exit %v):\n%s", m.want, m.run, m.text, err, out)
			}
		})
	}
}

// TestMutant runs the kit against the mutant CONFORMANCE_MUTANT names.
func TestMutant(t *testing.T) {
	name := os.Getenv("CONFORMANCE_MUTANT")
	i := slices.IndexFunc(mutants, func(m mutant) bool { return m.name == name })
	if i < 0 {
		t.Skip("run by TestKitCatches")
	}
	m := mutants[i]
	if m.sh != nil {
		conformance.TestBash(t, conformance.BashHarness{New: func(t *testing.T) conformance.BashInstance {
			dir := t.TempDir()
			fsys := memfs.New() // unused by the subtests mutants run
			return conformance.BashInstance{Bash: m.sh(t, dir), FS: hostFS{fsys, dir}, Root: dir}
		}, Skip: map[conformance.Capability]string{conformance.CapConfiguredEnv: "none configured", conformance.CapTerminal: "mutants of Run"}})
		return
	}
	conformance.TestFileSystem(t, conformance.FileSystemHarness{Skip: m.skip, New: func(t *testing.T) conformance.Instance {
		f := memfs.New()
		inst := conformance.Instance{FS: f, Root: f.Root()}
		if m.fs != nil {
			inst.FS = m.fs(f)
			inst.MakeSpecial = func(name string, typ fs.FileMode) error { return f.Mknod(name, typ|0o644) }
		}
		return inst
	}})
}

type unsorted struct{ *memfs.FS }

func (u unsorted) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	entries, err := u.FS.ReadDir(ctx, name)
	slices.Reverse(entries)
	return entries, err
}

// torn writes the first half, then the whole.
type torn struct{ *memfs.FS }

func (w torn) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if err := w.FS.WriteFile(ctx, name, data[:len(data)/2], perm); err != nil {
		return err
	}
	time.Sleep(100 * time.Microsecond)
	return w.FS.WriteFile(ctx, name, data, perm)
}

type noLock struct{ *memfs.FS }

func (noLock) Lock(context.Context, string) (func(), error) { return func() {}, nil }

// eager reads the whole file, then checks its size.
type eager struct{ *memfs.FS }

func (e eager) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	data, err := e.FS.ReadFile(ctx, name, 1<<40)
	if err == nil && int64(len(data)) > max {
		return nil, workspace.PathError("read", name, workspace.ErrFileTooLarge)
	}
	return data, err
}

// hidesOutside reports a link out as a missing file.
type hidesOutside struct{ *memfs.FS }

func (h hidesOutside) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	data, err := h.FS.ReadFile(ctx, name, max)
	if errors.Is(err, workspace.ErrOutsideWorkspace) {
		err = workspace.PathError("read", name, workspace.ErrNotFound)
	}
	return data, err
}

// fifoHang blocks on a named pipe, as open(2) does.
type fifoHang struct{ *memfs.FS }

func (f fifoHang) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	if info, err := f.FS.Stat(ctx, name); err == nil && info.Mode().Type() == fs.ModeNamedPipe {
		<-ctx.Done()
	}
	return f.FS.ReadFile(ctx, name, max)
}

// badWalk has a fast path that loses the last entry.
type badWalk struct{ *memfs.FS }

func (b badWalk) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	r, err := workspace.WalkGeneric(ctx, b.FS, req)
	if len(r.Entries) > 0 {
		r.Entries = r.Entries[:len(r.Entries)-1]
	}
	return r, err
}

func newBash(t *testing.T, dir string) *localexec.Bash {
	b, err := localexec.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// buffered delivers the output only when the command has ended.
type buffered struct{ workspace.Bash }

func (b buffered) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	var out bytes.Buffer
	user := cmd.Output
	cmd.Output = func(_ workspace.Stream, p []byte) { out.Write(p) }
	res, err := b.Bash.Run(ctx, cmd)
	if user != nil && out.Len() > 0 {
		user(workspace.Stdout, out.Bytes())
	}
	return res, err
}

// naive kills only the shell at the timeout, as exec.CommandContext does.
type naive struct{ dir string }

func (n naive) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	start := time.Now()
	if cmd.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cmd.Timeout)
		defer cancel()
	}
	c := exec.CommandContext(ctx, "sh", "-c", cmd.Script)
	c.Dir = n.dir
	c.WaitDelay = 100 * time.Millisecond
	var mu sync.Mutex
	c.Stdout = writerFunc(func(p []byte) { mu.Lock(); defer mu.Unlock(); cmd.Output(workspace.Stdout, p) })
	c.Stderr = writerFunc(func(p []byte) { mu.Lock(); defer mu.Unlock(); cmd.Output(workspace.Stderr, p) })
	err := c.Run()
	res := workspace.Result{ExitCode: c.ProcessState.ExitCode(), Duration: time.Since(start)}
	res.TimedOut = errors.Is(ctx.Err(), context.DeadlineExceeded)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) && !errors.Is(err, exec.ErrWaitDelay) {
		return res, err
	}
	return res, nil
}

type writerFunc func([]byte)

func (w writerFunc) Write(p []byte) (int, error) { w(p); return len(p), nil }

// hostFS reads the files of a host directory, for the Bash mutants' checks.
type hostFS struct {
	*memfs.FS
	dir string
}

func (h hostFS) ReadFile(_ context.Context, name string, max int64) ([]byte, error) {
	data, err := os.ReadFile(h.dir + "/" + name)
	if err != nil {
		return nil, workspace.PathError("read", name, workspace.ErrNotFound)
	}
	return data[:min(int64(len(data)), max)], nil
}

func TestBuild(t *testing.T) {
	fsys := memfs.New()
	conformance.Build(t, fsys, "a/b: text", "x*: run", "l => a/b", "p|", "s=", "e/")
	for _, tt := range []struct {
		name string
		mode fs.FileMode
	}{
		{"a", fs.ModeDir | 0o755},
		{"a/b", 0o644},
		{"x", 0o755},
		{"l", fs.ModeSymlink},
		{"p", fs.ModeNamedPipe | 0o644},
		{"s", fs.ModeSocket | 0o644},
		{"e", fs.ModeDir | 0o755},
	} {
		fi, err := fsys.Lstat(t.Context(), tt.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode(); got != tt.mode && !(tt.mode == fs.ModeSymlink && got.Type() == fs.ModeSymlink) {
			t.Errorf("%s: mode %v, want %v", tt.name, got, tt.mode)
		}
	}
	if data, err := fsys.ReadFile(t.Context(), "l", 100); err != nil || string(data) != "text" {
		t.Errorf("ReadFile(l) = %q, %v; want text", data, err)
	}
}
