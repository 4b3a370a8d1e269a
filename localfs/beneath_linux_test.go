package localfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// openBeneath opens names below the directory, through relative links that
// stay below it, in one call, and refuses every way out (the caller then
// asks ReadFile, which decides).
func TestOpenBeneath(t *testing.T) {
	_, top := newFS(t, "d/", "d/f: x", "ld => d", "up => ..", "abs => $ROOT/d", "lo => ../out")
	root, err := os.Open(filepath.Join(top, "ws"))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"d/f", true}, {"ld/f", true}, {"d/../d/f", true},
		{"../ws/d/f", false}, {"up/ws/d/f", false}, {"abs/f", false}, {"lo", false}, {"/etc/passwd", false},
	} {
		fd, err := openBeneath(int(root.Fd()), c.name, unix.O_RDONLY|unix.O_CLOEXEC, false)
		if err == nil {
			unix.Close(fd)
		}
		if (err == nil) != c.ok {
			t.Errorf("openBeneath(%q) = %v, want success %v", c.name, err, c.ok)
		}
	}
}

// replaceEntry puts a file in place of another in one step, and leaves a
// directory found there as it was, failing as a rename over it would.
func TestReplaceEntry(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"old": "old", "tmp": "new", "tmp2": "new"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dfd := int(d.Fd())
	if err := replaceEntry(dfd, "tmp", "old"); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "old")); err != nil || string(data) != "new" {
		t.Errorf("old holds %q, %v; want new", data, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary name is left: %v", err)
	}
	if err := replaceEntry(dfd, "tmp2", "d"); err != unix.EISDIR {
		t.Errorf("over a directory: %v, want EISDIR", err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "d")); err != nil || !fi.IsDir() {
		t.Errorf("the directory: %v, %v; want it in place", fi, err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "tmp2")); err != nil || string(data) != "new" {
		t.Errorf("tmp2 holds %q, %v; want it back, for the caller to remove", data, err)
	}
}
