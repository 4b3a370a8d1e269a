package engine

import (
	"archive/zip"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"

	"github.com/sandboxd/sandboxd/images"
)

// GoRoot is where a definition's Go toolchain is installed in the image.
const GoRoot = "/usr/local/go"

// installGo unpacks d's Go toolchain into the root filesystem at target:
// the module's zip, fetched through the module proxy (or taken from the
// cache, where it is kept by its hash) and checked against the pinned sum
// first. Files under bin/ and pkg/tool/ are made executable, as the go
// command does for a toolchain it fetches (a module zip keeps no modes).
func installGo(ctx context.Context, o *options, d images.Definition, target string) error {
	g := d.Go
	platform := "linux-" + runtime.GOARCH
	sum, ok := g.Sums[platform]
	if !ok {
		return fmt.Errorf("go %s: the definition pins no sum for %s", g.Version, platform)
	}
	mod, ver := g.Module(platform)
	zipFile, err := toolchainZip(ctx, o, mod, ver, sum)
	if err != nil {
		return err
	}
	zr, err := zip.OpenReader(zipFile)
	if err != nil {
		return err
	}
	defer zr.Close()
	root, err := os.OpenRoot(target)
	if err != nil {
		return err
	}
	defer root.Close()
	prefix := mod + "@" + ver + "/"
	dest := strings.TrimPrefix(GoRoot, "/")
	n := 0
	for _, f := range zr.File {
		rel, ok := strings.CutPrefix(f.Name, prefix)
		if !ok || rel == "" || strings.HasSuffix(rel, "/") || !filepath.IsLocal(rel) {
			continue
		}
		name := path.Join(dest, rel)
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		perm := os.FileMode(0o644)
		if strings.HasPrefix(rel, "bin/") || strings.HasPrefix(rel, "pkg/tool/") {
			perm = 0o755
		}
		if err := unzipTo(root, name, f, perm); err != nil {
			return fmt.Errorf("go %s: %s: %w", g.Version, rel, err)
		}
		n++
	}
	o.progress(fmt.Sprintf("installed Go %s (%s, %d files) at %s", g.Version, ver, n, GoRoot))
	return nil
}

func unzipTo(root *os.Root, name string, f *zip.File, perm os.FileMode) error {
	r, err := f.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// toolchainZip returns a file holding the zip of mod@ver whose hash is sum:
// the cache's, or one fetched from the module proxy, checked, then cached.
// A zip whose hash is not sum is an error, and never cached.
func toolchainZip(ctx context.Context, o *options, mod, ver, sum string) (string, error) {
	cached := filepath.Join(o.cacheDir, "go", strings.NewReplacer("/", "_", ":", "_", "+", "-").Replace(ver+"-"+sum)+".zip")
	if got, err := dirhash.HashZip(cached, dirhash.DefaultHash); err == nil && got == sum {
		o.progress("using cached Go toolchain " + cached)
		return cached, nil
	}
	if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
		return "", err
	}
	escaped, err := module.EscapePath(mod)
	if err != nil {
		return "", err
	}
	url := goProxy() + "/" + escaped + "/@v/" + ver + ".zip"
	o.progress("fetching " + url)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("fetching the Go toolchain: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("fetching the Go toolchain: %s answered %s", url, resp.Status)
	}
	tmp, err := os.CreateTemp(filepath.Dir(cached), ".partial-*.zip")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, resp.Body); err != nil {
		tmp.Close()
		return "", fmt.Errorf("fetching the Go toolchain: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	got, err := dirhash.HashZip(tmp.Name(), dirhash.DefaultHash)
	if err != nil {
		return "", fmt.Errorf("the Go toolchain from %s: %w", url, err)
	}
	if got != sum {
		return "", fmt.Errorf("the Go toolchain from %s has the hash %s, not the %s its definition pins: refused", url, got, sum)
	}
	if err := os.Rename(tmp.Name(), cached); err != nil {
		return "", err
	}
	return cached, nil
}

// goProxy is the first module proxy GOPROXY names, as the go command would
// try it, or proxy.golang.org.
func goProxy() string {
	for p := range strings.SplitSeq(os.Getenv("GOPROXY"), ",") {
		if p = strings.TrimSpace(strings.SplitN(p, "|", 2)[0]); strings.HasPrefix(p, "https://") || strings.HasPrefix(p, "http://") {
			return strings.TrimSuffix(p, "/")
		}
	}
	return "https://proxy.golang.org"
}
