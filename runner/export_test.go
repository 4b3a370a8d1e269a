package runner

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/sessionca"
)

// SessionCA is the certificate authority of s's egress: nil until its
// egress is on.
func SessionCA(s *Session) *sessionca.CA {
	if s.eg == nil {
		return nil
	}
	s.eg.mu.Lock()
	defer s.eg.mu.Unlock()
	return s.eg.ca
}

// Adopted is what a replica that adopts s has of its tenant's secrets:
// the session's record's JSON (its settings, as publish writes them), and
// the secrets its proxy would take from it.
func Adopted(s *Session) ([]byte, []egress.Secret, error) {
	data, err := json.Marshal(record{Settings: s.settingsNow()})
	if err != nil {
		return nil, nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, nil, err
	}
	return data, egressSecrets(keptTenantSecrets(nil, r.Settings.SecretValues, nil)), nil
}

// Crash ends m as its process's death would, as far as one process can:
// its sessions' streams to their workspaces are cut and their uids let go
// (Instance.Leave, for the backends that have it) and nothing else is
// done — no call drained, no workspace removed, no record changed, the
// backend's claim not given back.
func Crash(m *Manager) {
	m.mu.Lock()
	m.closing = true
	all := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		all = append(all, s)
	}
	clear(m.sessions)
	m.mu.Unlock()
	close(m.stopSweep)
	<-m.swept
	for _, p := range m.pools {
		p.stop()
		<-p.done
		for _, inst := range p.ready {
			if inst.Leave != nil {
				inst.Leave(context.Background())
			}
		}
	}
	for _, s := range all {
		s.cancel(ErrShuttingDown)
		if s.inst.Leave != nil {
			s.inst.Leave(context.Background())
		}
	}
}

// DaemonName is the daemon's name m runs as (WithDaemonName).
func DaemonName(m *Manager) string { return m.o.daemon }

// HoldBaselines holds the background read of the first tree of every
// session made until the test ends: once its store is made, each read
// sends on held and waits until release is called or its session ends.
// waiting receives once each time a call begins to wait for a first tree
// not yet read.
func HoldBaselines(t testing.TB) (held, waiting <-chan struct{}, release func()) {
	h, w, r := make(chan struct{}, 100), make(chan struct{}, 100), make(chan struct{})
	var once sync.Once
	baselineHook = func(ctx context.Context) {
		h <- struct{}{}
		select {
		case <-r:
		case <-ctx.Done():
		}
	}
	baselineWaitHook = func() { w <- struct{}{} }
	release = func() { once.Do(func() { close(r) }) }
	t.Cleanup(func() { release(); baselineHook, baselineWaitHook = nil, nil })
	return h, w, release
}

// BaselineComplete reports whether s's first tree is read (or failed),
// its background read over.
func BaselineComplete(s *Session) bool { return s.base.complete() }

// WatchNewBaselines reports, until the test ends, each time a new baseline
// (Rebaseline) begins to wait for the calls in flight that may change the
// workspace (holding), and each time such a call begins to wait for a new
// baseline (waiting).
func WatchNewBaselines(t testing.TB) (holding, waiting <-chan struct{}) {
	h, w := make(chan struct{}, 100), make(chan struct{}, 100)
	baselineHoldHook = func() { h <- struct{}{} }
	changeWaitHook = func() { w <- struct{}{} }
	t.Cleanup(func() { baselineHoldHook, changeWaitHook = nil, nil })
	return h, w
}

// ForkStoredFirst makes Fork, until the test ends, make its snapshot
// whole and then restore it into each fork, as it did before it wrote
// the snapshot into them as it was read: for BenchmarkDockerSnapshots'
// comparison.
func ForkStoredFirst(tb testing.TB) {
	forkStoredFirst.Store(true)
	tb.Cleanup(func() { forkStoredFirst.Store(false) })
}

// DamageForkSpool makes each fork's spool, until the test ends, hold at
// offset at another byte than the store wrote there, as a disk might.
func DamageForkSpool(tb testing.TB, at int64) {
	spoolWritten = func(spool *os.File, off int64, n int) {
		if off <= at && at < off+int64(n) {
			b := make([]byte, 1)
			spool.ReadAt(b, at)
			spool.WriteAt([]byte{b[0] ^ 0xff}, at)
		}
	}
	tb.Cleanup(func() { spoolWritten = nil })
}
