package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/kubernetes"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/testharness/k8stest"
)

// replicaConfig is config's file for the kubernetes backend, as replica
// of the daemon name.
func replicaConfig(t *testing.T, name, replica string) string {
	t.Helper()
	// Replicas leave their sessions to each other at SIGTERM: they must
	// not end them, as config() makes the other tests' daemons do.
	data, err := os.ReadFile(config(t, "kubernetes", name, func(cfg map[string]any) { cfg["endSessionsOnExit"] = false }))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["kubernetes"].(map[string]any)["replica"] = replica
	data, _ = json.Marshal(cfg)
	p := filepath.Join(t.TempDir(), "sandboxd-"+replica+".json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// bash runs a command in session id through d and returns its output.
func (d *daemon) bash(id, command string) string {
	d.t.Helper()
	r := d.call(acmeToken, id, "bash", map[string]any{"command": command})
	out, _ := r.StructuredContent["output"].(string)
	if r.IsError {
		d.t.Fatalf("bash %q through %s: %+v", command, d.url, r)
	}
	return out
}

// waitLog waits until d's log holds want n times.
func (d *daemon) waitLog(want string, n int) {
	d.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for strings.Count(d.stderr.String(), want) < n {
		if time.Now().After(deadline) {
			d.t.Fatalf("%q not in the log within 2m:\n%s", want, d.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplicas runs `sandboxd serve --backend kubernetes` as replicas of
// one daemon against the test cluster: a session made through one replica
// is served through the other, alternately; a replica killed with SIGKILL
// loses nothing (the other serves its sessions, files intact); a replica
// that starts after it leaves the live replica's sessions alone and takes
// over the dead one's; a replica stopped with SIGTERM leaves its sessions
// to the others.
func TestReplicas(t *testing.T) {
	if os.Getenv(k8stest.EnvKubeconfig) == "" {
		k8stest.Unavailable(t, os.ErrNotExist)
	}
	name := daemonName(t)
	a := start(t, replicaConfig(t, name, "a"))
	b := start(t, replicaConfig(t, name, "b"))
	t.Cleanup(func() { cleanupDaemon(t, name) })

	var s, idle runner.Info
	a.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	a.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &idle)
	if r := a.call(acmeToken, s.ID, "write", map[string]any{"path": "notes.txt", "content": "from a\n"}); r.IsError {
		t.Fatal(r.Content)
	}
	a.bash(idle.ID, "echo kept > kept.txt")
	// A background command started through a runs on in the pod's agent
	// whichever replica serves the session: each replica's bash_output
	// goes on from the last count it was given.
	bg := a.call(acmeToken, s.ID, "bash", map[string]any{"command": dockertest.Counting, "background": true})
	bgID, _ := bg.StructuredContent["id"].(string)
	if bg.IsError || bgID == "" {
		t.Fatalf("the background command: %+v", bg)
	}
	ticks := 0
	countedOn := func(d *daemon, when string) {
		t.Helper()
		for deadline, before := time.Now().Add(time.Minute), ticks; ticks <= before; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the background command's output did not go on past tick %d", when, before)
			}
			if n := dockertest.LastTick(bgOutput(t, d, s.ID, bgID, 1)); n > ticks {
				ticks = n
			}
		}
	}
	countedOn(a, "started through a")

	// Alternately: b takes the session over, then a takes it back.
	for i, d := range []*daemon{b, a, b} {
		if got := d.bash(s.ID, "cat notes.txt; echo turn "+string(rune('0'+i))+" >> notes.txt"); !strings.HasPrefix(got, "from a\n") {
			t.Fatalf("turn %d: %q", i, got)
		}
		// The replica it moved from lets go before it is asked again.
		other := map[*daemon]*daemon{a: b, b: a}[d]
		other.waitLog(`"msg":"session taken over by another replica"`, i/2+1)
		countedOn(d, fmt.Sprintf("turn %d", i))
	}
	var info runner.Info
	b.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &info)
	if !info.Created.Equal(s.Created) || info.Tenant != "acme" {
		t.Errorf("the session seen through b: %+v, made as %+v", info, s)
	}
	b.do(boltToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusNotFound, nil)

	// a dies; b serves the session on, files intact.
	a.kill()
	if got := b.bash(s.ID, "cat notes.txt"); got != "from a\nturn 0\nturn 1\nturn 2\n" {
		t.Fatalf("after a's SIGKILL: %q", got)
	}
	countedOn(b, "after a's SIGKILL")
	// bash_kill through b reaches the command a started, and its end is kept.
	if r := b.call(acmeToken, s.ID, "bash_kill", map[string]any{"id": bgID}); r.IsError {
		t.Fatalf("bash_kill: %+v", r)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		r := b.call(acmeToken, s.ID, "bash_output", map[string]any{"id": bgID, "wait": 1})
		if r.IsError {
			t.Fatalf("bash_output after bash_kill: %+v", r)
		}
		if r.StructuredContent["running"] == false {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background command still runs a minute after bash_kill: %+v", r)
		}
	}

	// Once a's Lease has expired, a new replica reaps at start: it leaves
	// b's session alone and may take over the one a held.
	waitLeaseExpired(t, name, "a")
	c := start(t, replicaConfig(t, name, "c"))
	if got := b.bash(s.ID, "cat notes.txt"); !strings.HasPrefix(got, "from a\n") {
		t.Fatalf("b's session after c started: %q", got)
	}
	if got := c.bash(idle.ID, "cat kept.txt"); got != "kept\n" {
		t.Fatalf("a's other session, taken over by c: %q", got)
	}
	if pods := daemonPods(t, name); len(pods) != 2 {
		t.Errorf("pods of the daemon: %v, want the two sessions'", pods)
	}
	// c stops as a rolling update stops it (SIGTERM): it leaves its session
	// to the others, and b takes it over, files intact.
	c.stop()
	if got := b.bash(idle.ID, "cat kept.txt"); got != "kept\n" {
		t.Fatalf("c's session after c stopped: %q", got)
	}
	b.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)
	b.do(acmeToken, "DELETE", "/v1/sessions/"+idle.ID, nil, http.StatusNoContent, nil)
	b.stop()
	if left := daemonPods(t, name); len(left) != 0 {
		t.Errorf("left: %v", left)
	}
}

// waitLeaseExpired waits until the Lease of replica of daemon name is
// past its duration (it is not renewed any more).
func waitLeaseExpired(t *testing.T, name, replica string) {
	t.Helper()
	kb := k8stest.Backend(t)
	leases := kb.Client().CoordinationV1().Leases(kb.Namespace())
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := leases.List(context.Background(), metav1.ListOptions{LabelSelector: backend.LabelDaemon + "=" + name})
		if err != nil {
			t.Fatal(err)
		}
		live := false
		for _, l := range list.Items {
			if l.Annotations[kubernetes.LabelReplica] == replica && l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
				time.Since(l.Spec.RenewTime.Time) < time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
				live = true
			}
		}
		if !live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Lease of replica %s did not expire", replica)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cleanupDaemon deletes the Leases and pods of daemon name: a killed
// replica's Lease stays, and so do its pods when the test failed before
// another replica took them over.
func cleanupDaemon(t *testing.T, name string) {
	kb := k8stest.Backend(t)
	ctx, sel := context.Background(), metav1.ListOptions{LabelSelector: backend.LabelDaemon + "=" + name}
	if err := kb.Client().CoordinationV1().Leases(kb.Namespace()).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Logf("deleting the daemon's Leases: %v", err)
	}
	if err := kb.Client().CoreV1().Pods(kb.Namespace()).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Logf("deleting the daemon's pods: %v", err)
	}
}
