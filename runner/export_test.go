package runner

import (
	"context"
	"encoding/json"
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
