package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
)

// maxControlBody caps a control-plane request body.
const maxControlBody = 1 << 20

// defaultTimeout is a sandbox's life when its request names none, as E2B's.
const defaultTimeout = 15 * time.Second

func (s *Server) controlRoutes() {
	auth := func(h func(http.ResponseWriter, *http.Request, Tenant)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get("X-API-Key")
			if key == "" {
				writeError(w, http.StatusUnauthorized, "an API key is required: X-API-Key (E2B_API_KEY), a tenant's token of this daemon")
				return
			}
			t, ok := Tenant{}, false
			if s.o.auth != nil {
				t, ok = s.o.auth(key)
			}
			if !ok {
				writeError(w, http.StatusUnauthorized, "the API key is not valid")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxControlBody)
			h(w, r, t)
		}
	}
	s.ctl.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.ctl.HandleFunc("POST /sandboxes", auth(s.create))
	s.ctl.HandleFunc("GET /sandboxes", auth(s.list(runner.StateRunning)))
	s.ctl.HandleFunc("GET /v2/sandboxes", auth(s.list(runner.StateRunning, runner.StatePaused)))
	s.ctl.HandleFunc("GET /sandboxes/{id}", auth(s.get))
	s.ctl.HandleFunc("DELETE /sandboxes/{id}", auth(s.kill))
	s.ctl.HandleFunc("POST /sandboxes/{id}/timeout", auth(s.setTimeout))
	s.ctl.HandleFunc("POST /sandboxes/{id}/refreshes", auth(s.refresh))
	s.ctl.HandleFunc("POST /sandboxes/{id}/connect", auth(s.connect))
	s.ctl.HandleFunc("POST /sandboxes/{id}/pause", auth(s.pause))
	s.ctl.HandleFunc("POST /sandboxes/{id}/resume", auth(s.resume))
	// Everything else of E2B's control plane: metrics, logs, snapshots,
	// templates and their builds, teams, keys, nodes.
	s.ctl.HandleFunc("/", auth(func(w http.ResponseWriter, r *http.Request, _ Tenant) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s: %v (sandboxd's E2B API serves sandboxes: create, list, get, kill, timeout, refreshes, connect, pause, resume; see the README's E2B compatibility table)", r.Method, r.URL.Path, errNotSupported))
	}))
}

// newSandbox is E2B's NewSandbox.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	AutoPause           bool              `json:"autoPause"`
	Secure              bool              `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             json.RawMessage   `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	MCP                 json.RawMessage   `json:"mcp"`
}

// networkConfig is E2B's SandboxNetworkConfig: allowPublicTraffic is
// served (Ports); the rest is refused.
type networkConfig struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	MaskRequestHost    string   `json:"maskRequestHost"`
}

// sandboxJSON is E2B's Sandbox, SandboxDetail and ListedSandbox in one.
type sandboxJSON struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	Alias           string            `json:"alias,omitempty"`
	ClientID        string            `json:"clientID"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	TrafficToken    string            `json:"trafficAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	StartedAt       *time.Time        `json:"startedAt,omitempty"`
	EndAt           *time.Time        `json:"endAt,omitempty"`
	CPUCount        *int              `json:"cpuCount,omitempty"`
	MemoryMB        *int              `json:"memoryMB,omitempty"`
	DiskSizeMB      *int              `json:"diskSizeMB,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	State           string            `json:"state,omitempty"`
}

// decode reads a JSON body into v; an empty body leaves v. It answers 400
// itself.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over %d bytes", mbe.Limit))
			return false
		}
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return false
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return true
	}
	if err := json.Unmarshal(data, v); err != nil {
		writeError(w, http.StatusBadRequest, "request body: "+strings.TrimPrefix(err.Error(), "json: "))
		return false
	}
	return true
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, t Tenant) {
	var req newSandbox
	if !decode(w, r, &req) {
		return
	}
	tpl, ok := s.o.templates[req.TemplateID]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template %q not found: this server has %s (the operator names them: e2b.templates)", req.TemplateID, strings.Join(slices.Sorted(maps.Keys(s.o.templates)), ", ")))
		return
	}
	var refuse []string
	if len(req.MCP) > 0 && string(req.MCP) != "null" {
		refuse = append(refuse, "mcp (the MCP gateway)")
	}
	var network networkConfig
	if len(req.Network) > 0 && string(req.Network) != "null" {
		dec := json.NewDecoder(bytes.NewReader(req.Network))
		dec.DisallowUnknownFields() // nothing accepted and ignored
		if err := dec.Decode(&network); err != nil {
			writeError(w, http.StatusBadRequest, "network: "+strings.TrimPrefix(err.Error(), "json: "))
			return
		}
		if len(network.AllowOut) > 0 || len(network.DenyOut) > 0 || network.MaskRequestHost != "" {
			refuse = append(refuse, "network.allowOut, denyOut and maskRequestHost (egress rules by CIDR, a masked host: the operator's egress configuration decides what a sandbox reaches)")
		}
	}
	if len(refuse) > 0 {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s: %v", strings.Join(refuse, "; "), errNotSupported))
		return
	}
	timeout, ok := seconds(w, req.Timeout, defaultTimeout)
	if !ok {
		return
	}
	st := runner.Settings{
		Image: tpl.Image, Template: tpl.Template, Grants: s.o.grants, Vars: req.EnvVars,
		Lifetime: runner.Duration(timeout),
	}
	// Internet access is what the operator's egress policy allows: a
	// sandbox that asks for none gets none; one that asks for it gets the
	// tenant's (nil keeps it).
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		st.Egress = []string{}
	}
	sess, err := s.m.Create(r.Context(), runner.CreateRequest{Tenant: t.Name, Settings: st, MaxSessions: t.MaxSessions, Egress: t.Egress})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if req.AutoPause && !sess.CanPause() {
		s.m.Delete(context.WithoutCancel(r.Context()), t.Name, sess.ID())
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("autoPause: %v", s.noPause()))
		return
	}
	rec := &record{id: sess.ID(), tenant: t.Name, template: req.TemplateID, metadata: req.Metadata, envs: req.EnvVars, started: time.Now(), autoPause: req.AutoPause}
	if req.Secure {
		rec.token = newToken()
	}
	if network.AllowPublicTraffic != nil && !*network.AllowPublicTraffic {
		rec.traffic = newToken()
	}
	b := newRun(rec, sess)
	s.track(b)
	if rec.autoPause {
		if err := s.setEnd(b, time.Now().Add(timeout), false); err != nil {
			s.m.Delete(context.WithoutCancel(r.Context()), t.Name, sess.ID())
			s.forget(b)
			s.fail(w, r, err)
			return
		}
	}
	go s.sweep()
	writeJSON(w, http.StatusCreated, s.describe(b, false, nil))
}

// seconds is a request's timeout of n seconds, def when it names none; a
// negative one it answers 400 itself.
func seconds(w http.ResponseWriter, n *int, def time.Duration) (time.Duration, bool) {
	if n == nil {
		return def, true
	}
	if *n < 0 {
		writeError(w, http.StatusBadRequest, "timeout: want a number of seconds, 0 or more")
		return 0, false
	}
	return time.Duration(*n) * time.Second, true
}

// describe is b as E2B shows it, paused when paused is not nil (the
// runner's description of it); detail adds what get and list show. A
// sandbox's end is its timeout's: when it is paused, the end of the
// time it is kept paused.
func (s *Server) describe(b *sandbox, detail bool, paused *runner.Info) sandboxJSON {
	out := sandboxJSON{TemplateID: b.template, SandboxID: b.id, Alias: b.template, ClientID: "sandboxd",
		EnvdVersion: EnvdVersion, EnvdAccessToken: b.token, TrafficToken: b.traffic}
	if s.o.domain != "" {
		out.Domain = &s.o.domain
	}
	if detail {
		end, state := b.sess.ExpiresAt(), runner.StateRunning
		switch {
		case paused != nil:
			state = runner.StatePaused
			if paused.ExpiresAt != nil {
				end = *paused.ExpiresAt
			}
		case b.autoPause:
			end = b.timeout()
		}
		zero := 0
		out.StartedAt, out.EndAt, out.State = &b.started, &end, state
		out.CPUCount, out.MemoryMB, out.DiskSizeMB = &zero, &zero, &zero
		out.Metadata = b.metadata
		if out.Metadata == nil {
			out.Metadata = map[string]string{}
		}
	}
	return out
}

// list answers GET /sandboxes (the running ones by default) and
// /v2/sandboxes (running and paused): the tenant's sandboxes of those
// states, or of the states the state query names, whose metadata holds
// every pair of the metadata query, newest first as E2B lists them, a page
// of limit at a time (x-next-token names the next).
func (s *Server) list(byDefault ...string) func(http.ResponseWriter, *http.Request, Tenant) {
	return func(w http.ResponseWriter, r *http.Request, t Tenant) { s.listStates(w, r, t, byDefault) }
}

func (s *Server) listStates(w http.ResponseWriter, r *http.Request, t Tenant, byDefault []string) {
	q := r.URL.Query()
	want, err := url.ParseQuery(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "metadata: want key=value pairs joined by &, each URL-encoded: "+err.Error())
		return
	}
	states := map[string]bool{}
	for _, st := range byDefault {
		states[st] = true
	}
	if q.Has("state") {
		clear(states)
		for _, v := range q["state"] {
			for st := range strings.SplitSeq(v, ",") {
				if st != runner.StateRunning && st != runner.StatePaused {
					writeError(w, http.StatusBadRequest, fmt.Sprintf("state %q: want running or paused", st))
					return
				}
				states[st] = true
			}
		}
	}
	limit := 0
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 {
			writeError(w, http.StatusBadRequest, "limit: want a positive number")
			return
		}
	}
	out := []sandboxJSON{}
	after := q.Get("nextToken")
	for _, info := range slices.Backward(s.m.Sessions(t.Name)) {
		b, paused, err := s.tenantLookup(t.Name, info.ID)
		if err != nil || !matches(b.metadata, want) || !states[stateOf(paused)] {
			continue
		}
		if after != "" {
			if b.id == after {
				after = ""
			}
			continue
		}
		if limit > 0 && len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SandboxID)
			break
		}
		out = append(out, s.describe(b, true, paused))
	}
	writeJSON(w, http.StatusOK, out)
}

func matches(md map[string]string, want url.Values) bool {
	for k, vs := range want {
		for _, v := range vs {
			if md[k] != v {
				return false
			}
		}
	}
	return true
}

// stateOf is the state of a sandbox whose runner's description is paused
// (nil when it runs).
func stateOf(paused *runner.Info) string {
	if paused != nil {
		return runner.StatePaused
	}
	return runner.StateRunning
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, t Tenant) {
	b, paused, err := s.tenantLookup(t.Name, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.describe(b, true, paused))
}

// kill ends the sandbox, a paused one too.
func (s *Server) kill(w http.ResponseWriter, r *http.Request, t Tenant) {
	id := r.PathValue("id")
	b, _, err := s.tenantLookup(t.Name, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.m.Delete(r.Context(), t.Name, id); err != nil && !errors.Is(err, runner.ErrClosed) && !errors.Is(err, runner.ErrNotFound) {
		s.fail(w, r, err)
		return
	}
	s.forget(b)
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is the body of timeout, connect and refreshes.
type timeoutBody struct {
	Timeout  *int `json:"timeout"`
	Duration *int `json:"duration"`
}

// setTimeout ends the sandbox timeout seconds from now, whatever its end
// was.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, t Tenant) {
	s.extend(w, r, t, func(b timeoutBody) *int { return b.Timeout }, false, http.StatusNoContent)
}

// refresh ends the sandbox duration seconds from now (default 60s), as
// setTimeout does.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request, t Tenant) {
	s.extend(w, r, t, func(b timeoutBody) *int {
		if b.Duration == nil {
			d := 60
			return &d
		}
		return b.Duration
	}, false, http.StatusNoContent)
}

// connect answers the sandbox, its end moved to timeout seconds from now
// when that is later than it was (a running sandbox's end is never
// brought forward); a paused sandbox is resumed first (201), its end then
// timeout seconds from now.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, t Tenant) {
	s.extend(w, r, t, func(b timeoutBody) *int { return b.Timeout }, true, http.StatusOK)
}

func (s *Server) extend(w http.ResponseWriter, r *http.Request, t Tenant, secs func(timeoutBody) *int, onlyLater bool, status int) {
	var body timeoutBody
	if !decode(w, r, &body) {
		return
	}
	n := secs(body)
	if n == nil || *n < 0 {
		writeError(w, http.StatusBadRequest, "timeout: want a number of seconds, 0 or more")
		return
	}
	var b *sandbox
	var err error
	if onlyLater { // connect: a paused sandbox is resumed
		var paused *runner.Info
		if b, paused, err = s.tenantLookup(t.Name, r.PathValue("id")); err == nil && paused != nil {
			s.resumeAnswer(w, r, b, time.Duration(*n)*time.Second, nil)
			return
		}
	} else {
		b, err = s.tenantBox(t.Name, r.PathValue("id"))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.setEnd(b, time.Now().Add(time.Duration(*n)*time.Second), onlyLater); err != nil {
		s.fail(w, r, err)
		return
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	writeJSON(w, status, s.describe(b, false, nil))
}

// fail answers err in E2B's shape and with the status the SDK reads: a
// missing sandbox 404 (NotFoundException), a cap 429, a refusal by the
// operator's policy 403, a bad setting 400, a paused sandbox 409, a pause
// the backend cannot make 501.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	if status >= 500 {
		s.o.logger.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	writeError(w, status, err.Error())
}

func statusOf(err error) int {
	var de *policy.DeniedError
	var se *runner.SettingError
	switch {
	case errors.Is(err, runner.ErrNotFound), errors.Is(err, runner.ErrClosed):
		return http.StatusNotFound
	case errors.Is(err, runner.ErrPaused):
		return http.StatusConflict
	case errors.Is(err, runner.ErrNoPause), errors.Is(err, errNotSupported):
		return http.StatusNotImplemented
	case errors.Is(err, runner.ErrTooManySessions), errors.Is(err, runner.ErrBusy):
		return http.StatusTooManyRequests
	case errors.Is(err, runner.ErrShuttingDown), errors.Is(err, backend.ErrUnreachable):
		return http.StatusServiceUnavailable
	case errors.As(err, &de):
		return http.StatusForbidden
	case errors.As(err, &se):
		return http.StatusBadRequest
	case errors.Is(err, context.Canceled):
		return 499
	}
	return http.StatusInternalServerError
}
