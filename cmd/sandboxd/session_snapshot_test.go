package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/httpapi"
)

// TestSessionSnapshotFork: snapshot, a session from it, a fork into two,
// the list and the removal, from the command line against a daemon.
func TestSessionSnapshotFork(t *testing.T) {
	sandboxd := memoryDaemon(t)
	id := strings.TrimSpace(sandboxd("session", "create", "--grant", "fs.write", "--always", "read,edit"))
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha\n"), 0o644)
	os.WriteFile(filepath.Join(src, "sub", "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("a.txt", filepath.Join(src, "link"))
	sandboxd("session", "put", id, ".", src)

	snap := strings.TrimSpace(sandboxd("session", "snapshot", id))
	if !strings.HasPrefix(snap, "snap-") {
		t.Fatalf("session snapshot printed %q", snap)
	}
	if ls := sandboxd("snapshot", "ls"); !strings.Contains(ls, snap) || !strings.Contains(ls, "1 snapshots") {
		t.Errorf("snapshot ls:\n%s", ls)
	}
	restored := strings.TrimSpace(sandboxd("session", "create", "--snapshot", snap, "--always", "read"))
	forks := strings.Fields(sandboxd("session", "fork", "--count", "2", "--settings", `{"always":["read"],"grants":[]}`, id))
	if len(forks) != 2 {
		t.Fatalf("session fork printed %q", forks)
	}
	want := treeOf(t, src)
	for _, s := range append(forks, restored) {
		back := t.TempDir()
		sandboxd("session", "get", "-C", back, s, ".")
		if got := treeOf(t, back); !maps.Equal(got, want) {
			t.Errorf("session %s holds\n%v\nwant\n%v", s, got, want)
		}
	}
	sandboxd("snapshot", "rm", snap)
	if code, _, errs := runInProcess(t, "snapshot", "rm", snap); code != 1 || !strings.Contains(errs, "no such snapshot") {
		t.Errorf("rm twice: exit %d: %s", code, errs)
	}
	if code, _, errs := runInProcess(t, "session", "fork", "--count", "0", id); code != 1 || !strings.Contains(errs, "a fork makes 1 to 32 sessions") {
		t.Errorf("fork 0: exit %d: %s", code, errs)
	}
}

// TestServeTemplates: a template declared from a directory fills a pool, and
// a session asking for it from the command line holds its tree; a template
// with neither a dir nor an image stops the start, naming it.
func TestServeTemplates(t *testing.T) {
	const token = "sbx_templates"
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "venv", "bin"), 0o755)
	os.WriteFile(filepath.Join(dir, "requirements.txt"), []byte("flask\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "venv", "bin", "activate"), []byte("# venv\n"), 0o755)
	cfg := map[string]any{
		"tenants":   []map[string]any{{"name": "a", "tokens": []string{httpapi.HashToken(token)}}},
		"snapshots": map[string]any{"templates": []map[string]any{{"name": "py", "dir": dir}}},
		"pools":     []map[string]any{{"size": 1, "template": "py"}},
	}
	data, _ := json.Marshal(cfg)
	config := filepath.Join(t.TempDir(), "sandboxd.json")
	os.WriteFile(config, data, 0o600)
	url, _ := startServe(t, "--backend", "memory", "--config", config)
	t.Setenv("SANDBOXD_URL", url)
	t.Setenv("SANDBOXD_TOKEN", token)
	if code, out, errs := runInProcess(t, "snapshot", "ls", "--templates"); code != 0 || !strings.Contains(out, "py ") {
		t.Fatalf("snapshot ls --templates: exit %d: %s%s", code, out, errs)
	}
	code, out, errs := runInProcess(t, "session", "create", "--template", "py", "--always", "read")
	if code != 0 {
		t.Fatalf("session create --template: exit %d: %s", code, errs)
	}
	back := t.TempDir()
	if code, _, errs := runInProcess(t, "session", "get", "-C", back, strings.TrimSpace(out), "."); code != 0 {
		t.Fatalf("session get: %s", errs)
	}
	if got, want := treeOf(t, back), treeOf(t, dir); !maps.Equal(got, want) {
		t.Errorf("the session holds\n%v\nwant\n%v", got, want)
	}

	cfg["snapshots"] = map[string]any{"templates": []map[string]any{{"name": "none"}}}
	data, _ = json.Marshal(cfg)
	os.WriteFile(config, data, 0o600)
	if code, _, errs := runInProcess(t, "serve", "--backend", "memory", "--listen", "127.0.0.1:0", "--config", config); code == 0 || !strings.Contains(errs, "snapshots.templates[0]: give it a dir or an image") {
		t.Errorf("a template of nothing: exit %d: %s", code, errs)
	}
}
