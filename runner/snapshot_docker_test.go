package runner_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// dockerTree is what the Docker snapshot tests build in a workspace: modes,
// links in and out, an empty directory, a name with a space and one past
// ASCII, and a file of 1 MiB.
const dockerTree = `mkdir -p src/pkg empty 'with space' && printf 'package main\n' > src/main.go &&
printf '#!/bin/sh\necho hi\n' > src/run.sh && chmod 755 src/run.sh && chmod 600 src/main.go &&
chmod 700 src/pkg && ln -s main.go src/link && ln -s /etc/passwd out && printf x > 'with space/f' &&
printf 'ü' > 'naïve' && dd if=/dev/urandom of=big bs=1024 count=1024 2>/dev/null`

func call(t *testing.T, s *runner.Session, tool string, args any) tools.Result {
	t.Helper()
	data, _ := json.Marshal(args)
	res, err := s.Call(context.Background(), tool, data, tools.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("%s: %s", tool, res.Text)
	}
	return res
}

// counters reads the two counters the writer keeps in s.
func counters(t *testing.T, s *runner.Session) (a, z int) {
	t.Helper()
	read := func(name string) int {
		data, err := s.FS().ReadFile(context.Background(), name, 64)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatalf("%s holds %q", name, data)
		}
		return n
	}
	return read("a-count"), read("z-count")
}

// TestDockerSnapshots: on Docker, a snapshot taken while a command writes
// is one moment's; a session from it has the tree byte for byte and mode
// for mode, owned by its own user; a fork into three gives three
// independent copies; a changed, cut or missing snapshot is refused with
// nothing left running; a snapshot over the tenant's cap (a sparse file
// at its full size) is refused; another tenant sees none of it; and all of
// it holds for a daemon started again on the same store.
func TestDockerSnapshots(t *testing.T) {
	dir := t.TempDir()
	open := func() *snapshot.Store {
		st, err := snapshot.Open(dir, snapshot.WithLimits(snapshot.Limits{Bytes: 100 << 20}))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := open()
	m, cli := dockerManager(t, runner.WithSnapshots(st))
	defer m.Shutdown(context.Background())
	src := create(t, m, "acme", shell)
	if br, res := bash(t, src, dockerTree); br == nil || br.ExitCode != 0 {
		t.Fatalf("building the tree: %s", res.Text)
	}

	// The writer bumps a-count, then z-count, each renamed into place: at
	// any moment a-count is z-count or one more. A copy made while it runs
	// reads a-count, then 8 MB of m-big and 2,000 files of m-files, then
	// z-count: without the freeze, z-count has gone on by then.
	bash(t, src, "dd if=/dev/urandom of=m-big bs=1048576 count=8 2>/dev/null; mkdir m-files; for i in {1..2000}; do echo $i > m-files/$i; done; echo 0 > a-count; echo 0 > z-count")
	res := call(t, src, "bash", map[string]any{"background": true,
		"command": "i=0; while :; do i=$((i+1)); echo $i > .a && mv .a a-count; echo $i > .z && mv .z z-count; done"})
	bg := res.Structured.(*tools.BackgroundResult).ID
	waitFor(t, func() bool { a, _ := counters(t, src); return a > 20 })
	during, err := src.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a, _ := counters(t, src)
	waitFor(t, func() bool { b, _ := counters(t, src); return b > a }) // it writes on after the freeze
	call(t, src, "bash_kill", map[string]any{"id": bg})
	bash(t, src, "rm -r m-big m-files")

	frozen := create(t, m, "acme", runner.Settings{Snapshot: during.ID, Grants: shell.Grants, Always: shell.Always})
	if got := treeDigest(t, frozen.FS()); got != during.Manifest {
		t.Errorf("the tree restored from the snapshot taken while writing is %s, the snapshot %s", got, during.Manifest)
	}
	if a, z := counters(t, frozen); a != z && a != z+1 {
		t.Errorf("the snapshot taken while writing has a-count %d and z-count %d: not one moment's", a, z)
	}

	// Quiet now: the source's tree, a snapshot of it and a session from
	// it are one tree.
	quiet, err := src.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := treeDigest(t, src.FS())
	restored := create(t, m, "acme", runner.Settings{Snapshot: quiet.ID, Grants: shell.Grants, Always: shell.Always})
	if quiet.Manifest != want || treeDigest(t, restored.FS()) != want {
		t.Errorf("source %s, snapshot %s, restored %s", want, quiet.Manifest, treeDigest(t, restored.FS()))
	}
	if br, res := bash(t, restored, `[ "$(stat -c %u src/main.go big empty)" = "$(printf '%s\n' $(id -u) $(id -u) $(id -u))" ] && [ "$(stat -c %a src/main.go src/run.sh src/pkg)" = "$(printf '600\n755\n700')" ] && [ "$(readlink out)" = /etc/passwd ] && ./src/run.sh`); br == nil || br.ExitCode != 0 || br.Output != "hi\n" {
		t.Errorf("the restored tree in its container: %s", res.Text)
	}

	// Fork into three; each changes its copy its own way.
	forks, err := m.Fork(context.Background(), "acme", restored.ID(), runner.ForkRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range forks {
		if treeDigest(t, f.FS()) != want {
			t.Errorf("fork %d's tree differs from its source's", i)
		}
		bash(t, f, "echo "+strconv.Itoa(i)+" > mine && rm src/main.go")
	}
	for i, f := range forks {
		if br, res := bash(t, f, "cat mine; ls src"); br == nil || br.Output != strconv.Itoa(i)+"\nlink\npkg\nrun.sh\n" {
			t.Errorf("fork %d: %s", i, res.Text)
		}
		// Its diff is its own change, against the tree it was forked with.
		d, err := f.Diff(context.Background(), runner.DiffRequest{})
		if err != nil || len(d.Changes) != 2 || d.Changes[0].Path != "mine" || d.Changes[1].Path != "src/main.go" || d.Changes[1].New != nil {
			t.Errorf("fork %d's diff: %+v %v", i, d, err)
		} else {
			d.Close()
		}
	}
	if treeDigest(t, restored.FS()) != want {
		t.Error("the forks changed their source")
	}

	// A sparse file of 100 MB counts at its full size: over the cap.
	bash(t, restored, "dd if=/dev/zero of=sparse bs=1 count=0 seek=104857600 2>/dev/null")
	before := containers(t, cli, nil)
	if _, err := restored.Snapshot(context.Background()); !errors.Is(err, snapshot.ErrLimit) {
		t.Errorf("a snapshot over the cap: %v", err)
	}
	// Another tenant sees none of it.
	if _, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "bolt", Settings: runner.Settings{Snapshot: quiet.ID}}); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("another tenant's restore: %v", err)
	}
	if list, _ := m.Snapshots("bolt"); len(list) != 0 {
		t.Errorf("bolt lists %v", list)
	}
	if _, err := m.Fork(context.Background(), "bolt", src.ID(), runner.ForkRequest{Count: 1}); !errors.Is(err, runner.ErrNotFound) {
		t.Errorf("another tenant's fork: %v", err)
	}
	tamperRefused(t, m, dir, quiet.ID)
	if after := containers(t, cli, nil); len(after) != len(before) {
		t.Errorf("refused restores left containers: %d before, %d after", len(before), len(after))
	}

	// A daemon started again on the store: the same snapshots, checked as
	// before.
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = open()
	defer st.Close()
	m2, _ := dockerManager(t, runner.WithSnapshots(st))
	defer m2.Shutdown(context.Background())
	list, _ := m2.Snapshots("acme")
	if len(list) != 2 || list[0].ID != during.ID || list[1].Manifest != quiet.Manifest {
		t.Fatalf("after a restart: %+v", list)
	}
	again := create(t, m2, "acme", runner.Settings{Snapshot: during.ID})
	if treeDigest(t, again.FS()) != during.Manifest {
		t.Error("restored after a restart: another tree")
	}
	if _, err := m2.Snapshot("bolt", during.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("another tenant after a restart: %v", err)
	}
	tamperRefused(t, m2, dir, during.ID)
}

// tamperRefused changes the pack of id three ways — a byte, an entry
// removed, cut short — then removes it, and checks that each time a
// session from it is refused, naming what is wrong.
func tamperRefused(t *testing.T, m *runner.Manager, dir, id string) {
	t.Helper()
	packs, _ := filepath.Glob(filepath.Join(dir, "tenants", "*", id, "data.tar"))
	if len(packs) != 1 {
		t.Fatalf("the pack of %s: %q", id, packs)
	}
	pack := packs[0]
	orig, err := os.ReadFile(pack)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(orig), "package main")
	flipped := append([]byte(nil), orig...)
	flipped[i] ^= 0x20
	for _, c := range []struct {
		name, want string
		data       []byte
	}{
		{"a byte changed", "the contents of src/main.go differ", flipped},
		{"an entry removed", `where the manifest has file "src/main.go"`, withoutEntry(t, orig, "src/main.go")},
		{"cut short", "cut short", orig[:len(orig)/3]},
		{"missing", "its pack is missing", nil},
	} {
		if c.data == nil {
			os.Remove(pack)
		} else {
			os.WriteFile(pack, c.data, 0o600)
		}
		_, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Snapshot: id}})
		if !errors.Is(err, snapshot.ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a refusal naming %q", c.name, err, c.want)
		}
	}
	os.WriteFile(pack, orig, 0o600)
}

// withoutEntry is the tar pack without the entry name, padded with zeros
// to its length (the end of a tar), so that only the entries tell.
func withoutEntry(t *testing.T, pack []byte, name string) []byte {
	t.Helper()
	var out bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(pack)), tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			continue
		}
		tw.WriteHeader(h)
		io.Copy(tw, tr)
	}
	tw.Close()
	return append(out.Bytes(), make([]byte, len(pack)-out.Len())...)
}

// TestDockerTemplateFromImage: a template declared from a directory of an
// image fills a pool's containers, owned by each session's user.
func TestDockerTemplateFromImage(t *testing.T) {
	st, err := snapshot.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, cli := dockerManager(t, runner.WithSnapshots(st),
		runner.WithTemplates(runner.Template{Name: "etc", Image: dockertest.Image(t), Path: "/etc"}),
		runner.WithPool(runner.PoolConfig{Size: 1, Template: "etc"}))
	defer m.Shutdown(context.Background())
	tmpl, err := st.Template("etc")
	if err != nil || tmpl.Files == 0 {
		t.Fatalf("template %+v %v", tmpl, err)
	}
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 1 })
	s := create(t, m, "acme", runner.Settings{Template: "etc", Grants: shell.Grants, Always: shell.Always})
	if !s.Info().Pooled || treeDigest(t, s.FS()) != tmpl.Manifest {
		t.Errorf("pooled %v, tree %s, want %s", s.Info().Pooled, treeDigest(t, s.FS()), tmpl.Manifest)
	}
	if br, res := bash(t, s, `[ "$(stat -c %u passwd)" = "$(id -u)" ] && grep -c sandbox passwd`); br == nil || br.ExitCode != 0 {
		t.Errorf("the template in the container: %s", res.Text)
	}
	// The container the image was read from is gone.
	f := make(client.Filters).Add("name", "sandboxd-template-")
	for k, v := range dockertest.Labels() {
		f.Add("label", k+"="+v)
	}
	if left, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: f}); err != nil || len(left.Items) != 0 {
		t.Errorf("left %v %v", left.Items, err)
	}
}
