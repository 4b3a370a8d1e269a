package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/sandboxd/sandboxd/workspace"
)

// egressRequest is the body of PUT /v1/sessions/{id}/egress.
type egressRequest struct {
	// Allow are the rules the session asks for from now on: HOST:PORT
	// rules and presets within its tenant's; null goes back to the
	// tenant's. Required.
	Allow json.RawMessage `json:"allow"`
}

// getEgress describes a session's egress: the rules in force, the
// session's own, its secrets' names.
func (s *Server) getEgress(w http.ResponseWriter, r *http.Request) {
	if sess, ok := s.session(w, r); ok {
		writeJSON(w, http.StatusOK, sess.Egress())
	}
}

// putEgress changes a live session's egress rules (runner.Session.SetEgress):
// open connections the new rules do not allow are cut.
func (s *Server) putEgress(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok {
		return
	}
	var req egressRequest
	if !s.decode(w, r, &req) {
		return
	}
	if len(req.Allow) == 0 {
		writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), `the body is {"allow": [RULES…]} (HOST:PORT rules and presets; null goes back to the tenant's egress)`)
		return
	}
	var allow []string
	if err := json.Unmarshal(req.Allow, &allow); err != nil {
		writeError(w, http.StatusBadRequest, workspace.ErrInvalidArgument.Name(), "allow: want a list of HOST:PORT rules and presets, or null")
		return
	}
	if allow == nil && string(req.Allow) != "null" {
		allow = []string{}
	}
	p, err := sess.SetEgress(r.Context(), allow)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}
