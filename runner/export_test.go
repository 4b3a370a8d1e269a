package runner

import (
	"encoding/json"

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
