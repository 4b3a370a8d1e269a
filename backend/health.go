package backend

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/workspace"
)

// ErrUnreachable is the error of a backend whose engine does not answer
// (the Docker socket is gone, the engine is stopped or frozen): the
// request may succeed later, once it is back. It carries
// workspace.ErrUnavailable, so errors.Is matches both; the HTTP API
// answers it 503 Unavailable with Retry-After, never NotFound or Internal.
var ErrUnreachable = fmt.Errorf("%w: the backend's engine does not answer", workspace.ErrUnavailable)

// Checker is a Backend that can tell whether its engine answers now.
// Check returns nil when it does, and an error wrapping ErrUnreachable
// when it does not within ctx; readiness probes (/readyz) ask it.
type Checker interface {
	Backend
	Check(ctx context.Context) error
}

// Remover is a Backend that removes what a closed workspace held in the
// background when the engine refuses at first (down, slow, failing):
// Instance.Close hands a removal that failed to a queue that retries it,
// with backoff, until it succeeds, and never drops it.
type Remover interface {
	Backend
	// Removals reports the queue: removals waiting for another attempt,
	// and failed attempts since the backend was made.
	Removals() RemovalStats
	// WaitRemovals returns once no removal waits, or with ctx's error when
	// ctx ends first.
	WaitRemovals(ctx context.Context) error
}

// RemovalStats is a snapshot of a Remover's queue.
type RemovalStats struct {
	// Pending counts the removals not yet done: each has failed at least
	// once and waits for its next attempt.
	Pending int
	// Failed counts the failed attempts of all removals, retried or not.
	Failed uint64
}
