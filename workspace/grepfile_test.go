package workspace

import (
	"bytes"
	"reflect"
	"testing"
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
