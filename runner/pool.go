package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PoolConfig asks for a warm pool: Size workspaces of Image, hardened with
// the image's default profile, started ahead of demand.
type PoolConfig struct {
	// Image is the image; "" is the policy's default.
	Image string `json:"image,omitempty"`
	// Size is how many ready workspaces the pool keeps.
	Size int `json:"size"`
}

// PoolStats describes a warm pool.
type PoolStats struct {
	Image string
	// Size is the target; Ready how many wait now; Claimed how many went to
	// sessions so far.
	Size, Ready int
	Claimed     uint64
}

// pool keeps ready workspaces of one spec. claim hands each to exactly one
// session (it is removed from ready under the lock); a background loop
// refills the pool after every claim.
type pool struct {
	m     *Manager
	w     Warmer
	key   string
	spec  Spec
	size  int
	wake  chan struct{}
	stop  context.CancelFunc
	ctx   context.Context
	done  chan struct{}
	image string

	mu      sync.Mutex
	ready   []*Instance
	claimed uint64
}

func (m *Manager) newPool(pc PoolConfig) (*pool, error) {
	w, ok := m.backend.(Warmer)
	if !ok {
		return nil, fmt.Errorf("runner: the %s backend keeps no warm pool", m.backend.Name())
	}
	if pc.Size <= 0 {
		return nil, fmt.Errorf("runner: pool of %q: size must be positive", pc.Image)
	}
	prof, err := m.o.policy.Apply(Settings{Image: pc.Image}.request("", ""))
	if err != nil {
		return nil, fmt.Errorf("runner: pool of %q: %w", pc.Image, err)
	}
	spec := m.spec(prof, m.o.tools)
	p := &pool{m: m, w: w, key: spec.poolKey(), spec: spec, size: pc.Size, image: prof.Image,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.ctx, p.stop = context.WithCancel(context.Background())
	go p.fill()
	return p, nil
}

// claim takes a ready workspace for spec from a matching pool, if any.
func (m *Manager) claim(spec Spec) (*Instance, bool) {
	if len(m.pools) == 0 {
		return nil, false
	}
	key := spec.poolKey()
	for _, p := range m.pools {
		if p.key == key {
			if inst := p.claim(); inst != nil {
				return inst, true
			}
		}
	}
	return nil, false
}

func (p *pool) claim() *Instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 {
		return nil
	}
	inst := p.ready[0]
	p.ready[0] = nil
	p.ready = p.ready[1:]
	p.claimed++
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return inst
}

// fill starts workspaces until the pool is full, then waits for a claim.
// Failures back off from 100ms up to 30s.
func (p *pool) fill() {
	defer close(p.done)
	backoff := 100 * time.Millisecond
	for {
		p.mu.Lock()
		need := len(p.ready) < p.size
		p.mu.Unlock()
		if !need {
			select {
			case <-p.wake:
				continue
			case <-p.ctx.Done():
				return
			}
		}
		inst, err := p.w.Warm(p.ctx, p.spec)
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.m.o.logger.Warn("warm pool: starting a workspace failed", "image", p.image, "error", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, 30*time.Second)
			case <-p.ctx.Done():
				return
			}
			continue
		}
		backoff = 100 * time.Millisecond
		p.mu.Lock()
		p.ready = append(p.ready, inst)
		p.mu.Unlock()
	}
}

func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Image: p.image, Size: p.size, Ready: len(p.ready), Claimed: p.claimed}
}

// closePools stops the pools filling and removes their ready workspaces.
func (m *Manager) closePools(ctx context.Context) error {
	var errs []error
	for _, p := range m.pools {
		p.stop()
		<-p.done
		p.mu.Lock()
		ready := p.ready
		p.ready = nil
		p.mu.Unlock()
		for _, inst := range ready {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
			errs = append(errs, inst.Close(rctx))
			cancel()
		}
	}
	return errors.Join(errs...)
}
