package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/backend"
)

// PoolConfig asks for a warm pool: Size workspaces of Image, hardened with
// the image's default profile, started ahead of demand.
type PoolConfig struct {
	// Image is the image; "" is the policy's default.
	Image string `json:"image,omitempty"`
	// Size is how many ready workspaces the pool keeps.
	Size int `json:"size"`
	// Template, when set, names a template (WithTemplates) the pool's
	// workspaces hold before they are claimed, written in and checked
	// against its manifest as each is started: they go to the sessions
	// that ask for the template.
	Template string `json:"template,omitempty"`
}

// PoolStats describes a warm pool.
type PoolStats struct {
	Image, Template string
	// Size is the target; Ready how many wait now; Claimed how many went to
	// sessions so far; Lost how many ended while they waited (a container
	// killed from outside), and were replaced.
	Size, Ready   int
	Claimed, Lost uint64
}

// pool keeps ready workspaces of one spec. claim hands each to exactly one
// session (it is removed from ready under the lock); a background loop
// refills the pool after every claim.
type pool struct {
	m     *Manager
	w     backend.Warmer
	key   string
	spec  backend.Spec
	size  int
	wake  chan struct{}
	stop  context.CancelFunc
	ctx   context.Context
	done  chan struct{}
	image string
	// template is what its workspaces hold ("" for none).
	template string

	mu      sync.Mutex
	ready   []*backend.Instance
	claimed uint64
	lost    uint64 // ready workspaces that ended before a claim
}

func (m *Manager) newPool(pc PoolConfig) (*pool, error) {
	w, ok := m.backend.(backend.Warmer)
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
	if pc.Template != "" {
		if err := m.check(origin{template: pc.Template}); err != nil {
			return nil, fmt.Errorf("runner: pool of %q: %w", pc.Image, err)
		}
	}
	spec := m.spec(prof, m.o.tools)
	p := &pool{m: m, w: w, key: poolKey(spec), spec: spec, size: pc.Size, image: prof.Image, template: pc.Template,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.ctx, p.stop = context.WithCancel(context.Background())
	go p.fill()
	return p, nil
}

// claim takes a ready workspace for spec from a matching pool, if any:
// one of a pool of the template, which holds its tree (filled), or else
// an empty one.
func (m *Manager) claim(ctx context.Context, spec backend.Spec, template string) (inst *backend.Instance, pooled, filled bool) {
	if len(m.pools) == 0 {
		return nil, false, false
	}
	key := poolKey(spec)
	for _, want := range []string{template, ""} {
		for _, p := range m.pools {
			if p.key == key && p.template == want {
				if inst := p.claim(ctx); inst != nil {
					return inst, true, want != ""
				}
			}
		}
		if template == "" {
			break
		}
	}
	return nil, false, false
}

// checkTimeout bounds the check of a pooled workspace before a claim.
const checkTimeout = 10 * time.Second

// claim hands out a ready workspace that still answers: it has not ended
// (backend.Instance.Done) and a Stat of its root succeeds, so a container that died
// while it waited is never handed out, even before its end is noticed.
// Those that fail are dropped on the way.
func (p *pool) claim(ctx context.Context) *backend.Instance {
	defer p.refill()
	for {
		p.mu.Lock()
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return nil
		}
		inst := p.ready[0]
		p.ready[0] = nil
		p.ready = p.ready[1:]
		p.mu.Unlock()
		err := errors.New("it ended")
		if !inst.Ended() {
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			_, err = inst.FS.Stat(cctx, ".")
			cancel()
		}
		p.mu.Lock()
		switch {
		case err == nil:
			p.claimed++
			p.mu.Unlock()
			return inst
		case ctx.Err() != nil: // the caller left: the check proved nothing
			p.ready = slices.Insert(p.ready, 0, inst)
			p.mu.Unlock()
			return nil
		}
		p.discard(inst, err)
		p.mu.Unlock()
	}
}

// refill wakes the filling loop.
func (p *pool) refill() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// watch drops inst from the ready workspaces if it ends while it waits
// there, and starts another.
func (p *pool) watch(inst *backend.Instance) {
	if inst.Done == nil {
		return
	}
	go func() {
		select {
		case <-inst.Done:
		case <-p.ctx.Done():
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if i := slices.Index(p.ready, inst); i >= 0 {
			p.ready = slices.Delete(p.ready, i, i+1)
			p.discard(inst, errors.New("it ended"))
			p.refill()
		}
	}()
}

// discard removes a ready workspace that failed its check (err), in the
// background; p.mu is held.
func (p *pool) discard(inst *backend.Instance, err error) {
	p.lost++
	if inst.Err != nil && inst.Err() != nil {
		err = inst.Err()
	}
	p.m.o.logger.Warn("warm pool: a ready workspace failed its check; starting another", "image", p.image, "workspace", inst.ID, "error", err)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
		defer cancel()
		inst.Close(ctx)
	}()
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
		inst, err := p.start()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.m.o.logger.Warn("warm pool: starting a workspace failed", "image", p.image, "template", p.template, "error", err, "retry_in", backoff)
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
		p.watch(inst)
	}
}

// start starts a workspace for the pool, with the pool's template written
// in and checked now, before any session can claim it.
func (p *pool) start() (*backend.Instance, error) {
	inst, err := p.w.Warm(p.ctx, p.spec)
	if err != nil || p.template == "" {
		return inst, err
	}
	if err := p.m.fill(p.ctx, inst, origin{template: p.template}); err != nil {
		inst.Close(context.WithoutCancel(p.ctx))
		return nil, err
	}
	return inst, nil
}

func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Image: p.image, Template: p.template, Size: p.size, Ready: len(p.ready), Claimed: p.claimed, Lost: p.lost}
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

// poolKey is what makes two specs interchangeable for a warm pool: all of
// the spec but the session's names.
func poolKey(s backend.Spec) string {
	s.Session, s.Tenant = "", ""
	s.Profile.Session, s.Profile.Tenant = "", ""
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a Spec is plain data
	}
	return string(b)
}
