package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/sessionca"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// TestServeBroker: sandboxd serve with a secret in its configuration, over
// HTTP, on Docker: a session's curl gets the placeholder, the destination
// gets the value; PUT /v1/sessions/ID/egress narrows the session to
// nothing and the next request is refused, naming the setting; the tool
// call's audit line and its egress line name the same call; and the
// secret's value is in no line of the daemon's whole log and no result.
func TestServeBroker(t *testing.T) {
	dockertest.Image(t)
	agentHere(t)
	const value = "serve-broker-VALUE-31415926535"
	t.Setenv("SANDBOXD_E2E_BROKER_TOKEN", value)
	upstream, err := sessionca.New("e2e-upstream", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Close()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+value {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "authorized\n")
	}))
	cert, err := upstream.Certificate("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}} // no SNI for an address: no GetCertificate

	srv.StartTLS()
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	dest := "127.0.0.1:" + u.Port()
	caFile := filepath.Join(t.TempDir(), "upstream.pem")
	if err := os.WriteFile(caFile, upstream.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	const token = "sbx_serve_broker"
	config := filepath.Join(t.TempDir(), "sandboxd.json")
	cfg := fmt.Sprintf(`{"backend": "docker", "image": "dev", "endSessionsOnExit": true, "tenants": [{"name": "acme", "tokens": [%q]}],
		"egress": {"allow": [%q], "allowPrivate": ["127.0.0.1"]},
		"secrets": [{"name": "API_TOKEN", "env": "SANDBOXD_E2E_BROKER_TOKEN", "allow": [%q]}],
		"caCerts": [%q]}`, httpapi.HashToken(token), dest, dest, caFile)
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _, logs := serveLogged(t, "--config", config)
	c, err := client.New(client.WithBaseURL(base), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	created, err := c.SessionCreate(ctx, client.SessionCreateOptions{Settings: runner.Settings{Grants: []string{tools.GrantShellExec}, Always: []string{"shell"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Session.ID
	defer c.SessionRemove(ctx, id, client.SessionRemoveOptions{})

	var results []string
	bash := func(script string) map[string]any {
		t.Helper()
		res, err := c.ToolCall(ctx, id, client.ToolCallOptions{Tool: "bash", Arguments: map[string]any{"command": script, "timeout": 120}})
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(res.CallResult)
		results = append(results, string(data))
		sc, _ := res.StructuredContent.(map[string]any)
		return sc
	}
	// 127.0.0.1 is in NO_PROXY, for the container's own loopback: this
	// destination is the daemon's, through the proxy.
	curl := `NO_PROXY= no_proxy= curl -sS -H "Authorization: Bearer $API_TOKEN" https://` + dest + `/`
	if out := bash(curl); out["output"] != "authorized\n" {
		t.Fatalf("curl with the placeholder: %v", out)
	}
	eg, err := c.SessionEgress(ctx, id, client.SessionEgressOptions{})
	if err != nil || len(eg.Egress.Allow) != 1 || eg.Egress.Allow[0] != dest || len(eg.Egress.Secrets) != 1 {
		t.Errorf("GET egress: %+v %v", eg, err)
	}
	if _, err := c.SessionEgressSet(ctx, id, client.SessionEgressSetOptions{Allow: []string{"127.0.0.1:1"}}); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("widening past the operator's: %v, want ErrForbidden", err)
	}
	if set, err := c.SessionEgressSet(ctx, id, client.SessionEgressSetOptions{}); err != nil || len(set.Egress.Allow) != 0 {
		t.Fatalf("PUT egress []: %+v %v", set, err)
	}
	out := bash(curl)
	if text, _ := out["output"].(string); !strings.Contains(text, "egress policy") || !strings.Contains(text, "refused") {
		t.Errorf("curl after narrowing to nothing: %v", out)
	}

	log := logs.String()
	if strings.Contains(log, value) {
		t.Errorf("the daemon's log holds the secret's value")
	}
	for _, r := range results {
		if strings.Contains(r, value) {
			t.Errorf("a result holds the secret's value: %s", r)
		}
	}
	// The first call's tool-call line and its egress line name one call.
	var callLine, egressLine map[string]any
	for line := range strings.SplitSeq(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["session"] != id {
			continue
		}
		switch rec["msg"] {
		case "tool call":
			if callLine == nil {
				callLine = rec
			}
		case "egress":
			if egressLine == nil {
				egressLine = rec
			}
		}
	}
	if callLine == nil || egressLine == nil || callLine["call"] == "" || callLine["call"] != egressLine["call"] || egressLine["tenant"] != "acme" ||
		fmt.Sprint(egressLine["secrets"]) != "[API_TOKEN]" || egressLine["port"] != float64(mustAtoi(t, u.Port())) {
		t.Errorf("audit lines: tool call %v, egress %v", callLine, egressLine)
	}
	if !strings.Contains(log, `"msg":"egress policy changed"`) {
		t.Error("the runtime change is not in the log")
	}
}

func mustAtoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
