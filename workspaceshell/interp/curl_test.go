package interp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/workspaceshell/internal/shelltest"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"

	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
)

const curlSecret = "tok-8d0c1f7e22"

// curlEnv is a workspace with one API-backed source served on loopback.
func curlEnv(t *testing.T) (interp.Env, string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != curlSecret {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/repos/acme/app":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"name":"app","q":%q,"key":%q}`, r.URL.RawQuery, r.Header.Get("X-Api-Key"))
		case "/search":
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s %s", r.Method, r.Header.Get("Content-Type"), body)
		case "/big":
			w.Write([]byte(strings.Repeat("y", 600)))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	g, err := sources.NewGateway(sources.Decls{{Name: "gh", Kind: sources.KindHTTP, HTTPDecl: sources.HTTPDecl{
		URL: srv.URL,
		Requests: []sources.RequestShape{
			{Method: "GET", Path: "/repos/{owner}/{repo}", Query: []string{"ref", "q"}},
			{Method: "POST", Path: "/search", Body: true},
			{Method: "GET", Path: "/big"},
			{Method: "GET", Path: "/missing"},
		},
		Credential:       &sources.Credential{Header: "X-Api-Key", Secret: sources.Secret{Env: "GH_KEY"}},
		MaxResponseBytes: 512,
	}}}, sources.WithLookupEnv(func(string) (string, bool) { return curlSecret, true }), sources.WithAudit(func(sources.AuditRecord) {}))
	if err != nil {
		t.Fatal(err)
	}
	env := shelltest.Setup(t, shelltest.Backends[0], shelltest.Tree{"query.txt": "term=go\nlang\n"})
	env.Sources = g
	return env, srv.URL
}

func TestCurl(t *testing.T) {
	env, url := curlEnv(t)
	for _, tc := range []struct {
		line, stdout, stderr string
		code                 int
	}{
		{"curl -s " + url + "/repos/acme/app", `{"name":"app","q":"","key":"[redacted]"}`, "", 0},
		{"curl -sG --data-urlencode 'q=a b' -d ref=main " + url + "/repos/acme/app", `{"name":"app","q":"q=a+b&ref=main","key":"[redacted]"}`, "", 0},
		{"curl -s -d @query.txt " + url + "/search", "POST application/x-www-form-urlencoded term=golang", "", 0},
		{"curl -s --data-binary @query.txt -H 'Content-Type: text/plain' " + url + "/search", "POST text/plain term=go\nlang\n", "", 0},
		{"curl -s " + url + "/repos/acme/app | wc -c", "40\n", "", 0},
		{"curl -sf " + url + "/missing", "", "curl: (22) The requested URL returned error: 404\n", 22},
		{"curl -s " + url + "/big", "", "the response is over the source's limit of 512 bytes", 63},
		{"curl -s ftp://x/y", "", "curl: (3) URL rejected", 3},
		{"curl -s", "", "want exactly one URL", 2},
		{"curl -s --proxy http://evil " + url, "", "unrecognized option '--proxy'", 2},
		{"curl -o out " + url, "", "invalid option -- 'o'", 2},
	} {
		t.Run(tc.line, func(t *testing.T) {
			res, err := interp.Run(context.Background(), env, tc.line, interp.Read)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || res.Stdout != tc.stdout || !strings.Contains(res.Stderr, tc.stderr) {
				t.Fatalf("got %d %q %q, want %d %q %q", res.ExitCode, res.Stdout, res.Stderr, tc.code, tc.stdout, tc.stderr)
			}
			if strings.Contains(res.Stdout+res.Stderr, curlSecret) {
				t.Fatal("the credential reached the output")
			}
		})
	}

	res, err := interp.Run(context.Background(), env, "curl -si "+url+"/repos/acme/app", interp.Read)
	if err != nil || !strings.HasPrefix(res.Stdout, "HTTP/1.1 200 OK\r\n") || !strings.Contains(res.Stdout, "Content-Type: application/json\r\n") {
		t.Fatalf("curl -i: %v %q", err, res.Stdout)
	}
}

func TestCurlRefusals(t *testing.T) {
	env, url := curlEnv(t)
	for _, tc := range []struct{ line, why string }{
		{"curl " + url + "/admin", "not a declared request"},
		{"curl -X DELETE " + url + "/repos/acme/app", "method DELETE"},
		{"curl " + url + "/repos/acme/app?token=1", `query parameter "token"`},
		{"curl -H 'X-Api-Key: mine' " + url + "/repos/acme/app", "credential"},
		{"curl http://203.0.113.9/repos/acme/app", "no source is at"},
		{"pwd; curl " + url + "/repos/a/b/c", "not a declared request"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			_, err := interp.Run(context.Background(), env, tc.line, interp.Read)
			var re *interp.RefusedError
			if !errors.As(err, &re) || !errors.Is(err, workspace.ErrForbidden) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("err = %v, want a refusal saying %q", err, tc.why)
			}
			if !strings.Contains(err.Error(), "/.sandboxd/sources/") {
				t.Fatalf("the refusal does not point at the descriptors: %v", err)
			}
		})
	}

	// Without API-backed sources there is no curl.
	env.Sources = nil
	_, err := interp.Run(context.Background(), env, "curl "+url+"/repos/acme/app", interp.Read)
	if !errors.Is(err, workspace.ErrForbidden) || !strings.Contains(err.Error(), "no API-backed sources") {
		t.Fatalf("err = %v", err)
	}
}
