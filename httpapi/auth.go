package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Tenant is one tenant of the daemon and the tokens that act for it.
type Tenant struct {
	// Name names the tenant in sessions, logs and metrics' absence of them.
	Name string `json:"name"`
	// Tokens are the SHA-256 hashes of the tenant's bearer tokens, as
	// HashToken writes them ("sha256:" and 64 hex digits). The tokens
	// themselves are never stored.
	Tokens []string `json:"tokens"`
	// MaxSessions, when positive, caps this tenant's sessions instead of the
	// daemon-wide cap.
	MaxSessions int `json:"maxSessions,omitempty"`
	// MaxSecrets is how many secrets of their own (the secretValues
	// setting: runner.TenantSecret) this tenant's sessions may bring; zero,
	// the default, allows none.
	MaxSecrets int `json:"maxSecrets,omitempty"`
	// Egress, when set, narrows the operator's egress rules for this
	// tenant's sessions (runner.CreateRequest.Egress).
	Egress []string `json:"egress,omitzero"`
}

const hashPrefix = "sha256:"

// HashToken returns the form a token is configured in: "sha256:" and the
// hex SHA-256 of the token.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hashPrefix + hex.EncodeToString(sum[:])
}

type credential struct {
	hash   [sha256.Size]byte
	tenant *Tenant
}

// authenticator finds the tenant of a bearer token by its hash, comparing
// against every configured hash in constant time.
type authenticator struct {
	creds []credential
}

func newAuthenticator(tenants []Tenant) (*authenticator, error) {
	a := &authenticator{}
	seen := map[string]bool{}
	for i := range tenants {
		t := &tenants[i]
		if t.Name == "" {
			return nil, fmt.Errorf("httpapi: tenant %d has no name", i+1)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("httpapi: tenant %q is configured twice", t.Name)
		}
		seen[t.Name] = true
		for k, h := range t.Tokens {
			raw, err := hex.DecodeString(strings.TrimPrefix(h, hashPrefix))
			if !strings.HasPrefix(h, hashPrefix) || err != nil || len(raw) != sha256.Size {
				// Not even part of the value is shown: it may be a token.
				return nil, fmt.Errorf("httpapi: tenant %q: token %d is not a hash: write it as `sandboxd token hash` prints it (sha256:<64 hex digits>)", t.Name, k+1)
			}
			c := credential{tenant: t}
			copy(c.hash[:], raw)
			a.creds = append(a.creds, c)
		}
	}
	return a, nil
}

var errNoToken = errors.New("a bearer token is required: Authorization: Bearer <token>")
var errBadToken = errors.New("the bearer token is not valid")

// tenant returns the tenant whose token r carries.
func (a *authenticator) tenant(r *http.Request) (*Tenant, error) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return nil, errNoToken
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	var found *Tenant
	for i := range a.creds {
		// Every hash is compared, so the time taken tells nothing.
		if subtle.ConstantTimeCompare(sum[:], a.creds[i].hash[:]) == 1 {
			found = a.creds[i].tenant
		}
	}
	if found == nil {
		return nil, errBadToken
	}
	return found, nil
}

// Tenant returns the tenant whose token this is, as the API's bearer
// tokens are judged (every hash compared, in constant time): for a
// translation of another API whose credential is a tenant's token (package
// e2b's API keys).
func (s *Server) Tenant(token string) (Tenant, bool) {
	r := &http.Request{Header: http.Header{"Authorization": {"Bearer " + token}}}
	t, err := s.auth.tenant(r)
	if err != nil {
		return Tenant{}, false
	}
	return *t, true
}

type tenantKey struct{}

// tenantOf returns the tenant authenticate put in r's context.
func tenantOf(r *http.Request) *Tenant {
	if t, ok := r.Context().Value(tenantKey{}).(*Tenant); ok {
		return t
	}
	return &Tenant{}
}

// authenticate lets through requests with a tenant's token, 401 otherwise.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return s.authenticateWith(s.auth, next)
}

// authenticateWith lets through requests with a token a knows, 401 otherwise.
func (s *Server) authenticateWith(a *authenticator, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := a.tenant(r)
		if len(a.creds) == 0 && a != s.auth {
			err = errNoScrapers
		}
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandboxd"`)
			writeError(w, http.StatusUnauthorized, "Unauthorized", err.Error())
			return
		}
		leaseOf(r.Context()).bind(s.tenantShare(t.Name))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, t)))
	})
}
