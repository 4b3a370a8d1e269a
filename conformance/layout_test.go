package conformance

import (
	"slices"
	"testing"
)

func TestLayoutRoundTrip(t *testing.T) {
	layout := []string{
		"z", "a/b/c: text", "a/l => $OUTSIDE/x", "q: \"two\\nlines\\x00\"", "d/", "p|", "s=", "e:", "sp: \" padded \"",
		"x*: run", "y*", "w*:",
	}
	entries, err := parseLayout(layout, map[string]string{"$OUT": "../o", "$OUTSIDE": "/o"})
	if err != nil {
		t.Fatal(err)
	}
	got := canonical(entries)
	want := []string{"a/", "a/b/", "a/b/c: text", "a/l => /o/x", "d/", "e", "p|", "q: \"two\\nlines\\x00\"", "s=", "sp: \" padded \"", "w*", "x*: run", "y*", "z"}
	if !slices.Equal(got, want) {
		t.Fatalf("canonical = %q\nwant        %q", got, want)
	}
	again, err := parseLayout(got, nil)
	if err != nil || !slices.Equal(canonical(again), want) {
		t.Fatalf("the canonical form does not read back: %q, %v", canonical(again), err)
	}
	for _, bad := range []string{"", "/abs", "a/../b: x", "l => ", ".", "f: \"unterminated"} {
		if _, err := parseLayout([]string{bad}, nil); err == nil {
			t.Errorf("parseLayout(%q) succeeded", bad)
		}
	}
}

func TestHostDirRoundTrip(t *testing.T) {
	d := HostDir(t.TempDir())
	layout := []string{"a/b: x", "a/l => ../a/b", "e/", "p|", "s="}
	if err := d.Build(layout...); err != nil {
		t.Fatal(err)
	}
	got, err := d.Dump()
	want := []string{"a/", "a/b: x", "a/l => ../a/b", "e/", "p|", "s="}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("Dump = %q, %v; want %q", got, err, want)
	}
}

func TestRelPath(t *testing.T) {
	for _, tt := range []struct{ from, to, want string }{
		{"/tmp/x/001", "/tmp/x/002", "../002"},
		{"/workspace", "/outside", "../outside"},
		{"/a/b", "/a/b", "."},
		{"/", "/o", "o"},
		{"/a/b/c", "/", "../../.."},
	} {
		if got := relPath(tt.from, tt.to); got != tt.want {
			t.Errorf("relPath(%q, %q) = %q, want %q", tt.from, tt.to, got, tt.want)
		}
	}
}
