package localfs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/workspace"
)

// newFS builds a layout (conformance.Build's language) in a new directory's
// "ws" and opens that as a workspace. Entries under "../out/" are built in
// the directory "out" beside it, which is outside; "$ROOT" and "$OUTSIDE" in
// a link's target are the absolute paths of the two. It returns the
// directory holding both.
func newFS(t testing.TB, layout ...string) (*FS, string) {
	t.Helper()
	top := t.TempDir()
	ws, out := filepath.Join(top, "ws"), filepath.Join(top, "out")
	var in, outside []string
	for _, e := range layout {
		e = strings.ReplaceAll(e, "$OUTSIDE", filepath.ToSlash(out))
		if rest, ok := strings.CutPrefix(e, "../out/"); ok {
			outside = append(outside, rest)
		} else {
			in = append(in, e)
		}
	}
	for _, b := range []struct {
		dir    string
		layout []string
	}{{ws, in}, {out, outside}} {
		if err := os.Mkdir(b.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := conformance.HostDir(b.dir).Build(b.layout...); err != nil {
			t.Fatal(err)
		}
	}
	fsys, err := New(ws, WithLockDir(filepath.Join(top, "locks")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	return fsys, top
}

// snapshot describes every entry below dir: type, link target, contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			m[rel] = "link " + target
		case d.Type().IsRegular():
			b, _ := os.ReadFile(p)
			m[rel] = "file " + string(b)
		default:
			m[rel] = d.Type().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runOp runs one FileSystem operation by name; "rename" takes "old>new".
func runOp(ctx context.Context, fsys *FS, op, name string) error {
	var err error
	switch op {
	case "read":
		_, err = fsys.ReadFile(ctx, name, 1<<20)
	case "write":
		err = fsys.WriteFile(ctx, name, []byte("new"), 0o644)
	case "stat":
		_, err = fsys.Stat(ctx, name)
	case "lstat":
		_, err = fsys.Lstat(ctx, name)
	case "readdir":
		_, err = fsys.ReadDir(ctx, name)
	case "mkdir":
		err = fsys.Mkdir(ctx, name, 0o755)
	case "mkdirall":
		err = fsys.MkdirAll(ctx, name, 0o755)
	case "remove":
		err = fsys.Remove(ctx, name)
	case "removeall":
		err = fsys.RemoveAll(ctx, name)
	case "symlink":
		err = fsys.Symlink(ctx, "anywhere", name)
	case "readlink":
		_, err = fsys.Readlink(ctx, name)
	case "rename":
		oldname, newname, _ := strings.Cut(name, ">")
		err = fsys.Rename(ctx, oldname, newname)
	case "lock":
		var unlock func()
		if unlock, err = fsys.Lock(ctx, name); err == nil {
			unlock()
		}
	default:
		panic("unknown op " + op)
	}
	return err
}

func TestOperations(t *testing.T) {
	const (
		linkOut      = "l => ../out/secret"
		linkOutAbs   = "l => $OUTSIDE/secret"
		dirLinkOut   = "ld => ../out"
		dirLinkOutAb = "ld => $OUTSIDE"
	)
	outside := []string{"../out/secret: s3cret", "../out/sub/", "../out/p|"}
	tests := []struct {
		name   string
		layout []string
		op     string
		path   string
		want   *workspace.Kind // nil: success
	}{
		// Names that are not io/fs names.
		{"dotdot read", nil, "read", "../out/secret", workspace.ErrInvalidArgument},
		{"dotdot write", nil, "write", "../out/new", workspace.ErrInvalidArgument},
		{"inner dotdot", []string{"d/"}, "write", "d/../../out/new", workspace.ErrInvalidArgument},
		{"absolute read", nil, "read", "/etc/passwd", workspace.ErrInvalidArgument},
		{"absolute write", nil, "write", "/tmp/new", workspace.ErrInvalidArgument},
		{"empty name", nil, "stat", "", workspace.ErrInvalidArgument},

		// A link out, relative or absolute.
		{"link out read", []string{linkOut}, "read", "l", workspace.ErrOutsideWorkspace},
		{"link out stat", []string{linkOut}, "stat", "l", workspace.ErrOutsideWorkspace},
		{"link out write", []string{linkOut}, "write", "l", workspace.ErrOutsideWorkspace},
		{"link out lstat", []string{linkOut}, "lstat", "l", nil},
		{"link out readlink", []string{linkOut}, "readlink", "l", nil},
		{"link out remove", []string{linkOut}, "remove", "l", nil},
		{"link out removeall", []string{"ld => ../out/sub"}, "removeall", "ld", nil},
		{"link out rename", []string{linkOut}, "rename", "l>m", nil},
		{"abs link out read", []string{linkOutAbs}, "read", "l", workspace.ErrOutsideWorkspace},
		{"abs link out write", []string{linkOutAbs}, "write", "l", workspace.ErrOutsideWorkspace},
		{"link to outside pipe", []string{"l => ../out/p"}, "read", "l", workspace.ErrOutsideWorkspace},
		{"dangling link out write", []string{"l => ../out/new"}, "write", "l", workspace.ErrOutsideWorkspace},

		// A chain of links that ends outside.
		{"chain out read", []string{"a => b", "b => c", "c => ../out/secret"}, "read", "a", workspace.ErrOutsideWorkspace},
		{"chain out write", []string{"a => b", "b => d/c", "d/", "d/c => ../../out/secret"}, "write", "a", workspace.ErrOutsideWorkspace},
		{"chain out abs write", []string{"a => b", "b => $ROOT/c", "c => $OUTSIDE/secret"}, "write", "a", workspace.ErrOutsideWorkspace},

		// New entries under a linked directory that is outside.
		{"linked dir write", []string{dirLinkOut}, "write", "ld/new", workspace.ErrOutsideWorkspace},
		{"linked dir abs write", []string{dirLinkOutAb}, "write", "ld/new", workspace.ErrOutsideWorkspace},
		{"linked dir deep write", []string{dirLinkOut}, "write", "ld/sub/new", workspace.ErrOutsideWorkspace},
		{"linked dir read", []string{dirLinkOut}, "read", "ld/secret", workspace.ErrOutsideWorkspace},
		{"linked dir readdir", []string{dirLinkOut}, "readdir", "ld", workspace.ErrOutsideWorkspace},
		{"linked dir mkdir", []string{dirLinkOut}, "mkdir", "ld/new", workspace.ErrOutsideWorkspace},
		{"linked dir mkdirall", []string{dirLinkOut}, "mkdirall", "ld/a/b", workspace.ErrOutsideWorkspace},
		{"linked dir remove", []string{dirLinkOut}, "remove", "ld/secret", workspace.ErrOutsideWorkspace},
		{"linked dir removeall", []string{dirLinkOut}, "removeall", "ld/sub", workspace.ErrOutsideWorkspace},
		{"linked dir symlink", []string{dirLinkOut}, "symlink", "ld/new", workspace.ErrOutsideWorkspace},
		{"linked dir rename into", []string{dirLinkOut, "f"}, "rename", "f>ld/f", workspace.ErrOutsideWorkspace},
		{"linked dir rename out of", []string{dirLinkOut}, "rename", "ld/secret>stolen", workspace.ErrOutsideWorkspace},
		{"nested link up and out", []string{"d/", "d/up => ../../out"}, "write", "d/up/new", workspace.ErrOutsideWorkspace},

		// Links that stay inside are followed.
		{"link in read", []string{"f", "l => f"}, "read", "l", nil},
		{"link in write", []string{"f", "l => f"}, "write", "l", nil},
		{"dangling link in write", []string{"l => new"}, "write", "l", nil},
		{"linked dir in write", []string{"d/", "ld => d"}, "write", "ld/new", nil},
		{"link up inside", []string{"f", "d/", "d/up => ../f"}, "read", "d/up", nil},
		{"abs link in read", []string{"f", "l => $ROOT/f"}, "read", "l", nil},
		{"abs link in write", []string{"f", "l => $ROOT/f"}, "write", "l", nil},
		{"abs dir link in write", []string{"d/", "ld => $ROOT/d"}, "write", "ld/new", nil},
		{"abs dir link in mkdir", []string{"d/", "ld => $ROOT/d"}, "mkdir", "ld/new", nil},
		{"long chain in", []string{"f", "l1 => l2", "l2 => l3", "l3 => l4", "l4 => l5", "l5 => l6",
			"l6 => l7", "l7 => l8", "l8 => l9", "l9 => l10", "l10 => f"}, "read", "l1", nil},
		{"link loop", []string{"a => b", "b => a"}, "read", "a", workspace.ErrInvalidArgument},
		{"link loop write", []string{"a => b", "b => a"}, "write", "a", workspace.ErrInvalidArgument},

		// Special files are refused at once.
		{"fifo read", []string{"p|"}, "read", "p", workspace.ErrNotAFile},
		{"fifo write", []string{"p|"}, "write", "p", workspace.ErrNotAFile},
		{"fifo readdir", []string{"p|"}, "readdir", "p", workspace.ErrNotADirectory},
		{"fifo via link read", []string{"p|", "l => p"}, "read", "l", workspace.ErrNotAFile},
		{"fifo via link write", []string{"p|", "l => p"}, "write", "l", workspace.ErrNotAFile},
		{"device read", []string{"null => /dev/null"}, "read", "null", workspace.ErrOutsideWorkspace},
		{"fifo parent write", []string{"p|"}, "write", "p/x", workspace.ErrNotADirectory},
		{"fifo parent read", []string{"p|"}, "read", "p/x", workspace.ErrNotADirectory},
		{"fifo parent mkdir", []string{"p|"}, "mkdir", "p/x", workspace.ErrNotADirectory},
		{"fifo removeall", []string{"p|"}, "removeall", "p", nil},
		{"dir read", []string{"d/"}, "read", "d", workspace.ErrNotAFile},
		{"dir write", []string{"d/"}, "write", "d", workspace.ErrNotAFile},
		{"root write", nil, "write", ".", workspace.ErrNotAFile},

		// The kinds of ordinary failures.
		{"missing read", nil, "read", "nope", workspace.ErrNotFound},
		{"missing parent write", nil, "write", "nodir/f", workspace.ErrNotFound},
		{"file parent write", []string{"f"}, "write", "f/x", workspace.ErrNotADirectory},
		{"file parent stat", []string{"f"}, "stat", "f/x", workspace.ErrNotADirectory},
		{"readdir file", []string{"f"}, "readdir", "f", workspace.ErrNotADirectory},
		{"mkdir exists", []string{"d/"}, "mkdir", "d", workspace.ErrExists},
		{"mkdir no parent", nil, "mkdir", "a/b", workspace.ErrNotFound},
		{"mkdirall through file", []string{"f"}, "mkdirall", "f/a/b", workspace.ErrNotADirectory},
		{"remove missing", nil, "remove", "nope", workspace.ErrNotFound},
		{"remove not empty", []string{"d/", "d/f"}, "remove", "d", workspace.ErrNotEmpty},
		{"remove root", nil, "remove", ".", workspace.ErrInvalidArgument},
		{"removeall missing", nil, "removeall", "nope", nil},
		{"removeall root", nil, "removeall", ".", workspace.ErrInvalidArgument},
		{"rename missing", nil, "rename", "nope>x", workspace.ErrNotFound},
		{"rename onto dir", []string{"f", "d/"}, "rename", "f>d", workspace.ErrExists},
		{"rename into itself", []string{"d/"}, "rename", "d>d/e", workspace.ErrInvalidArgument},
		{"rename over file", []string{"f", "g"}, "rename", "f>g", nil},
		{"symlink exists", []string{"f"}, "symlink", "f", workspace.ErrExists},
		{"readlink not link", []string{"f"}, "readlink", "f", workspace.ErrInvalidArgument},
		{"lock missing", nil, "lock", "new/file", nil},
		{"lock link out", []string{linkOut}, "lock", "l", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys, top := newFS(t, append(tc.layout, outside...)...)
			before := snapshot(t, filepath.Join(top, "out"))

			// A call that blocks (on a FIFO) blocks for good: the bound
			// only turns that hang into a failure.
			done := make(chan error, 1)
			go func() { done <- runOp(context.Background(), fsys, tc.op, tc.path) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s %q blocked", tc.op, tc.path)
			}

			if tc.want == nil && err != nil {
				t.Fatalf("%s %q: %v, want success", tc.op, tc.path, err)
			}
			if tc.want != nil {
				if !errors.Is(err, tc.want) {
					t.Fatalf("%s %q: %v, want %s", tc.op, tc.path, err, tc.want.Name())
				}
				var pe *fs.PathError
				if !errors.As(err, &pe) {
					t.Errorf("error %T is not an *fs.PathError", err)
				}
				if strings.Contains(err.Error(), top) {
					t.Errorf("error %q holds the host path", err)
				}
			}
			if after := snapshot(t, filepath.Join(top, "out")); !maps.Equal(before, after) {
				t.Errorf("outside changed:\n before %v\n after  %v", before, after)
			}
			for name := range snapshot(t, filepath.Join(top, "ws")) {
				if strings.Contains(name, tmpInfix) {
					t.Errorf("temporary file left: %s", name)
				}
			}
		})
	}
}

func TestLoopErrorSaysWhy(t *testing.T) {
	fsys, _ := newFS(t, "a => b", "b => a")
	_, err := fsys.ReadFile(context.Background(), "a", 100)
	if !errors.Is(err, syscall.ELOOP) || !strings.Contains(err.Error(), "symbolic links") {
		t.Errorf("ReadFile of a loop: %v, want a too-many-links error", err)
	}
}

func TestReadFile(t *testing.T) {
	ctx := context.Background()
	fsys, _ := newFS(t, "f: hello", "empty:")
	tests := []struct {
		name string
		max  int64
		want string
		kind *workspace.Kind
	}{
		{"f", 5, "hello", nil},
		{"f", 100, "hello", nil},
		{"f", 1<<63 - 1, "hello", nil},
		{"f", 4, "", workspace.ErrFileTooLarge},
		{"empty", 0, "", nil},
		{"f", -1, "", workspace.ErrInvalidArgument},
	}
	for _, tc := range tests {
		got, err := fsys.ReadFile(ctx, tc.name, tc.max)
		if tc.kind != nil {
			if !errors.Is(err, tc.kind) {
				t.Errorf("ReadFile(%q, %d): %v, want %s", tc.name, tc.max, err, tc.kind.Name())
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("ReadFile(%q, %d) = %q, %v; want %q", tc.name, tc.max, got, err, tc.want)
		}
	}
}

func TestMetadata(t *testing.T) {
	ctx := context.Background()
	fsys, top := newFS(t, "b/", "b/x", "a: abc", "l => a", "ld => b", "p|")
	entries, err := fsys.ReadDir(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %v %v", e.Name(), e.Type(), info.Mode().Type()))
	}
	want := []string{"a ---------- ----------", "b d--------- d---------", "l L--------- L---------",
		"ld L--------- L---------", "p p--------- p---------"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ReadDir = %q, want %q", got, want)
	}
	if info, err := fsys.Stat(ctx, "l"); err != nil || info.Size() != 3 || !info.Mode().IsRegular() {
		t.Errorf("Stat(l) = %v, %v; want the regular file a", info, err)
	}
	if info, err := fsys.Lstat(ctx, "l"); err != nil || info.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("Lstat(l) = %v, %v; want the link", info, err)
	}
	if target, err := fsys.Readlink(ctx, "l"); target != "a" || err != nil {
		t.Errorf("Readlink(l) = %q, %v", target, err)
	}
	if err := fsys.Rename(ctx, "ld", "ld2"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.RemoveAll(ctx, "ld2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(top, "ws/b/x")); err != nil {
		t.Errorf("RemoveAll of a link to a directory removed what it points to: %v", err)
	}
}

func TestWriteFileThroughLinkKeepsLink(t *testing.T) {
	ctx := context.Background()
	fsys, top := newFS(t, "d/", "d/f: old", "l => d/f", "abs => $ROOT/d/f", "ld => d", "ld/l2 => ../l")
	for _, name := range []string{"l", "abs", "ld/l2"} {
		data := []byte("via " + name)
		if err := fsys.WriteFile(ctx, name, data, 0o644); err != nil {
			t.Fatalf("WriteFile(%s): %v", name, err)
		}
		if got, _ := os.ReadFile(filepath.Join(top, "ws/d/f")); !bytes.Equal(got, data) {
			t.Errorf("after WriteFile(%s) target holds %q", name, got)
		}
	}
	snap := snapshot(t, filepath.Join(top, "ws"))
	if snap["l"] != "link d/f" || snap["abs"] != "link "+top+"/ws/d/f" || snap["d/l2"] != "link ../l" {
		t.Errorf("links changed: %v", snap)
	}
}

func TestWriteFileHardLinkNotWrittenThrough(t *testing.T) {
	fsys, top := newFS(t, "../out/secret: outside")
	if err := os.Link(filepath.Join(top, "out/secret"), filepath.Join(top, "ws/h")); err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile(context.Background(), "h", []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(top, "out/secret")); string(got) != "outside" {
		t.Errorf("outside file holds %q after a write to its hard link", got)
	}
	if got, _ := os.ReadFile(filepath.Join(top, "ws/h")); string(got) != "inside" {
		t.Errorf("h holds %q", got)
	}
}

func TestWriteFileMode(t *testing.T) {
	ctx := context.Background()
	fsys, top := newFS(t, "f", "x")
	ws := filepath.Join(top, "ws")
	umask := syscall.Umask(0o022)
	syscall.Umask(umask)
	tests := []struct {
		name     string
		existing fs.FileMode // 0: a new file
		perm     fs.FileMode
		want     fs.FileMode
	}{
		{"f", 0o640, 0o644, 0o640},
		{"x", 0o755, 0o600, 0o755},
		{"g", 0o710 | fs.ModeSetuid, 0o644, 0o710 | fs.ModeSetuid},
		{"new", 0, 0o600, 0o600 &^ fs.FileMode(umask)},
		{"new2", 0, 0o666, 0o666 &^ fs.FileMode(umask)},
	}
	for _, tc := range tests {
		p := filepath.Join(ws, tc.name)
		if tc.existing != 0 {
			os.WriteFile(p, nil, 0o600)
			if err := os.Chmod(p, tc.existing); err != nil {
				t.Fatal(err)
			}
		}
		if err := fsys.WriteFile(ctx, tc.name, []byte("data"), tc.perm); err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode() &^ fs.ModeType; got != tc.want {
			t.Errorf("%s: mode %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWriteFileAtomic has a reader that must only ever see one whole version.
func TestWriteFileAtomic(t *testing.T) {
	ctx := context.Background()
	fsys, _ := newFS(t)
	fsys.opts.sync = false // atomicity does not depend on it
	versions := [][]byte{bytes.Repeat([]byte("a"), 32<<10), bytes.Repeat([]byte("b"), 48<<10)}
	if err := fsys.WriteFile(ctx, "f", versions[0], 0o644); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			got, err := fsys.ReadFile(ctx, "f", 1<<20)
			if err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(got, versions[0]) && !bytes.Equal(got, versions[1]) {
				t.Errorf("reader saw a partial file of %d bytes", len(got))
				return
			}
			reads.Add(1)
		}
	})
	for i := range 200 {
		if err := fsys.WriteFile(ctx, "f", versions[i%2], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d reads during 200 writes", reads.Load())
}

// TestWriteFileCleansUp makes the final rename fail (the target keeps turning
// into a directory) and checks that no temporary file stays behind.
func TestWriteFileCleansUp(t *testing.T) {
	fsys, top := newFS(t, "d/")
	fsys.opts.sync = false
	target := filepath.Join(top, "ws/d/t")
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			os.Mkdir(target, 0o755)
			os.Remove(target)
		}
	})
	var failed, written int
	for range 1000 {
		err := fsys.WriteFile(context.Background(), "d/t", []byte("x"), 0o644)
		switch {
		case err == nil:
			written++
			os.Remove(target)
		case errors.Is(err, workspace.ErrNotAFile), errors.Is(err, workspace.ErrNotEmpty), errors.Is(err, workspace.ErrExists):
			failed++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d written, %d refused", written, failed)
	for name := range snapshot(t, filepath.Join(top, "ws")) {
		if strings.Contains(name, tmpInfix) {
			t.Errorf("temporary file left: %s", name)
		}
	}
}

// TestWriteFileSwapRace is the required race: while one goroutine keeps
// swapping the directory d for a link to a directory outside the workspace,
// 10,000 writes into d go through the adapter. No byte may land outside, and
// every write that succeeded must have landed in the real d.
func TestWriteFileSwapRace(t *testing.T) {
	ctx := context.Background()
	fsys, top := newFS(t, "d/")
	fsys.opts.sync = false // fsync is not what this test is about
	ws, out := filepath.Join(top, "ws"), filepath.Join(top, "out")
	stop := swapLoop(t, ws)
	defer stop()
	outcomes := map[string]int{}
	for i := range 10000 {
		err := fsys.WriteFile(ctx, fmt.Sprintf("d/f%d", i), []byte("data"), 0o644)
		switch k := workspace.KindOf(err); {
		case err == nil:
			outcomes["ok"]++
		case k == workspace.ErrOutsideWorkspace || k == workspace.ErrNotFound:
			outcomes[k.Name()]++
		case errors.Is(err, syscall.ELOOP) || k == workspace.ErrNotADirectory:
			// os.Root met a link that was gone when it came to read it.
			outcomes["vanished link"]++
		default:
			t.Errorf("write %d: %v", i, err)
			return
		}
	}
	swaps := stop()
	t.Logf("%d swaps; outcomes %v", swaps, outcomes)

	if left := snapshot(t, out); len(left) != 1 {
		t.Errorf("outside directory holds %d entries", len(left)-1)
	}
	landed := snapshot(t, filepath.Join(ws, "d"))
	if len(landed)-1 != outcomes["ok"] {
		t.Errorf("%d files in d, %d successful writes", len(landed)-1, outcomes["ok"])
	}
	if outcomes["ok"] == 0 || swaps == 0 {
		t.Errorf("the race did not happen: %d swaps, outcomes %v", swaps, outcomes)
	}
}

// swapLoop keeps swapping the directory ws/d for a link to ws/../out
// (relative and absolute in turn) and back, until the stop it returns is
// called; stop waits for the last swap to end and says how many were made.
func swapLoop(t *testing.T, ws string) (stop func() int) {
	var done atomic.Bool
	var swaps int
	var wg sync.WaitGroup
	wg.Go(func() {
		targets := []string{"../out", filepath.Join(filepath.Dir(ws), "out")}
		for !done.Load() {
			must(t, os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "d.real")))
			must(t, os.Symlink(targets[swaps%2], filepath.Join(ws, "d")))
			must(t, os.Remove(filepath.Join(ws, "d")))
			must(t, os.Rename(filepath.Join(ws, "d.real"), filepath.Join(ws, "d")))
			swaps++
		}
	})
	return func() int {
		done.Store(true)
		wg.Wait()
		return swaps
	}
}

func must(t *testing.T, err error) {
	if err != nil {
		t.Error(err)
	}
}

func TestLockInProcess(t *testing.T) {
	ctx := context.Background()
	fsys, top := newFS(t, "f", "l => f")
	before := snapshot(t, filepath.Join(top, "ws"))
	unlock, err := fsys.Lock(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	// The link resolves to f, so it shares f's lock; another name does not.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := fsys.Lock(short, "l"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second Lock of f through a link: %v, want the deadline", err)
	}
	other, err := fsys.Lock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	other()

	// A second FS on the same workspace excludes us by flock alone.
	fsys2, err := New(filepath.Join(top, "ws"), WithLockDir(filepath.Join(top, "locks")))
	if err != nil {
		t.Fatal(err)
	}
	defer fsys2.Close()
	got := make(chan func())
	go func() {
		u, err := fsys2.Lock(ctx, "f")
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	select {
	case <-got:
		t.Fatal("a second holder got the lock")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	unlock() // a second call is harmless
	select {
	case u := <-got:
		u()
	case <-time.After(time.Minute):
		t.Fatal("the lock was not released")
	}
	if after := snapshot(t, filepath.Join(top, "ws")); !maps.Equal(before, after) {
		t.Errorf("locking changed the workspace: %v", after)
	}
}

// TestLockAcrossProcesses holds the lock in a child process (this test binary
// run again, see TestMain) and checks that this process waits for it.
func TestLockAcrossProcesses(t *testing.T) {
	fsys, top := newFS(t, "f")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LOCALFS_LOCK_HELPER="+filepath.Join(top, "ws")+"|"+filepath.Join(top, "locks"))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "locked\n" {
		t.Fatalf("helper said %q, %v", line, err)
	}
	ctx := context.Background()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := fsys.Lock(short, "f"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock while another process holds it: %v, want the deadline", err)
	}
	stdin.Close()
	long, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	unlock, err := fsys.Lock(long, "f")
	if err != nil {
		t.Fatalf("Lock after the other process released it: %v", err)
	}
	unlock()
}

func TestMain(m *testing.M) {
	if spec := os.Getenv("LOCALFS_LOCK_HELPER"); spec != "" {
		ws, locks, _ := strings.Cut(spec, "|")
		fsys, err := New(ws, WithLockDir(locks))
		if err != nil {
			panic(err)
		}
		unlock, err := fsys.Lock(context.Background(), "f")
		if err != nil {
			panic(err)
		}
		fmt.Println("locked")
		bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
		unlock()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestDefaultLockDirMustBePrivate(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	fsys, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	unlock, err := fsys.Lock(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	dir := filepath.Join(tmp, "sandboxd-locks-"+userID())
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Lock(context.Background(), "f"); !errors.Is(err, workspace.ErrForbidden) {
		t.Errorf("Lock with a world-writable lock directory: %v, want Forbidden", err)
	}
}

func TestClosedAndCancelled(t *testing.T) {
	fsys, _ := newFS(t, "f")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := fsys.Stat(ctx, "f"); !errors.Is(err, context.Canceled) {
		t.Errorf("Stat with a cancelled context: %v", err)
	}
	fsys.Close()
	if _, err := fsys.Stat(context.Background(), "f"); !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("Stat after Close: %v, want Unavailable", err)
	}
}

func TestNew(t *testing.T) {
	top := t.TempDir()
	if err := conformance.HostDir(filepath.Join(top, "ws")).Build("f", "link => ."); err != nil {
		t.Fatal(err)
	}
	if _, err := New(filepath.Join(top, "missing")); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("New of a missing directory: %v", err)
	}
	if _, err := New(filepath.Join(top, "ws/f")); !errors.Is(err, workspace.ErrNotADirectory) {
		t.Errorf("New of a file: %v", err)
	}
	// A root reached through a link accepts absolute links in either spelling.
	fsys, err := New(filepath.Join(top, "ws/link"))
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	ctx := context.Background()
	for _, target := range []string{top + "/ws/link/f", top + "/ws/f"} {
		if err := fsys.Symlink(ctx, target, "abs"); err != nil {
			t.Fatal(err)
		}
		if _, err := fsys.ReadFile(ctx, "abs", 10); err != nil {
			t.Errorf("ReadFile through a link to %s: %v", target, err)
		}
		fsys.Remove(ctx, "abs")
	}
	if fsys.Dir() != filepath.Join(top, "ws/link") {
		t.Errorf("Dir() = %q", fsys.Dir())
	}
}

func BenchmarkReadFile(b *testing.B) {
	fsys, _ := newFS(b, "d/", "d/e/", "d/e/f: "+strings.Repeat("x", 4096))
	ctx := context.Background()
	for b.Loop() {
		if _, err := fsys.ReadFile(ctx, "d/e/f", 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteFile(b *testing.B) {
	data := bytes.Repeat([]byte("x"), 4096)
	for _, sync := range []bool{true, false} {
		b.Run(fmt.Sprintf("sync=%v", sync), func(b *testing.B) {
			fsys, _ := newFS(b, "d/", "d/f")
			fsys.opts.sync = sync
			ctx := context.Background()
			for b.Loop() {
				if err := fsys.WriteFile(ctx, "d/f", data, 0o644); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// chunkReader gives data at most chunk bytes a read, counting the reads.
type chunkReader struct {
	data  []byte
	chunk int
	reads int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	r.reads++
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.chunk)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// readAll stops at the size fstat gave once a read falls short there, and
// reads on to the end otherwise.
func TestReadAll(t *testing.T) {
	data := []byte("0123456789")
	tests := []struct {
		name      string
		size      int64 // as fstat gave it
		chunk     int
		max       int64
		want      string
		err       error
		wantReads int
	}{
		{"whole at once", 10, 100, 100, "0123456789", nil, 1},
		{"short reads", 10, 4, 100, "0123456789", nil, 3},
		{"grew since fstat", 4, 100, 100, "0123456789", nil, 3},
		{"shrank since fstat", 20, 100, 100, "0123456789", nil, 2},
		{"grew past max", 4, 100, 6, "", workspace.ErrFileTooLarge, 1},
	}
	for _, tc := range tests {
		r := &chunkReader{data: data, chunk: tc.chunk}
		got, err := readAll(r, tc.size, tc.max, nil)
		if !errors.Is(err, tc.err) || err == nil && string(got) != tc.want || r.reads != tc.wantReads {
			t.Errorf("%s: %q, %v in %d reads; want %q, %v in %d", tc.name, got, err, r.reads, tc.want, tc.err, tc.wantReads)
		}
	}
}
