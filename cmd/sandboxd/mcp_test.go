package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sessionca"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// TestMCPBadLinesKeepTheSession: sandboxd mcp answers each line that is not
// a valid message with a JSON-RPC error and goes on serving the same
// session — on Docker, the same container, with the work in it.
func TestMCPBadLinesKeepTheSession(t *testing.T) {
	for _, backend := range []string{"memory", "docker"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "docker" {
				dockertest.Client(t) // fails under CI when there is no engine
				dockertest.Image(t)
			}
			dir, _ := newWorkspace(t)
			config := filepath.Join(t.TempDir(), "config.json")
			if err := os.WriteFile(config, []byte(`{"maxFileBytes": 1048576}`), 0o644); err != nil {
				t.Fatal(err)
			}
			c := startRaw(t, "--backend", backend, "--workspace", dir, "--config", config, "--grant", "fs.write", "--always", "read,edit")
			c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write","arguments":{"path":"work.txt","content":"kept\n"}}}`)
			if r := c.next("2")["result"].(map[string]any); r["isError"] == true {
				t.Fatalf("write: %v", r)
			}
			// The line limit is 16 MiB when maxFileBytes is small.
			long := `{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":"write","arguments":{"path":"big","content":"` + strings.Repeat("x", 17<<20) + `"}}}`
			for _, tc := range []struct {
				name, line, id string
				code           float64
				says           string
			}{
				{"garbage", "hello", "null", -32700, "parse error"},
				{"cut short", `{"jsonrpc":"2.0","id":3,"method":"tools/ca`, "null", -32700, "parse error"},
				{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, "null", -32600, "not a string, a number or null"},
				{"batch", `[{"jsonrpc":"2.0","id":4,"method":"ping"}]`, "null", -32600, "no batches"},
				{"too long", long, `"long"`, -32600, "maxFileBytes"},
				{"not UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"write\",\"arguments\":{\"path\":\"work.txt\",\"content\":\"\xff\"}}}", "5", 0, "UTF-8"},
			} {
				c.send(tc.line)
				m := c.next(tc.id)
				if tc.code == 0 { // a tool failure, not a JSON-RPC error
					r, _ := m["result"].(map[string]any)
					if r["isError"] != true || !strings.Contains(r["structuredContent"].(map[string]any)["message"].(string), tc.says) {
						t.Fatalf("%s: %v", tc.name, m)
					}
					continue
				}
				e, _ := m["error"].(map[string]any)
				if e["code"] != tc.code || !strings.Contains(e["message"].(string), tc.says) {
					t.Fatalf("%s: %v, want code %v saying %q", tc.name, m, tc.code, tc.says)
				}
			}
			// The same session, with its work.
			c.send(`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"read","arguments":{"path":"work.txt"}}}`)
			if r := c.next("6")["result"].(map[string]any); r["structuredContent"].(map[string]any)["content"] != "kept\n" {
				t.Fatalf("read after the bad lines: %v", r)
			}
			c.stdin.Close()
			if err := c.cmd.Wait(); err != nil {
				t.Errorf("sandboxd mcp after its input closed: %v", err)
			}
		})
	}
}

// TestMCPEgress: sandboxd mcp --backend docker --egress gives the session's
// commands the proxy, which refuses a host the flags do not name with a
// 403 that names the flag; without --egress there is no proxy. No address
// outside the container is dialled: the refusal comes before any lookup.
func TestMCPEgress(t *testing.T) {
	dockertest.Client(t)
	dockertest.Image(t)
	dir, _ := newWorkspace(t)
	script := `echo "proxy=${HTTPS_PROXY-none}"
exec 3<>/dev/tcp/127.0.0.1/3128 || exit 0
printf 'GET http://notlisted.invalid/ HTTP/1.1\r\nHost: notlisted.invalid\r\nConnection: close\r\n\r\n' >&3
cat <&3`
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":` + strconvQuote(script) + `,"timeout":60}}}`
	for _, tc := range []struct {
		name  string
		flags []string
		want  []string
	}{
		{"on", []string{"--egress", "go", "--egress", "allowed.invalid:443"}, []string{"proxy=http://call-", ":egress@127.0.0.1:3128", "403 Forbidden", "notlisted.invalid:80 refused", "--egress notlisted.invalid:80"}},
		{"off", nil, []string{"proxy=none\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startRaw(t, append([]string{"--backend", "docker", "--workspace", dir, "--deliver", "none", "--grant", "shell.exec", "--always", "shell"}, tc.flags...)...)
			c.send(call)
			r := c.next("2")["result"].(map[string]any)
			out, _ := r["structuredContent"].(map[string]any)["output"].(string)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output %q lacks %q", out, w)
				}
			}
			if tc.name == "off" && strings.Contains(out, "HTTP/1.1") {
				t.Errorf("something answered on the proxy's port without --egress: %q", out)
			}
			c.stdin.Close()
			if err := c.cmd.Wait(); err != nil {
				t.Errorf("sandboxd mcp: %v", err)
			}
		})
	}
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// TestMCPCACert: sandboxd mcp --ca-cert gives the session's commands the
// named authorities beside their image's and the session's own: in
// extra-ca.crt (NODE_EXTRA_CA_CERTS) and in the bundle SSL_CERT_FILE names.
// Without the flag they are the host's added ones; --ca-cert ” is none.
func TestMCPCACert(t *testing.T) {
	dockertest.Client(t)
	dockertest.Image(t)
	dir, _ := newWorkspace(t)
	ca, err := sessionca.New("mcp-ca-cert-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	caFile := filepath.Join(t.TempDir(), "test-ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	_, hostPEM, err := sessionCAs(nil) // what this host's administrator added
	if err != nil {
		t.Fatal(err)
	}
	testPEM := strings.TrimSpace(string(ca.CertPEM()))
	script := `test "$SSL_CERT_FILE" = /tmp/.sandboxd/ca-certificates.crt || echo "SSL_CERT_FILE=$SSL_CERT_FILE"
test "$NODE_EXTRA_CA_CERTS" = /tmp/.sandboxd/extra-ca.crt || echo "NODE_EXTRA_CA_CERTS=$NODE_EXTRA_CA_CERTS"
echo "extra $(grep -c 'BEGIN CERTIFICATE' /tmp/.sandboxd/extra-ca.crt)"
cat /tmp/.sandboxd/extra-ca.crt; echo; echo ==; cat "$SSL_CERT_FILE"`
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":` + strconvQuote(script) + `,"timeout":60}}}`
	hostCerts := strings.Count(string(hostPEM), "BEGIN CERTIFICATE")
	for _, tc := range []struct {
		name       string
		flags      []string
		extra      int  // certificates in extra-ca.crt: the session's own and the added ones
		test, host bool // whether the test's and the host's authorities are trusted
	}{
		{"file", []string{"--ca-cert", caFile}, 2, true, false},
		{"none", []string{"--ca-cert", ""}, 1, false, false},
		{"default", nil, 1 + hostCerts, false, hostCerts > 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// An egress rule, so that the session has its proxy and its
			// own authority; nothing is dialled.
			args := []string{"--backend", "docker", "--workspace", dir, "--deliver", "none", "--grant", "shell.exec", "--always", "shell", "--egress", "allowed.invalid:443"}
			c := startRawTo(t, testTimeout, os.Stderr, append(args, tc.flags...)...)
			c.send(call)
			r := c.next("2")["result"].(map[string]any)
			out, _ := r["structuredContent"].(map[string]any)["output"].(string)
			extra, bundle, _ := strings.Cut(out, "\n==\n")
			if want := fmt.Sprintf("extra %d\n", tc.extra); !strings.HasPrefix(extra, want) {
				t.Errorf("output %q: want it to begin %q", out, want)
			}
			for _, f := range []struct {
				what, text string
			}{{"extra-ca.crt", extra}, {"the bundle", bundle}} {
				if got := strings.Contains(f.text, testPEM); got != tc.test {
					t.Errorf("%s holds the --ca-cert authority: %v, want %v", f.what, got, tc.test)
				}
				if hostCerts > 0 {
					if got := strings.Contains(f.text, strings.TrimSpace(string(hostPEM))); got != tc.host {
						t.Errorf("%s holds the host's added authorities: %v, want %v", f.what, got, tc.host)
					}
				}
			}
			// The image's own authorities come first (minimal has none).
			if n := strings.Count(bundle, "BEGIN CERTIFICATE"); n < tc.extra {
				t.Errorf("the bundle holds %d certificates, fewer than extra-ca.crt's %d", n, tc.extra)
			}
			c.stdin.Close()
			if err := c.cmd.Wait(); err != nil {
				t.Errorf("sandboxd mcp: %v", err)
			}
		})
	}
}
