package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const hash0 = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// TestConfigErrorsNameThePath: every mistake in serve's configuration is
// reported under the key's full path, with what to write instead, and no
// error shows a tenant's token.
func TestConfigErrorsNameThePath(t *testing.T) {
	const secret = "sbx_TOPSECRETTOKENVALUE"
	for _, tc := range []struct {
		name, config string
		want         string // the error, whole after the file name
	}{
		{"misspelt policy key", `{"policy": {"image": ["sandboxd/*"]}}`,
			`policy.image: unknown key; did you mean "policy.images"? (keys are case-sensitive)`},
		{"key in the wrong case", `{"policy": {"DefaultImage": "x"}}`,
			`policy.DefaultImage: unknown key; did you mean "policy.defaultImage"? (keys are case-sensitive)`},
		{"top-level key in the wrong case", `{"Policy": {}}`,
			`Policy: unknown key; did you mean "policy"? (keys are case-sensitive)`},
		{"unknown key far from any", `{"frobnicate": 1}`,
			"frobnicate: unknown key; the keys that may stand here are $schema, backend, buildMissing, caCerts, daemon, dataDir, e2b, egress, endSessionsOnExit, grants, http, image, images, kubernetes, limits, listen, metricsTokens, policy, pools, secrets, sessions, shutdownTimeout, snapshots, stateDir, tenants, tools"},
		{"second tenant's key", `{"tenants": [{"name": "a", "tokens": ["` + hash0 + `"]}, {"name": "b", "token": []}]}`,
			`tenants[1].token: unknown key; did you mean "tenants[1].tokens"? (keys are case-sensitive)`},
		{"plaintext token", `{"tenants": [{"name": "a", "tokens": ["` + hash0 + `", "` + secret + `"]}]}`,
			"tenants[0].tokens[1]: not a token hash (the value is not shown: it may be a token): write the line 'sandboxd token hash' prints for the token, \"sha256:\" and 64 hex digits, or make a token and its hash with 'sandboxd token new'"},
		{"token where a list goes", `{"tenants": [{"name": "a", "tokens": "` + secret + `"}]}`,
			"tenants[0].tokens: want a list, got a string"},
		{"token where a name goes", `{"tenants": [{"name": ["` + secret + `"]}]}`,
			"tenants[0].name: want a string, got a list"},
		{"ports without a domain", `{"tenants": [{"name": "a"}], "e2b": {"ports": {"listen": ":443"}}}`,
			`e2b.domain: ports need the domain whose names *.DOMAIN lead to e2b.ports.listen ("domain": "sandboxes.example.com")`},
		{"ports of a tenant there is not", `{"tenants": [{"name": "a"}], "e2b": {"domain": "d", "ports": {"listen": ":443", "tenants": ["b"]}}}`,
			`e2b.ports.tenants[0]: "b" is no tenant of the configuration ("*" names every tenant)`},
		{"ports with a certificate and no key", `{"tenants": [{"name": "a"}], "e2b": {"domain": "d", "ports": {"listen": ":443", "certFile": "c.pem"}}}`,
			`e2b.ports.certFile: give both certFile and keyFile (HTTPS), or neither (plain HTTP)`},
		{"ports capped below one", `{"tenants": [{"name": "a"}], "e2b": {"domain": "d", "ports": {"listen": ":443", "maxConnections": -2}}}`,
			`e2b.ports.maxConnections: -2: want the requests a tenant may have open at once, at least 1 (-1 for no cap, 0 or left out for 256)`},
		{"tenant without a name", `{"tenants": [{"tokens": ["` + hash0 + `"]}]}`,
			"tenants[0].name: every tenant needs a name"},
		{"tenant named twice", `{"tenants": [{"name": "a"}, {"name": "a"}]}`,
			"tenants[1].name: tenants[0] has this name already: give each tenant its own"},
		{"egress rule without a port", `{"egress": {"allow": ["go", "proxy.example.com"]}}`,
			`egress: egress rule "proxy.example.com": want HOST:PORT ("proxy.golang.org:443", "*.pythonhosted.org:443") or a preset (debian, github, go, npm, pypi)`},
		{"tenant's egress past the operator's", `{"egress": {"allow": ["go"]}, "tenants": [{"name": "a", "egress": ["pypi"]}]}`,
			"tenants[0].egress: egress pypi.org:443 is not within the operator's egress.allow (proxy.golang.org:443, sum.golang.org:443)"},
		{"secret for a host sessions cannot reach", `{"egress": {"allow": ["github"]}, "secrets": [{"name": "T", "env": "X", "allow": ["gitlab.com:443"]}]}`,
			`secrets[0]: secret "T": allow: egress gitlab.com:443 is not within the operator's egress.allow (github.com:443, api.github.com:443, codeload.github.com:443, objects.githubusercontent.com:443, raw.githubusercontent.com:443) (a secret for a destination sessions cannot reach would never be sent)`},
		{"secret with its value", `{"egress": {"allow": ["github"]}, "secrets": [{"name": "T", "allow": ["github.com:443"]}]}`,
			`secrets[0]: secret "T": set exactly one of env and file (the secret itself is never in the configuration)`},
		{"secret in a reserved variable", `{"egress": {"allow": ["github"]}, "secrets": [{"name": "HTTPS_PROXY", "env": "X", "allow": ["github.com:443"]}]}`,
			`secrets[0]: secret "HTTPS_PROXY": HTTPS_PROXY is a variable sandboxd or a program it runs reads for itself: name the secret otherwise`},
		{"relative CA file", `{"caCerts": ["ca.pem"]}`,
			`caCerts[0]: "ca.pem": want an absolute path of a PEM file`},
		{"unknown workspace disk", `{"limits": {"workspaceDisk": "xfs"}}`,
			`limits.workspaceDisk: "xfs": want off or loop`},
		{"string for a number", `{"limits": {"sessionsPerTenant": "3"}}`,
			"limits.sessionsPerTenant: want a whole number (int), got a string"},
		{"fraction for a whole number", `{"pools": [{"size": 1.5}]}`,
			"pools[0].size: want a whole number (int), got a number that is not one, or out of range"},
		{"bad duration", `{"sessions": {"idleTimeout": "soon"}}`,
			`sessions.idleTimeout: time: invalid duration "soon"`},
		{"unknown tool option", `{"tools": {"maxLine": 3}}`,
			`tools.maxLine: unknown key; did you mean "tools.maxLines"? (keys are case-sensitive)`},
		{"bad tool option", `{"tools": {"maxLines": -1}}`,
			"tools.maxLines: must be positive, got -1"},
		{"nested tool option", `{"tools": {"workspaceShell": {"mod": "read"}}}`,
			`tools.workspaceShell.mod: unknown key; did you mean "tools.workspaceShell.mode"? (keys are case-sensitive)`},
		{"policy limit", `{"policy": {"maxNanoCPUs": 2}}`,
			`policy.maxNanoCPUs: unknown key; did you mean "policy.maxNanoCpus"? (keys are case-sensitive)`},
		{"not an object", `["listen"]`, "want an object, got a list"},
		{"two values", `{} {}`, "more than one JSON value"},
		{"not JSON", `{"listen": `, "not JSON: unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "sandboxd.json")
			if err := os.WriteFile(file, []byte(tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := loadServeConfig(file)
			if err == nil || err.Error() != file+": "+tc.want {
				t.Errorf("loadServeConfig = %v\nwant %s: %s", err, file, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "SECRET") {
				t.Errorf("the error shows the token: %v", err)
			}
		})
	}
}

// TestConfigLoads: a file with keys as the reference writes them loads into
// the fields they name.
func TestConfigLoads(t *testing.T) {
	var c serveConfig
	err := c.parse([]byte(`{"policy": {"defaultImage": "sandboxd/dev:latest", "images": ["sandboxd/*"], "maxNanoCpus": 2000000000},
		"tenants": [{"name": "a", "tokens": ["` + hash0 + `"], "maxSessions": 2}], "sessions": {"idleTimeout": "5m"},
		"tools": {"maxLines": 100, "workspaceShell": {"mode": "read"}}, "pools": [{"image": "sandboxd/dev:latest", "size": 2}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy.DefaultImage != "sandboxd/dev:latest" || len(c.Policy.Images) != 1 || c.Policy.MaxNanoCPUs != 2e9 ||
		c.Tenants[0].MaxSessions != 2 || time.Duration(c.Sessions.IdleTimeout) != 5*time.Minute || c.Pools[0].Size != 2 {
		t.Errorf("loaded %+v", c)
	}
}
