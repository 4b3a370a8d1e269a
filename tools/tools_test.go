package tools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// fixture is a memory workspace with files, and a tool set over it.
type fixture struct {
	t   *testing.T
	fs  *memfs.FS
	set *tools.Set
}

// newFixture builds a set over a memfs holding layout (see
// conformance.Build). configure may change the default configuration, which
// grants everything and makes every skill active.
func newFixture(t *testing.T, layout []string, configure ...func(*tools.Config)) *fixture {
	t.Helper()
	fsys := memfs.New()
	conformance.Build(t, fsys, layout...)
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantFSWrite, tools.GrantShellExec}
	cfg.Always = []string{"read", "edit"}
	cfg.MaxCallsPerRun = 0
	for _, c := range configure {
		c(&cfg)
	}
	set, err := tools.New(tools.Env{FS: fsys, Session: workspace.Session{ID: "s1", RunID: "r1", Root: "/workspace"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, fs: fsys, set: set}
}

func (f *fixture) call(tool string, args any) tools.Result {
	f.t.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		f.t.Fatal(err)
	}
	return f.set.Call(context.Background(), tool, raw, tools.CallOptions{})
}

func (f *fixture) file(name string) string {
	f.t.Helper()
	data, err := f.fs.ReadFile(context.Background(), name, 1<<30)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(data)
}

// errKind returns the error kind of a failed result, or "" for a success.
func errKind(r tools.Result) string {
	if !r.IsError {
		return ""
	}
	return r.Structured.(*tools.ErrorResult).Error
}

func numbered(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString("line ")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString("\n")
	}
	return b.String()
}

func encode(t *testing.T, enc func(*bytes.Buffer, image.Image) error, w, h int) string {
	t.Helper()
	var b bytes.Buffer
	if err := enc(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func pngOf(t *testing.T, w, h int) string {
	return encode(t, func(b *bytes.Buffer, m image.Image) error { return png.Encode(b, m) }, w, h)
}

func TestRead(t *testing.T) {
	long := numbered(5400)
	bigLine := strings.Repeat("é", 30000) + "\nnext\n" // 60000 bytes on line 1
	f := newFixture(t, []string{
		"a.txt: alpha\nbeta\ngamma\n",
		"long.txt: " + long,
		"wide.txt: " + bigLine,
		"empty.txt",
		"latin1.txt: caf\xe9 ok\n",
		"bin.dat: PK\x03\x04\x00\x00rest",
		"pic.txt: " + pngOf(t, 3, 2), // a PNG whatever the name says
		"pic.jpg: " + encode(t, func(b *bytes.Buffer, m image.Image) error { return jpeg.Encode(b, m, nil) }, 5, 4),
		"pic.gif: " + encode(t, func(b *bytes.Buffer, m image.Image) error { return gif.Encode(b, m, nil) }, 7, 6),
		"wide.png: " + pngOf(t, 8001, 1),
		"headless.png: \x89PNG\r\n\x1a\nshort",
		"sub/link => ../a.txt",
		"out => /etc/passwd",
		"dir/x: x",
		"fifo|",
	})
	tests := []struct {
		name string
		args map[string]any
		kind string
		text string // the whole text, or with a leading "…" its ending
		want any    // compared with the structured content when set
	}{
		{"whole", map[string]any{"path": "a.txt"}, "", "alpha\nbeta\ngamma\n",
			&tools.ReadResult{Path: "a.txt", Content: "alpha\nbeta\ngamma\n", StartLine: 1, EndLine: 3, TotalLines: 3}},
		{"window", map[string]any{"path": "a.txt", "offset": 2, "limit": 1}, "", "beta\n\n[Showing lines 2-2 of 3. Use offset=3 to continue.]",
			&tools.ReadResult{Path: "a.txt", Content: "beta\n", StartLine: 2, EndLine: 2, TotalLines: 3, NextOffset: 3, Truncated: true}},
		{"absolute inside", map[string]any{"path": "/workspace/a.txt", "offset": 3}, "", "gamma\n", nil},
		{"through a link", map[string]any{"path": "sub/link"}, "", "alpha\nbeta\ngamma\n", nil},
		{"pages", map[string]any{"path": "long.txt"}, "", "…line xxxxx\n\n[Showing lines 1-2000 of 5400. Use offset=2001 to continue.]", nil},
		{"last page", map[string]any{"path": "long.txt", "offset": 5001}, "", "…line xxx\n", nil},
		{"one wide line", map[string]any{"path": "wide.txt"}, "", "…Use offset=2 to continue.]", nil},
		{"empty", map[string]any{"path": "empty.txt"}, "", "",
			&tools.ReadResult{Path: "empty.txt"}},
		{"past the end", map[string]any{"path": "a.txt", "offset": 9}, "InvalidArgument", "", nil},
		{"not utf-8", map[string]any{"path": "latin1.txt"}, "", "caf\uFFFD ok\n\n[The file is not valid UTF-8: bytes that are not are shown as U+FFFD.]", nil},
		{"binary", map[string]any{"path": "bin.dat"}, "", "[Binary file bin.dat (application/zip, 10 B) not shown.]",
			&tools.ReadBinaryResult{Path: "bin.dat", Binary: true, MIMEType: "application/zip", Bytes: 10}},
		{"png by its bytes", map[string]any{"path": "pic.txt"}, "", "", nil},
		{"jpeg", map[string]any{"path": "pic.jpg"}, "", "", nil},
		{"gif", map[string]any{"path": "pic.gif"}, "", "", nil},
		{"too wide", map[string]any{"path": "wide.png"}, "ImageRejected", "", nil},
		{"no size", map[string]any{"path": "headless.png"}, "ImageRejected", "", nil},
		{"directory", map[string]any{"path": "dir"}, "NotAFile", "", nil},
		{"fifo", map[string]any{"path": "fifo"}, "NotAFile", "", nil},
		{"missing", map[string]any{"path": "nope"}, "NotFound", "", nil},
		{"dotdot", map[string]any{"path": "../etc/passwd"}, "OutsideWorkspace", "", nil},
		{"absolute outside", map[string]any{"path": "/etc/passwd"}, "OutsideWorkspace", "", nil},
		{"link outside", map[string]any{"path": "out"}, "OutsideWorkspace", "", nil},
		{"no path", map[string]any{}, "InvalidArgument", "", nil},
		{"bad offset", map[string]any{"path": "a.txt", "offset": 0}, "InvalidArgument", "", nil},
		{"unknown argument", map[string]any{"path": "a.txt", "lines": 3}, "InvalidArgument", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.call("read", tt.args)
			if got := errKind(r); got != tt.kind {
				t.Fatalf("kind %q, want %q: %s", got, tt.kind, r.Text)
			}
			if tt.kind != "" {
				return
			}
			if end, ok := strings.CutPrefix(tt.text, "…"); ok {
				if !strings.HasSuffix(r.Text, end) {
					t.Errorf("text ends %q, want …%q", r.Text[max(0, len(r.Text)-80):], end)
				}
			} else if tt.text != "" && r.Text != tt.text {
				t.Errorf("text %q, want %q", r.Text, tt.text)
			}
			if tt.want != nil && !reflect.DeepEqual(r.Structured, tt.want) {
				t.Errorf("structured %+v, want %+v", r.Structured, tt.want)
			}
		})
	}

	t.Run("page sizes", func(t *testing.T) {
		r := f.call("read", map[string]any{"path": "long.txt", "offset": 2001}).Structured.(*tools.ReadResult)
		if r.StartLine != 2001 || r.EndLine != 4000 || r.NextOffset != 4001 || r.Content != strings.Join(strings.SplitAfter(long, "\n")[2000:4000], "") {
			t.Errorf("second page %d-%d next %d", r.StartLine, r.EndLine, r.NextOffset)
		}
		w := f.call("read", map[string]any{"path": "wide.txt"}).Structured.(*tools.ReadResult)
		if len(w.Content) != tools.DefaultMaxBytes || w.NextOffset != 2 || !strings.HasPrefix(bigLine, w.Content) {
			t.Errorf("wide line: %d bytes, next %d", len(w.Content), w.NextOffset)
		}
	})
	t.Run("images", func(t *testing.T) {
		if r := f.call("read", map[string]any{"path": "pic.txt"}); r.Text != fmt.Sprintf("[Image pic.txt (image/png, %d B).]", len(f.file("pic.txt"))) {
			t.Errorf("png text %q", r.Text)
		}
		r := f.call("read", map[string]any{"path": "pic.jpg"})
		want := &tools.ReadImageResult{Path: "pic.jpg", MIMEType: "image/jpeg", Bytes: int64(len(f.file("pic.jpg"))), Width: 5, Height: 4}
		if !reflect.DeepEqual(r.Structured, want) || r.Image == nil || r.Image.MIMEType != "image/jpeg" || string(r.Image.Data) != f.file("pic.jpg") {
			t.Errorf("jpeg: %+v", r.Structured)
		}
		if g := f.call("read", map[string]any{"path": "pic.gif"}).Structured.(*tools.ReadImageResult); g.Width != 7 || g.Height != 6 {
			t.Errorf("gif: %+v", g)
		}
		e := f.call("read", map[string]any{"path": "wide.png"}).Structured.(*tools.ErrorResult)
		if e.Path != "wide.png" || e.MIMEType != "image/png" || e.Bytes == 0 || !strings.Contains(e.Message, "8001x1") || !strings.Contains(e.Message, "smaller copy") {
			t.Errorf("rejection: %+v", e)
		}
	})
}

func TestReadLimits(t *testing.T) {
	files := []string{"big.txt: " + strings.Repeat("a", 2000), "pic.png: " + pngOf(t, 2, 2)}
	f := newFixture(t, files, func(c *tools.Config) { c.MaxFileBytes = 1000; c.ReadImages = false })
	if r := f.call("read", map[string]any{"path": "big.txt"}); errKind(r) != "FileTooLarge" || !strings.Contains(r.Text, "maxFileBytes") {
		t.Errorf("over maxFileBytes: %s", r.Text)
	}
	if r := f.call("read", map[string]any{"path": "pic.png"}); !strings.HasPrefix(r.Text, "[Binary file pic.png (image/png") || r.Image != nil {
		t.Errorf("readImages false: %s", r.Text)
	}
	big := strings.Repeat("\x00", tools.MaxImageBytes+1)
	f = newFixture(t, []string{"huge.png: " + pngOf(t, 2, 2) + big})
	if r := f.call("read", map[string]any{"path": "huge.png"}); errKind(r) != "ImageRejected" || !strings.Contains(r.Text, "3.75 MB") {
		t.Errorf("over 3.75 MiB: %s", r.Text)
	}
}

func TestImageSize(t *testing.T) {
	vp8x := "RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00\x3f\x1f\x00\x1f\x00\x00"
	vp8l := "RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f\x09\x40\x02\x00\x00\x00\x00\x00"
	vp8 := "RIFF\x00\x00\x00\x00WEBPVP8 \x00\x00\x00\x00\x00\x00\x00\x9d\x01\x2a\x10\x00\x20\x00"
	for _, tt := range []struct {
		name, data string
		w, h       int
	}{
		{"webp VP8X", vp8x, 8000, 32},
		{"webp VP8L", vp8l, 10, 10},
		{"webp VP8", vp8, 16, 32},
	} {
		f := newFixture(t, []string{"img: " + tt.data})
		r := f.call("read", map[string]any{"path": "img"})
		got, ok := r.Structured.(*tools.ReadImageResult)
		if !ok || got.MIMEType != "image/webp" || got.Width != tt.w || got.Height != tt.h {
			t.Errorf("%s: %s %+v", tt.name, r.Text, r.Structured)
		}
	}
}

func TestLsFind(t *testing.T) {
	files := []string{
		"a.go", "b.txt", "src/c.go", "src/deep/d.go", "linked => src",
		"node_modules/m.go", ".git/config", "build/out/x.go", "other/build/out/y.go",
	}
	f := newFixture(t, files, func(c *tools.Config) { c.Exclude = append(c.Exclude, "build/out") })
	tests := []struct {
		tool string
		args map[string]any
		kind string
		want any
	}{
		{"ls", map[string]any{}, "", &tools.LsResult{Path: ".", Entries: []string{".git/", "a.go", "b.txt", "build/", "linked@", "node_modules/", "other/", "src/"}}},
		{"ls", map[string]any{"path": "src", "limit": 1}, "", &tools.LsResult{Path: "src", Entries: []string{"c.go"}, Truncated: true}},
		{"ls", map[string]any{"path": "linked"}, "", &tools.LsResult{Path: "linked", Entries: []string{"c.go", "deep/"}}},
		{"ls", map[string]any{"path": "a.go"}, "NotADirectory", nil},
		{"ls", map[string]any{"path": "nope"}, "NotFound", nil},
		{"find", map[string]any{"pattern": "*.go"}, "", &tools.FindResult{Paths: []string{"a.go", "other/build/out/y.go", "src/c.go", "src/deep/d.go"}}},
		{"find", map[string]any{"pattern": "src/**/*.go"}, "", &tools.FindResult{Paths: []string{"src/c.go", "src/deep/d.go"}}},
		{"find", map[string]any{"pattern": "*.go", "path": "src/deep"}, "", &tools.FindResult{Paths: []string{"src/deep/d.go"}}},
		{"find", map[string]any{"pattern": "*.go", "limit": 2}, "", &tools.FindResult{Paths: []string{"a.go", "other/build/out/y.go"}, Truncated: true}},
		{"find", map[string]any{"pattern": "*.none"}, "", &tools.FindResult{Paths: []string{}}},
		{"find", map[string]any{"pattern": "[x"}, "InvalidArgument", nil},
		{"find", map[string]any{}, "InvalidArgument", nil},
		{"find", map[string]any{"pattern": "*", "path": "../x"}, "OutsideWorkspace", nil},
	}
	for _, tt := range tests {
		r := f.call(tt.tool, tt.args)
		if errKind(r) != tt.kind || (tt.want != nil && !reflect.DeepEqual(r.Structured, tt.want)) {
			t.Errorf("%s %v: %s %+v", tt.tool, tt.args, r.Text, r.Structured)
		}
	}
	if r := f.call("ls", map[string]any{"path": "src", "limit": 1}); !strings.Contains(r.Text, "[Showing 1 of 2 entries.") {
		t.Errorf("ls notice: %s", r.Text)
	}
}

// TestLinkOutsideOneAnswer: a path naming a link that leads out of the
// workspace gets the same answer from every tool that takes a path, whether
// the link names a directory or a file.
func TestLinkOutsideOneAnswer(t *testing.T) {
	f := newFixture(t, []string{"outdir => /etc", "outfile => /etc/passwd", "in/a.txt: a"})
	for _, link := range []string{"outdir", "outfile"} {
		for _, tt := range []struct {
			tool string
			args map[string]any
		}{
			{"ls", map[string]any{"path": link}},
			{"read", map[string]any{"path": link}},
			{"find", map[string]any{"pattern": "*", "path": link}},
			{"find", map[string]any{"pattern": "**", "path": link}},
			{"grep", map[string]any{"pattern": "root", "path": link}},
		} {
			if r := f.call(tt.tool, tt.args); errKind(r) != "OutsideWorkspace" {
				t.Errorf("%s %v: %s %+v, want OutsideWorkspace", tt.tool, tt.args, r.Text, r.Structured)
			}
		}
	}
}

func TestFindOutputCap(t *testing.T) {
	var files []string
	for i := range 30 {
		files = append(files, strings.Repeat("d", 20)+"/f"+string(rune('a'+i%26))+strings.Repeat("x", i))
	}
	f := newFixture(t, files, func(c *tools.Config) { c.MaxLines = 10 })
	r := f.call("find", map[string]any{"pattern": "**"})
	got := r.Structured.(*tools.FindResult)
	if len(got.Paths) != 10 || !got.Truncated || !strings.Contains(r.Text, "[Output cut to 10 lines") {
		t.Errorf("%d paths, truncated %v: %s", len(got.Paths), got.Truncated, r.Text)
	}
}

func TestGrep(t *testing.T) {
	files := []string{
		"a.go: package a\n// TODO one\nfunc A() {}\n// todo two\n",
		"sub/b.go: x\ny\nTODO three\nz\n",
		"sub/c.txt: TODO txt\n",
		"bin: TODO\x00binary",
		"node_modules/m.go: TODO hidden\n",
		"linked => sub",
		"alias.go => sub/b.go",
		"wide.txt: " + strings.Repeat("w", 600) + "TODO\n",
		"re.txt: a.b\naxb\n",
		"fifo|",
	}
	f := newFixture(t, files)
	m := func(p string, l int, text string) tools.GrepMatch {
		return tools.GrepMatch{Path: p, Line: l, Text: text}
	}
	tests := []struct {
		args map[string]any
		kind string
		text string
		want *tools.GrepResult
	}{
		{map[string]any{"pattern": "TODO", "glob": "*.go"}, "", "a.go:2:// TODO one\nsub/b.go:3:TODO three",
			&tools.GrepResult{Matches: []tools.GrepMatch{m("a.go", 2, "// TODO one"), m("sub/b.go", 3, "TODO three")}}},
		{map[string]any{"pattern": "todo", "ignoreCase": true, "path": "a.go"}, "", "a.go:2:// TODO one\na.go:4:// todo two", nil},
		{map[string]any{"pattern": "TODO", "path": "sub", "context": 1}, "", "sub/b.go-2-y\nsub/b.go:3:TODO three\nsub/b.go-4-z\n--\nsub/c.txt:1:TODO txt",
			&tools.GrepResult{Matches: []tools.GrepMatch{m("sub/b.go", 3, "TODO three"), m("sub/c.txt", 1, "TODO txt")},
				Context: []tools.GrepMatch{m("sub/b.go", 2, "y"), m("sub/b.go", 4, "z")}}},
		{map[string]any{"pattern": "a.b", "literal": true}, "", "re.txt:1:a.b", nil},
		{map[string]any{"pattern": "three", "path": "linked/b.go"}, "", "linked/b.go:3:TODO three", nil},
		{map[string]any{"pattern": "three", "path": "alias.go"}, "", "alias.go:3:TODO three", nil},
		{map[string]any{"pattern": "TODO", "limit": 1}, "", "a.go:2:// TODO one\n\n[Stopped at 1 matches; there are more. Narrow the pattern, path or glob.]",
			&tools.GrepResult{Matches: []tools.GrepMatch{m("a.go", 2, "// TODO one")}, Truncated: true}},
		// Lines are cut to 500 characters before matching: the TODO past them is not found.
		{map[string]any{"pattern": "w+TODO", "path": "wide.txt"}, "", "No matches found.", nil},
		{map[string]any{"pattern": "nothing here"}, "", "No matches found.", &tools.GrepResult{Matches: []tools.GrepMatch{}}},
		{map[string]any{"pattern": "(a+)+$", "path": "re.txt"}, "", "", nil}, // accepted: RE2 is linear
		{map[string]any{"pattern": "a(b"}, "InvalidArgument", "", nil},
		{map[string]any{"pattern": "x", "path": "fifo"}, "NotAFile", "", nil},
		{map[string]any{"pattern": "x", "path": "/tmp"}, "OutsideWorkspace", "", nil},
		{map[string]any{"pattern": "x", "context": -1}, "InvalidArgument", "", nil},
	}
	for _, tt := range tests {
		r := f.call("grep", tt.args)
		if errKind(r) != tt.kind || (tt.text != "" && r.Text != tt.text) || (tt.want != nil && !reflect.DeepEqual(r.Structured, tt.want)) {
			t.Errorf("grep %v: kind %q\n%s\n%+v", tt.args, errKind(r), r.Text, r.Structured)
		}
	}
	r := f.call("grep", map[string]any{"pattern": "w", "path": "wide.txt"})
	if got := r.Structured.(*tools.GrepResult).Matches[0].Text; len(got) != 500 || !strings.Contains(r.Text, "[Lines are cut to 500 characters") {
		t.Errorf("cut line: %d chars: %s", len(got), r.Text[len(r.Text)-80:])
	}
}

func TestWrite(t *testing.T) {
	f := newFixture(t, []string{"old.txt: old", "gitlink => .git", ".git/config: [core]", "dir/x",
		".git/hooks/h", "a/x => ../.git/hooks", "a/l => x/../config"})
	tests := []struct {
		args map[string]any
		kind string
		want any
	}{
		{map[string]any{"path": "new/deep/n.txt", "content": "hello"}, "", &tools.WriteResult{Path: "new/deep/n.txt", Bytes: 5, Created: true}},
		{map[string]any{"path": "old.txt", "content": "new"}, "", &tools.WriteResult{Path: "old.txt", Bytes: 3}},
		{map[string]any{"path": "old.txt", "content": ""}, "InvalidArgument", nil},
		{map[string]any{"path": "empty.txt", "content": ""}, "", &tools.WriteResult{Path: "empty.txt", Created: true}},
		{map[string]any{"path": ".git/config", "content": "x"}, "Protected", nil},
		{map[string]any{"path": ".GIT/hooks/pre-commit", "content": "x"}, "Protected", nil},
		{map[string]any{"path": "gitlink/hooks/post", "content": "x"}, "Protected", nil},
		{map[string]any{"path": "a/l", "content": "x"}, "Protected", nil}, // x/../config through a link is .git/config
		{map[string]any{"path": ".sandboxd/runtime/x", "content": "x"}, "Protected", nil},
		{map[string]any{"path": "dir", "content": "x"}, "NotAFile", nil},
		{map[string]any{"path": ".", "content": "x"}, "NotAFile", nil},
		{map[string]any{"path": "../escape", "content": "x"}, "OutsideWorkspace", nil},
		{map[string]any{"path": "x"}, "InvalidArgument", nil},
	}
	for _, tt := range tests {
		r := f.call("write", tt.args)
		if errKind(r) != tt.kind || (tt.want != nil && !reflect.DeepEqual(r.Structured, tt.want)) {
			t.Errorf("write %v: %s %+v", tt.args, r.Text, r.Structured)
		}
	}
	if f.file("new/deep/n.txt") != "hello" || f.file("old.txt") != "new" || f.file(".git/config") != "[core]" {
		t.Error("files not as written")
	}
}

func TestEditTool(t *testing.T) {
	orig := "\ufeffone\r\ntwo\r\nthree\r\n"
	f := newFixture(t, []string{"crlf.txt: " + orig, "latin1.txt: caf\xe9\n", ".git/HEAD: ref"})
	r := f.call("edit", map[string]any{"path": "crlf.txt", "edits": []map[string]string{
		{"oldText": "three\n", "newText": "3\nand more\n"},
		{"oldText": "one", "newText": "1"},
	}})
	want := "\ufeff1\r\ntwo\r\n3\r\nand more\r\n"
	if r.IsError || f.file("crlf.txt") != want {
		t.Fatalf("%s: %q", r.Text, f.file("crlf.txt"))
	}
	e := r.Structured.(*tools.EditResult)
	if e.Replaced != 2 || !reflect.DeepEqual(e.Lines, []int{3, 1}) || !strings.Contains(e.Diff, "+++ b/crlf.txt") || !strings.Contains(e.Diff, "-two\r\n") == strings.Contains(e.Diff, "-one") {
		t.Errorf("result %+v", e)
	}
	if r.Text != "Replaced 2 blocks in crlf.txt, at line 3, 1." || strings.Contains(r.Text, "@@") {
		t.Errorf("text %q", r.Text)
	}
	before := f.file("crlf.txt")
	for _, tt := range []struct {
		args map[string]any
		kind string
	}{
		{map[string]any{"path": "crlf.txt", "edits": []map[string]string{{"oldText": "two", "newText": "2"}, {"oldText": "absent", "newText": ""}}}, "NoMatch"},
		{map[string]any{"path": "crlf.txt", "edits": []map[string]string{{"oldText": "\r\n", "newText": "\n"}}}, "Ambiguous"},
		{map[string]any{"path": "crlf.txt", "edits": []map[string]string{{"oldText": "two", "newText": "2"}, {"oldText": "wo\r\n3", "newText": ""}}}, "InvalidArgument"},
		{map[string]any{"path": "crlf.txt", "edits": []map[string]string{}}, "InvalidArgument"},
		{map[string]any{"path": "latin1.txt", "edits": []map[string]string{{"oldText": "caf", "newText": "x"}}}, "NotUtf8"},
		{map[string]any{"path": ".git/HEAD", "edits": []map[string]string{{"oldText": "ref", "newText": "x"}}}, "Protected"},
		{map[string]any{"path": "none", "edits": []map[string]string{{"oldText": "ref", "newText": "x"}}}, "NotFound"},
	} {
		if r := f.call("edit", tt.args); errKind(r) != tt.kind {
			t.Errorf("edit %v: %s", tt.args, r.Text)
		}
	}
	if f.file("crlf.txt") != before || f.file("latin1.txt") != "caf\xe9\n" {
		t.Error("a failed edit changed the file")
	}
}

// TestSkillsKept: load_skill calls Env.SkillsChanged before it answers,
// and a failure there fails the call with the skill left off;
// ActiveSkills lists what is active, and Activate makes a skill active
// again on another set (a resumed session's) — but one not granted.
func TestSkillsKept(t *testing.T) {
	ctx := context.Background()
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{"fs.write"}
	var fail error
	kept := 0
	set, err := tools.New(tools.Env{FS: memfs.New(), SkillsChanged: func(context.Context) error { kept++; return fail }}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	fail = errors.New("the record cannot be written")
	if r := set.Call(ctx, "load_skill", json.RawMessage(`{"skill":"workspace.edit"}`), tools.CallOptions{}); !r.IsError || !strings.Contains(r.Text, "the record cannot be written") {
		t.Fatalf("load_skill whose skills cannot be kept: %s", r.Text)
	}
	if got := set.ActiveSkills(); !reflect.DeepEqual(got, []string{"workspace.read"}) {
		t.Fatalf("active after the failed load_skill: %q", got)
	}
	fail = nil
	if r := set.Call(ctx, "load_skill", json.RawMessage(`{"skill":"workspace.edit"}`), tools.CallOptions{}); r.IsError || kept != 2 {
		t.Fatalf("load_skill: %s (kept %d times)", r.Text, kept)
	}
	if r := set.Call(ctx, "load_skill", json.RawMessage(`{"skill":"workspace.edit"}`), tools.CallOptions{}); r.IsError || kept != 2 {
		t.Fatalf("load_skill of an active skill: %s (kept %d times, want no change)", r.Text, kept)
	}
	skills := set.ActiveSkills()
	if !reflect.DeepEqual(skills, []string{"workspace.read", "workspace.edit"}) {
		t.Fatalf("active skills: %q", skills)
	}
	again, err := tools.New(tools.Env{FS: memfs.New()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, sk := range skills {
		if err := again.Activate(sk); err != nil {
			t.Fatal(err)
		}
	}
	if r := again.Call(ctx, "write", json.RawMessage(`{"path":"a","content":"x"}`), tools.CallOptions{}); r.IsError {
		t.Fatalf("write once the skills are activated again: %s", r.Text)
	}
	if err := again.Activate("workspace.shell"); err == nil || !strings.Contains(err.Error(), "shell.exec") {
		t.Fatalf("Activate of a skill not granted: %v", err)
	}
	if err := again.Activate("nope"); err == nil {
		t.Fatal("Activate of an unknown skill succeeded")
	}
}

func TestSkillsAndLimits(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	newSet := func(c func(*tools.Config)) (*tools.Set, error) {
		cfg := tools.DefaultConfig()
		c(&cfg)
		return tools.New(tools.Env{FS: fsys}, cfg)
	}
	if _, err := newSet(func(c *tools.Config) { c.Always = []string{"read", "edit"} }); err == nil || !strings.Contains(err.Error(), "fs.write") {
		t.Errorf("always edit without the grant: %v", err)
	}
	set, err := newSet(func(c *tools.Config) { c.Grants = []string{"fs.write"}; c.MaxCallsPerRun = 4 })
	if err != nil {
		t.Fatal(err)
	}
	active := func() (names []string) {
		for _, tl := range set.Active() {
			names = append(names, tl.Name)
		}
		return names
	}
	if got := active(); !reflect.DeepEqual(got, []string{"read", "ls", "find", "grep", "journal_list", "journal_show", "journal_revert", "load_skill"}) {
		t.Errorf("active at start: %v", got)
	}
	changed := 0
	opts := tools.CallOptions{RunID: "run1", ToolsChanged: func() { changed++ }}
	call := func(tool, args string) tools.Result { return set.Call(ctx, tool, json.RawMessage(args), opts) }
	if r := call("write", `{"path":"a","content":"x"}`); errKind(r) != tools.KindToolUnavailable {
		t.Errorf("write before load_skill: %s", r.Text)
	}
	if r := call("load_skill", `{"skill":"workspace.shell"}`); errKind(r) != tools.KindCapabilityForbidden {
		t.Errorf("shell without grant: %s", r.Text)
	}
	if r := call("load_skill", `{"skill":"workspace.edit"}`); r.IsError || changed != 1 || !reflect.DeepEqual(r.Structured, &tools.LoadSkillResult{Skill: "workspace.edit", Tools: []string{"write", "edit"}}) {
		t.Errorf("load edit: %s, changed %d", r.Text, changed)
	}
	if r := call("write", `{"path":"a","content":"x"}`); r.IsError {
		t.Errorf("write after load_skill: %s", r.Text)
	}
	if r := call("ls", `{}`); errKind(r) != tools.KindCallLimit {
		t.Errorf("fifth call of the run: %s", r.Text)
	}
	if r := set.Call(ctx, "ls", nil, tools.CallOptions{RunID: "run2"}); r.IsError {
		t.Errorf("another run: %s", r.Text)
	}
	if r := set.Call(ctx, "nope", nil, tools.CallOptions{}); errKind(r) != tools.KindToolUnavailable {
		t.Errorf("unknown tool: %s", r.Text)
	}
	sec := set.EnvironmentSection()
	for _, want := range []string{"/workspace", "Tools: read, ls, find, grep, write, edit.", ".git/**", "node_modules"} {
		if !strings.Contains(sec, want) {
			t.Errorf("environment section lacks %q:\n%s", want, sec)
		}
	}
	if strings.Contains(sec, "bash") {
		t.Errorf("environment section names bash, which this set lacks:\n%s", sec)
	}
	names := map[string]bool{}
	for _, tl := range set.List() {
		names[tl.Name] = true
		var schema map[string]any
		if err := json.Unmarshal(tl.InputSchema, &schema); err != nil || schema["type"] != "object" || tl.Description == "" {
			t.Errorf("%s: schema %s", tl.Name, tl.InputSchema)
		}
	}
	if d := set.List()[0].Description; !strings.Contains(d, "up to 3.75 MB and 8000 pixels") || !strings.Contains(d, "Files over 32 MB are refused") {
		t.Errorf("read description: %s", d)
	}
	if len(names) != 10 || names["bash"] || !names["journal_revert"] { // no Bash in Env: no bash tool; fs.write: the journal
		t.Errorf("catalogue %v", names)
	}
}

func TestConfig(t *testing.T) {
	cfg, err := tools.ParseConfig([]byte(`{"maxLines": 10, "grants": ["fs.write"], "always": ["read", "workspace.edit"]}`))
	if err != nil || cfg.MaxLines != 10 || cfg.MaxBytes != tools.DefaultMaxBytes || !cfg.Confine || cfg.SpillDir != ".sandboxd/runtime/tool-output" {
		t.Fatalf("%+v %v", cfg, err)
	}
	for _, tt := range []struct{ json, option string }{
		{`{"maxLine": 10}`, `"maxLine"`},
		{`{"maxLines": "ten"}`, "maxLines"},
		{`{"maxLines": 0}`, "maxLines"},
		{`{"tools": ["read", "cat"]}`, "tools"},
		{`{"always": ["root"]}`, "always"},
		{`{"confine": false}`, "confine"},
		{`{"protect": ["[x"]}`, "protect"},
		{`{"bashTimeoutMs": 700000}`, "bashTimeoutMs"},
		{`{"spillDir": "../out"}`, "spillDir"},
		{`{"grants": ["root"]}`, "grants"},
		{`{"maxCallsPerRun": -1}`, "maxCallsPerRun"},
		{`{"bashEnv": {"A=B": "x"}}`, "bashEnv"},
	} {
		if _, err := tools.ParseConfig([]byte(tt.json)); err == nil || !strings.Contains(err.Error(), tt.option) {
			t.Errorf("%s: %v, want an error naming %s", tt.json, err, tt.option)
		}
	}
	if _, err := tools.New(tools.Env{FS: memfs.New()}, tools.Config{}); err == nil {
		t.Error("the zero Config was accepted")
	}
}

// TestNamesCannotSpoofListings: a name holding a newline, an escape
// sequence or a bidirectional control is quoted in ls, find and grep text,
// one name a line, so it cannot pass for other entries; the structured
// results keep it as it is.
func TestNamesCannotSpoofListings(t *testing.T) {
	names := map[string]string{ // name → as the text shows it
		"a.go\nsecrets.txt":     `"a.go\nsecrets.txt"`,
		"x\x1b[2K\x1b[1Aok.txt": `"x\x1b[2K\x1b[1Aok.txt"`,
		"evil\u202etxt.exe":     `"evil\u202etxt.exe"`,
		"cr\rb.go":              `"cr\rb.go"`,
		`"quoted"`:              `"\"quoted\""`,
		"plain name é.txt":      "plain name é.txt",
		"d\nd/inner.txt":        `"d\nd/inner.txt"`,
	}
	var files []string
	for n := range names {
		files = append(files, n+": needle\n")
	}
	f := newFixture(t, files)
	var want []string
	for n, shown := range names {
		if !strings.Contains(n, "/") {
			want = append(want, shown)
		}
	}
	want = append(want, `"d\nd"/`)
	slices.Sort(want)
	check := func(tool string, args map[string]any, want []string) {
		t.Helper()
		r := f.call(tool, args)
		got := strings.Split(r.Text, "\n")
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s text:\n%s\nwant the lines %q", tool, r.Text, want)
		}
		if strings.ContainsAny(r.Text, "\x1b\r\u202e") || !utf8.ValidString(r.Text) {
			t.Errorf("%s text holds a raw control: %q", tool, r.Text)
		}
	}
	check("ls", map[string]any{}, want)
	var paths, lines []string
	for _, shown := range names {
		paths = append(paths, shown)
		lines = append(lines, shown+":1:needle")
	}
	slices.Sort(paths)
	slices.Sort(lines)
	check("find", map[string]any{"pattern": "**"}, paths)
	check("grep", map[string]any{"pattern": "needle"}, lines)
	if r := f.call("find", map[string]any{"pattern": "**"}); !slices.Contains(r.Structured.(*tools.FindResult).Paths, "a.go\nsecrets.txt") {
		t.Errorf("structured paths %q", r.Structured.(*tools.FindResult).Paths)
	}
}

// TestEditConcurrentWriters: an edit reads, edits and writes the file in one
// step under its lock, so edits and other writers that lock the file do not
// lose each other's changes.
func TestEditConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	fsys := memfs.New()
	const n = 20
	var initial strings.Builder
	for i := range n {
		fmt.Fprintf(&initial, "line %d\n", i)
	}
	if err := fsys.WriteFile(ctx, "a.txt", []byte(initial.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := tools.DefaultConfig()
	cfg.Grants, cfg.Always = []string{tools.GrantFSWrite}, []string{"edit"}
	set, err := tools.New(tools.Env{FS: fsys, Session: workspace.Session{Root: "/workspace"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { // an edit of line i
			raw, _ := json.Marshal(map[string]any{"path": "a.txt", "edits": []tools.Replacement{{OldText: fmt.Sprintf("line %d\n", i), NewText: fmt.Sprintf("edited %d\n", i)}}})
			if r := set.Call(ctx, "edit", raw, tools.CallOptions{}); r.IsError {
				t.Errorf("edit %d: %s", i, r.Text)
			}
		})
		wg.Go(func() { // another writer, which locks: appends a line
			unlock, err := workspace.Lock(ctx, fsys, "a.txt")
			if err != nil {
				t.Error(err)
				return
			}
			defer unlock()
			data, err := fsys.ReadFile(ctx, "a.txt", 1<<20)
			if err == nil {
				err = fsys.WriteFile(ctx, "a.txt", fmt.Appendf(data, "appended %d\n", i), 0o644)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	data, _ := fsys.ReadFile(ctx, "a.txt", 1<<20)
	for i := range n {
		for _, want := range []string{fmt.Sprintf("edited %d\n", i), fmt.Sprintf("appended %d\n", i)} {
			if !strings.Contains(string(data), want) {
				t.Errorf("the file lost %q:\n%s", want, data)
			}
		}
	}
}
