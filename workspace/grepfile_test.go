package workspace

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"
	"testing/fstest"
)

// referenceGrep is the plain algorithm grepFile must agree with: every line
// matched in turn, with a ring of context lines before and a count after.
func referenceGrep(m *LineMatcher, name string, data []byte, req GrepRequest) []GrepLine {
	var out, before []GrepLine
	after, lineNo := 0, 0
	for len(data) > 0 {
		lineNo++
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		line = CutLine(bytes.TrimSuffix(line, []byte("\r")), req.MaxLineChars)
		l := GrepLine{Path: name, Line: lineNo, Text: string(line)}
		switch {
		case m.line.Match(line):
			l.Match = true
			out = append(append(out, before...), l)
			before, after = before[:0], req.Context
		case after > 0:
			out = append(out, l)
			after--
		case req.Context > 0:
			if len(before) == req.Context {
				before = append(before[:0], before[1:]...)
			}
			before = append(before, l)
		}
	}
	return out
}

// FuzzGrepFile checks grepFile's literal search and context assembly against
// the plain algorithm; its seeds run as an ordinary test.
func FuzzGrepFile(f *testing.F) {
	f.Add("alpha\nbeta\r\nGamma beta\n\nbeta", "beta", false, 1, 0)
	f.Add("x\nDeadline Exceeded\ny\nz\ndeadline exceeded!\n", "deadline exceeded", true, 2, 0)
	f.Add("func (f *File) Close() error\nfunc (x) Close(\n", `func \(\w+ \*\w+\) Close\(`, false, 0, 0)
	f.Add("aaaa TODO\nTODO\n", "TODO$", false, 1, 6)
	f.Add("K\u212a k\nſs S\n", "(?i)ks", false, 0, 0)
	f.Add("a\xffb\nab\n", "a\ufffdb", false, 0, 0)
	f.Add("one\ntwo\nthree\nfour\nfive\nsix\n", "o", false, 3, 2)
	f.Add("\n\n\nx\n\n", "^$", false, 1, 0)
	f.Fuzz(func(t *testing.T, data, pattern string, ignoreCase bool, context, maxChars int) {
		if context < 0 || context > 5 || maxChars < 0 || maxChars > 50 {
			return
		}
		m, err := NewLineMatcher(pattern, false, ignoreCase)
		if err != nil {
			return
		}
		req := GrepRequest{Context: context, MaxLineChars: maxChars}
		got := m.grepFile("f", []byte(data), req)
		want := referenceGrep(m, "f", []byte(data), req)
		if len(got) == 0 && len(want) == 0 {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("pattern %q (fold %v, literal %q) context %d cut %d on %q:\ngot  %v\nwant %v", pattern, ignoreCase, m.lit, context, maxChars, data, got, want)
		}
	})
}

// GrepWithReader gives GrepGeneric's result and reads through its reader.
func TestGrepWithReader(t *testing.T) {
	ctx := t.Context()
	fsys := mapFS{"a.go": "x\nTODO a\n", "b/c.go": "TODO c\n", "b/d.txt": "none\n"}
	req := GrepRequest{Pattern: "TODO", Context: 1}
	want, err := GrepGeneric(ctx, fsys, req)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var read []string
	got, err := GrepWithReader(ctx, fsys, req, func(ctx context.Context, name string, max int64) ([]byte, error) {
		mu.Lock()
		read = append(read, name)
		mu.Unlock()
		return fsys.ReadFile(ctx, name, max)
	})
	slices.Sort(read)
	if err != nil || !reflect.DeepEqual(got, want) || !reflect.DeepEqual(read, []string{"a.go", "b/c.go", "b/d.txt"}) || want.Matches != 2 {
		t.Errorf("got %+v (read %v, %v), want %+v", got, read, err, want)
	}
}

// mapFS is a read-only FileSystem of files in a map, directories implied.
type mapFS map[string]string

func (m mapFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	return m.Lstat(ctx, name)
}
func (m mapFS) Lstat(_ context.Context, name string) (fs.FileInfo, error) {
	return fs.Stat(m.fstest(), name)
}
func (m mapFS) ReadDir(_ context.Context, name string) ([]fs.DirEntry, error) {
	return fs.ReadDir(m.fstest(), name)
}
func (m mapFS) ReadFile(_ context.Context, name string, _ int64) ([]byte, error) {
	return fs.ReadFile(m.fstest(), name)
}
func (m mapFS) fstest() fstest.MapFS {
	out := fstest.MapFS{}
	for k, v := range m {
		out[k] = &fstest.MapFile{Data: []byte(v)}
	}
	return out
}
func (mapFS) WriteFile(context.Context, string, []byte, fs.FileMode) error { return ErrForbidden }
func (mapFS) Mkdir(context.Context, string, fs.FileMode) error             { return ErrForbidden }
func (mapFS) Remove(context.Context, string) error                         { return ErrForbidden }
func (mapFS) Rename(context.Context, string, string) error                 { return ErrForbidden }

// countingFS counts the directories listed.
type countingFS struct {
	mapFS
	mu    sync.Mutex
	lists int
}

func (c *countingFS) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.mapFS.ReadDir(ctx, name)
}

// A search that reaches its limit stops its walk there: it does not list
// the rest of the tree first. Its result is the full search's, cut.
func TestGrepLimitStopsWalk(t *testing.T) {
	ctx := t.Context()
	files := mapFS{}
	const dirs = 600
	for d := range dirs {
		files[fmt.Sprintf("d%04d/a.go", d)] = "TODO\n"
	}
	full, err := GrepGeneric(ctx, files, GrepRequest{Pattern: "TODO"})
	if err != nil || full.Matches != dirs {
		t.Fatalf("the full search: %d matches, %v", full.Matches, err)
	}
	fsys := &countingFS{mapFS: files}
	got, err := GrepGeneric(ctx, fsys, GrepRequest{Pattern: "TODO", Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Truncated || got.Matches != 3 || !reflect.DeepEqual(got.Lines, full.Lines[:3]) {
		t.Errorf("limit 3: %+v, want the first 3 of the full search's, truncated", got)
	}
	// The root, and the directories of at most grepAhead files beyond the
	// results taken (with the workers' and a channel's slack).
	if max := 1 + 3 + grepAhead + 2*runtime.GOMAXPROCS(0) + 2; fsys.lists > max {
		t.Errorf("the search listed %d directories, want at most %d of %d", fsys.lists, max, dirs+1)
	}
}
