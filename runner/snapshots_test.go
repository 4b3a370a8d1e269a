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
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/workspace"
)

func snapshotStore(t *testing.T, opts ...snapshot.Option) *snapshot.Store {
	t.Helper()
	st, err := snapshot.Open(t.TempDir(), append([]snapshot.Option{snapshot.WithSync(false)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func treeDigest(t *testing.T, fsys workspace.FileSystem) string {
	t.Helper()
	m, err := snapshot.Describe(t.Context(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	return m.Digest()
}

var snapLayout = []string{"README.md: hello", "src/main.go: package main", "bin/run*: #!/bin/sh", "l => src/main.go", "empty/"}

// TestSnapshotRestoreFork: a session's tree is saved, a new session
// starts from it, and a fork into three gives three independent copies.
func TestSnapshotRestoreFork(t *testing.T) {
	st := snapshotStore(t)
	m := newManager(t, memory.Backend{}, runner.WithSnapshots(st))
	src, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Grants: []string{"fs.write"}, Vars: map[string]string{"K": "v"}}})
	if err != nil {
		t.Fatal(err)
	}
	conformance.Build(t, src.FS(), snapLayout...)
	want := treeDigest(t, src.FS())
	info, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Manifest != want || info.Session != src.ID() || info.Files != 3 {
		t.Errorf("snapshot %+v, tree %s", info, want)
	}

	restored, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Snapshot: info.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if got := treeDigest(t, restored.FS()); got != want {
		t.Errorf("restored tree %s, want %s", got, want)
	}
	if s := restored.Info().Settings.Snapshot; s != info.ID {
		t.Errorf("settings.snapshot %q", s)
	}
	// Its diff is of what changed since the restore, the snapshot its
	// first tree, even once the snapshot is gone.
	restored.FS().WriteFile(t.Context(), "src/main.go", []byte("package changed"), 0o644)
	restored.FS().Remove(t.Context(), "README.md")
	if d, err := restored.Diff(t.Context(), runner.DiffRequest{}); err != nil || len(d.Changes) != 2 ||
		d.Changes[0].Path != "README.md" || d.Changes[0].New != nil || d.Changes[1].Path != "src/main.go" {
		t.Errorf("the restored session's diff: %+v %v", d, err)
	} else {
		var patch strings.Builder
		if err := d.WritePatch(t.Context(), &patch); err != nil || !strings.Contains(patch.String(), "-package main\n") || !strings.Contains(patch.String(), "+package changed\n") {
			t.Errorf("patch %q %v", patch.String(), err)
		}
		d.Close()
	}

	forks, err := m.Fork(t.Context(), "acme", src.ID(), runner.ForkRequest{Count: 3, Settings: json.RawMessage(`{"vars": {"K": "fork"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 3 {
		t.Fatalf("%d forks", len(forks))
	}
	for i, f := range forks {
		in := f.Info()
		if in.ForkOf != src.ID() || in.Settings.Vars["K"] != "fork" || len(in.Settings.Grants) != 1 {
			t.Errorf("fork %d: %+v", i, in)
		}
		if got := treeDigest(t, f.FS()); got != want {
			t.Errorf("fork %d's tree %s, want %s", i, got, want)
		}
		if err := f.FS().WriteFile(t.Context(), "README.md", []byte{byte('a' + i)}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, f := range forks {
		data, err := f.FS().ReadFile(t.Context(), "README.md", 10)
		if err != nil || string(data) != string(rune('a'+i)) {
			t.Errorf("fork %d sees %q %v", i, data, err)
		}
	}
	if got := treeDigest(t, src.FS()); got != want {
		t.Error("the forks changed their source")
	}
	// The fork's own snapshot is gone; the tenant's is listed.
	list, _ := m.Snapshots("acme")
	if len(list) != 1 || list[0].ID != info.ID {
		t.Errorf("snapshots %+v", list)
	}
	if st := m.Stats().Snapshots; st == nil || st.Snapshots != 1 || st.Ops[[2]string{"fork", "ok"}] != 1 || st.Ops[[2]string{"restore", "ok"}] != 4 {
		t.Errorf("stats %+v", st)
	}
}

// TestSnapshotsTenantsApart: another tenant's snapshot and session cannot
// be restored, forked or seen.
func TestSnapshotsTenantsApart(t *testing.T) {
	m := newManager(t, memory.Backend{}, runner.WithSnapshots(snapshotStore(t)))
	src, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "bolt", Settings: runner.Settings{Snapshot: info.ID}}); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("restore by another tenant: %v", err)
	}
	if _, err := m.Snapshot("bolt", info.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("get: %v", err)
	}
	if err := m.DeleteSnapshot("bolt", info.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("delete: %v", err)
	}
	if _, err := m.Fork(t.Context(), "bolt", src.ID(), runner.ForkRequest{Count: 1}); !errors.Is(err, runner.ErrNotFound) {
		t.Errorf("fork: %v", err)
	}
	if len(m.List("bolt")) != 0 {
		t.Error("bolt has sessions")
	}
}

// TestRestoreRefusesCorrupt: a session is never handed out from a
// snapshot whose store was changed; its workspace is removed.
func TestRestoreRefusesCorrupt(t *testing.T) {
	dir := t.TempDir()
	st, err := snapshot.Open(dir, snapshot.WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	b := newGate()
	m := newManager(t, b, runner.WithSnapshots(st))
	src, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	conformance.Build(t, src.FS(), snapLayout...)
	info, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	packs, _ := filepath.Glob(filepath.Join(dir, "tenants", "*", info.ID, "data.tar"))
	data, _ := os.ReadFile(packs[0])
	i := strings.Index(string(data), "package main")
	data[i] = 'P'
	os.WriteFile(packs[0], data, 0o600)
	opened, closed := b.opened.Load(), b.closed.Load()
	_, err = m.Create(t.Context(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Snapshot: info.ID}})
	if !errors.Is(err, snapshot.ErrCorrupt) || !strings.Contains(err.Error(), "src/main.go") {
		t.Fatalf("create from a changed snapshot: %v", err)
	}
	if len(m.List("acme")) != 1 || b.opened.Load()-opened != 1 || b.closed.Load()-closed != 1 {
		t.Errorf("sessions %d, workspaces opened %d and closed %d", len(m.List("acme")), b.opened.Load()-opened, b.closed.Load()-closed)
	}
	if _, err := m.Fork(t.Context(), "acme", src.ID(), runner.ForkRequest{Count: 2}); err != nil {
		t.Errorf("a fork takes a snapshot of its own: %v", err)
	}
	if st := m.Stats().Snapshots; st.Ops[[2]string{"restore", "corrupt"}] != 1 {
		t.Errorf("ops %v", st.Ops)
	}
}

// TestSnapshotCaps: a snapshot past the tenant's cap is refused; a fork
// counts against none.
func TestSnapshotCaps(t *testing.T) {
	m := newManager(t, memory.Backend{}, runner.WithSnapshots(snapshotStore(t, snapshot.WithLimits(snapshot.Limits{Count: 1}))))
	s, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(t.Context()); !errors.Is(err, snapshot.ErrLimit) {
		t.Errorf("second: %v", err)
	}
	if _, err := m.Fork(t.Context(), "acme", s.ID(), runner.ForkRequest{Count: 1}); err != nil {
		t.Errorf("fork at the cap: %v", err)
	}
	if _, err := m.Fork(t.Context(), "acme", s.ID(), runner.ForkRequest{Count: runner.MaxForks + 1}); err == nil {
		t.Error("a fork past MaxForks")
	}
}

// TestForkAllOrNothing: a fork that cannot make all its sessions makes
// none.
func TestForkAllOrNothing(t *testing.T) {
	m := newManager(t, memory.Backend{}, runner.WithSnapshots(snapshotStore(t)))
	s, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Fork(t.Context(), "acme", s.ID(), runner.ForkRequest{Count: 3, MaxSessions: 3})
	if !errors.Is(err, runner.ErrTooManySessions) {
		t.Fatalf("fork past the cap: %v", err)
	}
	if n := len(m.List("acme")); n != 1 {
		t.Errorf("%d sessions after a refused fork", n)
	}
	list, _ := m.Snapshots("acme")
	if len(list) != 0 {
		t.Errorf("snapshots %v", list)
	}
}

func TestNoSnapshots(t *testing.T) {
	m := newManager(t, memory.Backend{})
	s, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(t.Context()); !errors.Is(err, runner.ErrNoSnapshots) {
		t.Errorf("snapshot: %v", err)
	}
	if _, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Snapshot: "snap-x"}}); !errors.Is(err, runner.ErrNoSnapshots) {
		t.Errorf("create: %v", err)
	}
}

// TestTemplatePool: a template declared from a directory fills a pool's
// workspaces, which go to the sessions that ask for it.
func TestTemplatePool(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "venv", "bin"), 0o755)
	os.WriteFile(filepath.Join(dir, "requirements.txt"), []byte("flask\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "venv", "bin", "activate"), []byte("# venv\n"), 0o755)
	os.Symlink("/usr/bin/python3", filepath.Join(dir, "venv", "bin", "python"))
	st := snapshotStore(t)
	m := newManager(t, memory.Backend{}, runner.WithSnapshots(st),
		runner.WithTemplates(runner.Template{Name: "py", Source: func(ctx context.Context, w io.Writer) error {
			fsys, err := localfs.New(dir)
			if err != nil {
				return err
			}
			defer fsys.Close()
			return snapshot.WriteTree(ctx, fsys, w)
		}}),
		runner.WithPool(runner.PoolConfig{Size: 1, Template: "py"}))
	tmpl, err := st.Template("py")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return m.Stats().Pools[0].Ready == 1 })
	s, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Template: "py"}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Info().Pooled || treeDigest(t, s.FS()) != tmpl.Manifest {
		t.Errorf("pooled %v, tree %s, want %s", s.Info().Pooled, treeDigest(t, s.FS()), tmpl.Manifest)
	}
	// Without a ready one, a session gets the template all the same.
	s2, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Template: "py"}})
	if err != nil || treeDigest(t, s2.FS()) != tmpl.Manifest {
		t.Errorf("second: %v", err)
	}
	// A plain session does not get the template's workspace.
	plain, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if entries, _ := plain.FS().ReadDir(t.Context(), "."); len(entries) != 0 {
		t.Errorf("a plain session holds %v", entries)
	}
	if _, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Template: "nonesuch"}}); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("unknown template: %v", err)
	}
	if _, err := runner.New(t.Context(), memory.Backend{}, runner.WithSnapshots(st), runner.WithTemplates(runner.Template{Name: "x", Image: "sandboxd/minimal"})); err == nil {
		t.Error("an image template on a backend that reads no images")
	}
}

// cutExport is the memory backend whose workspaces' trees, read for a
// snapshot, end half way with errCut: a whole first file, then a second
// one cut short.
type cutExport struct{ memory.Backend }

var errCut = errors.New("the workspace's archive was cut (a test's fault)")

func (b cutExport) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.Backend.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	inst.Export = func(ctx context.Context, w io.Writer) error {
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Name: "whole", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5})
		tw.Write([]byte("whole"))
		tw.WriteHeader(&tar.Header{Name: "half", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 20})
		tw.Write(make([]byte, 100<<10))
		tw.Flush()
		return errCut
	}
	return inst, nil
}

// TestForkSnapshotCut: a fork whose snapshot fails after its forks began
// to copy it (their stream is the snapshot's as it is read) makes none of
// them, says why, and leaves no snapshot.
// TestForkSpoolDamaged: a fork's copies read the pack from a spool on the
// store's disk; one byte of a file's contents there other than the store
// wrote makes the fork fail as damaged, and no fork is made.
func TestForkSpoolDamaged(t *testing.T) {
	m := newManager(t, memory.Backend{}, runner.WithSnapshots(snapshotStore(t)))
	s, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.FS().WriteFile(t.Context(), "a.txt", bytes.Repeat([]byte("x"), 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	runner.DamageForkSpool(t, 512+1000) // within a.txt's contents, after the pack's first header
	_, err = m.Fork(t.Context(), "acme", s.ID(), runner.ForkRequest{Count: 2})
	if !errors.Is(err, snapshot.ErrCorrupt) {
		t.Fatalf("a fork whose spool was damaged: %v, want snapshot.ErrCorrupt", err)
	}
	if n := len(m.List("acme")); n != 1 {
		t.Errorf("%d sessions after a damaged fork", n)
	}
}

func TestForkSnapshotCut(t *testing.T) {
	st := snapshotStore(t)
	m := newManager(t, cutExport{}, runner.WithSnapshots(st))
	s, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Fork(t.Context(), "acme", s.ID(), runner.ForkRequest{Count: 3})
	if !errors.Is(err, errCut) {
		t.Fatalf("a fork whose snapshot is cut: %v, want the cause", err)
	}
	if n := len(m.List("acme")); n != 1 {
		t.Errorf("%d sessions after a failed fork", n)
	}
	if got := m.Stats().Snapshots; got.Snapshots != 0 || got.Ops[[2]string{"fork", "failed"}] != 1 || got.Ops[[2]string{"restore", "ok"}] != 0 {
		t.Errorf("after a failed fork: %+v", got)
	}
}
