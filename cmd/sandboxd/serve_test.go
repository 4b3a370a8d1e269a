package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/images"
)

// TestServeBuildsMissingImage starts serve against an engine without
// sandboxd's images: it builds the default image, saying so, and then
// listens on it.
func TestServeBuildsMissingImage(t *testing.T) {
	e := &fakeEngine{api: "1.47", info: healthyInfo(), images: map[string]int64{}}
	e.start(t)
	minimal, _ := images.Lookup("minimal")

	// Without the agent, nothing could run: serve says so and stops.
	t.Setenv("SANDBOXD_AGENT", "")
	t.Setenv("PATH", t.TempDir())
	code, _, errs := runInProcess(t, "serve", "--listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errs, "no sandboxd-agent binary") {
		t.Errorf("serve without an agent: exit %d, %s", code, errs)
	}
	agentHere(t)
	out, serr := serveUntil(t, "")
	errs = serr.String()
	for _, want := range []string{"image minimal: image " + minimal.Ref() + " is not built yet; building it now", "importing", "built " + minimal.Ref()} {
		if !strings.Contains(errs, want) {
			t.Errorf("serve's progress lacks %q:\n%s", want, errs)
		}
	}
	if !strings.Contains(out.String(), "backend docker, image "+minimal.Ref()) {
		t.Errorf("welcome: %s", out.String())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.imported) != 1 || e.imported[0] != minimal.Ref() {
		t.Errorf("imported %v, want %s once", e.imported, minimal.Ref())
	}
}

// serveUntil runs serve in process with args until it has said where it
// listens and its standard error holds want, then stops it, and returns its
// output.
func serveUntil(t *testing.T, want string, args ...string) (stdout, stderr *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out, errs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, stdio{in: strings.NewReader(""), out: &out, err: &errs}, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...))
	}()
	for deadline := time.Now().Add(5 * time.Minute); !strings.Contains(out.String(), "listening on") || !strings.Contains(errs.String(), want); time.Sleep(20 * time.Millisecond) {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d:\n%s%s", code, out.String(), errs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start, or did not say %q:\n%s", want, errs.String())
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve exited %d after its context ended:\n%s", code, errs.String())
	}
	return &out, &errs
}

// TestServeReportsPoolFill: serve shows its warm pools filling at start.
func TestServeReportsPoolFill(t *testing.T) {
	config := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(config, []byte(`{"backend": "memory", "tenants": [{"name": "a", "tokens": ["sha256:0000000000000000000000000000000000000000000000000000000000000000"]}], "pools": [{"size": 3}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs := serveUntil(t, "warm pool sandboxd/minimal:latest: 3/3 workspaces started: ready", "--config", config)
	var counts []string
	for _, m := range regexp.MustCompile(`\] warm pool sandboxd/minimal:latest: ([0-3])/3 workspaces started`).FindAllStringSubmatch(errs.String(), -1) {
		counts = append(counts, m[1])
	}
	rising := len(counts) > 0
	for i := 1; i < len(counts); i++ {
		rising = rising && counts[i] > counts[i-1]
	}
	if !rising {
		t.Errorf("pool progress %v: want counts rising to 3\n%s", counts, errs)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
