package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
)

func TestSnapshots(t *testing.T) {
	st, err := snapshot.Open(t.TempDir(), snapshot.WithSync(false), snapshot.WithLimits(snapshot.Limits{Count: 1}))
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, daemonConfig{runner: []runner.Option{runner.WithSnapshots(st)}})
	acme, bolt := d.client(t, acmeToken), d.client(t, boltToken)
	ctx := context.Background()
	id := create(t, acme, writer)
	call(t, acme, id, "write", map[string]any{"path": "f", "content": "x"})
	made, err := acme.SnapshotCreate(ctx, id, client.SnapshotCreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.SnapshotCreate(ctx, id, client.SnapshotCreateOptions{}); !errors.Is(err, client.ErrSnapshotLimit) {
		t.Errorf("over the cap: %v", err)
	}
	if _, err := bolt.SnapshotInspect(ctx, made.Snapshot.ID, client.SnapshotInspectOptions{}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("bolt: %v", err)
	}
	list, err := acme.SnapshotList(ctx, client.SnapshotListOptions{})
	if err != nil || len(list.Snapshots) != 1 || list.Usage.Count != 1 {
		t.Errorf("list %+v %v", list, err)
	}
	s, err := acme.SessionCreate(ctx, client.SessionCreateOptions{Settings: runner.Settings{Snapshot: made.Snapshot.ID}})
	if err != nil || s.Session.Settings.Snapshot != made.Snapshot.ID {
		t.Fatalf("restore: %+v %v", s, err)
	}
	forks, err := acme.SessionFork(ctx, id, client.SessionForkOptions{Count: 2, Settings: json.RawMessage(`{"grants":[],"always":["read"]}`)})
	if err != nil || len(forks.Sessions) != 2 || len(forks.Sessions[0].Settings.Grants) != 0 {
		t.Errorf("fork %+v %v", forks, err)
	}
	if _, err := acme.TemplateList(ctx, client.TemplateListOptions{}); err != nil {
		t.Error(err)
	}
	if _, err := acme.SnapshotRemove(ctx, made.Snapshot.ID, client.SnapshotRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := acme.SnapshotRemove(ctx, made.Snapshot.ID, client.SnapshotRemoveOptions{}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("removed twice: %v", err)
	}
}
