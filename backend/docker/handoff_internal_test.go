package docker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHandoffMount(t *testing.T) {
	base := t.TempDir()
	private := filepath.Join(base, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		mounted   bool
		err       string
	}{
		{name: "none", dir: ""},
		{name: "made", dir: filepath.Join(base, "new", "handoff"), mounted: true},
		{name: "private", dir: private, mounted: true},
		{name: "open to others", dir: open, err: "no one else may enter"},
		{name: "a link", dir: link, err: "no one else may enter"},
		{name: "too long for a socket", dir: filepath.Join(base, strings.Repeat("d", 100))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, hostDir, ok, err := handoffMount(tc.dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v; want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || ok != tc.mounted {
				t.Fatalf("mounted %v, err %v; want %v", ok, err, tc.mounted)
			}
			if !ok {
				return
			}
			fi, err := os.Stat(hostDir)
			if err != nil || fi.Mode().Perm() != 0o755 || filepath.Dir(hostDir) != tc.dir {
				t.Fatalf("the container's directory %s: %v %v", hostDir, fi, err)
			}
			if m.Source != hostDir || m.Target != mountHandoff || !m.ReadOnly {
				t.Errorf("mount %+v", m)
			}
			if err := removeHandoffDir(hostDir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(hostDir); !os.IsNotExist(err) {
				t.Errorf("removeHandoffDir left %s", hostDir)
			}
		})
	}
	// Only what Start made is ever removed.
	if err := removeHandoffDir(private); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(private); err != nil {
		t.Errorf("removeHandoffDir removed a directory it did not make: %v", err)
	}
}
