package engine_test

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/images/engine"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestMain(m *testing.M) { dockertest.Main(m, "images") }

// TestBuildMinimal builds the minimal image anew into a fresh cache, checks
// the root filesystem it cached and the image's labels, and that a second
// build is a no-op that says so.
func TestBuildMinimal(t *testing.T) {
	cli := dockertest.Client(t)
	ctx := context.Background()
	cache := t.TempDir()
	var lines []string
	ref, err := engine.Build(ctx, cli, "minimal", engine.WithCacheDir(cache), engine.WithRebuild(), engine.WithProgress(func(s string) { lines = append(lines, s) }))
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if !strings.Contains(strings.Join(lines, "\n"), "apt-get download busybox-static") {
		t.Errorf("progress does not say what it ran:\n%s", strings.Join(lines, "\n"))
	}
	tarballs, _ := filepath.Glob(filepath.Join(cache, "minimal-*.tar"))
	if len(tarballs) != 1 {
		t.Fatalf("cache holds %v", tarballs)
	}
	entries := readTar(t, tarballs[0])
	for name, want := range map[string]string{
		"workspace/":      "dir 1000:1000",
		"tmp/":            "dir 0:0 1777",
		"bin/busybox":     "reg 0:0",
		"bin/sh":          "link /bin/busybox",
		"bin/bash":        "link bash-static",
		"bin/bash-static": "reg 0:0",
		"etc/passwd":      "reg 0:0",
	} {
		if got := entries[name]; !strings.HasPrefix(got, want) {
			t.Errorf("rootfs entry %s = %q, want %q", name, got, want)
		}
	}

	d, _ := images.Lookup("minimal")
	info, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	labels := info.Config.Labels
	if labels[images.LabelSandboxd] != "1" || labels[images.LabelImage] != "minimal" || labels[images.LabelDefinition] != d.Hash() {
		t.Errorf("labels %v", labels)
	}
	if info.Config.User != "1000:1000" || info.Config.WorkingDir != "/workspace" {
		t.Errorf("user %q workdir %q", info.Config.User, info.Config.WorkingDir)
	}
	if _, err := cli.ImageInspect(ctx, d.Latest()); err != nil {
		t.Errorf("latest tag: %v", err)
	}

	lines = nil
	if _, err := engine.Build(ctx, cli, "minimal", engine.WithCacheDir(cache), engine.WithProgress(func(s string) { lines = append(lines, s) })); err != nil {
		t.Fatal(err)
	}
	if text := strings.Join(lines, "\n"); !strings.Contains(text, "up to date") || strings.Contains(text, "importing") {
		t.Errorf("second build of an unchanged image is not a no-op that says so:\n%s", text)
	}
	if again, err := cli.ImageInspect(ctx, ref); err != nil || again.ID != info.ID {
		t.Errorf("after a second build the image is %v (%v), want %s unchanged", again.ID, err, info.ID)
	}
	if ref2, err := engine.Ensure(ctx, cli, "minimal"); err != nil || ref2 != ref {
		t.Errorf("Ensure = %q, %v; want %q", ref2, err, ref)
	}
}

func readTar(t *testing.T, name string) map[string]string {
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		desc := map[byte]string{tar.TypeDir: "dir", tar.TypeReg: "reg", tar.TypeSymlink: "link " + h.Linkname}[h.Typeflag]
		if h.Typeflag != tar.TypeSymlink {
			desc += " " + strconv.Itoa(h.Uid) + ":" + strconv.Itoa(h.Gid)
			if h.Typeflag == tar.TypeDir && h.Mode&0o1000 != 0 {
				desc += " 1777"
			}
		}
		out[h.Name] = desc
	}
}

var buildDev = flag.Bool("dev", false, "also build the dev image with debootstrap (minutes on a cold cache)")

// TestBuildDev builds the dev image (with the default cache, so a rerun is
// quick) and checks that its tools are there and that it runs as user 1000.
// Under CI it always runs: CI builds the images before the tests, so the
// build finds the image made and checks what it is.
func TestBuildDev(t *testing.T) {
	if !*buildDev && os.Getenv("CI") == "" {
		t.Skip("run with -dev to build the dev image (CI runs it against the image it built)")
	}
	cli := dockertest.Client(t)
	ctx := context.Background()
	ref, err := engine.Build(ctx, cli, "dev", engine.WithProgress(func(s string) { t.Log(s) }))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Labels[images.LabelImage] != "dev" || info.Config.User != "1000:1000" {
		t.Errorf("labels %v user %q", info.Config.Labels, info.Config.User)
	}
}

// noImages is an engine that has no image at all.
type noImages struct{ engine.Client }

func (noImages) ImageInspect(context.Context, string, ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	return client.ImageInspectResult{}, cerrdefs.ErrNotFound
}

// TestResolve: a definition's name means its image; a missing image is an
// Unavailable error naming what to run.
func TestResolve(t *testing.T) {
	dev, _ := images.Lookup("dev")
	for in, want := range map[string]string{"dev": dev.Ref(), dev.Ref(): dev.Ref(), "alpine:3": "alpine:3", "sandboxd/*": "sandboxd/*", "": ""} {
		if got := images.Canonical(in); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", in, got, want)
		}
	}
	for image, fix := range map[string]string{"dev": "sandboxd image build dev", dev.Ref(): "sandboxd image build dev", "alpine:3": "docker pull alpine:3, or docker load"} {
		_, err := engine.Resolve(context.Background(), noImages{}, image)
		if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "run "+fix) {
			t.Errorf("Resolve(%q) on an empty engine = %v, want Unavailable naming %q", image, err, fix)
		}
	}
	cli := dockertest.Client(t)
	ref := dockertest.Image(t)
	if got, err := engine.Resolve(context.Background(), cli, images.Default); err != nil || got != ref {
		t.Errorf("Resolve(%q) = %q, %v; want %q", images.Default, got, err, ref)
	}
}

// TestDeclare: an operator's definition fills in defaults, is refused when
// not whole, takes its name everywhere and builds the same way, its files
// and links in place.
func TestDeclare(t *testing.T) {
	for _, bad := range []images.Definition{
		{Name: "minimal", Packages: []string{"busybox-static"}},
		{Name: "Bad/Name", Packages: []string{"busybox-static"}},
		{Name: "nopackages"},
		{Name: "relative", Packages: []string{"jq"}, Files: []images.File{{Path: "etc/x"}}},
		{Name: "escapes", Packages: []string{"jq"}, Files: []images.File{{Path: "/../x"}}},
		{Name: "badmode", Packages: []string{"jq"}, Files: []images.File{{Path: "/x", Mode: "rw"}}},
	} {
		if _, err := images.Declare(bad); err == nil {
			t.Errorf("Declare(%+v) succeeded", bad)
		}
	}
	d, err := images.Declare(images.Definition{Name: "itest-tiny", Builder: "busybox", Packages: []string{"busybox-static"},
		Files: []images.File{{Path: "/etc/motd", Content: "hello\n", Mode: "0600"}}, Links: map[string]string{"/usr/bin/hi": "/bin/busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Variant != "" || d.Suite != "bookworm" || d.User.UID != 1000 || len(d.Env) == 0 {
		t.Errorf("defaults not filled in: %+v", d)
	}
	if got, err := images.Lookup("itest-tiny"); err != nil || got.Ref() != d.Ref() || images.Canonical("itest-tiny") != d.Ref() {
		t.Errorf("Lookup = %v, %v; Canonical = %q; want %s", got.Ref(), err, images.Canonical("itest-tiny"), d.Ref())
	}
	if _, err := images.Lookup("nope"); err == nil || !strings.Contains(err.Error(), "itest-tiny") {
		t.Errorf("Lookup(nope) = %v, want the declared image listed", err)
	}

	cli := dockertest.Client(t)
	ctx := context.Background()
	cache := t.TempDir()
	ref, err := engine.Build(ctx, cli, "itest-tiny", engine.WithCacheDir(cache), engine.WithRebuild())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.ImageRemove(context.Background(), d.Latest(), client.ImageRemoveOptions{})
		cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{})
	})
	tarballs, _ := filepath.Glob(filepath.Join(cache, "itest-tiny-*.tar"))
	if len(tarballs) != 1 {
		t.Fatalf("cache holds %v", tarballs)
	}
	entries := readTar(t, tarballs[0])
	if entries["etc/motd"] != "reg 0:0" || entries["usr/bin/hi"] != "link /bin/busybox" {
		t.Errorf("etc/motd %q, usr/bin/hi %q", entries["etc/motd"], entries["usr/bin/hi"])
	}
}
