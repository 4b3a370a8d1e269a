package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runner"
)

// TestEgressEndpoint: GET and PUT /v1/sessions/ID/egress answer for the
// session's tenant only, a PUT needs allow, and a backend whose commands
// use the host's network (local) refuses it naming why (the proxy's own
// behaviour is runner's TestDockerBroker and cmd/sandboxd's
// TestServeBroker).
func TestEgressEndpoint(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, runner.Settings{})
	var p runner.EgressPolicy
	e.json(acmeToken, "GET", "/v1/sessions/"+s.ID+"/egress", nil, http.StatusOK, &p)
	if p.Allow == nil || len(p.Allow) != 0 || p.Secrets == nil {
		t.Errorf("GET egress: %+v", p)
	}
	if status, _, _ := e.do(boltToken, "GET", "/v1/sessions/"+s.ID+"/egress", nil); status != http.StatusNotFound {
		t.Errorf("another tenant's GET: %d", status)
	}
	for body, want := range map[string]string{
		`{}`:                 "the body is",
		`{"allow": "go"}`:    "want a list",
		`{"allow": ["go"]}`:  "gives commands the host's network",
		`{"alow": ["go"]}`:   "unknown field",
		`{"allow": ["x:0"]}`: "gives commands the host's network",
	} {
		status, data, _ := e.do(acmeToken, "PUT", "/v1/sessions/"+s.ID+"/egress", strings.NewReader(body), "Content-Type", "application/json")
		if status != http.StatusBadRequest || !strings.Contains(string(data), want) {
			t.Errorf("PUT %s: %d %s; want 400 saying %q", body, status, data, want)
		}
	}
}
