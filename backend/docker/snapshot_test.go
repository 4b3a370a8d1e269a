package docker_test

import (
	"context"
	"io"
	"testing"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestExportImport: a container's tree read by Export (the archive API, the
// container frozen) and through its agent (snapshot.WriteTree, the way of
// backends without an export, Kubernetes's) is the same tree once stored
// (a hard link a file of its own, a FIFO skipped); restored into fresh
// containers by Import and through the agent (snapshot.ReadTree), it comes
// back the same; the container runs on after its freeze.
func TestExportImport(t *testing.T) {
	ctx := context.Background()
	src := dockertest.Start(t, docker.Spec{})
	script := `mkdir -p a/b empty && printf 'x\n' > a/b/f && printf '#!/bin/sh\n' > run && chmod 755 run &&
chmod 600 a/b/f && chmod 700 a && ln -s b/f a/l && ln -s /etc/passwd out && mkfifo pipe && ln a/b/f hard`
	if res, err := src.Bash().Run(ctx, workspace.Command{Script: script}); err != nil || res.ExitCode != 0 {
		t.Fatalf("building the tree: %v %+v", err, res)
	}
	st, err := snapshot.Open(t.TempDir(), snapshot.WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var id string
	describe := func(src snapshot.Source) snapshot.Manifest {
		t.Helper()
		info, err := st.Create(ctx, "t", src, snapshot.CreateRequest{})
		id = info.ID
		if err != nil {
			t.Fatal(err)
		}
		r, err := st.Reader("t", info.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if len(info.Skipped) != 1 || info.Skipped[0] != "pipe (FIFO)" {
			t.Errorf("skipped %q", info.Skipped)
		}
		return snapshot.Manifest{Version: 1, Entries: r.Entries()}
	}
	exported := describe(src.Export)
	walked := describe(func(ctx context.Context, w io.Writer) error { return snapshot.WriteTree(ctx, src.Agent(), w) })
	if exported.Digest() != walked.Digest() {
		t.Fatalf("Export and WriteTree read two trees:\n%+v\n%+v", exported.Entries, walked.Entries)
	}
	if res, err := src.Bash().Run(ctx, workspace.Command{Script: "true"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("the container after its export: %v %+v", err, res)
	}
	for name, write := range map[string]func(c *docker.Container, r io.Reader) error{
		"Import":   func(c *docker.Container, r io.Reader) error { return c.Import(ctx, r) },
		"ReadTree": func(c *docker.Container, r io.Reader) error { return snapshot.ReadTree(ctx, c.Agent(), r) },
	} {
		dst := dockertest.Start(t, docker.Spec{})
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(st.Restore(ctx, "t", id, pw)) }()
		if err := write(dst, pr); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		m, err := snapshot.Describe(ctx, dst.Agent())
		if err != nil {
			t.Fatal(err)
		}
		if m.Digest() != exported.Digest() {
			t.Errorf("%s wrote another tree:\n%+v\nwant\n%+v", name, m.Entries, exported.Entries)
		}
	}
}
