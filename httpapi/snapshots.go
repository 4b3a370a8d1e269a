package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/snapshot"
)

// SnapshotList is the answer of GET /v1/snapshots: the tenant's snapshots,
// what they hold and the tenant's caps.
type SnapshotList struct {
	Snapshots []snapshot.Info `json:"snapshots"`
	Usage     snapshot.Usage  `json:"usage"`
	Limits    snapshot.Limits `json:"limits"`
}

// TemplateList is the answer of GET /v1/templates.
type TemplateList struct {
	Templates []snapshot.Info `json:"templates"`
}

// ForkRequest is the body of POST /v1/sessions/ID/fork.
type ForkRequest struct {
	// Count is how many sessions (1 to runner.MaxForks).
	Count int `json:"count"`
	// Settings replace the source's, key by key.
	Settings json.RawMessage `json:"settings,omitempty"`
}

// ForkResult is the answer of a fork: the new sessions.
type ForkResult struct {
	Sessions []runner.Info `json:"sessions"`
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(w, r)
	if !ok {
		return
	}
	info, err := sess.Snapshot(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/snapshots/"+info.ID)
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	t := tenantOf(r).Name
	list, err := s.m.Snapshots(t)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := SnapshotList{Snapshots: list}
	if out.Snapshots == nil {
		out.Snapshots = []snapshot.Info{}
	}
	out.Usage, out.Limits, _ = s.m.SnapshotUsage(t)
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	info, err := s.m.Snapshot(tenantOf(r).Name, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteSnapshot(tenantOf(r).Name, r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	list, err := s.m.Templates()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if list == nil {
		list = []snapshot.Info{}
	}
	writeJSON(w, http.StatusOK, TemplateList{Templates: list})
}

func (s *Server) forkSession(w http.ResponseWriter, r *http.Request) {
	t := tenantOf(r)
	var req ForkRequest
	if !s.decode(w, r, &req) {
		return
	}
	forks, err := s.m.Fork(r.Context(), t.Name, r.PathValue("id"), runner.ForkRequest{Count: req.Count, Settings: req.Settings, MaxSessions: t.MaxSessions, MaxSecrets: t.MaxSecrets})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := ForkResult{Sessions: make([]runner.Info, len(forks))}
	for i, f := range forks {
		out.Sessions[i] = f.Info()
	}
	writeJSON(w, http.StatusCreated, out)
}

// pauseSession stops the session's workspace, keeping its files
// (runner.Manager.Pause), and answers it paused.
func (s *Server) pauseSession(w http.ResponseWriter, r *http.Request) {
	info, err := s.m.Pause(r.Context(), tenantOf(r).Name, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// resumeSession brings a paused session back (runner.Manager.Resume) and
// answers it running.
func (s *Server) resumeSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.m.Resume(r.Context(), tenantOf(r).Name, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sess.Info())
}
