package engine

import (
	"archive/zip"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/dirhash"

	"github.com/sandboxd/sandboxd/images"
)

// TestInstallGo: the toolchain comes from the module proxy GOPROXY names,
// is refused when its hash is not the pinned one, and once checked is
// unpacked to /usr/local/go with bin/ and pkg/tool/ executable, then
// taken from the cache.
func TestInstallGo(t *testing.T) {
	ver := "v0.0.1-go1.99.0.linux-" + runtime.GOARCH
	zipFile := filepath.Join(t.TempDir(), "tc.zip")
	f, err := os.Create(zipFile)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	for name, body := range map[string]string{"bin/go": "#!/bin/sh\necho go1.99.0\n", "pkg/tool/linux/compile": "c", "src/fmt/print.go": "package fmt\n", "go.env": "GOTOOLCHAIN=auto\n"} {
		w, _ := zw.Create("golang.org/toolchain@" + ver + "/" + name)
		w.Write([]byte(body))
	}
	zw.Close()
	f.Close()
	sum, err := dirhash.HashZip(zipFile, dirhash.DefaultHash)
	if err != nil {
		t.Fatal(err)
	}
	fetched := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/golang.org/toolchain/@v/"+ver+".zip" {
			http.NotFound(w, r)
			return
		}
		fetched++
		http.ServeFile(w, r, zipFile)
	}))
	defer srv.Close()
	t.Setenv("GOPROXY", "off,"+srv.URL+",direct")
	o := &options{progress: func(string) {}, cacheDir: t.TempDir()}
	platform := "linux-" + runtime.GOARCH

	bad := images.Definition{Name: "x", Go: &images.GoToolchain{Version: "1.99.0", Sums: map[string]string{platform: "h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}}}
	if err := installGo(t.Context(), o, bad, t.TempDir()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a toolchain whose hash is not the pinned one: %v", err)
	}
	d := images.Definition{Name: "x", Go: &images.GoToolchain{Version: "1.99.0", Sums: map[string]string{platform: sum}}}
	for range 2 {
		target := t.TempDir()
		if err := installGo(t.Context(), o, d, target); err != nil {
			t.Fatal(err)
		}
		for name, perm := range map[string]os.FileMode{"bin/go": 0o755, "pkg/tool/linux/compile": 0o755, "src/fmt/print.go": 0o644, "go.env": 0o644} {
			fi, err := os.Stat(filepath.Join(target, GoRoot, name))
			if err != nil || fi.Mode().Perm() != perm {
				t.Errorf("%s: %v %v, want mode %v", name, fi.Mode(), err, perm)
			}
		}
	}
	if fetched != 2 { // the bad sum's try, then once: the second install is the cache's
		t.Errorf("fetched %d times, want 2", fetched)
	}
}

// TestRemoveStale: a work directory no build holds the lock of (one a
// killed build left) is removed before a build; one a build holds is not.
func TestRemoveStale(t *testing.T) {
	o := &options{progress: func(string) {}, cacheDir: t.TempDir()}
	stale, _ := os.MkdirTemp(o.cacheDir, "dev-work-")
	os.WriteFile(filepath.Join(stale, ".lock"), nil, 0o644)
	os.MkdirAll(filepath.Join(stale, "rootfs/usr/bin"), 0o755)
	busy, _ := os.MkdirTemp(o.cacheDir, "dev-work-")
	unlock, err := lockWork(busy)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	removeStale(o)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale work directory is still there: %v", err)
	}
	if _, err := os.Stat(busy); err != nil {
		t.Errorf("the work directory of a running build was removed: %v", err)
	}
}
