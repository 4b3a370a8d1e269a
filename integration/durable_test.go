package integration

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// countsOn waits, up to a minute, for the counting command in container to
// pass after by three ticks while no daemon runs, and returns its count.
func countsOn(t *testing.T, cli *client.Client, container string, after int) int {
	t.Helper()
	n := 0
	for deadline := time.Now().Add(time.Minute); n <= after+3; n = dockertest.Count(context.Background(), cli, container) {
		if time.Now().After(deadline) {
			t.Fatalf("the background command did not count on without a daemon: %d, %d before", n, after)
		}
		time.Sleep(50 * time.Millisecond) // a poll of the engine, not a wait for it
	}
	return n
}

// fileDiff is the part of patch, a git-format patch, that changes name.
func fileDiff(patch, name string) string {
	for part := range strings.SplitSeq(patch, "diff --git ") {
		if strings.HasPrefix(part, "a/"+name+" b/"+name+"\n") {
			return part
		}
	}
	return ""
}

// countingSession creates a session of the acme tenant with a file,
// kept.txt ("kept\n"), and command (one that counts, as
// dockertest.Counting) running in the background, and returns the
// session and the command's ID.
func countingSession(t *testing.T, d *daemon, command string) (runner.Info, string) {
	t.Helper()
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	if r := d.call(acmeToken, s.ID, "write", map[string]any{"path": "kept.txt", "content": "kept\n"}); r.IsError {
		t.Fatal(r.Content)
	}
	bg := d.call(acmeToken, s.ID, "bash", map[string]any{"command": command, "background": true})
	id, _ := bg.StructuredContent["id"].(string)
	if bg.IsError || id == "" {
		t.Fatalf("the background command: %+v", bg)
	}
	return s, id
}

// bgOutput is the output of the background command id of session since
// the last bash_output, waiting up to wait seconds for some; the command
// must be running.
func bgOutput(t *testing.T, d *daemon, session, id string, wait float64) string {
	t.Helper()
	r := d.call(acmeToken, session, "bash_output", map[string]any{"id": id, "wait": wait})
	out, _ := r.StructuredContent["output"].(string)
	if r.IsError || r.StructuredContent["running"] != true {
		t.Fatalf("bash_output: %+v", r)
	}
	return out
}

// TestServeRestartKeepsSessions: a Docker session outlives `sandboxd
// serve` killed with SIGKILL and, then, stopped with SIGTERM: each time the
// restarted daemon answers for the same session ID, with its file; its
// journal and its first tree came back with it — the diff since its start
// shows the same change of that file, and after the SIGKILL the edit made
// before it is undone (journal_revert), which the SIGTERM's restart keeps
// too — and nothing is said lost; its background command ran on
// meanwhile, and bash_output gives the lines written while no daemon ran;
// a detached call the first run accepted answers 410 Interrupted.
// session rm --all ends the session, and a stop then leaves nothing of the
// daemon on the engine.
func TestServeRestartKeepsSessions(t *testing.T) {
	cli := dockertest.Client(t) // fails under CI without an engine; skips elsewhere
	name := daemonName(t)
	file := config(t, "docker", name, func(cfg map[string]any) { cfg["endSessionsOnExit"] = false })
	d := start(t, file)
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	if r := d.call(acmeToken, s.ID, "write", map[string]any{"path": "kept.txt", "content": "kept\n"}); r.IsError {
		t.Fatal(r.Content)
	}
	if r := d.call(acmeToken, s.ID, "edit", map[string]any{"path": "kept.txt", "edits": []map[string]string{{"oldText": "kept", "newText": "kept, edited"}}}); r.IsError {
		t.Fatal(r.Content)
	}
	// The background command below writes n as it counts: the diff of
	// kept.txt alone is compared.
	diff := func(d *daemon) string {
		t.Helper()
		return fileDiff(string(d.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/diff", nil, http.StatusOK, nil)), "kept.txt")
	}
	commits := func(d *daemon) int {
		t.Helper()
		r := d.call(acmeToken, s.ID, "journal_list", map[string]any{})
		list, _ := r.StructuredContent["commits"].([]any)
		if r.IsError {
			t.Fatal(r.Content)
		}
		return len(list)
	}
	kept := diff(d)
	if !strings.Contains(kept, "+kept, edited\n") {
		t.Fatalf("the diff of kept.txt before the restarts: %q", kept)
	}
	journaled := commits(d)
	bg := d.call(acmeToken, s.ID, "bash", map[string]any{"command": dockertest.Counting, "background": true})
	id, _ := bg.StructuredContent["id"].(string)
	if bg.IsError || id == "" {
		t.Fatalf("the background command: %+v", bg)
	}
	output := func(d *daemon) string {
		t.Helper()
		r := d.call(acmeToken, s.ID, "bash_output", map[string]any{"id": id, "wait": 0.5})
		out, _ := r.StructuredContent["output"].(string)
		if r.IsError || r.StructuredContent["running"] != true {
			t.Fatalf("bash_output: %+v", r)
		}
		return out
	}
	before := 0
	for before < 3 {
		before = max(before, dockertest.LastTick(output(d)))
	}
	var detached httpapi.CallStatus
	d.do(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/bash", map[string]any{"arguments": map[string]any{"command": "echo done"}, "detach": true}, http.StatusAccepted, &detached)

	for _, stop := range []struct {
		name string
		stop func(*daemon)
	}{
		{"SIGKILL", (*daemon).kill},
		{"SIGTERM", (*daemon).stop},
	} {
		stop.stop(d)
		meanwhile := countsOn(t, cli, s.Workspace, before)
		d = start(t, file)
		var back runner.Info
		d.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &back)
		if back.Workspace != s.Workspace || !back.Created.Equal(s.Created) {
			t.Fatalf("after %s: the session is %+v, was %+v", stop.name, back, s)
		}
		if r := d.call(acmeToken, s.ID, "read", map[string]any{"path": "kept.txt"}); r.IsError || !strings.Contains(r.Content[0].Text, "kept") {
			t.Fatalf("after %s: its file: %+v", stop.name, r)
		}
		if len(back.Lost) != 0 {
			t.Fatalf("after %s: the session lost %q", stop.name, back.Lost)
		}
		if got := diff(d); got != kept {
			t.Fatalf("after %s: the diff of kept.txt since the start is\n%s\nwant\n%s", stop.name, got, kept)
		}
		if n := commits(d); n != journaled {
			t.Fatalf("after %s: %d commits in the journal, want %d", stop.name, n, journaled)
		}
		if stop.name == "SIGKILL" { // undo the edit the first run made
			if r := d.call(acmeToken, s.ID, "journal_revert", map[string]any{"to": journaled - 1}); r.IsError {
				t.Fatalf("after %s: undoing the edit: %+v", stop.name, r)
			}
			if r := d.call(acmeToken, s.ID, "read", map[string]any{"path": "kept.txt"}); r.IsError || strings.Contains(r.Content[0].Text, "edited") {
				t.Fatalf("after %s: kept.txt once the edit is undone: %+v", stop.name, r)
			}
			kept, journaled = diff(d), journaled+1
			if !strings.Contains(kept, "+kept\n") || strings.Contains(kept, "edited") {
				t.Fatalf("after %s: the diff of kept.txt once the edit is undone: %q", stop.name, kept)
			}
		}
		if out := output(d); !strings.Contains(out, "tick "+strconv.Itoa(meanwhile)+"\n") {
			t.Fatalf("after %s: bash_output %q lacks tick %d, written while no daemon ran", stop.name, out, meanwhile)
		} else {
			before = dockertest.LastTick(out)
		}
		var e struct{ Error, Message string }
		d.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/calls/"+detached.ID, nil, http.StatusGone, &e)
		if e.Error != "Interrupted" {
			t.Fatalf("after %s: the detached call: %+v, want Interrupted", stop.name, e)
		}
	}

	rm := exec.Command(filepath.Join(binDir, "sandboxd"), "session", "rm", "--all")
	rm.Env = append(rm.Environ(), "SANDBOXD_URL="+d.url, "SANDBOXD_TOKEN="+acmeToken)
	if out, err := rm.CombinedOutput(); err != nil {
		t.Fatalf("session rm --all: %v\n%s", err, out)
	}
	d.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusNotFound, nil)
	d.stop()
	if left := daemonContainers(t, cli, name, 0); len(left) != 0 {
		t.Fatalf("left after session rm --all and a stop: %v", left)
	}
}
