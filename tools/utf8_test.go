package tools_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/tools"
)

// TestTextNotUTF8IsRefused: text encoding/json would silently turn into
// U+FFFD — bytes that are not UTF-8, escapes of half a surrogate pair — is
// refused, naming the argument, and nothing is written; every other escape
// arrives as sent.
func TestTextNotUTF8IsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, args string
		want       string // the file's content; "" when refused
		refusal    []string
	}{
		{name: "utf8", args: `{"path":"a.txt","content":"héllo"}`, want: "héllo"},
		{name: "surrogate pair", args: `{"path":"a.txt","content":"\ud83d\ude00"}`, want: "😀"},
		{name: "escaped backslash", args: `{"path":"a.txt","content":"\\udc80 \\\ud83d\ude00"}`, want: `\udc80 \😀`},
		{name: "byte ff", args: "{\"path\":\"a.txt\",\"content\":\"ab\xffcd\"}", refusal: []string{"argument content", "0xff", "UTF-8"}},
		{name: "cut sequence", args: "{\"path\":\"a.txt\",\"content\":\"\xe2\x82\"}", refusal: []string{"argument content", "0xe2"}},
		{name: "lone low surrogate", args: `{"path":"a.txt","content":"x\udc80"}`, refusal: []string{"argument content", `\udc80`}},
		{name: "lone high surrogate", args: `{"path":"a.txt","content":"\ud800x"}`, refusal: []string{"argument content", `\ud800`}},
		{name: "two high surrogates", args: `{"path":"a.txt","content":"\ud800\ud800"}`, refusal: []string{`\ud800`}},
		{name: "high at the end", args: `{"path":"a.txt","content":"\ud800"}`, refusal: []string{`\ud800`}},
		{name: "path", args: "{\"path\":\"a\xc0.txt\",\"content\":\"x\"}", refusal: []string{"argument path", "0xc0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil)
			r := f.set.Call(context.Background(), "write", []byte(tc.args), tools.CallOptions{})
			if tc.refusal == nil {
				if r.IsError {
					t.Fatalf("refused: %s", r.Text)
				}
				if got := f.file("a.txt"); got != tc.want {
					t.Fatalf("content %q, want %q", got, tc.want)
				}
				return
			}
			if errKind(r) != "InvalidArgument" {
				t.Fatalf("result %+v, want an InvalidArgument failure", r)
			}
			for _, s := range tc.refusal {
				if !strings.Contains(r.Text, s) {
					t.Errorf("message %q lacks %q", r.Text, s)
				}
			}
			entries, err := f.fs.ReadDir(context.Background(), ".")
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			if len(entries) != 0 {
				t.Errorf("the refused write left %v", entries)
			}
		})
	}
}

// FuzzWrittenTextIsExact: whatever the bytes of a write's content, sent
// raw in the JSON (only quotes, backslashes and control bytes escaped), the
// file holds exactly them when they are UTF-8, and the write is refused,
// leaving nothing, when they are not.
func FuzzWrittenTextIsExact(f *testing.F) {
	for _, s := range []string{"plain", "héllo", "\xff", "a\xe2\x82", "\ud7ff\ue000", "\\udc80", "\"\\\n\t\x00", "😀\xf0\x9f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		var args strings.Builder
		args.WriteString(`{"path":"f.txt","content":"`)
		for i := 0; i < len(content); i++ {
			switch b := content[i]; {
			case b == '"' || b == '\\':
				args.WriteByte('\\')
				args.WriteByte(b)
			case b < 0x20:
				fmt.Fprintf(&args, `\u%04x`, b)
			default:
				args.WriteByte(b)
			}
		}
		args.WriteString(`"}`)
		f := newFixture(t, nil)
		r := f.set.Call(context.Background(), "write", []byte(args.String()), tools.CallOptions{})
		if !utf8.ValidString(content) {
			if errKind(r) != "InvalidArgument" {
				t.Fatalf("write of %q: %+v", content, r)
			}
			if _, err := f.fs.Stat(context.Background(), "f.txt"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("a refused write left f.txt (%v)", err)
			}
			return
		}
		if r.IsError {
			t.Fatalf("write of %q: %s", content, r.Text)
		}
		if got := f.file("f.txt"); got != content {
			t.Fatalf("wrote %q, the file holds %q", content, got)
		}
	})
}
