package sources_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
)

// The content every kind of source is made of in these tests.
var (
	files = map[string]string{"README.md": "# docs\n", "api/v1.md": "GET /things\n", "bin/run.sh": "#!/bin/sh\necho hi\n"}
	links = map[string]string{"latest": "api/v1.md"}
)

func makeDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// tarEntry is one header of a tar made by a test.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func makeTar(t *testing.T, entries []tarEntry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "src.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func goodTar(t *testing.T) string {
	return makeTar(t, []tarEntry{
		{name: "./", typ: tar.TypeDir},
		{name: "README.md", body: files["README.md"], typ: tar.TypeReg},
		{name: "api/v1.md", body: files["api/v1.md"], typ: tar.TypeReg},
		{name: "bin/", typ: tar.TypeDir},
		{name: "bin/run.sh", body: files["bin/run.sh"], typ: tar.TypeReg, mode: 0o755},
		{name: "latest", link: "api/v1.md", typ: tar.TypeSymlink},
	})
}

// makeGit commits the test content in a new repository and returns it
// and the commit.
func makeGit(t *testing.T) (string, string) {
	t.Helper()
	dir := makeDir(t)
	run := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "GIT_CONFIG_NOSYSTEM=1"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("init", "-q")
	run("add", "-A")
	run("commit", "-q", "-m", "one")
	commit := run("rev-parse", "HEAD")
	// A later commit and a dirty work tree must not show in the snapshot.
	os.WriteFile(filepath.Join(dir, "README.md"), []byte("changed\n"), 0o644)
	run("commit", "-q", "-am", "two")
	os.WriteFile(filepath.Join(dir, "untracked"), []byte("x"), 0o644)
	// A hook that would leave a mark if git ran it.
	os.WriteFile(filepath.Join(dir, ".git/hooks/post-checkout"), []byte("#!/bin/sh\ntouch "+dir+"/HOOKRAN\n"), 0o755)
	return dir, commit
}

func readAll(t *testing.T, fsys workspace.FileSystem, name string) string {
	t.Helper()
	data, err := fsys.ReadFile(context.Background(), name, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestMaterializeEachKind(t *testing.T) {
	ctx := context.Background()
	repo, commit := makeGit(t)
	decls := sources.Decls{
		{Name: "dir", Kind: sources.KindDir, Path: makeDir(t)},
		{Name: "tar", Kind: sources.KindTar, Path: goodTar(t)},
		{Name: "git", Kind: sources.KindGit, Path: repo, Commit: commit},
	}
	fsys := memfs.New()
	res, err := sources.Materialize(ctx, fsys, decls, sources.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sources) != 3 {
		t.Fatalf("got %d sources", len(res.Sources))
	}
	digest := res.Sources[0].Digest
	for _, s := range res.Sources {
		if !s.Changed || s.Files != 3 || s.Bytes != 37 || s.Path != ".sandboxd/sources/"+s.Name || !strings.HasPrefix(s.Digest, "sha256:") {
			t.Errorf("%+v", s)
		}
		if s.Digest != digest { // same content, same digest, whatever the kind
			t.Errorf("%s: digest %s, dir's %s", s.Name, s.Digest, digest)
		}
		for name, content := range files {
			if got := readAll(t, fsys, s.Path+"/"+name); got != content {
				t.Errorf("%s/%s = %q", s.Path, name, got)
			}
		}
		if got := readAll(t, fsys, s.Path+"/latest"); got != files["api/v1.md"] {
			t.Errorf("%s/latest = %q", s.Path, got)
		}
		info, _ := fsys.Stat(ctx, s.Path+"/bin/run.sh")
		if info.Mode()&0o100 == 0 {
			t.Errorf("%s: run.sh lost its execute bit: %v", s.Name, info.Mode())
		}
		if _, err := fsys.Stat(ctx, s.Path+"/untracked"); !errors.Is(err, workspace.ErrNotFound) {
			t.Errorf("%s/untracked: %v", s.Path, err)
		}
	}
	if _, err := os.Stat(filepath.Join(repo, "HOOKRAN")); err == nil {
		t.Error("a hook of the repository ran")
	}
	// Again: nothing changes, the digests are the same.
	again, err := sources.Materialize(ctx, fsys, decls, sources.Request{})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range again.Sources {
		if s.Changed || s.Digest != res.Sources[i].Digest {
			t.Errorf("second run: %+v", s)
		}
	}
	entries, _ := fsys.ReadDir(ctx, sources.SnapshotDir)
	if len(entries) != 3 {
		t.Errorf("leftovers in %s: %v", sources.SnapshotDir, entries)
	}
}

func TestMaterializeRestoresAChangedSnapshot(t *testing.T) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "ws")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	lfs, err := localfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lfs.Close()
	decls := sources.Decls{{Name: "docs", Kind: sources.KindDir, Path: makeDir(t)}}
	first, err := sources.Materialize(ctx, lfs, decls, sources.Request{Names: []string{"docs"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tamper := range []func(){
		func() { lfs.WriteFile(ctx, ".sandboxd/sources/docs/README.md", []byte("x"), 0o644) },
		func() { lfs.WriteFile(ctx, ".sandboxd/sources/docs/extra", []byte("x"), 0o644) },
		func() { lfs.Remove(ctx, ".sandboxd/sources/docs/latest") },
		func() { workspace.RemoveAll(ctx, lfs, ".sandboxd/sources/docs") },
	} {
		tamper()
		res, err := sources.Materialize(ctx, lfs, decls, sources.Request{Path: ".sandboxd/sources/docs/api"})
		if err != nil {
			t.Fatal(err)
		}
		if s := res.Sources[0]; !s.Changed || s.Digest != first.Sources[0].Digest {
			t.Errorf("after tampering: %+v", s)
		}
		if got := readAll(t, lfs, ".sandboxd/sources/docs/README.md"); got != files["README.md"] {
			t.Errorf("README.md = %q", got)
		}
		if _, err := lfs.Lstat(ctx, ".sandboxd/sources/docs/extra"); !errors.Is(err, workspace.ErrNotFound) {
			t.Errorf("extra survived: %v", err)
		}
	}
}

func TestHostileSourcesAreRefused(t *testing.T) {
	big := strings.Repeat("x", 2000)
	tars := map[string][]tarEntry{
		"dotdot":         {{name: "../evil", body: "x", typ: tar.TypeReg}},
		"inner dotdot":   {{name: "a/../../evil", body: "x", typ: tar.TypeReg}},
		"absolute":       {{name: "/etc/evil", body: "x", typ: tar.TypeReg}},
		"link out":       {{name: "l", link: "../../etc/passwd", typ: tar.TypeSymlink}},
		"absolute link":  {{name: "l", link: "/etc/passwd", typ: tar.TypeSymlink}},
		"link chain out": {{name: "d/", typ: tar.TypeDir}, {name: "d/l", link: "..", typ: tar.TypeSymlink}, {name: "d/m", link: "l/..", typ: tar.TypeSymlink}},
		"entry via link": {{name: "sub/", typ: tar.TypeDir}, {name: "l", link: "sub", typ: tar.TypeSymlink}, {name: "l/x", body: "x", typ: tar.TypeReg}},
		"char device":    {{name: "null", typ: tar.TypeChar}},
		"fifo":           {{name: "p", typ: tar.TypeFifo}},
		"hard link out":  {{name: "h", link: "/etc/passwd", typ: tar.TypeLink}},
		"too big":        {{name: "big", body: big, typ: tar.TypeReg}},
		"duplicate":      {{name: "a", body: "x", typ: tar.TypeReg}, {name: "a", link: "/", typ: tar.TypeSymlink}},
	}
	lim := sources.Limits{MaxFileBytes: 1000}
	good := sources.Decl{Name: "good", Kind: sources.KindDir, Path: makeDir(t)}
	for name, entries := range tars {
		t.Run("tar "+name, func(t *testing.T) {
			refused(t, sources.Decls{good, {Name: "bad", Kind: sources.KindTar, Path: makeTar(t, entries)}}, lim)
		})
	}
	dirs := map[string]func(dir string) error{
		"link out":      func(dir string) error { return os.Symlink("../../..", filepath.Join(dir, "l")) },
		"absolute link": func(dir string) error { return os.Symlink("/etc", filepath.Join(dir, "l")) },
		"link chain out": func(dir string) error {
			os.Symlink("..", filepath.Join(dir, "api/up"))
			return os.Symlink("api/up/..", filepath.Join(dir, "m"))
		},
		"fifo":    func(dir string) error { return syscall.Mkfifo(filepath.Join(dir, "p"), 0o644) },
		"too big": func(dir string) error { return os.WriteFile(filepath.Join(dir, "big"), []byte(big), 0o644) },
	}
	for name, hostile := range dirs {
		t.Run("dir "+name, func(t *testing.T) {
			dir := makeDir(t)
			if err := hostile(dir); err != nil {
				t.Fatal(err)
			}
			refused(t, sources.Decls{good, {Name: "bad", Kind: sources.KindDir, Path: dir}}, lim)
		})
	}
	t.Run("total bytes", func(t *testing.T) {
		refused(t, sources.Decls{good}, sources.Limits{MaxBytes: 20})
	})
	t.Run("too many files", func(t *testing.T) {
		refused(t, sources.Decls{good}, sources.Limits{MaxFiles: 3})
	})
	t.Run("git commit not in repository", func(t *testing.T) {
		repo, _ := makeGit(t)
		refused(t, sources.Decls{good, {Name: "bad", Kind: sources.KindGit, Path: repo, Commit: strings.Repeat("ab", 20)}}, lim)
	})
}

// refused checks that materializing decls fails and writes nothing at all.
func refused(t *testing.T, decls sources.Decls, lim sources.Limits) {
	t.Helper()
	fsys := memfs.New()
	_, err := sources.Materialize(context.Background(), fsys, decls, sources.Request{Limits: lim})
	if err == nil {
		t.Fatal("materialized a hostile source")
	}
	t.Log(err)
	if entries, _ := fsys.ReadDir(context.Background(), "."); len(entries) != 0 {
		t.Errorf("something was materialized: %v", entries)
	}
}

func TestValidateAndSelect(t *testing.T) {
	commit := strings.Repeat("a", 40)
	for _, tc := range []struct {
		d     sources.Decl
		field string
	}{
		{sources.Decl{Name: "", Kind: "dir", Path: "/x"}, "sources[0].name"},
		{sources.Decl{Name: "../x", Kind: "dir", Path: "/x"}, "sources[0].name"},
		{sources.Decl{Name: ".hidden", Kind: "dir", Path: "/x"}, "sources[0].name"},
		{sources.Decl{Name: "a/b", Kind: "dir", Path: "/x"}, "sources[0].name"},
		{sources.Decl{Name: "a", Kind: "ftp", Path: "/x"}, "sources[0].kind"},
		{sources.Decl{Name: "a", Kind: "http", Path: "/x"}, "sources[0].path"},
		{sources.Decl{Name: "a", Kind: "dir", Path: "rel"}, "sources[0].path"},
		{sources.Decl{Name: "a", Kind: "dir", Path: "/x/../y"}, "sources[0].path"},
		{sources.Decl{Name: "a", Kind: "git", Path: "/x", Commit: "main"}, "sources[0].commit"},
		{sources.Decl{Name: "a", Kind: "git", Path: "/x", Commit: "ABC"}, "sources[0].commit"},
		{sources.Decl{Name: "a", Kind: "tar", Path: "/x", Commit: commit}, "sources[0].commit"},
		{sources.Decl{Name: "a", Kind: "git", Path: "/x", Commit: commit}, ""},
		{sources.Decl{Name: "A.b_c-1", Kind: "tar", Path: "/x.tar"}, ""},
	} {
		err := sources.Decls{tc.d}.Validate()
		var de *sources.DeclError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v", tc.d, err)
		case tc.field != "" && (!errors.As(err, &de) || de.Field != tc.field || !errors.Is(err, workspace.ErrInvalidArgument)):
			t.Errorf("%+v: got %v, want an error naming %s", tc.d, err, tc.field)
		}
	}
	dup := sources.Decls{{Name: "a", Kind: "dir", Path: "/x"}, {Name: "a", Kind: "dir", Path: "/y"}}
	if err := dup.Validate(); err == nil || !strings.Contains(err.Error(), "sources[1].name") {
		t.Errorf("duplicate names: %v", err)
	}

	ds := sources.Decls{{Name: "a", Kind: "dir", Path: "/x"}, {Name: "b", Kind: "dir", Path: "/y"}}
	for _, tc := range []struct {
		req  sources.Request
		want string // names selected, or "NotFound"
	}{
		{sources.Request{}, "a b"},
		{sources.Request{Path: "."}, "a b"},
		{sources.Request{Path: ".sandboxd"}, "a b"},
		{sources.Request{Path: ".sandboxd/sources/b"}, "b"},
		{sources.Request{Path: ".sandboxd/sources/b/deep/x"}, "b"},
		{sources.Request{Names: []string{"b"}}, "b"},
		{sources.Request{Names: []string{"c"}}, "NotFound"},
		{sources.Request{Path: "src"}, "NotFound"},
		{sources.Request{Path: ".sandboxd/sources/bb"}, "NotFound"},
		{sources.Request{Path: ".sandboxd/sources/a", Names: []string{"b"}}, "NotFound"},
	} {
		sel, err := ds.Select(tc.req)
		var got []string
		for _, d := range sel {
			got = append(got, d.Name)
		}
		if err != nil {
			if !errors.Is(err, workspace.ErrNotFound) {
				t.Errorf("%+v: %v", tc.req, err)
			}
			got = []string{"NotFound"}
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%+v: got %v, want %s", tc.req, got, tc.want)
		}
	}
}

// TestCheck says whether each kind of source can be materialized now,
// without reading it whole.
func TestCheck(t *testing.T) {
	repo, commit := makeGit(t)
	missing := filepath.Join(t.TempDir(), "missing")
	notTar := filepath.Join(t.TempDir(), "not.tar")
	os.WriteFile(notTar, []byte(strings.Repeat("not a tar archive ", 64)), 0o644)
	http := func(env string) sources.Decl {
		return sources.Decl{Name: "api", Kind: sources.KindHTTP, HTTPDecl: sources.HTTPDecl{URL: "https://api.example.com",
			Requests: []sources.RequestShape{{Method: "GET", Path: "/x"}}, Credential: &sources.Credential{Header: "Authorization", Secret: sources.Secret{Env: env}}}}
	}
	t.Setenv("SANDBOXD_TEST_CHECK_TOKEN", "s3cret-for-check")
	for _, tc := range []struct {
		d    sources.Decl
		want string // "" for no error
	}{
		{sources.Decl{Name: "d", Kind: sources.KindDir, Path: makeDir(t)}, ""},
		{sources.Decl{Name: "d", Kind: sources.KindDir, Path: missing}, "directory " + missing},
		{sources.Decl{Name: "t", Kind: sources.KindTar, Path: goodTar(t)}, ""},
		{sources.Decl{Name: "t", Kind: sources.KindTar, Path: notTar}, "tar file"},
		{sources.Decl{Name: "g", Kind: sources.KindGit, Path: repo, Commit: commit}, ""},
		{sources.Decl{Name: "g", Kind: sources.KindGit, Path: repo, Commit: strings.Repeat("0", 40)}, "commit 000000000000"},
		{http("SANDBOXD_TEST_CHECK_TOKEN"), ""},
		{http("SANDBOXD_TEST_CHECK_UNSET"), "SANDBOXD_TEST_CHECK_UNSET is unset"},
	} {
		err := tc.d.Check(context.Background())
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %s: %v", tc.d.Kind, tc.d.Name, err)
		case tc.want != "" && (!errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %s: %v, want Unavailable saying %q", tc.d.Kind, tc.d.Name, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("the error holds the credential: %v", err)
		}
	}
}
