package sources_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
)

const secret = "s3cret-token-5f2a9c"

// api is a loopback HTTP server that records what reached it and checks
// the credential.
type api struct {
	*httptest.Server
	mu   sync.Mutex
	hits []string
}

func newAPI(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *api {
	a := &api{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.hits = append(a.hits, r.Method+" "+r.URL.RequestURI()+" auth="+r.Header.Get("Authorization"))
		a.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *api) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.hits...)
}

func itemsSource(url string) sources.Decl {
	return sources.Decl{Name: "items", Kind: sources.KindHTTP, HTTPDecl: sources.HTTPDecl{
		URL: url + "/v1",
		Requests: []sources.RequestShape{
			{Method: "GET", Path: "/items/{id}", Query: []string{"fields"}, Description: "one item"},
			{Method: "GET", Path: "/items", Query: []string{"page"}},
			{Method: "POST", Path: "/items", Body: true},
			{Method: "GET", Path: "/files/{path...}"},
			{Method: "POST", Path: "/items/{id}/touch"},
		},
		Credential:       &sources.Credential{Header: "Authorization", Prefix: "Bearer ", Secret: sources.Secret{Env: "ITEMS_TOKEN"}},
		MaxResponseBytes: 1 << 10,
		TimeoutMs:        2000,
	}}
}

func gateway(t *testing.T, audit *[]sources.AuditRecord, decls ...sources.Decl) *sources.Gateway {
	t.Helper()
	var mu sync.Mutex
	g, err := sources.NewGateway(decls,
		sources.WithLookupEnv(func(k string) (string, bool) {
			if k == "ITEMS_TOKEN" {
				return secret, true
			}
			return "", false
		}),
		sources.WithAudit(func(r sources.AuditRecord) {
			mu.Lock()
			defer mu.Unlock()
			if audit != nil {
				*audit = append(*audit, r)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// itemsAPI serves the declared paths, echoes the credential (as a careless
// or hostile API might), redirects, and sends an oversized body on demand.
func itemsAPI(t *testing.T, elsewhere string) *api {
	return newAPI(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secret {
			http.Error(w, "no credential", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/v1/items/42":
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
			w.Header().Set("Set-Cookie", "session=abc")
			fmt.Fprintf(w, `{"id":42,"fields":%q,"seen":%q}`, r.URL.Query().Get("fields"), r.Header.Get("Authorization"))
		case "/v1/items/big":
			w.Write([]byte(strings.Repeat("x", 4<<10)))
		case "/v1/items/moved":
			http.Redirect(w, r, "/v1/items/42", http.StatusFound)
		case "/v1/items/away":
			http.Redirect(w, r, elsewhere+"/steal", http.StatusFound)
		case "/v1/items/admin":
			http.Redirect(w, r, "/v1/admin", http.StatusFound)
		case "/v1/items/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute): // only until the client gives up, as it must
			}
		case "/v1/items":
			body, _ := io.ReadAll(r.Body)
			if string(body) == "redirect-me" {
				http.Redirect(w, r, "/v1/items/42/touch", http.StatusTemporaryRedirect)
				return
			}
			fmt.Fprintf(w, "%s %s", r.Method, body)
		default:
			http.NotFound(w, r)
		}
	})
}

func TestGatewaySendsDeclaredRequestsWithTheCredential(t *testing.T) {
	other := newAPI(t, func(w http.ResponseWriter, r *http.Request) {})
	srv := itemsAPI(t, other.URL)
	var audit []sources.AuditRecord
	g := gateway(t, &audit, itemsSource(srv.URL))
	ctx := context.Background()

	resp, err := g.Do(ctx, sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42?fields=name", Header: http.Header{"Accept": {"application/json"}}, Session: "s-1", Run: "r-1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 200 || resp.Source != "items" {
		t.Fatalf("status %d source %q", resp.Status, resp.Source)
	}
	if want := `{"id":42,"fields":"name","seen":"Bearer [redacted]"}`; string(resp.Body) != want {
		t.Fatalf("body = %s, want %s", resp.Body, want)
	}
	if got := resp.Header.Get("X-Echo"); got != "Bearer [redacted]" {
		t.Fatalf("X-Echo = %q", got)
	}
	if resp.Header.Get("Set-Cookie") != "" {
		t.Fatal("Set-Cookie reached the agent")
	}
	if hits := srv.requests(); len(hits) != 1 || hits[0] != "GET /v1/items/42?fields=name auth=Bearer "+secret {
		t.Fatalf("the API saw %q", hits)
	}

	// POST with a body, and a redirect to a declared request with -L.
	resp, err = g.Do(ctx, sources.HTTPRequest{Method: "POST", URL: srv.URL + "/v1/items", Body: []byte("new"), Header: http.Header{"Content-Type": {"text/plain"}}})
	if err != nil || string(resp.Body) != "POST new" {
		t.Fatalf("POST: %v %+v", err, resp)
	}
	resp, err = g.Do(ctx, sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/moved", FollowRedirects: true})
	if err != nil || resp.Status != 200 || !strings.HasSuffix(resp.URL, "/v1/items/42") {
		t.Fatalf("redirect within the declarations: %v %+v", err, resp)
	}
	// Without -L the redirect is the answer.
	resp, err = g.Do(ctx, sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/away"})
	if err != nil || resp.Status != http.StatusFound {
		t.Fatalf("redirect not followed: %v %+v", err, resp)
	}
	// A {path...} wildcard takes several segments.
	if _, err := g.Do(ctx, sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/files/a/b%20c.txt"}); err != nil {
		t.Fatal(err)
	}

	for _, r := range audit {
		if strings.Contains(fmt.Sprintf("%+v", r), secret) {
			t.Fatalf("the audit holds the secret: %+v", r)
		}
	}
	if len(audit) != 5 || audit[0].Outcome != "sent" || audit[0].Session != "s-1" || audit[0].Run != "r-1" || audit[0].Status != 200 || audit[0].Source != "items" {
		t.Fatalf("audit = %+v", audit)
	}
}

func TestGatewayRefusesWhatIsNotDeclared(t *testing.T) {
	other := newAPI(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "stolen") })
	srv := itemsAPI(t, other.URL)
	var audit []sources.AuditRecord
	g := gateway(t, &audit, itemsSource(srv.URL))
	otherHost := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	for _, tc := range []struct {
		name string
		req  sources.HTTPRequest
		kind *workspace.Kind
		// sent says the API saw the request (a redirect refused after it).
		sent bool
		why  string
	}{
		{"undeclared path", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/admin"}, workspace.ErrForbidden, false, "not a declared request"},
		{"undeclared method", sources.HTTPRequest{Method: "DELETE", URL: srv.URL + "/v1/items/42"}, workspace.ErrForbidden, false, "method DELETE is not declared"},
		{"undeclared host", sources.HTTPRequest{Method: "GET", URL: otherHost + "/v1/items/42"}, workspace.ErrForbidden, false, "no source is at"},
		{"other server", sources.HTTPRequest{Method: "GET", URL: other.URL + "/v1/items/42"}, workspace.ErrForbidden, false, "no source is at"},
		{"other scheme", sources.HTTPRequest{Method: "GET", URL: strings.Replace(srv.URL, "http:", "https:", 1) + "/v1/items/42"}, workspace.ErrForbidden, false, "no source is at"},
		{"outside the base path", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v2/items/42"}, workspace.ErrForbidden, false, "no source is at"},
		{"undeclared query", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42?admin=1"}, workspace.ErrForbidden, false, `query parameter "admin"`},
		{"dot-dot segment", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/%2e%2e"}, workspace.ErrForbidden, false, "refused"},
		{"encoded slash", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/..%2Fadmin"}, workspace.ErrForbidden, false, "separator"},
		{"dot-dot with a path parameter", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/files/..;/admin"}, workspace.ErrForbidden, false, "path parameters"},
		{"encoded semicolon", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/files/..%3b/admin"}, workspace.ErrForbidden, false, "path parameters"},
		{"encoded semicolon, upper case", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42%3Bjsessionid=x"}, workspace.ErrForbidden, false, "path parameters"},
		{"path parameter on an id", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42;x=1"}, workspace.ErrForbidden, false, "path parameters"},
		{"double-encoded dot-dot", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/files/%252e%252e/admin"}, workspace.ErrForbidden, false, "encoded twice"},
		{"double-encoded slash", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/files/a%252fb"}, workspace.ErrForbidden, false, "encoded twice"},
		{"dot-dot with a trailing space", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/files/..%20/admin"}, workspace.ErrForbidden, false, "refused"},
		{"three dots", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/files/.../admin"}, workspace.ErrForbidden, false, "refused"},
		{"credential header", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42", Header: http.Header{"Authorization": {"Bearer mine"}}}, workspace.ErrForbidden, false, "credential"},
		{"undeclared header", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42", Header: http.Header{"X-Admin": {"1"}}}, workspace.ErrForbidden, false, "header X-Admin"},
		{"body on GET", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42", Body: []byte("x")}, workspace.ErrForbidden, false, "takes no body"},
		{"user in URL", sources.HTTPRequest{Method: "GET", URL: strings.Replace(srv.URL, "://", "://me:pw@", 1) + "/v1/items/42"}, workspace.ErrForbidden, false, "user"},
		{"redirect elsewhere", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/away", FollowRedirects: true}, workspace.ErrForbidden, true, "redirects to"},
		{"redirect to an undeclared path", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/admin", FollowRedirects: true}, workspace.ErrForbidden, true, "redirects to"},
		{"body redirected to a request without one", sources.HTTPRequest{Method: "POST", URL: srv.URL + "/v1/items", Body: []byte("redirect-me"), FollowRedirects: true}, workspace.ErrForbidden, true, "takes none"},
		{"oversized response", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/big"}, workspace.ErrFileTooLarge, true, "limit of 1024 bytes"},
		{"timeout", sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/slow", MaxTime: 200 * time.Millisecond}, workspace.ErrTimeout, true, "within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(srv.requests())
			resp, err := g.Do(context.Background(), tc.req)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err = %v (response %+v), want %v", err, resp, tc.kind.Name())
			}
			if !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("err = %v, want it to say %q", err, tc.why)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error holds the secret: %v", err)
			}
			if sent := len(srv.requests()) > before; sent != tc.sent {
				t.Fatalf("the API saw the request: %t, want %t", sent, tc.sent)
			}
			if last := audit[len(audit)-1]; last.Outcome == "sent" || last.URL != tc.req.URL {
				t.Fatalf("audit = %+v", last)
			}
		})
	}
	if hits := other.requests(); len(hits) != 0 {
		t.Fatalf("the other server saw %q", hits)
	}
}

func TestGatewayCredentialFromFile(t *testing.T) {
	srv := itemsAPI(t, "")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := itemsSource(srv.URL)
	d.Credential = &sources.Credential{Header: "Authorization", Prefix: "Bearer ", Secret: sources.Secret{File: file}}
	g := gateway(t, nil, d)
	resp, err := g.Do(context.Background(), sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42"})
	if err != nil || resp.Status != 200 {
		t.Fatalf("%v %+v", err, resp)
	}
	// Rotated, then gone: each request reads it again.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(context.Background(), sources.HTTPRequest{Method: "GET", URL: srv.URL + "/v1/items/42"})
	if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), file) {
		t.Fatalf("err = %v", err)
	}

	d.Credential = &sources.Credential{Header: "Authorization", Secret: sources.Secret{Env: "NOT_SET_ANYWHERE"}}
	_, err = sources.NewGateway(sources.Decls{d}, sources.WithLookupEnv(func(string) (string, bool) { return "", false }))
	if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "NOT_SET_ANYWHERE") {
		t.Fatalf("err = %v", err)
	}
}

func TestHTTPSourceDeclarations(t *testing.T) {
	good := itemsSource("https://api.example.com")
	for _, tc := range []struct {
		field string
		edit  func(d *sources.Decl)
	}{
		{"sources[0].url", func(d *sources.Decl) { d.URL = "ftp://x/" }},
		{"sources[0].url", func(d *sources.Decl) { d.URL = "https://api.example.com/?a=1" }},
		{"sources[0].url", func(d *sources.Decl) { d.URL = "https://user@api.example.com/" }},
		{"sources[0].url", func(d *sources.Decl) { d.URL = "/relative" }},
		{"sources[0].path", func(d *sources.Decl) { d.Path = "/srv" }},
		{"sources[0].requests", func(d *sources.Decl) { d.Requests = nil }},
		{"sources[0].requests[0].method", func(d *sources.Decl) { d.Requests[0].Method = "get" }},
		{"sources[0].requests[0].path", func(d *sources.Decl) { d.Requests[0].Path = "items" }},
		{"sources[0].requests[0].path", func(d *sources.Decl) { d.Requests[0].Path = "/a/{rest...}/b" }},
		{"sources[0].requests[0].path", func(d *sources.Decl) { d.Requests[0].Path = "/a/../b" }},
		{"sources[0].requests[0].path", func(d *sources.Decl) { d.Requests[0].Path = "/{x}/{x}" }},
		{"sources[0].requests[1].path", func(d *sources.Decl) { d.Requests[1] = d.Requests[0] }},
		{"sources[0].requests[0].headers", func(d *sources.Decl) { d.Requests[0].Headers = []string{"authorization"} }},
		{"sources[0].requests[0].headers", func(d *sources.Decl) { d.Requests[0].Headers = []string{"Host"} }},
		{"sources[0].credential", func(d *sources.Decl) { d.Credential.File = "/run/token" }},
		{"sources[0].credential", func(d *sources.Decl) { d.Credential.Env = "" }},
		{"sources[0].credential.header", func(d *sources.Decl) { d.Credential.Header = "Bad Header" }},
		{"sources[0].maxResponseBytes", func(d *sources.Decl) { d.MaxResponseBytes = -1 }},
	} {
		d := good
		d.Requests = append([]sources.RequestShape(nil), good.Requests...)
		c := *good.Credential
		d.Credential = &c
		tc.edit(&d)
		var de *sources.DeclError
		err := sources.Decls{d}.Validate()
		if !errors.As(err, &de) || de.Field != tc.field || !errors.Is(err, workspace.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want a DeclError on that field", tc.field, err)
		}
	}
	dir := sources.Decl{Name: "d", Kind: sources.KindDir, Path: "/srv", HTTPDecl: sources.HTTPDecl{URL: "https://x"}}
	if err := (sources.Decls{dir}).Validate(); err == nil {
		t.Error("a dir source with a url was accepted")
	}
	if err := (sources.Decls{good}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestHTTPSourceDescriptor(t *testing.T) {
	d := itemsSource("https://api.example.com")
	fsys := memfs.New()
	ctx := context.Background()
	first, err := sources.Materialize(ctx, fsys, sources.Decls{d}, sources.Request{})
	if err != nil {
		t.Fatal(err)
	}
	second, err := sources.Materialize(ctx, fsys, sources.Decls{d}, sources.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if first.Sources[0].Digest != second.Sources[0].Digest || !first.Sources[0].Changed || second.Sources[0].Changed {
		t.Fatalf("materialized twice: %+v then %+v", first.Sources[0], second.Sources[0])
	}
	raw, err := fsys.ReadFile(ctx, sources.SnapshotPath("items")+"/"+sources.DescriptorFile, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "ITEMS_TOKEN") || strings.Contains(string(raw), secret) {
		t.Fatalf("the descriptor names where the credential is:\n%s", raw)
	}
	var desc sources.Descriptor
	if err := json.Unmarshal(raw, &desc); err != nil {
		t.Fatal(err)
	}
	want := sources.DescribedRequest{Method: "GET", URL: "https://api.example.com/v1/items/{id}", Description: "one item",
		Vary:    sources.Vary{Path: []string{"id"}, Query: []string{"fields"}, Headers: []string{"Accept"}},
		Example: "curl -s 'https://api.example.com/v1/items/ID?fields=VALUE'"}
	if got := desc.Requests[0]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("requests[0] = %+v, want %+v", got, want)
	}
	if desc.Requests[2].Vary.Body != true || desc.Limits.MaxResponseBytes != 1<<10 || !strings.Contains(desc.Auth, "Authorization") {
		t.Fatalf("descriptor = %+v", desc)
	}
	// One descriptor per request shape, complete in itself.
	entries, err := fsys.ReadDir(ctx, sources.SnapshotPath("items")+"/requests")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"01-get-items-id.json", "02-get-items.json", "03-post-items.json", "04-get-files-path.json", "05-post-items-id-touch.json"}; !slices.Equal(names, want) {
		t.Fatalf("requests/ = %q, want %q", names, want)
	}
	raw, err = fsys.ReadFile(ctx, sources.SnapshotPath("items")+"/requests/03-post-items.json", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var one sources.RequestDescriptor
	if err := json.Unmarshal(raw, &one); err != nil {
		t.Fatal(err)
	}
	if one.Source != "items" || one.Method != "POST" || !one.Vary.Body || one.Limits.TimeoutMs != 2000 ||
		one.Example != "curl -s -X POST -H 'Content-Type: application/json' -d @body.json 'https://api.example.com/v1/items'" {
		t.Fatalf("requests/03-post-items.json = %+v", one)
	}
}

// TestGatewayConcurrent: one gateway serves many sessions at once; every
// request is answered as if alone, and audited once.
func TestGatewayConcurrent(t *testing.T) {
	srv := itemsAPI(t, "")
	var mu sync.Mutex
	audited := map[string]int{}
	// 1,000 requests at once on a loaded machine: the time limit only
	// bounds a hang here.
	decl := itemsSource(srv.URL)
	decl.TimeoutMs = time.Minute.Milliseconds()
	g, err := sources.NewGateway(sources.Decls{decl},
		sources.WithLookupEnv(func(string) (string, bool) { return secret, true }),
		sources.WithAudit(func(r sources.AuditRecord) {
			mu.Lock()
			audited[r.Outcome]++
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for i := range 40 {
		wg.Go(func() {
			for j := range 25 {
				url := srv.URL + "/v1/items/42"
				if (i+j)%5 == 0 {
					url = srv.URL + "/v1/admin"
				}
				resp, err := g.Do(context.Background(), sources.HTTPRequest{Method: "GET", URL: url, Session: fmt.Sprint("s-", i)})
				switch {
				case strings.HasSuffix(url, "/admin") && !errors.Is(err, workspace.ErrForbidden):
					errs <- fmt.Errorf("undeclared: %v", err)
				case strings.HasSuffix(url, "/42") && (err != nil || !strings.Contains(string(resp.Body), "[redacted]")):
					errs <- fmt.Errorf("declared: %v %+v", err, resp)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if audited["sent"] != 800 || audited["refused"] != 200 {
		t.Errorf("audited %v, want 800 sent and 200 refused", audited)
	}
}
