package httpapi_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

const (
	acmeToken    = "acme-token"
	boltToken    = "bolt-token"
	scraperToken = "metrics-token"
)

type env struct {
	t   *testing.T
	url string
	m   *runner.Manager
	srv *httpapi.Server
}

type config struct {
	runner  []runner.Option
	api     []httpapi.Option
	acmeCap int
	backend backend.Backend // default: local.Backend in a temporary directory
}

// start serves a manager over the local backend (so bash runs) for two
// tenants, acme and bolt.
func start(t *testing.T, c config) *env {
	t.Helper()
	metrics := httpapi.NewMetrics()
	cfg := tools.DefaultConfig()
	cfg.ProgressMs = 10
	opts := append([]runner.Option{runner.WithTools(cfg), runner.WithObserver(metrics.Observe)}, c.runner...)
	if c.backend == nil {
		c.backend = &local.Backend{Dir: t.TempDir()}
	}
	m, err := runner.New(context.Background(), c.backend, opts...)
	if err != nil {
		t.Fatal(err)
	}
	tenants := []httpapi.Tenant{
		{Name: "acme", Tokens: []string{httpapi.HashToken(acmeToken)}, MaxSessions: c.acmeCap},
		{Name: "bolt", Tokens: []string{httpapi.HashToken("old"), httpapi.HashToken(boltToken)}},
	}
	srv, err := httpapi.New(m, append([]httpapi.Option{httpapi.WithTenants(tenants), httpapi.WithMetrics(metrics), httpapi.WithMetricsTokens(httpapi.HashToken(scraperToken))}, c.api...)...)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		m.Shutdown(context.Background())
	})
	return &env{t: t, url: ts.URL, m: m, srv: srv}
}

// do sends a request and returns the status and body.
func (e *env) do(token, method, path string, body io.Reader, header ...string) (int, []byte, http.Header) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return res.StatusCode, data, res.Header
}

func (e *env) json(token, method, path string, in any, want int, out any) {
	e.t.Helper()
	var body io.Reader
	if in != nil {
		data, _ := json.Marshal(in)
		body = bytes.NewReader(data)
	}
	status, data, _ := e.do(token, method, path, body, "Content-Type", "application/json")
	if status != want {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, path, status, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			e.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
}

func (e *env) create(token string, st runner.Settings) runner.Info {
	e.t.Helper()
	var info runner.Info
	e.json(token, "POST", "/v1/sessions", st, http.StatusCreated, &info)
	return info
}

type result struct {
	Content []struct {
		Type, Text string
	}
	StructuredContent map[string]any
	IsError           bool
}

func (e *env) call(token, id, tool string, args any) result {
	e.t.Helper()
	var r result
	e.json(token, "POST", "/v1/sessions/"+id+"/tools/"+tool, map[string]any{"arguments": args}, http.StatusOK, &r)
	return r
}

var writer = runner.Settings{Grants: []string{"fs.write", "shell.exec"}, Always: []string{"read", "edit", "shell"}}

func TestAuth(t *testing.T) {
	e := start(t, config{})
	for _, tc := range []struct{ name, header string }{
		{"no token", ""},
		{"bad token", "Bearer nope"},
		{"other scheme", "Basic " + acmeToken},
		{"a hash is not a token", "Bearer " + httpapi.HashToken(acmeToken)},
	} {
		req, _ := http.NewRequest("GET", e.url+"/v1/sessions", nil)
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: status %d, WWW-Authenticate %q", tc.name, res.StatusCode, res.Header.Get("WWW-Authenticate"))
		}
	}
	for _, p := range []string{"/healthz", "/readyz", "/openapi.json"} {
		if status, _, _ := e.do("", "GET", p, nil); status != http.StatusOK {
			t.Errorf("GET %s without a token: %d", p, status)
		}
	}
	// /metrics shows every tenant's activity: only a metrics token reads it.
	for _, tok := range []string{"", acmeToken, boltToken, "nope"} {
		if status, _, _ := e.do(tok, "GET", "/metrics", nil); status != http.StatusUnauthorized {
			t.Errorf("GET /metrics with token %q: %d", tok, status)
		}
	}
	if status, _, _ := e.do(scraperToken, "GET", "/metrics", nil); status != http.StatusOK {
		t.Errorf("GET /metrics with the metrics token: %d", status)
	}
	if status, _, _ := e.do(scraperToken, "GET", "/v1/sessions", nil); status != http.StatusUnauthorized {
		t.Errorf("the metrics token listed sessions: %d", status)
	}
	e.json(boltToken, "GET", "/v1/sessions", nil, http.StatusOK, nil) // either of bolt's tokens
	e.json("old", "GET", "/v1/sessions", nil, http.StatusOK, nil)

	if _, err := httpapi.New(e.m, httpapi.WithTenants([]httpapi.Tenant{{Name: "x", Tokens: []string{"plain-token"}}})); err == nil || strings.Contains(err.Error(), "plain") {
		t.Errorf("a token configured in the clear: %v; want an error that does not show it", err)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	if s.Tenant != "acme" || s.Backend != "local" || !strings.HasPrefix(s.ID, "s-") {
		t.Fatalf("created %+v", s)
	}
	if r := e.call(acmeToken, s.ID, "write", map[string]any{"path": "a.txt", "content": "secret\n"}); r.IsError {
		t.Fatal(r.Content)
	}
	var list struct{ Sessions []runner.Info }
	e.json(acmeToken, "GET", "/v1/sessions", nil, http.StatusOK, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].ID != s.ID {
		t.Fatalf("acme lists %+v", list)
	}
	e.json(boltToken, "GET", "/v1/sessions", nil, http.StatusOK, &list)
	if len(list.Sessions) != 0 {
		t.Fatalf("bolt lists acme's sessions: %+v", list)
	}
	base := "/v1/sessions/" + s.ID
	for _, r := range []struct{ method, path, body string }{
		{"GET", base, ""},
		{"DELETE", base, ""},
		{"GET", base + "/tools", ""},
		{"POST", base + "/tools/read", `{"arguments":{"path":"a.txt"}}`},
		{"GET", base + "/files/a.txt", ""},
		{"PUT", base + "/files/", ""},
	} {
		status, body, _ := e.do(boltToken, r.method, r.path, strings.NewReader(r.body))
		if status != http.StatusNotFound || bytes.Contains(body, []byte("secret")) {
			t.Errorf("bolt %s %s: %d %s", r.method, r.path, status, body)
		}
	}
	var got runner.Info
	e.json(acmeToken, "GET", base, nil, http.StatusOK, &got)
	e.json(acmeToken, "DELETE", base, nil, http.StatusNoContent, nil)
	e.json(acmeToken, "GET", base, nil, http.StatusNotFound, nil)
}

func TestToolCalls(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	var cat struct {
		Tools []tools.Tool
	}
	e.json(acmeToken, "GET", "/v1/sessions/"+s.ID+"/tools", nil, http.StatusOK, &cat)
	var names []string
	for _, tl := range cat.Tools {
		names = append(names, tl.Name)
		if !strings.Contains(string(tl.OutputSchema), `"oneOf"`) {
			t.Errorf("%s: outputSchema %s", tl.Name, tl.OutputSchema)
		}
	}
	if !slices.Equal(names, slices.Concat(tools.AllTools, tools.BackgroundTools, tools.JournalTools, []string{tools.LoadSkill})) {
		t.Fatalf("catalogue %v", names)
	}
	r := e.call(acmeToken, s.ID, "write", map[string]any{"path": "dir/a.txt", "content": "one\ntwo\n"})
	if r.IsError || r.StructuredContent["path"] != "dir/a.txt" || r.StructuredContent["created"] != true {
		t.Fatalf("write: %+v", r)
	}
	r = e.call(acmeToken, s.ID, "read", map[string]any{"path": "dir/a.txt"})
	if r.IsError || r.StructuredContent["content"] != "one\ntwo\n" || r.Content[0].Type != "text" || !strings.Contains(r.Content[0].Text, "one") {
		t.Fatalf("read: %+v", r)
	}
	r = e.call(acmeToken, s.ID, "read", map[string]any{"path": "missing"})
	if !r.IsError || r.StructuredContent["error"] != "NotFound" {
		t.Fatalf("read missing: %+v", r)
	}
	r = e.call(acmeToken, s.ID, "bash", map[string]any{"command": "exit 3"})
	if r.IsError || r.StructuredContent["exitCode"] != float64(3) {
		t.Fatalf("bash exit 3: %+v", r)
	}
	status, body, _ := e.do(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/read", strings.NewReader(`{"arguments":{},"extra":1}`))
	if status != http.StatusBadRequest || !bytes.Contains(body, []byte("InvalidArgument")) {
		t.Fatalf("unknown body field: %d %s", status, body)
	}
}

func TestRefusals(t *testing.T) {
	e := start(t, config{acmeCap: 1, runner: []runner.Option{runner.WithMaxCallsInFlight(1)},
		api: []httpapi.Option{httpapi.WithMaxBodyBytes(1 << 10)}})

	var fail struct{ Error, Message string }
	e.json(acmeToken, "POST", "/v1/sessions", runner.Settings{Privileged: true}, http.StatusForbidden, &fail)
	if fail.Error != "Forbidden" || !strings.Contains(fail.Message, "privileged") {
		t.Fatalf("privileged: %+v", fail)
	}
	e.json(acmeToken, "POST", "/v1/sessions", runner.Settings{Network: "host"}, http.StatusForbidden, &fail)
	if !strings.Contains(fail.Message, "network") {
		t.Fatalf("host network: %+v", fail)
	}
	e.json(acmeToken, "POST", "/v1/sessions", map[string]any{"imagez": "x"}, http.StatusBadRequest, nil)

	s := e.create(acmeToken, writer)
	status, _, h := e.do(acmeToken, "POST", "/v1/sessions", nil)
	if status != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("second session over the cap: %d", status)
	}
	e.create(boltToken, runner.Settings{}) // bolt has no cap

	big := `{"arguments":{"path":"x","content":"` + strings.Repeat("x", 2<<10) + `"}}`
	if status, body, _ := e.do(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/write", strings.NewReader(big)); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("body over the cap: %d %s", status, body)
	}

	// One call in flight at a time: a second is 429 while the first waits.
	root := s.Root
	done := make(chan result, 1)
	go func() {
		done <- e.call(acmeToken, s.ID, "bash", map[string]any{"command": "while [ ! -e go ]; do sleep 0.01; done"})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var info runner.Info
		e.json(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &info)
		if info.CallsInFlight == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	status, body, _ := e.do(acmeToken, "POST", "/v1/sessions/"+s.ID+"/tools/ls", nil)
	if status != http.StatusTooManyRequests || !bytes.Contains(body, []byte("Busy")) {
		t.Fatalf("call over the cap: %d %s", status, body)
	}
	os.WriteFile(filepath.Join(root, "go"), nil, 0o644)
	if r := <-done; r.IsError {
		t.Fatalf("first call: %+v", r)
	}
}

// TestBashStreamsEvents: the command prints, then waits for a file the test
// writes only once it has the command's first output as an event.
func TestBashStreamsEvents(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body := `{"arguments":{"command":"echo ready; while [ ! -e go ]; do sleep 0.01; done; echo done >&2"}}`
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/sessions/"+s.ID+"/tools/bash", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+acmeToken)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := readEvents(res.Body)
	first := <-events
	if first.name != "output" || !strings.Contains(first.data, `"text":"ready\n"`) || !strings.Contains(first.data, `"stream":"stdout"`) {
		t.Fatalf("first event %+v", first)
	}
	if err := os.WriteFile(filepath.Join(s.Root, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var last event
	for ev := range events {
		last = ev
	}
	if last.name != "result" {
		t.Fatalf("last event %+v", last)
	}
	var r result
	if err := json.Unmarshal([]byte(last.data), &r); err != nil {
		t.Fatal(err)
	}
	if r.IsError || r.StructuredContent["output"] != "ready\ndone\n" {
		t.Fatalf("result %+v", r)
	}
}

type event struct{ name, data string }

func readEvents(r io.Reader) <-chan event {
	ch := make(chan event)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		var ev event
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			case line == "":
				ch <- ev
				ev = event{}
			}
		}
	}()
	return ch
}

type entry struct {
	name string
	typ  byte
	body string
	link string
}

func makeTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Linkname: e.link}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)[:h.Size]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readTar(t *testing.T, data []byte) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		out = append(out, entry{h.Name, h.Typeflag, string(body), h.Linkname})
	}
}

func TestTarRoundTrip(t *testing.T) {
	spools := t.TempDir()
	t.Setenv("TMPDIR", spools) // where uploads spool
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	in := makeTar(t,
		entry{name: "src/", typ: tar.TypeDir},
		entry{name: "src/main.go", typ: tar.TypeReg, body: "package main\n"},
		entry{name: "./src/lib/util.go", typ: tar.TypeReg, body: "package lib\n"},
		entry{name: "src/link", typ: tar.TypeSymlink, link: "main.go"},
		entry{name: "README", typ: tar.TypeReg, body: "hi\n"},
	)
	var res struct{ Files, Dirs, Links, Bytes int }
	status, body, _ := e.do(acmeToken, "PUT", "/v1/sessions/"+s.ID+"/files/proj", bytes.NewReader(in), "Content-Type", "application/x-tar")
	if status != http.StatusOK {
		t.Fatalf("upload: %d %s", status, body)
	}
	json.Unmarshal(body, &res)
	if res.Files != 3 || res.Dirs != 1 || res.Links != 1 || res.Bytes != 28 {
		t.Fatalf("upload result %+v", res)
	}
	if r := e.call(acmeToken, s.ID, "read", map[string]any{"path": "proj/src/link"}); r.StructuredContent["content"] != "package main\n" {
		t.Fatalf("read through the uploaded link: %+v", r)
	}
	left, _ := os.ReadDir(spools)
	left = slices.DeleteFunc(left, func(e os.DirEntry) bool {
		// The session's journal store, and its first tree (for its diff).
		return strings.HasPrefix(e.Name(), "sandboxd-journal-") || strings.HasPrefix(e.Name(), "sandboxd-delivery-")
	})
	if len(left) != 0 {
		t.Fatalf("the upload left %v in its spool directory", left)
	}
	if r := e.call(acmeToken, s.ID, "read", map[string]any{"path": "proj/README"}); r.StructuredContent["content"] != "hi\n" {
		t.Fatalf("read of an uploaded file: %+v", r)
	}

	status, body, h := e.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/files/proj", nil)
	if status != http.StatusOK || h.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("download: %d %s", status, body)
	}
	want := []entry{
		{"README", tar.TypeReg, "hi\n", ""},
		{"src/", tar.TypeDir, "", ""},
		{"src/lib/", tar.TypeDir, "", ""},
		{"src/lib/util.go", tar.TypeReg, "package lib\n", ""},
		{"src/link", tar.TypeSymlink, "", "main.go"},
		{"src/main.go", tar.TypeReg, "package main\n", ""},
	}
	if got := readTar(t, body); !slices.Equal(got, want) {
		t.Fatalf("downloaded\n%v\nwant\n%v", got, want)
	}
	status, body, _ = e.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/files/proj/src/main.go", nil)
	if got := readTar(t, body); status != http.StatusOK || !slices.Equal(got, []entry{{"main.go", tar.TypeReg, "package main\n", ""}}) {
		t.Fatalf("download of a file: %d %v", status, got)
	}
	if status, _, _ := e.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/files/nope", nil); status != http.StatusNotFound {
		t.Fatalf("download of a missing path: %d", status)
	}
	if status, _, _ := e.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/files/../x", nil); status == http.StatusOK {
		t.Fatal("download of ../x succeeded")
	}
}

func TestMaliciousTarsWriteNothing(t *testing.T) {
	e := start(t, config{api: []httpapi.Option{httpapi.WithMaxTransferBytes(64 << 10)}})
	s := e.create(acmeToken, writer)
	outside := t.TempDir()
	// The workspace already has a link that leads out.
	if err := os.Symlink(outside, filepath.Join(s.Root, "escape")); err != nil {
		t.Fatal(err)
	}
	benign := entry{name: "first.txt", typ: tar.TypeReg, body: "written first\n"}
	for _, tc := range []struct {
		name    string
		entries []entry
		status  int
		kind    string
	}{
		{"absolute name", []entry{{name: "/etc/passwd", typ: tar.TypeReg, body: "x"}}, 400, "OutsideWorkspace"},
		{"dot dot", []entry{{name: "a/../../x", typ: tar.TypeReg, body: "x"}}, 400, "OutsideWorkspace"},
		{"absolute link out", []entry{{name: "l", typ: tar.TypeSymlink, link: "/etc"}}, 400, "OutsideWorkspace"},
		{"relative link out", []entry{{name: "d/l", typ: tar.TypeSymlink, link: "../../../x"}}, 400, "OutsideWorkspace"},
		{"write through a link of the archive", []entry{
			{name: "l", typ: tar.TypeSymlink, link: "sub"},
			{name: "l/x", typ: tar.TypeReg, body: "x"}}, 400, "OutsideWorkspace"},
		{"write through a link that leads out", []entry{{name: "escape/x", typ: tar.TypeReg, body: "x"}}, 400, "OutsideWorkspace"},
		{"char device", []entry{{name: "dev", typ: tar.TypeChar}}, 400, "NotAFile"},
		{"fifo", []entry{{name: "fifo", typ: tar.TypeFifo}}, 400, "NotAFile"},
		{"hard link", []entry{{name: "h", typ: tar.TypeLink, link: "first.txt"}}, 400, "InvalidArgument"},
		{"sandboxd's own dir", []entry{{name: ".sandboxd/x", typ: tar.TypeReg, body: "x"}}, 400, "Protected"},
		{"file over the cap", []entry{{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 40<<10)}, {name: "big2", typ: tar.TypeReg, body: strings.Repeat("x", 30<<10)}}, 413, "TooLarge"},
		{"stream over the cap", []entry{{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 100<<10)}}, 413, "TooLarge"},
		{"not a tar", nil, 400, "InvalidArgument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte("this is not a tar stream, but it is long enough to hold a header block or so…" + strings.Repeat(".", 600))
			if tc.entries != nil {
				data = makeTar(t, append([]entry{benign}, tc.entries...)...)
			}
			status, body, _ := e.do(acmeToken, "PUT", "/v1/sessions/"+s.ID+"/files/", bytes.NewReader(data))
			var fail struct{ Error, Message string }
			json.Unmarshal(body, &fail)
			if status != tc.status || fail.Error != tc.kind {
				t.Fatalf("status %d %s, want %d %s", status, body, tc.status, tc.kind)
			}
			left, _ := os.ReadDir(s.Root)
			if len(left) != 1 || left[0].Name() != "escape" {
				t.Fatalf("the workspace holds %v after a refused upload", left)
			}
			if out, _ := os.ReadDir(outside); len(out) != 0 {
				t.Fatalf("written outside: %v", out)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	e.call(acmeToken, s.ID, "write", map[string]any{"path": "a", "content": "x"})
	e.call(acmeToken, s.ID, "read", map[string]any{"path": "nope"})
	e.call(acmeToken, s.ID, "no-such-tool", nil)
	_, body, _ := e.do(scraperToken, "GET", "/metrics", nil)
	text := string(body)
	for _, want := range []string{
		"sandboxd_sessions 1\n",
		`sandboxd_tool_calls_total{tool="write",outcome="ok"} 1` + "\n",
		`sandboxd_tool_calls_total{tool="read",outcome="error"} 1` + "\n",
		`sandboxd_tool_calls_total{tool="other",outcome="error"} 1` + "\n",
		`sandboxd_tool_call_duration_seconds_bucket{tool="write",le="+Inf"} 1` + "\n",
		`sandboxd_tool_call_duration_seconds_count{tool="read"} 1` + "\n",
		"# TYPE sandboxd_tool_call_duration_seconds histogram\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "acme") || strings.Contains(text, s.ID) {
		t.Error("metrics name a tenant or a session")
	}
}

// bearer adds a token to every request of an HTTP client.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func TestMCP(t *testing.T) {
	e := start(t, config{})
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   e.url + "/mcp?grant=fs.write&always=read,edit",
		HTTPClient: &http.Client{Transport: bearer{acmeToken}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "write", Arguments: map[string]any{"path": "m.txt", "content": "over mcp\n"}})
	if err != nil || res.IsError {
		t.Fatalf("write over MCP: %v %+v", err, res)
	}
	var list struct{ Sessions []runner.Info }
	e.json(acmeToken, "GET", "/v1/sessions", nil, http.StatusOK, &list)
	if len(list.Sessions) != 1 {
		t.Fatalf("sessions after an MCP connect: %+v", list)
	}
	id := list.Sessions[0].ID
	if r := e.call(acmeToken, id, "read", map[string]any{"path": "m.txt"}); r.StructuredContent["content"] != "over mcp\n" {
		t.Fatalf("the MCP session's file over HTTP: %+v", r)
	}

	// Another tenant cannot use the MCP session's ID.
	mcpID := cs.ID()
	status, _, _ := e.do(boltToken, "POST", "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`),
		"Mcp-Session-Id", mcpID, "Content-Type", "application/json", "Accept", "application/json, text/event-stream")
	if status != http.StatusNotFound {
		t.Fatalf("bolt with acme's MCP session: %d", status)
	}
	// No token: 401.
	if status, _, _ := e.do("", "POST", "/mcp", strings.NewReader(`{}`)); status != http.StatusUnauthorized {
		t.Fatalf("MCP without a token: %d", status)
	}

	// Attach a second MCP session to the existing session; closing it
	// leaves the session.
	cs2, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   e.url + "/mcp?session=" + id,
		HTTPClient: &http.Client{Transport: bearer{acmeToken}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err = cs2.CallTool(ctx, &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"path": "m.txt"}})
	if err != nil || res.IsError {
		t.Fatalf("read over the attached session: %v %+v", err, res)
	}
	cs2.Close()

	// Closing the MCP session that started it ends the session.
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.json(acmeToken, "GET", "/v1/sessions", nil, http.StatusOK, &list)
		if len(list.Sessions) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session left after its MCP session closed: %+v", list)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProviderRun: a provider run holds the session's changes until its
// end, which commits them as one or puts the workspace back.
func TestProviderRun(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	run := "/v1/sessions/" + s.ID + "/provider-run"
	e.json(acmeToken, "POST", run, map[string]any{"message": "agent run 1"}, http.StatusNoContent, nil)
	var r map[string]any
	e.json(acmeToken, "POST", run, nil, http.StatusBadRequest, &r)
	if r["error"] != "Forbidden" || !strings.Contains(r["message"].(string), "already active") {
		t.Fatalf("a second run: %v", r)
	}
	for _, p := range []string{"a.txt", "b.txt"} {
		if res := e.call(acmeToken, s.ID, "write", map[string]any{"path": p, "content": p}); res.IsError || res.StructuredContent["commit"] != nil {
			t.Fatalf("write in the run: %+v", res)
		}
	}
	e.json(acmeToken, "POST", run+"/end", map[string]any{}, http.StatusBadRequest, nil)
	var out httpapi.ProviderRunResult
	e.json(acmeToken, "POST", run+"/end", map[string]any{"commit": true}, http.StatusOK, &out)
	if !out.Committed || out.Commit == nil || out.Commit.Message != "agent run 1" || !slices.Equal(out.Commit.Paths, []string{"a.txt", "b.txt"}) {
		t.Fatalf("end with commit: %+v", out)
	}
	e.json(acmeToken, "POST", run+"/end", map[string]any{"commit": true}, http.StatusBadRequest, nil)

	e.json(acmeToken, "POST", run, nil, http.StatusNoContent, nil)
	e.call(acmeToken, s.ID, "write", map[string]any{"path": "a.txt", "content": "changed"})
	e.json(acmeToken, "POST", run+"/end", map[string]any{"commit": false}, http.StatusOK, &out)
	if !out.Restored || out.Committed {
		t.Fatalf("end without commit: %+v", out)
	}
	if res := e.call(acmeToken, s.ID, "read", map[string]any{"path": "a.txt"}); res.StructuredContent["content"] != "a.txt" {
		t.Fatalf("a.txt after the rollback: %+v", res)
	}
	e.json(boltToken, "POST", run, nil, http.StatusNotFound, nil)
}

// logLines is a slog handler's output that a test can wait on.
type logLines struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	more chan struct{}
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case l.more <- struct{}{}:
	default:
	}
	return l.buf.Write(p)
}

// wait waits until a line holding s is logged, or fails after within.
func (l *logLines) wait(t *testing.T, s string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		l.mu.Lock()
		found := strings.Contains(l.buf.String(), s)
		l.mu.Unlock()
		if found {
			return
		}
		select {
		case <-l.more:
		case <-deadline:
			t.Fatalf("%q not logged within %v:\n%s", s, within, l.buf.String())
		}
	}
}

// A client that stops reading its event stream has its call cut after the
// write timeout; the command is slowed meanwhile, not buffered.
func TestEventStreamStalled(t *testing.T) {
	logs := &logLines{more: make(chan struct{}, 1)}
	e := start(t, config{api: []httpapi.Option{httpapi.WithWriteTimeout(time.Second), httpapi.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}})
	s := e.create(acmeToken, writer)
	req, _ := http.NewRequest("POST", e.url+"/v1/sessions/"+s.ID+"/tools/bash", strings.NewReader(`{"arguments":{"command":"yes"}}`))
	req.Header.Set("Authorization", "Bearer "+acmeToken)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	logs.wait(t, "call cut: its client stopped reading", 60*time.Second)
	if _, err := io.Copy(io.Discard, res.Body); err == nil {
		t.Error("the cut stream ended as if whole")
	}
}

// A client that stops reading a download has it cut after the write
// timeout, logged as a client that stopped reading, not as a broken
// download.
func TestDownloadStalled(t *testing.T) {
	logs := &logLines{more: make(chan struct{}, 1)}
	e := start(t, config{api: []httpapi.Option{httpapi.WithWriteTimeout(time.Second), httpapi.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}})
	s := e.create(acmeToken, writer)
	if res := e.call(acmeToken, s.ID, "bash", map[string]any{"command": "head -c 33554432 /dev/zero > big"}); res.IsError {
		t.Fatalf("making the file: %+v", res)
	}
	req, _ := http.NewRequest("GET", e.url+"/v1/sessions/"+s.ID+"/files/big", nil)
	req.Header.Set("Authorization", "Bearer "+acmeToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	logs.wait(t, `msg="call cut: its client stopped reading" tenant=acme session=`+s.ID+" tool=download", 60*time.Second)
	if _, err := io.Copy(io.Discard, res.Body); err == nil {
		t.Error("the cut download ended as if whole")
	}
}
