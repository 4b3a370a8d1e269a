package snapshot_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/workspace"
)

var layout = []string{
	"README.md: hello",
	"src/",
	"src/main.go: package main",
	"src/run.sh*: #!/bin/sh\necho hi",
	"src/empty/",
	"src/link => main.go",
	"src/out => ../../outside",
	"docs/a/b/c.txt: deep",
	".git/HEAD: ref: refs/heads/main",
	".sandboxd/spill/x: not saved",
	"pipe|",
}

func tree(t *testing.T, lines ...string) *memfs.FS {
	t.Helper()
	fsys := memfs.New()
	conformance.Build(t, fsys, lines...)
	return fsys
}

func from(fsys workspace.FileSystem) snapshot.Source {
	return func(ctx context.Context, w io.Writer) error { return snapshot.WriteTree(ctx, fsys, w) }
}

func open(t *testing.T, dir string, opts ...snapshot.Option) *snapshot.Store {
	t.Helper()
	st, err := snapshot.Open(dir, append([]snapshot.Option{snapshot.WithSync(false)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// restore restores id into a fresh memfs.
func restore(t *testing.T, st *snapshot.Store, tenant, id string) (*memfs.FS, error) {
	t.Helper()
	fsys := memfs.New()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- snapshot.ReadTree(t.Context(), fsys, pr) }()
	err := st.Restore(t.Context(), tenant, id, pw)
	pw.CloseWithError(err)
	if rerr := <-done; err == nil {
		err = rerr
	}
	return fsys, err
}

func digest(t *testing.T, fsys workspace.FileSystem) string {
	t.Helper()
	m, err := snapshot.Describe(t.Context(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	return m.Digest()
}

func TestRoundTrip(t *testing.T) {
	src := tree(t, layout...)
	st := open(t, t.TempDir())
	info, err := st.Create(t.Context(), "acme", from(src), snapshot.CreateRequest{Session: "s-1"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Files != 5 || info.Links != 2 || info.Dirs != 6 || info.Session != "s-1" || !strings.HasPrefix(info.ID, "snap-") {
		t.Errorf("info %+v", info)
	}
	if want := int64(len("hello") + len("package main") + len("#!/bin/sh\necho hi") + len("deep") + len("ref: refs/heads/main")); info.Bytes != want {
		t.Errorf("bytes %d, the files' sizes %d", info.Bytes, want)
	}
	if len(info.Skipped) != 1 || !strings.Contains(info.Skipped[0], "pipe (FIFO)") {
		t.Errorf("skipped %q, want the FIFO", info.Skipped)
	}
	if info.Manifest != digest(t, src) {
		t.Errorf("manifest %s, the tree's %s", info.Manifest, digest(t, src))
	}
	got, err := restore(t, st, "acme", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := digest(t, got); d != info.Manifest {
		t.Errorf("restored tree %s, snapshot %s", d, info.Manifest)
	}
	data, err := got.ReadFile(t.Context(), "src/run.sh", 1<<20)
	if err != nil || string(data) != "#!/bin/sh\necho hi" {
		t.Errorf("run.sh %q %v", data, err)
	}
	if fi, err := got.Lstat(t.Context(), "src/run.sh"); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh mode %v %v", fi, err)
	}
	if target, err := got.Readlink(t.Context(), "src/out"); err != nil || target != "../../outside" {
		t.Errorf("link %q %v", target, err)
	}
	if _, err := got.Lstat(t.Context(), ".sandboxd"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf(".sandboxd restored: %v", err)
	}
	if _, err := got.Lstat(t.Context(), "src/empty"); err != nil {
		t.Errorf("empty directory: %v", err)
	}
}

// TestDescribeTellsTreesApart: a changed byte, mode, link target or a
// missing empty directory changes the digest.
func TestDescribeTellsTreesApart(t *testing.T) {
	base := digest(t, tree(t, "a: x", "d/", "l => a"))
	for _, lines := range [][]string{
		{"a: y", "d/", "l => a"},
		{"a*: x", "d/", "l => a"},
		{"a: x", "d/", "l => d"},
		{"a: x", "l => a"},
	} {
		if digest(t, tree(t, lines...)) == base {
			t.Errorf("%q has the digest of the base tree", lines)
		}
	}
	if digest(t, tree(t, "l => a", "d/", "a: x")) != base {
		t.Error("the same tree built in another order has another digest")
	}
}

// packOf returns the path of the snapshot's pack, found by its ID.
func packOf(t *testing.T, dir, id string) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(dir, "tenants", "*", id, "data.tar"))
	if len(matches) != 1 {
		t.Fatalf("pack of %s: %q", id, matches)
	}
	return matches[0]
}

// TestTamperedRefused: a snapshot whose store was changed is refused,
// naming what changed, and never restored.
func TestTamperedRefused(t *testing.T) {
	cases := []struct {
		name, want string
		tamper     func(t *testing.T, pack string)
	}{
		{"one byte changed", "the contents of src/main.go differ", func(t *testing.T, pack string) {
			data, _ := os.ReadFile(pack)
			i := bytes.Index(data, []byte("package main"))
			data[i] ^= 1
			os.WriteFile(pack, data, 0o600)
		}},
		{"one file removed", "cut short or changed", func(t *testing.T, pack string) {
			rewrite(t, pack, func(h *tar.Header) bool { return h.Name != "docs/a/b/c.txt" })
		}},
		{"one file removed, the pack's size kept", "ends before", func(t *testing.T, pack string) {
			size := fileSize(t, pack)
			rewrite(t, pack, func(h *tar.Header) bool { return h.Name != "src/run.sh" })
			os.Truncate(pack, size) // zeros: the end of a tar
		}},
		{"truncated", "cut short", func(t *testing.T, pack string) {
			os.Truncate(pack, fileSize(t, pack)/2)
		}},
		{"truncated to nothing", "cut short", func(t *testing.T, pack string) { os.Truncate(pack, 0) }},
		{"pack missing", "its pack is missing", func(t *testing.T, pack string) { os.Remove(pack) }},
		{"manifest changed", "its manifest was changed", func(t *testing.T, pack string) {
			m := filepath.Join(filepath.Dir(pack), "manifest.json")
			data, _ := os.ReadFile(m)
			os.WriteFile(m, bytes.Replace(data, []byte(`"mode":420`), []byte(`"mode":438`), 1), 0o600)
		}},
		{"manifest missing", "its manifest is missing", func(t *testing.T, pack string) {
			os.Remove(filepath.Join(filepath.Dir(pack), "manifest.json"))
		}},
		{"snapshot removed", "missing", func(t *testing.T, pack string) { os.RemoveAll(filepath.Dir(pack)) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			st := open(t, dir)
			info, err := st.Create(t.Context(), "acme", from(tree(t, layout...)), snapshot.CreateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			c.tamper(t, packOf(t, dir, info.ID))
			_, err = restore(t, st, "acme", info.ID)
			if !errors.Is(err, snapshot.ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("restore: %v, want ErrCorrupt naming %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "sandboxd snapshot rm "+info.ID) {
				t.Errorf("the error names no fix: %v", err)
			}
			if err := st.Verify(t.Context(), "acme", info.ID); !errors.Is(err, snapshot.ErrCorrupt) {
				t.Errorf("verify: %v", err)
			}
		})
	}
}

func fileSize(t *testing.T, name string) int64 {
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// rewrite writes the tar file name again with the entries keep keeps.
func rewrite(t *testing.T, name string, keep func(*tar.Header) bool) {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(data)), tar.NewWriter(&out)
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !keep(h) {
			found = true
			continue
		}
		tw.WriteHeader(h)
		io.Copy(tw, tr)
	}
	tw.Close()
	if !found {
		t.Fatal("rewrite removed nothing")
	}
	os.WriteFile(name, out.Bytes(), 0o600)
}

// TestTenantsApart: a tenant sees only its own snapshots; another's ID is
// not found, as one never made.
func TestTenantsApart(t *testing.T) {
	st := open(t, t.TempDir())
	info, err := st.Create(t.Context(), "acme", from(tree(t, "a: x")), snapshot.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get("bolt", info.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("get: %v", err)
	}
	if _, err := restore(t, st, "bolt", info.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("restore: %v", err)
	}
	if err := st.Delete("bolt", info.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("delete: %v", err)
	}
	if l := st.List("bolt"); len(l) != 0 {
		t.Errorf("bolt lists %v", l)
	}
	if l := st.List("acme"); len(l) != 1 || l[0].ID != info.ID {
		t.Errorf("acme lists %v", l)
	}
	if _, err := st.Get("acme", "snap-nonesuch"); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	if err := st.Delete("acme", info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get("acme", info.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("deleted: %v", err)
	}
}

// leftovers lists what the store's directory holds besides its spaces.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() != ".lock" {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// TestCaps: a snapshot past the tenant's count or bytes is refused, and
// leaves nothing; files count at their full size.
func TestCaps(t *testing.T) {
	dir := t.TempDir()
	st := open(t, dir, snapshot.WithLimits(snapshot.Limits{Count: 2, Bytes: 3 << 20}))
	small := tree(t, "a: x")
	var ids []string
	for range 2 {
		info, err := st.Create(t.Context(), "acme", from(small), snapshot.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	before := leftovers(t, dir)
	_, err := st.Create(t.Context(), "acme", from(small), snapshot.CreateRequest{})
	if !errors.Is(err, snapshot.ErrLimit) || !strings.Contains(err.Error(), "snapshots.maxCount") {
		t.Fatalf("third: %v", err)
	}
	// Another tenant has caps of its own.
	if _, err := st.Create(t.Context(), "bolt", from(small), snapshot.CreateRequest{}); err != nil {
		t.Fatalf("bolt: %v", err)
	}
	st.Delete("acme", ids[1])

	// 4 MiB of zeros: their full size counts.
	big := memfs.New()
	if err := big.WriteFile(t.Context(), "zeros", make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = st.Create(t.Context(), "acme", from(big), snapshot.CreateRequest{})
	if !errors.Is(err, snapshot.ErrLimit) || !strings.Contains(err.Error(), "snapshots.maxBytes") {
		t.Fatalf("over bytes: %v", err)
	}
	if got := leftovers(t, dir); len(got) != len(before) {
		t.Errorf("a refused snapshot left %q (before: %q)", got, before)
	}
	if u, _ := st.Usage("acme"); u.Count != 1 {
		t.Errorf("usage %+v", u)
	}
	// A fork's snapshot is counted against neither cap.
	if _, err := st.Create(t.Context(), "acme", from(big), snapshot.CreateRequest{Transient: true}); err != nil {
		t.Errorf("transient: %v", err)
	}
}

// TestCapsConcurrent: snapshots made at once cannot pass the count cap
// together.
func TestCapsConcurrent(t *testing.T) {
	st := open(t, t.TempDir(), snapshot.WithLimits(snapshot.Limits{Count: 3}))
	src := tree(t, layout[:4]...)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = st.Create(t.Context(), "acme", from(src), snapshot.CreateRequest{}) })
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, snapshot.ErrLimit):
			t.Error(err)
		}
	}
	if ok != 3 || len(st.List("acme")) != 3 {
		t.Errorf("%d made, %d listed; want 3", ok, len(st.List("acme")))
	}
}

// TestSourceFails: a source that breaks off fails the snapshot with its
// error, and leaves nothing.
func TestSourceFails(t *testing.T) {
	dir := t.TempDir()
	st := open(t, dir)
	boom := errors.New("the container went away")
	src := func(ctx context.Context, w io.Writer) error {
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "a", Size: 1 << 20, Mode: 0o644})
		tw.Write(make([]byte, 1000))
		return boom
	}
	if _, err := st.Create(t.Context(), "acme", src, snapshot.CreateRequest{}); !errors.Is(err, boom) {
		t.Fatalf("create: %v", err)
	}
	if got := leftovers(t, dir); len(got) != 0 {
		t.Errorf("left %q", got)
	}
	// A stream cut short without an error is refused too.
	short := func(ctx context.Context, w io.Writer) error {
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "a", Size: 10, Mode: 0o644})
		tw.Write([]byte("12345"))
		return nil
	}
	if _, err := st.Create(t.Context(), "acme", short, snapshot.CreateRequest{}); err == nil {
		t.Fatal("a stream cut short made a snapshot")
	}
}

// TestStreams: what a tar stream may hold and what it may not.
func TestStreams(t *testing.T) {
	type ent struct {
		h    tar.Header
		data string
	}
	stream := func(es ...ent) snapshot.Source {
		return func(ctx context.Context, w io.Writer) error {
			tw := tar.NewWriter(w)
			for _, e := range es {
				e.h.Size = int64(len(e.data))
				if e.h.Mode == 0 {
					e.h.Mode = 0o644
				}
				if err := tw.WriteHeader(&e.h); err != nil {
					return err
				}
				io.WriteString(tw, e.data)
			}
			return tw.Close()
		}
	}
	file := func(name, data string) ent { return ent{tar.Header{Typeflag: tar.TypeReg, Name: name}, data} }
	st := open(t, t.TempDir())
	// A hard link becomes a file of its own; a missing parent is made; a
	// setuid bit is dropped.
	info, err := st.Create(t.Context(), "acme", stream(
		file("./x/a", "shared"),
		ent{tar.Header{Typeflag: tar.TypeLink, Name: "x/b", Linkname: "x/a"}, ""},
		ent{tar.Header{Typeflag: tar.TypeReg, Name: "s", Mode: 0o4755}, "suid"},
	), snapshot.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := restore(t, st, "acme", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := tree(t, "x/a: shared", "x/b: shared", "s*: suid")
	if digest(t, got) != digest(t, want) || info.Manifest != digest(t, want) {
		t.Errorf("restored %s, want %s", digest(t, got), digest(t, want))
	}
	for name, bad := range map[string]snapshot.Source{
		"absolute":        stream(file("/etc/passwd", "x")),
		"dot-dot":         stream(file("../x", "x")),
		"under a link":    stream(ent{tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/etc"}, ""}, file("l/passwd", "x")),
		"under a file":    stream(file("f", "x"), file("f/g", "x")),
		"twice":           stream(file("a", "x"), file("a", "y")),
		"hard link first": stream(ent{tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "a"}, ""}),
	} {
		if _, err := st.Create(t.Context(), "acme", bad, snapshot.CreateRequest{}); !errors.Is(err, snapshot.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestReopen: snapshots outlive the store's process; what a snapshot being
// made left, and forks' snapshots, do not.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	st := open(t, dir)
	src := tree(t, layout...)
	info, err := st.Create(t.Context(), "acme", from(src), snapshot.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fork, err := st.Create(t.Context(), "acme", from(src), snapshot.CreateRequest{Transient: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutTemplate(t.Context(), "py", from(src)); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, ".tmp-123"), 0o700)
	os.WriteFile(filepath.Join(dir, ".tmp-123", "data.tar"), []byte("half"), 0o600)

	if _, err := snapshot.Open(dir); err == nil || !strings.Contains(err.Error(), "in use by another daemon (pid "+strconv.Itoa(os.Getpid())+")") {
		t.Fatalf("a second Open of an open store: %v", err)
	}
	st.Close()
	st2 := open(t, dir)
	if l := st2.List("acme"); len(l) != 1 || !reflect.DeepEqual(l[0], info) {
		t.Errorf("after reopening: %+v, want %+v", l, info)
	}
	if _, err := st2.Get("acme", fork.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("a fork's snapshot outlived the store: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-123")); !os.IsNotExist(err) {
		t.Errorf("a half-made snapshot was left: %v", err)
	}
	got, err := restore(t, st2, "acme", info.ID)
	if err != nil || digest(t, got) != info.Manifest {
		t.Errorf("restore after reopening: %v", err)
	}
	if _, err := st2.Template("py"); err != nil {
		t.Errorf("template after reopening: %v", err)
	}
}

// TestTemplates: a template is made from its source, kept while its tree is
// the same, made again when it changes, and restored checked.
func TestTemplates(t *testing.T) {
	dir := t.TempDir()
	st := open(t, dir)
	src := tree(t, "req.txt: flask", "venv/bin/python => /usr/bin/python3")
	a, err := st.PutTemplate(t.Context(), "py", from(src))
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.PutTemplate(t.Context(), "py", from(src))
	if err != nil || !reflect.DeepEqual(a, b) {
		t.Errorf("the same tree again: %+v %v, want %+v", b, err, a)
	}
	src.WriteFile(t.Context(), "req.txt", []byte("django"), 0o644)
	c, err := st.PutTemplate(t.Context(), "py", from(src))
	if err != nil || c.Manifest == a.Manifest {
		t.Fatalf("a changed tree: %+v %v", c, err)
	}
	fsys := memfs.New()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(st.RestoreTemplate(t.Context(), "py", pw)) }()
	if err := snapshot.ReadTree(t.Context(), fsys, pr); err != nil || digest(t, fsys) != c.Manifest {
		t.Errorf("restored: %v", err)
	}
	if l := st.Templates(); len(l) != 1 || l[0].Manifest != c.Manifest {
		t.Errorf("templates %+v", l)
	}
	if _, err := st.PutTemplate(t.Context(), "../x", from(src)); !errors.Is(err, snapshot.ErrInvalid) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := st.Template("nonesuch"); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	if got := leftovers(t, dir); len(got) != 3 {
		t.Errorf("the store holds %q, want one template's three files", got)
	}
}

// TestDiskFull: a snapshot that fills the disk fails with ErrNoSpace and
// leaves nothing; the store works on once there is room. It mounts a
// small tmpfs, so it needs root (as CI runs).
func TestDiskFull(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("mounting a tmpfs: %v: %s", err, out)
		}
		t.Skipf("mounting a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	st := open(t, dir, snapshot.WithSync(true))
	big := memfs.New()
	for i := range 4 {
		big.WriteFile(t.Context(), fmt.Sprintf("f%d", i), bytes.Repeat([]byte{byte(i + 1)}, 1<<20), 0o644)
	}
	_, err := st.Create(t.Context(), "acme", from(big), snapshot.CreateRequest{})
	if !errors.Is(err, snapshot.ErrNoSpace) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("create on a full disk: %v", err)
	}
	if got := leftovers(t, dir); len(got) != 0 {
		t.Errorf("a failed snapshot left %q", got)
	}
	if l := st.List("acme"); len(l) != 0 {
		t.Errorf("lists %v", l)
	}
	info, err := st.Create(t.Context(), "acme", from(tree(t, "a: x")), snapshot.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restore(t, st, "acme", info.ID); err != nil {
		t.Fatal(err)
	}
}

// TestCreateTee: a Tee is given, byte for byte, the stream a Restore of
// the snapshot writes.
func TestCreateTee(t *testing.T) {
	st := open(t, t.TempDir())
	var tee bytes.Buffer
	info, err := st.Create(t.Context(), "acme", from(tree(t, layout...)), snapshot.CreateRequest{Transient: true, Tee: &tee})
	if err != nil {
		t.Fatal(err)
	}
	var restored bytes.Buffer
	if err := st.Restore(t.Context(), "acme", info.ID, &restored); err != nil {
		t.Fatal(err)
	}
	if tee.Len() == 0 || !bytes.Equal(tee.Bytes(), restored.Bytes()) {
		t.Fatalf("the tee got %d bytes, a restore writes %d, not the same", tee.Len(), restored.Len())
	}
}
