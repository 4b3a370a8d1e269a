package httpapi

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/backend"
)

// engineRetry is the Retry-After of an answer the engine's absence made
// (backend.ErrUnreachable), in seconds: an engine restarts in seconds.
const engineRetry = "5"

// retryLater gives a 503 that has no Retry-After one of a second: every
// 503 the API sends says when to try again.
func retryLater(w http.ResponseWriter, status int) {
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
}

// readyCheck bounds /readyz's question to the engine.
const readyCheck = 5 * time.Second

// idleState counts the requests in flight and holds the drain.
type idleState struct {
	mu       sync.Mutex
	draining bool
	n        int
	zero     chan struct{} // closed, and replaced, when n falls to 0
}

// probe reports whether r is one a drain never refuses: the probes and
// metrics a load balancer and a scraper keep asking.
func probe(r *http.Request) bool {
	switch r.URL.Path {
	case "/healthz", "/readyz", "/metrics", "/openapi.json":
		return true
	}
	return false
}

// standing reports whether r is /mcp's standing GET stream, which ends
// only with the server: a drain refuses a new one but does not wait for
// those open.
func standing(r *http.Request) bool { return r.URL.Path == "/mcp" && r.Method == http.MethodGet }

// enter counts r in flight, or answers it 503 ShuttingDown (with
// Retry-After) once the server drains, and reports whether r may go on.
func (s *Server) enter(w http.ResponseWriter, r *http.Request) bool {
	if probe(r) {
		return true
	}
	s.idle.mu.Lock()
	if s.idle.draining {
		s.idle.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "ShuttingDown", "the daemon is shutting down: it takes no new requests")
		return false
	}
	if !standing(r) {
		s.idle.n++
	}
	s.idle.mu.Unlock()
	return true
}

// leave ends what enter counted.
func (s *Server) leave(r *http.Request) {
	if probe(r) || standing(r) {
		return
	}
	s.idle.mu.Lock()
	defer s.idle.mu.Unlock()
	if s.idle.n--; s.idle.n == 0 && s.idle.zero != nil {
		close(s.idle.zero)
		s.idle.zero = nil
	}
}

// Drain makes the server refuse new requests — 503 ShuttingDown with
// Retry-After, on connections it keeps open — and /readyz answer 503, so
// that a load balancer stops sending work while the requests in flight
// finish (WaitIdle). /healthz and /metrics keep answering. Call it before
// shutting the HTTP server and the manager down; it cannot be undone.
func (s *Server) Drain() {
	s.idle.mu.Lock()
	s.idle.draining = true
	s.idle.mu.Unlock()
}

// Draining reports whether Drain was called.
func (s *Server) Draining() bool {
	s.idle.mu.Lock()
	defer s.idle.mu.Unlock()
	return s.idle.draining
}

// WaitIdle returns once no request is in flight (the probes, /metrics and
// /mcp's standing GET stream do not count), or with ctx's error when ctx
// ends first. After Drain, no request starts once it has returned nil.
func (s *Server) WaitIdle(ctx context.Context) error {
	for {
		s.idle.mu.Lock()
		if s.idle.n == 0 {
			s.idle.mu.Unlock()
			return nil
		}
		if s.idle.zero == nil {
			s.idle.zero = make(chan struct{})
		}
		zero := s.idle.zero
		s.idle.mu.Unlock()
		select {
		case <-zero:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// Gate returns h behind the server's drain: its requests are refused
// once the server drains, as the server's own are, and counted in flight
// until then (WaitIdle). Handlers served beside the server on one
// listener (E2B's) go through it.
func (s *Server) Gate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.enter(w, r) {
			return
		}
		defer s.leave(r)
		h.ServeHTTP(w, r)
	})
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 while the server takes work: 503 ShuttingDown once
// it drains, and 503 Unavailable while the backend's engine does not
// answer (backend.Checker), both with Retry-After.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.Draining() {
		writeError(w, http.StatusServiceUnavailable, "ShuttingDown", "the daemon is shutting down")
		return
	}
	if c, ok := s.m.Backend().(backend.Checker); ok {
		ctx, cancel := context.WithTimeout(r.Context(), readyCheck)
		defer cancel()
		if err := c.Check(ctx); err != nil {
			w.Header().Set("Retry-After", engineRetry)
			writeError(w, http.StatusServiceUnavailable, "Unavailable", err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
