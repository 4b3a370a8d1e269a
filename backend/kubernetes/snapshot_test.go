package kubernetes_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
	"github.com/sandboxd/sandboxd/tools"
)

// TestSnapshots: a pod's workspace (an emptyDir) is snapshotted through its
// agent and restored through it, into a session from the snapshot and into
// a fork: both hold the tree, modes and links included.
func TestSnapshots(t *testing.T) {
	st, err := snapshot.Open(t.TempDir(), snapshot.WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := manager(t, runner.WithSnapshots(st))
	ctx := context.Background()
	shell := runner.Settings{Grants: []string{"shell.exec"}, Always: []string{"shell"}}
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: shell})
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := json.Marshal(map[string]string{"command": "mkdir -p a/b empty && printf 'x\\n' > a/b/f && printf '#!/bin/sh\\n' > run && chmod 755 run && chmod 600 a/b/f && ln -s b/f a/l"})
	if res, err := s.Call(ctx, "bash", cmd, tools.CallOptions{}); err != nil || res.IsError {
		t.Fatalf("building the tree: %v %+v", err, res)
	}
	want, err := snapshot.Describe(ctx, s.FS())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Snapshot(ctx)
	if err != nil || info.Manifest != want.Digest() || info.Files != 2 || info.Links != 1 {
		t.Fatalf("snapshot %+v %v, the tree %s", info, err, want.Digest())
	}
	restored, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Snapshot: info.ID}})
	if err != nil {
		t.Fatal(err)
	}
	forks, err := m.Fork(ctx, "acme", s.ID(), runner.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*runner.Session{restored, forks[0]} {
		got, err := snapshot.Describe(ctx, r.FS())
		if err != nil || got.Digest() != want.Digest() {
			t.Errorf("session %s holds %+v (%v), want %+v", r.ID(), got.Entries, err, want.Entries)
		}
	}
}
