package integration

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runner"
)

// TestServeDrain: on SIGTERM `sandboxd serve` drains — a new request is
// answered 503 ShuttingDown with Retry-After (the listener stays open, so
// a client is told, not refused), /readyz turns 503 — while a call in
// flight runs on to its answer; then the daemon exits cleanly.
func TestServeDrain(t *testing.T) {
	d := start(t, config(t, "memory", daemonName(t)))
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	gate := filepath.Join(t.TempDir(), "go")
	args, _ := json.Marshal(map[string]any{"arguments": map[string]any{
		"command": "echo started; while [ ! -f " + gate + " ]; do sleep 0.05; done; echo finished", "timeout": 300}})
	res, err := d.request(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/bash", strings.NewReader(string(args)), "Accept", "text/event-stream")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), "started") {
	}

	d.cmd.Process.Signal(syscall.SIGTERM)
	// The drain begins a moment after the signal: wait for its word.
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := d.request(acmeToken, "GET", "/v1/sessions", nil)
		if err != nil {
			t.Fatalf("a request while draining: %v (refused, not told)", err)
		}
		r.Body.Close()
		if r.StatusCode == http.StatusServiceUnavailable {
			if r.Header.Get("Retry-After") == "" {
				t.Errorf("503 while draining without Retry-After")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no drain within a minute of SIGTERM: %d", r.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r, err := d.request("", "GET", "/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz while draining: %d", r.StatusCode)
	}

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var result string
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			result = data
		}
	}
	if !strings.Contains(result, "finished") {
		t.Errorf("the call in flight at SIGTERM: %s", result)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("sandboxd serve exited with %v:\n%s", err, d.stderr)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("sandboxd serve did not exit after its drain:\n%s", d.stderr)
	}
}
