package e2b_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
)

// sign is the SDK's get_signature (e2b/sandbox/signature.py).
func sign(path, op, user, token string, exp int64) url.Values {
	raw := path + ":" + op + ":" + user + ":" + token
	q := url.Values{"path": {path}, "username": {user}}
	if exp != 0 {
		raw += fmt.Sprintf(":%d", exp)
		q.Set("signature_expiration", fmt.Sprint(exp))
	}
	sum := sha256.Sum256([]byte(raw))
	q.Set("signature", "v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
	return q
}

// TestSignedURLs: a secure sandbox's signed /files URL reads (GET) or
// writes (POST) its one file without any header, until it expires; a
// signature for another path, operation or sandbox, or an expired one, is
// 401 in envd's words.
func TestSignedURLs(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base","secure":true}`)
	other := e.create("bolt-key", `{"templateID":"base","secure":true}`)
	put(t, e, c, "a.txt", "signed contents")
	do := func(method string, q url.Values, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, e.url+"/files?"+q.Encode(), strings.NewReader(body))
		if method == "POST" {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		return send(t, req)
	}
	if st, body := do("GET", sign("a.txt", "read", "user", c.EnvdAccessToken, 0), ""); st != 200 || body != "signed contents" {
		t.Fatalf("signed read: %d %s", st, body)
	}
	if st, body := do("GET", sign("a.txt", "read", "user", c.EnvdAccessToken, time.Now().Add(time.Minute).Unix()), ""); st != 200 || body != "signed contents" {
		t.Fatalf("signed read before its expiry: %d %s", st, body)
	}
	if st, body := do("POST", sign("b.txt", "write", "user", c.EnvdAccessToken, 0), "uploaded"); st != 200 {
		t.Fatalf("signed write: %d %s", st, body)
	}
	if st, body := do("GET", sign("b.txt", "read", "user", c.EnvdAccessToken, 0), ""); st != 200 || body != "uploaded" {
		t.Fatalf("read of the signed write: %d %s", st, body)
	}
	var e401 struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	st, body := do("GET", sign("a.txt", "read", "user", c.EnvdAccessToken, time.Now().Add(-time.Minute).Unix()), "")
	if json.Unmarshal([]byte(body), &e401); st != 401 || e401.Code != 401 || e401.Message != "signature is already expired" {
		t.Fatalf("expired: %d %s", st, body)
	}
	wrongPath := sign("a.txt", "read", "user", c.EnvdAccessToken, 0)
	wrongPath.Set("path", "b.txt")
	for name, q := range map[string]url.Values{
		"another path":      wrongPath,
		"another operation": sign("a.txt", "write", "user", c.EnvdAccessToken, 0),
		"another token":     sign("a.txt", "read", "user", "ea_guess", 0),
	} {
		if st, body := do("GET", q, ""); st != 401 {
			t.Errorf("%s: %d %s", name, st, body)
		}
	}
	// bolt's token signs for bolt's sandbox only.
	if st, body := do("GET", sign("a.txt", "read", "user", other.EnvdAccessToken, 0), ""); st != 404 {
		t.Errorf("bolt's signature for a file only acme's sandbox has: %d %s", st, body)
	}
	// The access token alone names its sandbox (Sandbox.connect's requests).
	byToken := processconnect.NewProcessClient(&http.Client{Transport: headers{token: c.EnvdAccessToken}}, e.url)
	if _, out, _, _, err := run(t, byToken, "cat a.txt", false); err != nil || out != "signed contents" {
		t.Fatalf("named by its token: %q %v", out, err)
	}
	noSuch := processconnect.NewProcessClient(&http.Client{Transport: headers{token: "ea_nobodys"}}, e.url)
	if _, _, _, _, err := run(t, noSuch, "true", false); err == nil {
		t.Fatal("an unknown token named a sandbox")
	}
}
