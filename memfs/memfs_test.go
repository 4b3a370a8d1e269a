package memfs_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// clock is a fake time source that moves one second per reading.
type clock struct{ n atomic.Int64 }

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func (c *clock) now() time.Time { return epoch.Add(time.Duration(c.n.Add(1)) * time.Second) }

// build makes a workspace from a layout in the conformance kit's language
// (see conformance.Build).
func build(t testing.TB, layout []string, opts ...memfs.Option) *memfs.FS {
	t.Helper()
	f := memfs.New(opts...)
	conformance.Build(t, f, layout...)
	return f
}

// layout is the workspace most tests start from.
var layout = []string{
	"dir/",
	"dir/f.txt: hello",
	"dir/sub/",
	"dir/sub/g.txt: deep",
	"empty/",
	"top.txt: top",
	"fifo|",
	"sock=",
	"link-file => dir/f.txt",
	"link-dir => dir",
	"link-abs => /workspace/dir/f.txt",
	"link-abs-dir => /workspace/dir",
	"link-root => /workspace",
	"dir/up => ../top.txt",
	"dir/parent => ..",
	"link-sub => dir/sub",
	"link-dot => ./dir/sub/.",
	"link-trail => dir/sub/..",
	"tricky => link-sub/../f.txt",
	"chain => link-dir",
	"chain-file => chain/f.txt",
	"link-fifo => fifo",
	"dangling => nowhere.txt",
	"dangling-dir => nodir/x.txt",
	"out-rel => ../etc/passwd",
	"out-abs => /etc/passwd",
	"out-dir => /etc",
	"out-prefix => /workspace2/x",
	"out-dotdot => /workspace/../etc",
	"dir/out-deep => ../../x",
	"out-chain => out-dir",
	"out-via-chain => chain/../../x",
	"loop1 => loop2",
	"loop2 => loop1",
	"self => self",
	"loop-dir => loop-dir/x",
}

var ctx = context.Background()

// wantKind fails the test unless err carries kind (nil: no error) in an
// *fs.PathError.
func wantKind(t *testing.T, what string, err error, kind *workspace.Kind) {
	t.Helper()
	if kind == nil {
		if err != nil {
			t.Errorf("%s: unexpected error %v", what, err)
		}
		return
	}
	if !errors.Is(err, kind) {
		t.Errorf("%s: error %v, want %s", what, err, kind.Name())
		return
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		t.Errorf("%s: error %T is not an *fs.PathError", what, err)
	}
}

func TestStat(t *testing.T) {
	f := build(t, layout)
	tests := []struct {
		name  string
		lstat bool
		kind  *workspace.Kind
		mode  fs.FileMode // type bits expected
		size  int64
	}{
		{name: ".", mode: fs.ModeDir},
		{name: "dir", mode: fs.ModeDir},
		{name: "dir/f.txt", size: 5},
		{name: "fifo", mode: fs.ModeNamedPipe},
		{name: "sock", mode: fs.ModeSocket},
		{name: "link-file", size: 5},
		{name: "link-file", lstat: true, mode: fs.ModeSymlink, size: int64(len("dir/f.txt"))},
		{name: "link-dir", mode: fs.ModeDir},
		{name: "link-dir/f.txt", size: 5},
		{name: "link-dir/f.txt", lstat: true, size: 5},
		{name: "link-abs", size: 5},
		{name: "link-abs-dir/sub/g.txt", size: 4},
		{name: "link-root", mode: fs.ModeDir},
		{name: "link-root/top.txt", size: 3},
		{name: "dir/up", size: 3},
		{name: "dir/parent/top.txt", size: 3},
		{name: "dir/parent/dir/parent/dir/f.txt", size: 5},
		{name: "tricky", size: 5}, // ".." after a link climbs from where the link led, as os.Root does
		{name: "chain/sub/g.txt", size: 4},
		{name: "link-dot", mode: fs.ModeDir},
		{name: "link-dot/g.txt", size: 4},
		{name: "link-trail/f.txt", size: 5},
		{name: "chain-file", size: 5},
		{name: "link-fifo", mode: fs.ModeNamedPipe},
		{name: "missing", kind: workspace.ErrNotFound},
		{name: "missing/x", kind: workspace.ErrNotFound},
		{name: "dangling", kind: workspace.ErrNotFound},
		{name: "dangling", lstat: true, mode: fs.ModeSymlink, size: int64(len("nowhere.txt"))},
		{name: "top.txt/x", kind: workspace.ErrNotADirectory},
		{name: "out-rel", kind: workspace.ErrOutsideWorkspace},
		{name: "out-rel", lstat: true, mode: fs.ModeSymlink, size: int64(len("../etc/passwd"))},
		{name: "out-abs", kind: workspace.ErrOutsideWorkspace},
		{name: "out-dir", kind: workspace.ErrOutsideWorkspace},
		{name: "out-dir", lstat: true, mode: fs.ModeSymlink, size: 4},
		{name: "out-dir/passwd", kind: workspace.ErrOutsideWorkspace},
		{name: "out-dir/passwd", lstat: true, kind: workspace.ErrOutsideWorkspace},
		{name: "out-prefix", kind: workspace.ErrOutsideWorkspace},
		{name: "out-dotdot", kind: workspace.ErrOutsideWorkspace},
		{name: "dir/out-deep", kind: workspace.ErrOutsideWorkspace},
		{name: "out-chain", kind: workspace.ErrOutsideWorkspace},
		{name: "out-chain/x", lstat: true, kind: workspace.ErrOutsideWorkspace},
		{name: "out-via-chain", kind: workspace.ErrOutsideWorkspace},
		{name: "loop1", kind: workspace.ErrInvalidArgument},
		{name: "loop1", lstat: true, mode: fs.ModeSymlink, size: 5},
		{name: "self", kind: workspace.ErrInvalidArgument},
		{name: "self/x", lstat: true, kind: workspace.ErrInvalidArgument},
		{name: "loop-dir", kind: workspace.ErrInvalidArgument},
	}
	for _, tt := range tests {
		op, stat := "Stat", f.Stat
		if tt.lstat {
			op, stat = "Lstat", f.Lstat
		}
		what := fmt.Sprintf("%s(%q)", op, tt.name)
		info, err := stat(ctx, tt.name)
		wantKind(t, what, err, tt.kind)
		if err != nil || tt.kind != nil {
			continue
		}
		if info.Mode().Type() != tt.mode || info.Size() != tt.size {
			t.Errorf("%s = %v size %d, want type %v size %d", what, info.Mode(), info.Size(), tt.mode, tt.size)
		}
		if want := filepath.Base(tt.name); info.Name() != want {
			t.Errorf("%s: Name() = %q, want %q", what, info.Name(), want)
		}
	}
}

func TestInvalidNames(t *testing.T) {
	f := build(t, layout)
	for _, name := range []string{"", "/", "/top.txt", "./top.txt", "dir/", "dir//f.txt", "dir/../top.txt", "..", "a\x00b"} {
		calls := map[string]error{}
		_, calls["Stat"] = f.Stat(ctx, name)
		_, calls["Lstat"] = f.Lstat(ctx, name)
		_, calls["ReadDir"] = f.ReadDir(ctx, name)
		_, calls["ReadFile"] = f.ReadFile(ctx, name, 1<<20)
		calls["WriteFile"] = f.WriteFile(ctx, name, nil, 0o644)
		calls["Mkdir"] = f.Mkdir(ctx, name, 0o755)
		calls["MkdirAll"] = f.MkdirAll(ctx, name, 0o755)
		calls["Remove"] = f.Remove(ctx, name)
		calls["RemoveAll"] = f.RemoveAll(ctx, name)
		calls["Rename from"] = f.Rename(ctx, name, "new")
		calls["Rename to"] = f.Rename(ctx, "top.txt", name)
		calls["Symlink"] = f.Symlink(ctx, "top.txt", name)
		_, calls["Readlink"] = f.Readlink(ctx, name)
		_, calls["Lock"] = f.Lock(ctx, name)
		calls["Mknod"] = f.Mknod(name, fs.ModeNamedPipe)
		calls["Link"] = f.Link("top.txt", name)
		for call, err := range calls {
			wantKind(t, fmt.Sprintf("%s(%q)", call, name), err, workspace.ErrInvalidArgument)
		}
	}
	if _, err := f.Stat(ctx, "top.txt"); err != nil {
		t.Errorf("top.txt lost after invalid calls: %v", err)
	}
}

func TestReadFile(t *testing.T) {
	f := build(t, layout)
	if err := f.WriteFile(ctx, "empty.txt", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		max  int64
		want string
		kind *workspace.Kind
	}{
		{name: "dir/f.txt", max: 100, want: "hello"},
		{name: "dir/f.txt", max: 5, want: "hello"},
		{name: "dir/f.txt", max: 4, kind: workspace.ErrFileTooLarge},
		{name: "empty.txt", max: 0, want: ""},
		{name: "link-file", max: 100, want: "hello"},
		{name: "link-abs", max: 100, want: "hello"},
		{name: "dir/up", max: 100, want: "top"},
		{name: "tricky", max: 100, want: "hello"},
		{name: "chain-file", max: 100, want: "hello"},
		{name: "dir", max: 100, kind: workspace.ErrNotAFile},
		{name: ".", max: 100, kind: workspace.ErrNotAFile},
		{name: "link-dir", max: 100, kind: workspace.ErrNotAFile},
		{name: "fifo", max: 100, kind: workspace.ErrNotAFile},
		{name: "sock", max: 100, kind: workspace.ErrNotAFile},
		{name: "link-fifo", max: 100, kind: workspace.ErrNotAFile},
		{name: "missing", max: 100, kind: workspace.ErrNotFound},
		{name: "dangling", max: 100, kind: workspace.ErrNotFound},
		{name: "top.txt/x", max: 100, kind: workspace.ErrNotADirectory},
		{name: "out-rel", max: 100, kind: workspace.ErrOutsideWorkspace},
		{name: "out-abs", max: 100, kind: workspace.ErrOutsideWorkspace},
		{name: "out-dir/passwd", max: 100, kind: workspace.ErrOutsideWorkspace},
		{name: "out-chain/passwd", max: 100, kind: workspace.ErrOutsideWorkspace},
		{name: "loop1", max: 100, kind: workspace.ErrInvalidArgument},
	}
	for _, tt := range tests {
		what := fmt.Sprintf("ReadFile(%q, %d)", tt.name, tt.max)
		got, err := f.ReadFile(ctx, tt.name, tt.max)
		wantKind(t, what, err, tt.kind)
		if tt.kind == nil && (string(got) != tt.want || got == nil) {
			t.Errorf("%s = %q, want %q", what, got, tt.want)
		}
	}

	// The result is the caller's: changing it changes nothing stored.
	got, _ := f.ReadFile(ctx, "dir/f.txt", 100)
	got[0] = 'J'
	if again, _ := f.ReadFile(ctx, "dir/f.txt", 100); string(again) != "hello" {
		t.Errorf("after changing a result, file holds %q", again)
	}
}

func TestReadDir(t *testing.T) {
	f := build(t, layout)
	tests := []struct {
		name string
		want string // "name:type" list
		kind *workspace.Kind
	}{
		{name: "dir", want: "f.txt:- out-deep:L parent:L sub:d up:L"},
		{name: "link-dir", want: "f.txt:- out-deep:L parent:L sub:d up:L"},
		{name: "link-dir/sub", want: "g.txt:-"},
		{name: "link-dot", want: "g.txt:-"},
		{name: "link-trail", want: "f.txt:- out-deep:L parent:L sub:d up:L"},
		{name: "empty", want: ""},
		{name: "top.txt", kind: workspace.ErrNotADirectory},
		{name: "link-file", kind: workspace.ErrNotADirectory},
		{name: "fifo", kind: workspace.ErrNotADirectory},
		{name: "missing", kind: workspace.ErrNotFound},
		{name: "out-dir", kind: workspace.ErrOutsideWorkspace},
		{name: "loop1", kind: workspace.ErrInvalidArgument},
	}
	for _, tt := range tests {
		what := fmt.Sprintf("ReadDir(%q)", tt.name)
		entries, err := f.ReadDir(ctx, tt.name)
		wantKind(t, what, err, tt.kind)
		if tt.kind != nil {
			continue
		}
		var got []string
		for _, e := range entries {
			typ := "-"
			switch {
			case e.IsDir():
				typ = "d"
			case e.Type()&fs.ModeSymlink != 0:
				typ = "L"
			}
			got = append(got, e.Name()+":"+typ)
		}
		if strings.Join(got, " ") != tt.want {
			t.Errorf("%s = %q, want %q", what, strings.Join(got, " "), tt.want)
		}
	}

	root, err := f.ReadDir(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(root))
	types := map[string]fs.FileMode{}
	for i, e := range root {
		names[i] = e.Name()
		types[e.Name()] = e.Type()
		info, err := e.Info()
		if err != nil || info.Name() != e.Name() || info.Mode().Type() != e.Type() {
			t.Errorf("entry %q: Info() = %v, %v", e.Name(), info, err)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("ReadDir(.) not sorted: %q", names)
	}
	if types["fifo"] != fs.ModeNamedPipe || types["sock"] != fs.ModeSocket || types["out-dir"] != fs.ModeSymlink {
		t.Errorf("ReadDir(.) types: fifo %v, sock %v, out-dir %v", types["fifo"], types["sock"], types["out-dir"])
	}
}

func TestWriteFile(t *testing.T) {
	tests := []struct {
		name   string
		kind   *workspace.Kind
		lands  string // where the data must be read back; "" is name
		keeps  string // a link that must still be a link afterwards
		exists bool   // the target existed: its mode 0600 is kept
	}{
		{name: "new.txt"},
		{name: "dir/new.txt"},
		{name: "dir/f.txt", exists: true},
		{name: "link-dir/new.txt", lands: "dir/new.txt"},
		{name: "link-root/new.txt", lands: "new.txt"},
		{name: "link-file", lands: "dir/f.txt", keeps: "link-file", exists: true},
		{name: "link-abs", lands: "dir/f.txt", keeps: "link-abs", exists: true},
		{name: "chain-file", lands: "dir/f.txt", keeps: "chain-file", exists: true},
		{name: "dir/up", lands: "top.txt", keeps: "dir/up", exists: true},
		{name: "dangling", lands: "nowhere.txt", keeps: "dangling"},
		{name: "dangling-dir", kind: workspace.ErrNotFound},
		{name: "missing/new.txt", kind: workspace.ErrNotFound},
		{name: "top.txt/new.txt", kind: workspace.ErrNotADirectory},
		{name: "dir", kind: workspace.ErrNotAFile},
		{name: ".", kind: workspace.ErrNotAFile},
		{name: "link-dir", kind: workspace.ErrNotAFile},
		{name: "link-trail", kind: workspace.ErrNotAFile},
		{name: "fifo", kind: workspace.ErrNotAFile},
		{name: "link-fifo", kind: workspace.ErrNotAFile},
		{name: "sock", kind: workspace.ErrNotAFile},
		{name: "link-dot/new.txt", lands: "dir/sub/new.txt"},
		{name: "link-trail/new.txt", lands: "dir/new.txt"},
		{name: "out-rel", kind: workspace.ErrOutsideWorkspace},
		{name: "out-abs", kind: workspace.ErrOutsideWorkspace},
		{name: "out-dir/new.txt", kind: workspace.ErrOutsideWorkspace},
		{name: "out-chain/new.txt", kind: workspace.ErrOutsideWorkspace},
		{name: "dir/out-deep", kind: workspace.ErrOutsideWorkspace},
		{name: "out-via-chain", kind: workspace.ErrOutsideWorkspace},
		{name: "loop1", kind: workspace.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := build(t, layout)
			if tt.exists {
				lands := cmp.Or(tt.lands, tt.name)
				if err := f.Remove(ctx, lands); err != nil {
					t.Fatal(err)
				}
				if err := f.WriteFile(ctx, lands, []byte("old"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			before := snapshot(t, f)
			err := f.WriteFile(ctx, tt.name, []byte("new data"), 0o664)
			wantKind(t, "WriteFile", err, tt.kind)
			if tt.kind != nil {
				if after := snapshot(t, f); after != before {
					t.Errorf("a failed WriteFile changed the tree:\n%s\nwas\n%s", after, before)
				}
				return
			}
			lands := cmp.Or(tt.lands, tt.name)
			if got, err := f.ReadFile(ctx, lands, 100); string(got) != "new data" {
				t.Errorf("ReadFile(%q) = %q, %v", lands, got, err)
			}
			info, err := f.Lstat(ctx, lands)
			if err != nil {
				t.Fatal(err)
			}
			want := fs.FileMode(0o644) // 0664 less the umask
			if tt.exists {
				want = 0o600
			}
			if info.Mode() != want {
				t.Errorf("mode of %q = %v, want %v", lands, info.Mode(), want)
			}
			if tt.keeps != "" {
				if info, err := f.Lstat(ctx, tt.keeps); err != nil || info.Mode().Type() != fs.ModeSymlink {
					t.Errorf("link %q after WriteFile: %v, %v", tt.keeps, info, err)
				}
			}
			checkUsed(t, f)
		})
	}
}

// eachEntry calls visit for every entry of the tree, in walk order.
func eachEntry(t *testing.T, f *memfs.FS, visit func(name string, info fs.FileInfo)) {
	t.Helper()
	res, err := workspace.Walk(ctx, f, workspace.WalkRequest{})
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	for _, e := range res.Entries {
		info, err := f.Lstat(ctx, e.Path)
		if err != nil {
			t.Fatalf("Lstat(%q): %v", e.Path, err)
		}
		visit(e.Path, info)
	}
}

// snapshot describes a whole tree, to tell whether anything changed.
func snapshot(t *testing.T, f *memfs.FS) string {
	t.Helper()
	var b strings.Builder
	eachEntry(t, f, func(name string, info fs.FileInfo) {
		fmt.Fprintf(&b, "%s %v %d", name, info.Mode(), info.Size())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := f.Readlink(ctx, name)
			fmt.Fprintf(&b, " -> %s", target)
		case info.Mode().IsRegular():
			data, _ := f.ReadFile(ctx, name, 1<<20)
			fmt.Fprintf(&b, " %q", data)
		}
		b.WriteByte('\n')
	})
	return b.String()
}

// checkUsed fails the test unless Used counts the bytes of every name of a
// regular file in the tree.
func checkUsed(t *testing.T, f *memfs.FS) {
	t.Helper()
	var sum int64
	eachEntry(t, f, func(_ string, info fs.FileInfo) {
		if info.Mode().IsRegular() {
			sum += info.Size()
		}
	})
	if got := f.Used(); got != sum {
		t.Errorf("Used() = %d, but the files hold %d bytes", got, sum)
	}
}

func TestMaxBytes(t *testing.T) {
	f := build(t, []string{"d/", "d/sub/"}, memfs.WithMaxBytes(10))
	steps := []struct {
		desc string
		do   func() error
		kind *workspace.Kind
		used int64
	}{
		{"write 6", func() error { return f.WriteFile(ctx, "a", []byte("123456"), 0o644) }, nil, 6},
		{"write 5 more", func() error { return f.WriteFile(ctx, "b", []byte("12345"), 0o644) }, workspace.ErrNoSpace, 6},
		{"grow a to 10", func() error { return f.WriteFile(ctx, "a", []byte("1234567890"), 0o644) }, nil, 10},
		{"grow a to 11", func() error { return f.WriteFile(ctx, "a", []byte("12345678901"), 0o644) }, workspace.ErrNoSpace, 10},
		{"shrink a to 2", func() error { return f.WriteFile(ctx, "a", []byte("12"), 0o644) }, nil, 2},
		{"empty file", func() error { return f.WriteFile(ctx, "d/e", nil, 0o644) }, nil, 2},
		{"dirs and links cost nothing", func() error { return f.Symlink(ctx, "a", "l") }, nil, 2},
		{"write 4 deep", func() error { return f.WriteFile(ctx, "d/sub/x", []byte("1234"), 0o644) }, nil, 6},
		{"link counts per name", func() error { return f.Link("d/sub/x", "y") }, nil, 10},
		{"one link too many", func() error { return f.Link("d/sub/x", "z") }, workspace.ErrNoSpace, 10},
		{"rename over frees", func() error { return f.Rename(ctx, "a", "y") }, nil, 6},
		{"rename a tree", func() error { return f.Rename(ctx, "d", "e") }, nil, 6},
		{"remove frees", func() error { return f.Remove(ctx, "y") }, nil, 4},
		{"removeall frees", func() error { return f.RemoveAll(ctx, "e") }, nil, 0},
		{"room again", func() error { return f.WriteFile(ctx, "b", []byte("1234567890"), 0o644) }, nil, 10},
	}
	for _, s := range steps {
		before := snapshot(t, f)
		err := s.do()
		wantKind(t, s.desc, err, s.kind)
		if s.kind != nil && snapshot(t, f) != before {
			t.Errorf("%s: failed but changed the tree", s.desc)
		}
		if got := f.Used(); got != s.used {
			t.Errorf("%s: Used() = %d, want %d", s.desc, got, s.used)
		}
		checkUsed(t, f)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 11), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := memfs.FromDir(ctx, dir, memfs.WithMaxBytes(10)); !errors.Is(err, workspace.ErrNoSpace) {
		t.Errorf("FromDir over the bound: %v, want NoSpace", err)
	}
	if f, err := memfs.FromDir(ctx, dir, memfs.WithMaxBytes(11)); err != nil || f.Used() != 11 {
		t.Errorf("FromDir at the bound: %v", err)
	}
}

func TestWriteFileReplacesHardLinks(t *testing.T) {
	f := build(t, []string{"a.txt: shared"})
	if err := f.Link("a.txt", "b.txt"); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.ReadFile(ctx, "b.txt", 100); string(got) != "shared" {
		t.Fatalf("hard link reads %q", got)
	}
	if err := f.WriteFile(ctx, "a.txt", []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, _ := f.ReadFile(ctx, "a.txt", 100)
	b, _ := f.ReadFile(ctx, "b.txt", 100)
	if string(a) != "mine" || string(b) != "shared" {
		t.Errorf("after WriteFile(a.txt): a.txt %q, b.txt %q; want %q, %q", a, b, "mine", "shared")
	}

	// Renaming one name of a file onto another does nothing, as rename(2) does.
	if err := f.Link("b.txt", "c.txt"); err != nil {
		t.Fatal(err)
	}
	if err := f.Rename(ctx, "b.txt", "c.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Lstat(ctx, "b.txt"); err != nil {
		t.Errorf("b.txt after renaming it onto its own hard link: %v", err)
	}

	// A file shared with another workspace, as one outside a disk workspace
	// may be: writing it here leaves the other alone.
	other := build(t, []string{"secret: s3cret"})
	if err := f.LinkFrom(other, "secret", "in.txt"); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.ReadFile(ctx, "in.txt", 100); string(got) != "s3cret" {
		t.Fatalf("linked file reads %q", got)
	}
	if err := f.WriteFile(ctx, "in.txt", []byte("pwned"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := other.ReadFile(ctx, "secret", 100); string(got) != "s3cret" {
		t.Errorf("writing a shared file changed the other workspace: %q", got)
	}

	for _, tt := range []struct {
		old, new string
		kind     *workspace.Kind
	}{
		{"missing", "x", workspace.ErrNotFound},
		{"a.txt", "b.txt", workspace.ErrExists},
		{".", "x", workspace.ErrForbidden},
	} {
		wantKind(t, fmt.Sprintf("Link(%q, %q)", tt.old, tt.new), f.Link(tt.old, tt.new), tt.kind)
	}
}

func TestModes(t *testing.T) {
	f := memfs.New(memfs.WithUmask(0o027))
	if err := f.Mkdir(ctx, "d", 0o777); err != nil {
		t.Fatal(err)
	}
	if err := f.MkdirAll(ctx, "d/e/f", 0o775); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteFile(ctx, "d/x", nil, 0o666|fs.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := f.Mknod("d/p", fs.ModeNamedPipe|0o666); err != nil {
		t.Fatal(err)
	}
	if err := f.Symlink(ctx, "x", "d/l"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]fs.FileMode{
		".":     fs.ModeDir | 0o755,
		"d":     fs.ModeDir | 0o750,
		"d/e":   fs.ModeDir | 0o750,
		"d/e/f": fs.ModeDir | 0o750,
		"d/x":   fs.ModeSetuid | 0o640,
		"d/p":   fs.ModeNamedPipe | 0o640,
		"d/l":   fs.ModeSymlink | 0o777,
	} {
		if info, err := f.Lstat(ctx, name); err != nil || info.Mode() != want {
			t.Errorf("Lstat(%q) = %v, %v; want mode %v", name, info, err, want)
		}
	}
	wantKind(t, "Mknod(regular)", f.Mknod("q", 0o644), workspace.ErrInvalidArgument)
	wantKind(t, "Mknod(dir)", f.Mknod("q", fs.ModeDir|0o644), workspace.ErrInvalidArgument)
	wantKind(t, "Mknod(existing)", f.Mknod("d/l", fs.ModeSocket), workspace.ErrExists)
}

func TestModTimes(t *testing.T) {
	var c clock
	f := memfs.New(memfs.WithClock(c.now))
	mtime := func(name string) time.Time {
		t.Helper()
		info, err := f.Lstat(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return info.ModTime()
	}
	steps := []struct {
		do      func() error
		changed []string // names whose time must move
		kept    []string // names whose time must not
	}{
		{func() error { return f.Mkdir(ctx, "d", 0o755) }, []string{".", "d"}, nil},
		{func() error { return f.WriteFile(ctx, "d/a", []byte("1"), 0o644) }, []string{"d", "d/a"}, []string{"."}},
		{func() error { return f.WriteFile(ctx, "d/a", []byte("2"), 0o644) }, []string{"d/a"}, []string{"."}},
		{func() error { return f.Symlink(ctx, "a", "d/l") }, []string{"d", "d/l"}, []string{"d/a"}},
		{func() error { return f.Rename(ctx, "d/l", "l") }, []string{".", "d"}, []string{"d/a"}},
		{func() error { return f.Remove(ctx, "l") }, []string{"."}, []string{"d"}},
		{func() error { _, err := f.ReadFile(ctx, "d/a", 10); return err }, nil, []string{".", "d", "d/a"}},
	}
	for i, s := range steps {
		before := map[string]time.Time{}
		for _, n := range append(slices.Clone(s.kept), s.changed...) {
			if _, err := f.Lstat(ctx, n); err == nil {
				before[n] = mtime(n)
			}
		}
		if err := s.do(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		for _, n := range s.changed {
			if got := mtime(n); !got.After(before[n]) {
				t.Errorf("step %d: %q time %v, want after %v", i, n, got, before[n])
			}
		}
		for _, n := range s.kept {
			if got := mtime(n); !got.Equal(before[n]) {
				t.Errorf("step %d: %q time moved from %v to %v", i, n, before[n], got)
			}
		}
	}
}

func TestMkdir(t *testing.T) {
	tests := []struct {
		name string
		all  bool
		kind *workspace.Kind
		dir  string // where the directory must exist afterwards; "" is name
	}{
		{name: "new"},
		{name: "dir/new"},
		{name: "link-dir/new", dir: "dir/new"},
		{name: "dir", kind: workspace.ErrExists},
		{name: ".", kind: workspace.ErrExists},
		{name: "top.txt", kind: workspace.ErrExists},
		{name: "link-dir", kind: workspace.ErrExists},
		{name: "dangling", kind: workspace.ErrExists},
		{name: "out-dir", kind: workspace.ErrExists},
		{name: "missing/new", kind: workspace.ErrNotFound},
		{name: "top.txt/new", kind: workspace.ErrNotADirectory},
		{name: "out-dir/new", kind: workspace.ErrOutsideWorkspace},
		{name: "out-chain/new", kind: workspace.ErrOutsideWorkspace},

		{name: ".", all: true},
		{name: "dir", all: true},
		{name: "a/b/c", all: true},
		{name: "dir/sub/x/y", all: true},
		{name: "link-dir/x/y", all: true, dir: "dir/x/y"},
		{name: "chain/x", all: true, dir: "dir/x"},
		{name: "link-dot/x", all: true, dir: "dir/sub/x"},
		{name: "link-trail", all: true, dir: "dir"},
		{name: "link-dir", all: true, dir: "dir"},
		{name: "top.txt", all: true, kind: workspace.ErrNotADirectory},
		{name: "top.txt/a/b", all: true, kind: workspace.ErrNotADirectory},
		{name: "link-file/a", all: true, kind: workspace.ErrNotADirectory},
		{name: "dangling/a", all: true, kind: workspace.ErrExists},
		{name: "out-dir/a", all: true, kind: workspace.ErrOutsideWorkspace},
		{name: "out-rel", all: true, kind: workspace.ErrOutsideWorkspace},
		{name: "loop1/a", all: true, kind: workspace.ErrInvalidArgument},
	}
	for _, tt := range tests {
		op, mkdir := "Mkdir", f0Mkdir
		if tt.all {
			op, mkdir = "MkdirAll", f0MkdirAll
		}
		t.Run(op+"/"+tt.name, func(t *testing.T) {
			f := build(t, layout)
			before := snapshot(t, f)
			err := mkdir(f, tt.name)
			wantKind(t, op, err, tt.kind)
			if tt.kind != nil {
				if snapshot(t, f) != before {
					t.Errorf("a failed %s changed the tree", op)
				}
				return
			}
			dir := cmp.Or(tt.dir, tt.name)
			if info, err := f.Lstat(ctx, dir); err != nil || !info.IsDir() {
				t.Errorf("Lstat(%q) after %s = %v, %v", dir, op, info, err)
			}
		})
	}
}

func f0Mkdir(f *memfs.FS, name string) error    { return f.Mkdir(ctx, name, 0o755) }
func f0MkdirAll(f *memfs.FS, name string) error { return f.MkdirAll(ctx, name, 0o755) }

func TestRemove(t *testing.T) {
	tests := []struct {
		name  string
		all   bool
		kind  *workspace.Kind
		gone  []string // names that must no longer exist (Lstat)
		stays []string // names that must still exist
	}{
		{name: "top.txt", gone: []string{"top.txt"}, stays: []string{"dir/up"}},
		{name: "empty", gone: []string{"empty"}},
		{name: "fifo", gone: []string{"fifo"}},
		{name: "link-file", gone: []string{"link-file"}, stays: []string{"dir/f.txt"}},
		{name: "link-dir", gone: []string{"link-dir"}, stays: []string{"dir/f.txt"}},
		{name: "out-dir", gone: []string{"out-dir"}},
		{name: "loop1", gone: []string{"loop1"}, stays: []string{"loop2"}},
		{name: "link-dir/f.txt", gone: []string{"dir/f.txt"}},
		{name: "dir", kind: workspace.ErrNotEmpty},
		{name: ".", kind: workspace.ErrInvalidArgument},
		{name: "missing", kind: workspace.ErrNotFound},
		{name: "missing/x", kind: workspace.ErrNotFound},
		{name: "top.txt/x", kind: workspace.ErrNotADirectory},
		{name: "out-dir/passwd", kind: workspace.ErrOutsideWorkspace},

		{name: "dir", all: true, gone: []string{"dir", "dir/f.txt"}, stays: []string{"top.txt", "link-dir"}},
		{name: "link-dir", all: true, gone: []string{"link-dir"}, stays: []string{"dir/sub/g.txt"}},
		{name: "link-root", all: true, gone: []string{"link-root"}, stays: []string{"top.txt"}},
		{name: "link-dir/sub", all: true, gone: []string{"dir/sub"}, stays: []string{"dir/f.txt"}},
		{name: "top.txt", all: true, gone: []string{"top.txt"}},
		{name: "out-dir", all: true, gone: []string{"out-dir"}},
		{name: "missing", all: true},
		{name: "missing/x/y", all: true},
		{name: ".", all: true, kind: workspace.ErrInvalidArgument},
		{name: "top.txt/x", all: true, kind: workspace.ErrNotADirectory},
		{name: "out-dir/x", all: true, kind: workspace.ErrOutsideWorkspace},
	}
	for _, tt := range tests {
		op, remove := "Remove", (*memfs.FS).Remove
		if tt.all {
			op, remove = "RemoveAll", (*memfs.FS).RemoveAll
		}
		t.Run(op+"/"+tt.name, func(t *testing.T) {
			f := build(t, layout)
			before := snapshot(t, f)
			err := remove(f, ctx, tt.name)
			wantKind(t, op, err, tt.kind)
			if tt.kind != nil || len(tt.gone) == 0 {
				if snapshot(t, f) != before {
					t.Errorf("%s changed the tree but should not have", op)
				}
			}
			for _, n := range tt.gone {
				if _, err := f.Lstat(ctx, n); !errors.Is(err, workspace.ErrNotFound) {
					t.Errorf("Lstat(%q) after %s: %v, want NotFound", n, op, err)
				}
			}
			for _, n := range tt.stays {
				if _, err := f.Lstat(ctx, n); err != nil {
					t.Errorf("Lstat(%q) after %s: %v", n, op, err)
				}
			}
			checkUsed(t, f)
		})
	}
}

func TestRename(t *testing.T) {
	tests := []struct {
		old, new string
		kind     *workspace.Kind
		check    string // a name that must hold "hello" afterwards, or be a link if it ends in @
	}{
		{old: "dir/f.txt", new: "g.txt", check: "g.txt"},
		{old: "dir/f.txt", new: "top.txt", check: "top.txt"},
		{old: "dir/f.txt", new: "link-dir/sub/f.txt", check: "dir/sub/f.txt"},
		{old: "dir", new: "empty", check: "empty/f.txt"},
		{old: "dir", new: "newdir", check: "newdir/f.txt"},
		{old: "dir/f.txt", new: "dir/f.txt", check: "dir/f.txt"},
		{old: "link-file", new: "moved", check: "moved@"},
		{old: "link-dir", new: "top.txt", check: "top.txt@"},
		{old: "dir/f.txt", new: "link-file", check: "link-file"}, // the link is replaced, not followed
		{old: "dir/f.txt", new: "fifo", check: "fifo"},
		{old: "out-dir", new: "dir/out", check: "dir/out@"},
		{old: "missing", new: "x", kind: workspace.ErrNotFound},
		{old: "dangling", new: "x", check: "x@"},
		{old: "top.txt", new: "missing/x", kind: workspace.ErrNotFound},
		{old: "top.txt", new: "dir", kind: workspace.ErrExists},
		{old: "top.txt", new: "empty", kind: workspace.ErrExists},
		{old: "empty", new: "top.txt", kind: workspace.ErrNotADirectory},
		{old: "empty", new: "dir", kind: workspace.ErrNotEmpty},
		{old: "dir", new: "dir/sub/x", kind: workspace.ErrInvalidArgument},
		{old: "dir", new: "link-dir/x", kind: workspace.ErrInvalidArgument},
		{old: ".", new: "x", kind: workspace.ErrInvalidArgument},
		{old: "top.txt", new: ".", kind: workspace.ErrInvalidArgument},
		{old: "top.txt", new: "out-dir/x", kind: workspace.ErrOutsideWorkspace},
		{old: "out-dir/passwd", new: "x", kind: workspace.ErrOutsideWorkspace},
		{old: "top.txt", new: "top.txt/x", kind: workspace.ErrNotADirectory},
	}
	for _, tt := range tests {
		t.Run(tt.old+"->"+tt.new, func(t *testing.T) {
			f := build(t, layout)
			before := snapshot(t, f)
			err := f.Rename(ctx, tt.old, tt.new)
			wantKind(t, "Rename", err, tt.kind)
			if tt.kind != nil {
				if snapshot(t, f) != before {
					t.Errorf("a failed Rename changed the tree")
				}
				return
			}
			if name, ok := strings.CutSuffix(tt.check, "@"); ok {
				if info, err := f.Lstat(ctx, name); err != nil || info.Mode().Type() != fs.ModeSymlink {
					t.Errorf("Lstat(%q) = %v, %v; want a link", name, info, err)
				}
			} else if got, err := f.ReadFile(ctx, tt.check, 100); string(got) != "hello" {
				t.Errorf("ReadFile(%q) = %q, %v", tt.check, got, err)
			}
			if tt.old != tt.new {
				if _, err := f.Lstat(ctx, tt.old); !errors.Is(err, workspace.ErrNotFound) {
					t.Errorf("Lstat(%q) after Rename: %v", tt.old, err)
				}
			}
			checkUsed(t, f)
		})
	}
}

func TestSymlink(t *testing.T) {
	f := build(t, layout)
	tests := []struct {
		target, name string
		kind         *workspace.Kind
	}{
		{"dir/f.txt", "new-link", nil},
		{"/etc/shadow", "dir/new-out", nil}, // stored as given; following it is refused
		{"x", "top.txt", workspace.ErrExists},
		{"x", "dangling", workspace.ErrExists},
		{"x", "dir", workspace.ErrExists},
		{"x", "missing/l", workspace.ErrNotFound},
		{"x", "out-dir/l", workspace.ErrOutsideWorkspace},
		{"", "empty-target", workspace.ErrInvalidArgument},
		{"a\x00b", "nul-target", workspace.ErrInvalidArgument},
	}
	for _, tt := range tests {
		what := fmt.Sprintf("Symlink(%q, %q)", tt.target, tt.name)
		wantKind(t, what, f.Symlink(ctx, tt.target, tt.name), tt.kind)
		if tt.kind == nil {
			if got, err := f.Readlink(ctx, tt.name); got != tt.target || err != nil {
				t.Errorf("Readlink after %s = %q, %v", what, got, err)
			}
		}
	}
	if _, err := f.ReadFile(ctx, "dir/new-out", 100); !errors.Is(err, workspace.ErrOutsideWorkspace) {
		t.Errorf("following a new link outside: %v", err)
	}
	for name, kind := range map[string]*workspace.Kind{
		"top.txt":        workspace.ErrInvalidArgument,
		"dir":            workspace.ErrInvalidArgument,
		"missing":        workspace.ErrNotFound,
		"out-dir/passwd": workspace.ErrOutsideWorkspace,
	} {
		_, err := f.Readlink(ctx, name)
		wantKind(t, fmt.Sprintf("Readlink(%q)", name), err, kind)
	}
	if got, err := f.Readlink(ctx, "link-dir/up"); got != "../top.txt" || err != nil {
		t.Errorf("Readlink through a linked directory = %q, %v", got, err)
	}
}

func TestWithRoot(t *testing.T) {
	f := build(t, []string{"a.txt: a", "in => /srv/ws/a.txt", "old => /workspace/a.txt"}, memfs.WithRoot("/srv/ws/"))
	if f.Root() != "/srv/ws" {
		t.Errorf("Root() = %q", f.Root())
	}
	if got, err := f.ReadFile(ctx, "in", 10); string(got) != "a" {
		t.Errorf("ReadFile(in) = %q, %v", got, err)
	}
	if _, err := f.ReadFile(ctx, "old", 10); !errors.Is(err, workspace.ErrOutsideWorkspace) {
		t.Errorf("ReadFile(old) = %v, want OutsideWorkspace", err)
	}
	if memfs.New().Root() != memfs.DefaultRoot {
		t.Errorf("default Root() = %q", memfs.New().Root())
	}
}

func TestErrorOps(t *testing.T) {
	f := build(t, layout)
	_, statErr := f.Stat(ctx, "missing")
	_, lstatErr := f.Lstat(ctx, "missing")
	_, readErr := f.ReadFile(ctx, "missing", 1)
	_, tooLarge := f.ReadFile(ctx, "top.txt", 1)
	_, dirErr := f.ReadDir(ctx, "missing")
	_, linkErr := f.Readlink(ctx, "top.txt")
	for _, tt := range []struct {
		err      error
		op, path string
	}{
		{statErr, "stat", "missing"},
		{lstatErr, "lstat", "missing"},
		{readErr, "open", "missing"},
		{tooLarge, "read", "top.txt"},
		{dirErr, "open", "missing"},
		{f.WriteFile(ctx, "dir", nil, 0), "open", "dir"},
		{f.Mkdir(ctx, "dir", 0), "mkdir", "dir"},
		{f.MkdirAll(ctx, "top.txt/a", 0), "mkdir", "top.txt"},
		{f.Remove(ctx, "dir"), "remove", "dir"},
		{f.Rename(ctx, "missing", "x"), "rename", "missing"},
		{f.Rename(ctx, "top.txt", "missing/x"), "rename", "missing/x"},
		{f.Symlink(ctx, "x", "dir"), "symlink", "dir"},
		{linkErr, "readlink", "top.txt"},
	} {
		var pe *fs.PathError
		if !errors.As(tt.err, &pe) || pe.Op != tt.op || pe.Path != tt.path {
			t.Errorf("error %v: want op %q path %q", tt.err, tt.op, tt.path)
		}
	}
	_, loopErr := f.Stat(ctx, "loop1")
	if !strings.Contains(loopErr.Error(), "too many levels of symbolic links") {
		t.Errorf("link loop error %q does not say what went wrong", loopErr)
	}
}

func TestContextEnded(t *testing.T) {
	f := build(t, layout)
	done, cancel := context.WithCancel(ctx)
	cancel()
	before := snapshot(t, f)
	calls := map[string]error{}
	_, calls["Stat"] = f.Stat(done, "top.txt")
	_, calls["Lstat"] = f.Lstat(done, "top.txt")
	_, calls["ReadDir"] = f.ReadDir(done, ".")
	_, calls["ReadFile"] = f.ReadFile(done, "top.txt", 100)
	calls["WriteFile"] = f.WriteFile(done, "top.txt", nil, 0o644)
	calls["Mkdir"] = f.Mkdir(done, "x", 0o755)
	calls["MkdirAll"] = f.MkdirAll(done, "x/y", 0o755)
	calls["Remove"] = f.Remove(done, "top.txt")
	calls["RemoveAll"] = f.RemoveAll(done, "dir")
	calls["Rename"] = f.Rename(done, "top.txt", "x")
	calls["Symlink"] = f.Symlink(done, "top.txt", "x")
	_, calls["Readlink"] = f.Readlink(done, "link-file")
	_, calls["Lock"] = f.Lock(done, "top.txt")
	for call, err := range calls {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with an ended context: %v", call, err)
		}
	}
	if snapshot(t, f) != before {
		t.Errorf("calls with an ended context changed the tree")
	}
}

func TestLock(t *testing.T) {
	f := build(t, layout)
	unlock, err := f.Lock(ctx, "dir/f.txt")
	if err != nil {
		t.Fatal(err)
	}
	// The same file through a link, or through a linked directory, is the same lock.
	for _, name := range []string{"dir/f.txt", "link-file", "link-dir/f.txt", "chain-file"} {
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, err := f.Lock(short, name)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock(%q) while dir/f.txt is held: %v, want a timeout", name, err)
		}
	}
	// Other files are free, existing or not.
	for _, name := range []string{"top.txt", "not/yet/there.txt", "."} {
		u, err := f.Lock(ctx, name)
		if err != nil {
			t.Errorf("Lock(%q): %v", name, err)
			continue
		}
		u()
	}
	_, err = f.Lock(ctx, "out-dir/x")
	wantKind(t, "Lock(out-dir/x)", err, workspace.ErrOutsideWorkspace)

	got := make(chan struct{})
	go func() {
		u, err := f.Lock(ctx, "link-file")
		if err == nil {
			u()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("Lock(link-file) returned while dir/f.txt was held")
	case <-time.After(10 * time.Millisecond):
	}
	unlock()
	unlock() // a second call does nothing
	<-got
}

// TestConcurrent runs writers, renamers and readers at once (run with -race):
// a reader sees one whole version of a file, never a mix.
func TestConcurrent(t *testing.T) {
	f := build(t, []string{"d/", "d/f.txt: " + strings.Repeat("a", 4096)})
	versions := [][]byte{bytes.Repeat([]byte("a"), 4096), bytes.Repeat([]byte("b"), 8192), {}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				buf := slices.Clone(versions[(i+w)%len(versions)])
				if err := f.WriteFile(ctx, "d/f.txt", buf, 0o644); err != nil {
					t.Error(err)
					return
				}
				clear(buf) // the caller may reuse its buffer at once
				name := fmt.Sprintf("d/tmp%d", w)
				if err := f.WriteFile(ctx, name, []byte("x"), 0o644); err != nil {
					t.Error(err)
					return
				}
				if err := f.Rename(ctx, name, fmt.Sprintf("d/r%d", w)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 4 {
		wg.Go(func() {
			for range 300 {
				data, err := f.ReadFile(ctx, "d/f.txt", 1<<20)
				if err != nil {
					t.Error(err)
					return
				}
				if !slices.ContainsFunc(versions, func(v []byte) bool { return bytes.Equal(v, data) }) {
					t.Errorf("read a mixed or changed version of %d bytes", len(data))
					return
				}
				if _, err := f.ReadDir(ctx, "d"); err != nil {
					t.Error(err)
					return
				}
				if _, err := workspace.Walk(ctx, f, workspace.WalkRequest{}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
}

func TestFromDir(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "src/pkg"), 0o750))
	must(os.WriteFile(filepath.Join(dir, "src/pkg/a.go"), []byte("package pkg\n"), 0o640))
	must(os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Symlink("src/pkg/a.go", filepath.Join(dir, "rel")))
	must(os.Symlink(filepath.Join(dir, "run.sh"), filepath.Join(dir, "abs-in")))
	must(os.Symlink(dir, filepath.Join(dir, "abs-root")))
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "abs-out")))
	must(os.Symlink("../outside", filepath.Join(dir, "rel-out")))
	old := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	must(os.Chtimes(filepath.Join(dir, "src/pkg/a.go"), old, old))
	must(os.Chtimes(filepath.Join(dir, "src/pkg"), old, old))
	if l, err := net.Listen("unix", filepath.Join(dir, "sock")); err == nil {
		defer l.Close()
	} else {
		t.Logf("no unix socket here (%v): the skipping of special files goes untested", err)
	}

	f, err := memfs.FromDir(ctx, dir)
	must(err)
	checkUsed(t, f)
	for _, tt := range []struct {
		name string
		mode fs.FileMode
		data string // for files
		link string // for links
	}{
		{name: "src", mode: fs.ModeDir | 0o750},
		{name: "src/pkg", mode: fs.ModeDir | 0o750},
		{name: "src/pkg/a.go", mode: 0o640, data: "package pkg\n"},
		{name: "run.sh", mode: 0o755, data: "#!/bin/sh\n"},
		{name: "rel", mode: fs.ModeSymlink | 0o777, link: "src/pkg/a.go"},
		{name: "abs-in", mode: fs.ModeSymlink | 0o777, link: "/workspace/run.sh"},
		{name: "abs-root", mode: fs.ModeSymlink | 0o777, link: "/workspace"},
		{name: "abs-out", mode: fs.ModeSymlink | 0o777, link: "/etc/passwd"},
		{name: "rel-out", mode: fs.ModeSymlink | 0o777, link: "../outside"},
	} {
		info, err := f.Lstat(ctx, tt.name)
		if err != nil {
			t.Errorf("Lstat(%q): %v", tt.name, err)
			continue
		}
		if info.Mode() != tt.mode {
			t.Errorf("%q: mode %v, want %v", tt.name, info.Mode(), tt.mode)
		}
		if tt.data != "" {
			if got, _ := f.ReadFile(ctx, tt.name, 100); string(got) != tt.data {
				t.Errorf("%q holds %q, want %q", tt.name, got, tt.data)
			}
		}
		if tt.link != "" {
			if got, _ := f.Readlink(ctx, tt.name); got != tt.link {
				t.Errorf("%q links to %q, want %q", tt.name, got, tt.link)
			}
		}
	}
	for _, name := range []string{"src/pkg", "src/pkg/a.go"} {
		if info, _ := f.Lstat(ctx, name); !info.ModTime().Equal(old) {
			t.Errorf("%q: time %v, want %v", name, info.ModTime(), old)
		}
	}
	if got, err := f.ReadFile(ctx, "abs-root/rel", 100); string(got) != "package pkg\n" {
		t.Errorf("through abs-root/rel: %q, %v", got, err)
	}
	if _, err := f.Lstat(ctx, "sock"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("a socket was copied: %v", err)
	}
	if _, err := memfs.FromDir(ctx, filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("FromDir(missing) = %v", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := memfs.FromDir(done, dir); !errors.Is(err, context.Canceled) {
		t.Errorf("FromDir with an ended context = %v", err)
	}
}

// The generic walk and grep are what memfs offers; these show what they cost.
func benchTree(b *testing.B) *memfs.FS {
	f := memfs.New()
	line := []byte("the quick brown fox jumps over the lazy dog\n")
	for d := range 20 {
		dir := fmt.Sprintf("pkg%02d/sub", d)
		if err := f.MkdirAll(ctx, dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for i := range 100 {
			if err := f.WriteFile(ctx, fmt.Sprintf("%s/f%03d.go", dir, i), bytes.Repeat(line, 50), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	return f
}

func BenchmarkWalk(b *testing.B) {
	f := benchTree(b)
	for b.Loop() {
		if res, err := workspace.Walk(ctx, f, workspace.WalkRequest{Pattern: "**/*.go"}); err != nil || len(res.Entries) != 2000 {
			b.Fatal(len(res.Entries), err)
		}
	}
}

func BenchmarkGrep(b *testing.B) {
	f := benchTree(b)
	for b.Loop() {
		if res, err := workspace.Grep(ctx, f, workspace.GrepRequest{Pattern: "lazy", Limit: 100}); err != nil || res.Matches != 100 {
			b.Fatal(res.Matches, err)
		}
	}
}

func BenchmarkReadFile(b *testing.B) {
	f := benchTree(b)
	for b.Loop() {
		if _, err := f.ReadFile(ctx, "pkg10/sub/f050.go", 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteFile(b *testing.B) {
	f := benchTree(b)
	data := bytes.Repeat([]byte("x"), 2048)
	for b.Loop() {
		if err := f.WriteFile(ctx, "pkg10/sub/f050.go", data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// TestChanges: every change is logged at its real name — both names of a
// rename, the target of a link written through — and a generation the FS
// no longer remembers back to says so.
func TestChanges(t *testing.T) {
	ctx := t.Context()
	f := memfs.New()
	if names, now, ok := f.Changes(0); !ok || now != 0 || len(names) != 0 {
		t.Fatalf("a new FS: Changes(0) = %q, %d, %v", names, now, ok)
	}
	steps := []struct {
		do   func() error
		want []string
	}{
		{func() error { return f.MkdirAll(ctx, "a/b", 0o755) }, []string{"a", "a/b"}},
		{func() error { return f.WriteFile(ctx, "a/b/f", []byte("x"), 0o644) }, []string{"a/b/f"}},
		{func() error { return f.Symlink(ctx, "a/b", "l") }, []string{"l"}},
		{func() error { return f.WriteFile(ctx, "l/f", []byte("y"), 0o644) }, []string{"a/b/f"}},
		{func() error { return f.Rename(ctx, "a/b", "c") }, []string{"a/b", "c"}},
		{func() error { return f.Remove(ctx, "l") }, []string{"l"}},
		{func() error { return f.RemoveAll(ctx, "c") }, []string{"c"}},
		{func() error { return f.Remove(ctx, "missing") }, nil},
	}
	_, since, _ := f.Changes(0)
	for i, s := range steps {
		s.do()
		names, now, ok := f.Changes(since)
		if !ok || !slices.Equal(names, s.want) {
			t.Errorf("step %d: Changes = %q, %v; want %q", i, names, ok, s.want)
		}
		since = now
	}
	for i := range 5000 {
		if err := f.WriteFile(ctx, "f", []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, ok := f.Changes(since); ok {
		t.Error("Changes from before 5000 writes is ok; want not remembered")
	}
	if names, _, ok := f.Changes(since + 4000); !ok || len(names) != 1000 {
		t.Errorf("Changes of the last 1000 writes: %d names, %v", len(names), ok)
	}
}

// TestAppendToSharedFile: appends to two names of one file (a hard link)
// each write past the file they found, not into each other's bytes, though
// an append takes over the spare capacity of what it replaced.
func TestAppendToSharedFile(t *testing.T) {
	ctx := context.Background()
	f := memfs.New()
	if err := f.WriteFile(ctx, "a", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ name, data string }{{"a", "1"}, {"a", "2"}} {
		if err := f.AppendFile(ctx, step.name, []byte(step.data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Link("a", "b"); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ name, data string }{{"a", "3"}, {"b", "4"}, {"a", "5"}, {"b", "6"}} {
		if err := f.AppendFile(ctx, step.name, []byte(step.data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"a": "x1235", "b": "x1246"} {
		if got, _ := f.ReadFile(ctx, name, 100); string(got) != want {
			t.Errorf("%s holds %q, want %q", name, got, want)
		}
	}
}
