package memory

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestRacyFileHashed: a file recorded recently, then rewritten leaving its
// size, times and inode as recorded — as a coarse clock can — is found by
// its contents.
func TestRacyFileHashed(t *testing.T) {
	ctx := t.Context()
	fsys := memfs.New() // its times are now: the file is racy when recorded
	if err := fsys.WriteFile(ctx, "f", []byte("aaaa"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := NewMirror(fsys, WithTempDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	run := func() {
		t.Helper()
		if res, err := b.Run(ctx, workspace.Command{Script: "true"}); err != nil || res.ExitCode != 0 {
			t.Fatalf("Run = %+v, %v", res, err)
		}
	}
	b.watchOff = true // the rewrite is made outside any command, unwatched
	run()
	// Rewrite f in place with its time put back, and make the record match
	// the host in everything but the contents, as if the status-change time
	// had not moved within the clock's tick.
	p := filepath.Join(b.root, "f")
	before, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("bbbb"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	after, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	e := b.snap["f"]
	// Recorded as it was written, however long the first Run took on a
	// loaded machine: the file is racy.
	e.seen = after.ModTime()
	if e.host.ino, e.host.ctime, _ = sysStat(after); !e.host.same(hostStateOf(after)) {
		t.Fatalf("the record %+v does not match the host %+v", e.host, hostStateOf(after))
	}
	run()
	if got := readFile(t, fsys, "f"); got != "bbbb" {
		t.Errorf("f = %q, want the rewrite found by its contents", got)
	}
	if e := b.snap["f"]; e == nil || !e.seen.After(time.Now().Add(-time.Minute)) {
		t.Errorf("f's record after the copy: %+v", e)
	}
}

func readFile(t *testing.T, fsys *memfs.FS, name string) string {
	t.Helper()
	data, err := fsys.ReadFile(t.Context(), name, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestTopmost(t *testing.T) {
	tests := []struct {
		in, want []string
	}{
		{[]string{}, []string{}},
		{[]string{"b", "a", "b"}, []string{"a", "b"}},
		{[]string{"a/b", "a-b", "a", "a/b/c"}, []string{"a", "a-b"}},
		{[]string{"x/y", "x/y/z", "x/yz"}, []string{"x/y", "x/yz"}},
		{[]string{"a", "."}, nil},
	}
	for _, tt := range tests {
		if got := topmost(tt.in); !slices.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
			t.Errorf("topmost(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}
