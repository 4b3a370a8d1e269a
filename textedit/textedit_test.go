package textedit_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/textedit"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestApply(t *testing.T) {
	type R = textedit.Replacement
	tests := []struct {
		name    string
		content string
		edits   []R
		fuzzy   bool
		want    string
		lines   []int
		kind    *workspace.Kind
	}{
		{"one", "a\nb\nc\n", []R{{"b", "B"}}, true, "a\nB\nc\n", []int{2}, nil},
		{"several", "a\nb\nc\n", []R{{"c\n", "C\nD\n"}, {"a\n", ""}}, true, "b\nC\nD\n", []int{2, 1}, nil},
		{"lines shift", "a\nb\nc\n", []R{{"a", "x\ny\nz"}, {"c", "C"}}, true, "x\ny\nz\nb\nC\n", []int{1, 5}, nil},
		{"missing", "abc", []R{{"abd", "x"}}, true, "", nil, workspace.ErrNoMatch},
		{"twice", "ab ab", []R{{"ab", "x"}}, true, "", nil, workspace.ErrAmbiguous},
		{"overlapping occurrences", "aaa", []R{{"aa", "x"}}, true, "", nil, workspace.ErrAmbiguous},
		{"overlap", "abcd", []R{{"abc", "x"}, {"cd", "y"}}, true, "", nil, workspace.ErrInvalidArgument},
		{"adjacent", "abcd", []R{{"ab", "x"}, {"cd", "y"}}, true, "xy", []int{1, 1}, nil},
		{"empty old", "abc", []R{{"", "x"}}, true, "", nil, workspace.ErrInvalidArgument},
		{"no change", "abc", []R{{"b", "b"}}, true, "", nil, workspace.ErrInvalidArgument},
		{"latin1", "caf\xe9", []R{{"caf", "x"}}, true, "", nil, workspace.ErrNotUTF8},
		{"crlf kept", "a\r\nb\r\n", []R{{"a\nb", "x\ny"}}, true, "x\r\ny\r\n", []int{1}, nil},
		{"crlf old text", "a\r\nb\r\n", []R{{"a\r\nb", "z"}}, true, "z\r\n", []int{1}, nil},
		{"lf file, crlf old text", "a\nb\n", []R{{"a\r\nb", "z"}}, true, "z\n", []int{1}, nil},
		{"mixed endings kept", "a\r\nb\nc\r\n", []R{{"b", "B"}}, true, "a\r\nB\nc\r\n", []int{2}, nil},
		{"bom kept", "\ufeffx = 1\n", []R{{"x = 1", "x = 2"}}, true, "\ufeffx = 2\n", []int{1}, nil},
		{"fuzzy whitespace", "if  x {\n\treturn\t1   \n}\n", []R{{"if x {\n  return 1\n}", "if x { return 2 }"}}, true, "if x { return 2 }\n", []int{1}, nil},
		{"fuzzy quotes and dashes", "say(“hi”) – ok\n", []R{{"say(\"hi\") - ok", "done"}}, true, "done\n", []int{1}, nil},
		{"fuzzy off", "say(“hi”)\n", []R{{"say(\"hi\")", "x"}}, false, "", nil, workspace.ErrNoMatch},
		{"fuzzy ambiguous", "a  b\na\tb\n", []R{{"a b ", "x"}}, true, "", nil, workspace.ErrAmbiguous},
		{"exact wins over fuzzy", "a  b\na b\n", []R{{"a b", "x"}}, true, "a  b\nx\n", []int{2}, nil},
	}
	for _, tt := range tests {
		got, lines, err := textedit.Apply([]byte(tt.content), tt.edits, tt.fuzzy)
		if tt.kind != nil {
			var we *workspace.Error
			if !errors.Is(err, tt.kind) || !errors.As(err, &we) || we.Msg == "" || got != nil || lines != nil {
				t.Errorf("%s: err %v, want %s", tt.name, err, tt.kind.Name())
			}
			continue
		}
		if err != nil || string(got) != tt.want || !reflect.DeepEqual(lines, tt.lines) {
			t.Errorf("%s: %q %v %v, want %q %v", tt.name, got, lines, err, tt.want, tt.lines)
		}
	}
}

// FuzzApply checks the edit matcher: it never panics, keeps a BOM and
// valid UTF-8, and where the plain rule applies (one exact occurrence, no
// "\r") it is exactly a single replacement.
func FuzzApply(f *testing.F) {
	f.Add("a\nb\nc\n", "b", "B", true)
	f.Add("\ufeffx\r\ny\r\n", "x\ny", "z\n", true)
	f.Add("if  x {\n\treturn\n}", "if x {\n return\n}", "", true)
	f.Add("“quoted” — dash", "\"quoted\" - dash", "q", true)
	f.Add("aaa", "aa", "b", false)
	f.Add("caf\xe9", "caf", "x", true)
	f.Add("x \u00a0\u2003y\n", "x y", "z", true)
	f.Add("a\r\r\nb", "\r\nb", "c", true)
	f.Fuzz(func(t *testing.T, content, old, repl string, fuzzy bool) {
		out, lines, err := textedit.Apply([]byte(content), []textedit.Replacement{{OldText: old, NewText: repl}}, fuzzy)
		if err != nil {
			if out != nil || lines != nil {
				t.Fatal("a failed edit returned content")
			}
			return
		}
		if !utf8.Valid(out) || len(lines) != 1 || lines[0] < 1 {
			t.Fatalf("bad result %q %v", out, lines)
		}
		if strings.HasPrefix(content, "\ufeff") != strings.HasPrefix(string(out), "\ufeff") && !strings.HasPrefix(repl, "\ufeff") {
			t.Fatalf("BOM not kept: %q -> %q", content, out)
		}
		plain := !strings.Contains(content+old+repl, "\r") && strings.Count(content, old) == 1 && !strings.HasPrefix(content, "\ufeff")
		if plain && string(out) != strings.Replace(content, old, repl, 1) {
			t.Fatalf("Apply(%q, %q→%q) = %q", content, old, repl, out)
		}
	})
}
