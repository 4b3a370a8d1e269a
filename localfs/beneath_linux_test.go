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
		fd, err := openBeneath(int(root.Fd()), c.name, unix.O_RDONLY|unix.O_CLOEXEC)
		if err == nil {
			unix.Close(fd)
		}
		if (err == nil) != c.ok {
			t.Errorf("openBeneath(%q) = %v, want success %v", c.name, err, c.ok)
		}
	}
}
