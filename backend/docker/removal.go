package docker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/backend"
)

// Removal retry bounds: the first retry waits removalMinDelay, each later
// one twice the one before, up to removalMaxDelay.
const (
	removalMinDelay = 250 * time.Millisecond
	removalMaxDelay = 15 * time.Second
)

// removals is a Backend's queue of removals that failed (the engine down,
// slow, answering 5xx): each is retried in the background, with backoff,
// until it succeeds. None is ever dropped; each failed attempt is logged
// and counted. The zero value is ready to use.
type removals struct {
	mu      sync.Mutex
	pending map[uint64]string // by key, what is removed (for logs)
	next    uint64
	failed  uint64
	changed chan struct{} // closed, and replaced, whenever one is done
	kick    chan struct{} // closed, and replaced, by wait: retry now
	logger  *slog.Logger  // nil: slog.Default()
}

// add queues remove, the removal of what, for retries. err is the failure
// of the attempt just made, logged and counted; nil means none was made,
// and the first attempt runs at once in the background.
func (q *removals) add(what string, remove func(context.Context) error, err error) {
	q.mu.Lock()
	if q.pending == nil {
		q.pending = map[uint64]string{}
	}
	q.next++
	key := q.next
	q.pending[key] = what
	q.mu.Unlock()
	delay := time.Duration(0)
	if err != nil {
		q.fail(what, err, removalMinDelay)
		delay = removalMinDelay
	}
	go q.retry(key, what, remove, delay)
}

// retry attempts remove after delay, and again, waiting twice as long each
// time up to removalMaxDelay, until it succeeds.
func (q *removals) retry(key uint64, what string, remove func(context.Context) error, delay time.Duration) {
	for {
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-q.kicked():
			}
			t.Stop()
		}
		// remove bounds itself (removeCtx); no caller's context may cut it.
		err := remove(context.Background())
		if err == nil {
			q.done(key, what)
			return
		}
		delay = min(max(2*delay, removalMinDelay), removalMaxDelay)
		q.fail(what, err, delay)
	}
}

func (q *removals) fail(what string, err error, next time.Duration) {
	q.mu.Lock()
	q.failed++
	logger := q.logger
	q.mu.Unlock()
	if logger == nil {
		logger = slog.Default()
	}
	logger.Warn("removing a workspace failed; retrying", "workspace", what, "retry_in", next.String(), "error", err)
}

func (q *removals) done(key uint64, what string) {
	q.mu.Lock()
	delete(q.pending, key)
	if q.changed != nil {
		close(q.changed)
		q.changed = nil
	}
	logger := q.logger
	q.mu.Unlock()
	if logger == nil {
		logger = slog.Default()
	}
	logger.Info("workspace removed after retries", "workspace", what)
}

// kicked returns the channel wait closes to have every retry attempted at
// once, rather than at the end of its backoff.
func (q *removals) kicked() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.kick == nil {
		q.kick = make(chan struct{})
	}
	return q.kick
}

func (q *removals) stats() backend.RemovalStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return backend.RemovalStats{Pending: len(q.pending), Failed: q.failed}
}

// wait returns once nothing is pending, or with ctx's error. It has every
// pending removal attempted at once, once: a waiter (a shutdown) need not
// sit out a backoff that grew while the engine was away.
func (q *removals) wait(ctx context.Context) error {
	q.mu.Lock()
	if q.kick != nil {
		close(q.kick)
		q.kick = nil
	}
	q.mu.Unlock()
	for {
		q.mu.Lock()
		n := len(q.pending)
		if n == 0 {
			q.mu.Unlock()
			return nil
		}
		if q.changed == nil {
			q.changed = make(chan struct{})
		}
		ch := q.changed
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("docker backend: %d removals still waiting for the engine: %w", n, context.Cause(ctx))
		}
	}
}

// Removals reports the removals that wait for another attempt and the
// attempts that failed ([backend.Remover]).
func (d *Backend) Removals() backend.RemovalStats { return d.queue().stats() }

// WaitRemovals returns once no removal of a closed workspace waits for the
// engine, or with ctx's error, naming how many do, when ctx ends first.
func (d *Backend) WaitRemovals(ctx context.Context) error { return d.queue().wait(ctx) }

// queue is d's removal queue, its logger set on first use.
func (d *Backend) queue() *removals {
	d.rq.mu.Lock()
	if d.rq.logger == nil {
		d.rq.logger = d.Logger
	}
	d.rq.mu.Unlock()
	return &d.rq
}
