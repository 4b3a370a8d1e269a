package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
)

// flakyEngine is a local backend whose engine can be taken away: while
// down, Open fails as the Docker backend's does with its socket gone, and
// Check says it is unreachable.
type flakyEngine struct {
	*local.Backend
	down atomic.Bool
}

func (f *flakyEngine) gone() error {
	return fmt.Errorf("%w (unix:///var/run/docker.sock): dial unix /var/run/docker.sock: connect: no such file or directory", backend.ErrUnreachable)
}

func (f *flakyEngine) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	if f.down.Load() {
		return nil, fmt.Errorf("docker backend: %w", f.gone())
	}
	return f.Backend.Open(ctx, spec)
}

func (f *flakyEngine) Check(context.Context) error {
	if f.down.Load() {
		return f.gone()
	}
	return nil
}

// TestEngineDown: with the engine unreachable a create is 503 Unavailable
// with Retry-After — never 404 or 500 — and /readyz is 503; once it is
// back both answer as before.
func TestEngineDown(t *testing.T) {
	b := &flakyEngine{Backend: &local.Backend{Dir: t.TempDir()}}
	e := start(t, config{backend: b})
	b.down.Store(true)
	for _, tc := range []struct{ method, path, kind string }{
		{"POST", "/v1/sessions", "Unavailable"},
		{"GET", "/readyz", "Unavailable"},
	} {
		status, body, h := e.do(acmeToken, tc.method, tc.path, strings.NewReader("{}"), "Content-Type", "application/json")
		var eb struct{ Error, Message string }
		json.Unmarshal(body, &eb)
		if status != http.StatusServiceUnavailable || eb.Error != tc.kind || h.Get("Retry-After") == "" {
			t.Errorf("%s %s with the engine down: %d %s, Retry-After %q; want 503 %s with Retry-After", tc.method, tc.path, status, body, h.Get("Retry-After"), tc.kind)
		}
	}
	b.down.Store(false)
	e.create(acmeToken, writer)
	if status, body, _ := e.do("", "GET", "/readyz", nil); status != http.StatusOK {
		t.Errorf("/readyz with the engine back: %d %s", status, body)
	}
}

// TestDrain: once the server drains, a new request is 503 ShuttingDown
// with Retry-After on the open listener, /readyz is 503 and /healthz 200,
// while a call in flight runs on to its answer; WaitIdle returns once it
// has.
func TestDrain(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	dir := s.Workspace
	args, _ := json.Marshal(map[string]any{"arguments": map[string]any{
		"command": "touch started; while [ ! -f go ]; do sleep 0.05; done; echo finished", "timeout": 300}})
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", e.url+"/v1/sessions/"+s.ID+"/tools/bash", bytes.NewReader(args))
		req.Header.Set("Authorization", "Bearer "+acmeToken)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- err.Error()
			return
		}
		defer res.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(res.Body)
		answered <- fmt.Sprintf("%d %s", res.StatusCode, buf.String())
	}()
	waitFile(t, filepath.Join(dir, "started"))

	e.srv.Drain()
	status, body, h := e.do(acmeToken, "GET", "/v1/sessions", nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), `"ShuttingDown"`) || h.Get("Retry-After") == "" {
		t.Errorf("a new request while draining: %d %s, Retry-After %q", status, body, h.Get("Retry-After"))
	}
	if status, _, _ := e.do(acmeToken, "GET", "/mcp", nil, "Accept", "text/event-stream"); status != http.StatusServiceUnavailable {
		t.Errorf("a new /mcp stream while draining: %d", status)
	}
	if status, _, h := e.do("", "GET", "/readyz", nil); status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Errorf("/readyz while draining: %d", status)
	}
	if status, _, _ := e.do("", "GET", "/healthz", nil); status != http.StatusOK {
		t.Errorf("/healthz while draining: %d", status)
	}
	// The call holds the server busy until the test lets it finish.
	busy, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := e.srv.WaitIdle(busy)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitIdle with a call in flight: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-answered:
		if !strings.HasPrefix(got, "200 ") || !strings.Contains(got, "finished") {
			t.Fatalf("the call in flight while draining: %s", got)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the call in flight never answered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.srv.WaitIdle(ctx); err != nil {
		t.Fatalf("WaitIdle once the call answered: %v", err)
	}
}

// waitFile waits for name to exist; the bound only turns a hang into a
// failure.
func waitFile(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(name); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
