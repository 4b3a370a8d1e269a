package client_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

const (
	acmeToken = "acme-token"
	boltToken = "bolt-token"
)

// daemon is an httpapi server over the memory backend, in-process.
type daemon struct {
	url string
	srv *httpapi.Server
	m   *runner.Manager
}

type daemonConfig struct {
	runner []runner.Option
	api    []httpapi.Option
}

func startDaemon(t *testing.T, c daemonConfig) *daemon {
	t.Helper()
	m, err := runner.New(context.Background(), memory.Backend{TempDir: t.TempDir()},
		append([]runner.Option{runner.WithTools(tools.DefaultConfig())}, c.runner...)...)
	if err != nil {
		t.Fatal(err)
	}
	tenants := []httpapi.Tenant{
		{Name: "acme", Tokens: []string{httpapi.HashToken(acmeToken)}},
		{Name: "bolt", Tokens: []string{httpapi.HashToken(boltToken)}},
	}
	srv, err := httpapi.New(m, append([]httpapi.Option{httpapi.WithTenants(tenants)}, c.api...)...)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		m.Shutdown(context.Background())
	})
	return &daemon{url: ts.URL, srv: srv, m: m}
}

func (d *daemon) client(t *testing.T, token string) *client.Client {
	t.Helper()
	c, err := client.New(client.WithBaseURL(d.url), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var writer = runner.Settings{Grants: []string{"fs.write", "shell.exec"}, Always: []string{"read", "edit", "shell"}}

func create(t *testing.T, c *client.Client, st runner.Settings) string {
	t.Helper()
	res, err := c.SessionCreate(context.Background(), client.SessionCreateOptions{Settings: st})
	if err != nil {
		t.Fatal(err)
	}
	return res.Session.ID
}

func call(t *testing.T, c *client.Client, id, tool string, args any) client.ToolCallResult {
	t.Helper()
	res, err := c.ToolCall(context.Background(), id, client.ToolCallOptions{Tool: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func TestNewOptions(t *testing.T) {
	t.Setenv("SANDBOXD_URL", "http://example.test:9/base/")
	t.Setenv("SANDBOXD_TOKEN", "from-env")
	c, err := client.New(client.FromEnv)
	if err != nil || c.BaseURL() != "http://example.test:9/base" {
		t.Fatalf("FromEnv: %v, %v", c, err)
	}
	if c, err := client.New(); err != nil || c.BaseURL() != client.DefaultURL {
		t.Fatalf("default: %v, %v", c, err)
	}
	for _, bad := range []client.Opt{client.WithBaseURL("127.0.0.1:7878"), client.WithBaseURL("ftp://x"), client.WithHTTPClient(nil)} {
		if _, err := client.New(bad); err == nil {
			t.Errorf("New accepted a bad option")
		}
	}
	// The http.Client given is the one used, and the token goes with
	// every request.
	var got string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("Authorization") + " " + r.URL.EscapedPath()
		w.Write([]byte(`{"sessions":[]}`))
	}))
	defer ts.Close()
	c, err = client.New(client.WithBaseURL(ts.URL+"/prefix"), client.WithToken("tok"), client.WithHTTPClient(ts.Client()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SessionList(context.Background(), client.SessionListOptions{}); err != nil {
		t.Fatal(err)
	}
	if got != "Bearer tok /prefix/v1/sessions" {
		t.Fatalf("request: %q", got)
	}
}

func TestSessions(t *testing.T) {
	d := startDaemon(t, daemonConfig{})
	ctx := context.Background()
	acme, bolt := d.client(t, acmeToken), d.client(t, boltToken)
	id := create(t, acme, writer)
	info, err := acme.SessionInspect(ctx, id, client.SessionInspectOptions{})
	if err != nil || info.Session.ID != id || info.Session.Tenant != "acme" || info.Session.Backend != "memory" || !slices.Equal(info.Session.Settings.Grants, writer.Grants) {
		t.Fatalf("inspect: %+v, %v", info, err)
	}
	list, err := acme.SessionList(ctx, client.SessionListOptions{})
	if err != nil || len(list.Sessions) != 1 || list.Sessions[0].ID != id {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if list, err := bolt.SessionList(ctx, client.SessionListOptions{}); err != nil || len(list.Sessions) != 0 {
		t.Fatalf("another tenant's list: %+v, %v", list, err)
	}
	if _, err := bolt.SessionInspect(ctx, id, client.SessionInspectOptions{}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("another tenant's session: %v", err)
	}
	if _, err := acme.SessionRemove(ctx, id, client.SessionRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = acme.SessionInspect(ctx, id, client.SessionInspectOptions{})
	var apiErr *client.Error
	if !errors.Is(err, client.ErrNotFound) || !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Kind != "NotFound" {
		t.Fatalf("a removed session: %#v", err)
	}
	if _, err := acme.SessionRemove(ctx, id, client.SessionRemoveOptions{}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("removed twice: %v", err)
	}
	if _, err := acme.Ping(ctx, client.PingOptions{}); err != nil {
		t.Fatalf("ping: %v", err)
	}
	d.srv.Drain()
	if _, err := acme.Ping(ctx, client.PingOptions{}); !errors.Is(err, client.ErrShuttingDown) {
		t.Fatalf("ping a draining daemon: %v", err)
	}
}

func TestToolCalls(t *testing.T) {
	d := startDaemon(t, daemonConfig{})
	ctx := context.Background()
	c := d.client(t, acmeToken)
	id := create(t, c, writer)
	cat, err := c.ToolList(ctx, id, client.ToolListOptions{})
	if err != nil || !slices.ContainsFunc(cat.Tools, func(tl tools.Tool) bool { return tl.Name == "bash" && tl.Active }) || len(cat.Skills) == 0 {
		t.Fatalf("tools: %+v, %v", cat, err)
	}
	if r := call(t, c, id, "write", map[string]any{"path": "a.txt", "content": "one\n"}); r.IsError {
		t.Fatalf("write: %+v", r)
	}
	r := call(t, c, id, "read", map[string]string{"path": "a.txt"})
	if r.IsError || !strings.Contains(r.Content[0].Text, "one") {
		t.Fatalf("read: %+v", r)
	}
	// A tool's failure is a result, not an error.
	if r := call(t, c, id, "read", []byte(`{"path":"missing"}`)); !r.IsError {
		t.Fatalf("read missing: %+v", r)
	}
	if r := call(t, c, id, "read", nil); !r.IsError {
		t.Fatalf("read without arguments: %+v", r)
	}
	// bash's output streams to Output as it is written.
	var out bytes.Buffer
	res, err := c.ToolCall(ctx, id, client.ToolCallOptions{Tool: "bash", Arguments: map[string]any{"command": "echo streamed; exit 3"}, Output: &out})
	if err != nil || res.IsError || out.String() != "streamed\n" || res.StructuredContent.(map[string]any)["exitCode"] != float64(3) {
		t.Fatalf("bash streamed: %q %+v %v", out.String(), res, err)
	}
	if _, err := c.ToolCall(ctx, id, client.ToolCallOptions{Tool: "read", Arguments: func() {}}); err == nil {
		t.Fatal("arguments that do not marshal were sent")
	}
}

// startedWriter signals the first write it takes.
type startedWriter struct {
	once    sync.Once
	started chan struct{}
}

func (w *startedWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.started) })
	return len(p), nil
}

// holdCall starts a bash call that runs until the session ends and returns
// once its output shows it is running, with the channel of its error.
func holdCall(t *testing.T, c *client.Client, id string) <-chan error {
	t.Helper()
	w := &startedWriter{started: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := c.ToolCall(context.Background(), id, client.ToolCallOptions{Tool: "bash",
			Arguments: map[string]any{"command": "echo running; sleep 600", "timeout": 600}, Output: w})
		done <- err
	}()
	select {
	case <-w.started:
	case err := <-done:
		t.Fatalf("the held call ended: %v", err)
	}
	return done
}

func tarOf(t *testing.T, files map[string]string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), Typeflag: tar.TypeReg}
		if strings.HasSuffix(name, "/") {
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, files[name])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// Every error kind of the API comes back as an *Error that errors.Is
// matches to its sentinel.
func TestErrorKinds(t *testing.T) {
	d := startDaemon(t, daemonConfig{
		runner: []runner.Option{runner.WithMaxSessions(2), runner.WithMaxCallsInFlight(1), runner.WithGrants("fs.write", "shell.exec")},
		api:    []httpapi.Option{httpapi.WithMaxBodyBytes(1 << 20), httpapi.WithMemoryBudget(6 << 20), httpapi.WithMaxTransferBytes(5 << 20)},
	})
	ctx := context.Background()
	c := d.client(t, acmeToken)
	id := create(t, c, writer)
	held := create(t, c, writer)
	running := holdCall(t, c, held)

	for _, tc := range []struct {
		name   string
		do     func() error
		want   error
		status int
	}{
		{"no token", func() error {
			_, err := d.client(t, "").SessionList(ctx, client.SessionListOptions{})
			return err
		}, client.ErrUnauthorized, 401},
		{"a bad token", func() error {
			_, err := d.client(t, "nope").SessionList(ctx, client.SessionListOptions{})
			return err
		}, client.ErrUnauthorized, 401},
		{"no such session", func() error {
			_, err := c.ToolCall(ctx, "s-nope", client.ToolCallOptions{Tool: "read", Arguments: map[string]string{"path": "a"}})
			return err
		}, client.ErrNotFound, 404},
		{"no such file", func() error {
			_, err := c.CopyFromSession(ctx, id, client.CopyFromSessionOptions{Path: "missing.txt"})
			return err
		}, fs.ErrNotExist, 404},
		{"a grant beyond the operator's", func() error {
			_, err := c.SessionCreate(ctx, client.SessionCreateOptions{Settings: runner.Settings{Privileged: true}})
			return err
		}, client.ErrForbidden, 403},
		{"a bad setting", func() error {
			_, err := c.SessionCreate(ctx, client.SessionCreateOptions{Settings: runner.Settings{Scope: scopeOf("[")}})
			return err
		}, client.ErrInvalidArgument, 400},
		{"the tenant's cap", func() error {
			_, err := c.SessionCreate(ctx, client.SessionCreateOptions{Settings: writer})
			return err
		}, client.ErrTooManySessions, 429},
		{"the session's calls in flight", func() error {
			_, err := c.ToolCall(ctx, held, client.ToolCallOptions{Tool: "read", Arguments: map[string]string{"path": "a"}})
			return err
		}, client.ErrBusy, 429},
		{"over the transfer cap", func() error {
			_, err := c.CopyToSession(ctx, id, client.CopyToSessionOptions{Content: tarOf(t, map[string]string{"big": strings.Repeat("x", 6<<20)})})
			return err
		}, client.ErrTooLarge, 413},
		{"over the memory budget", func() error {
			_, err := c.CopyToSession(ctx, id, client.CopyToSessionOptions{Content: tarOf(t, map[string]string{"big": strings.Repeat("x", 4<<20)})})
			return err
		}, client.ErrOverloaded, 503},
		{"a journal commit there is not", func() error {
			since := 7
			_, err := c.SessionDiff(ctx, id, client.SessionDiffOptions{Since: &since})
			return err
		}, client.ErrNotFound, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			var apiErr *client.Error
			if !errors.Is(err, tc.want) || !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status {
				t.Fatalf("got %#v (%v), want %v, status %d", err, err, tc.want, tc.status)
			}
			if (tc.status == 429 || tc.status == 503) && apiErr.RetryAfter <= 0 {
				t.Errorf("no Retry-After: %+v", apiErr)
			}
		})
	}

	// A call cut by its session's end is ErrSessionEnded.
	if _, err := c.SessionRemove(ctx, held, client.SessionRemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-running; !errors.Is(err, client.ErrSessionEnded) {
		t.Fatalf("a call whose session ended: %#v", err)
	}
}

// An answer that is not the daemon's JSON (a proxy's) is classified by its
// status.
func TestErrorWithoutKind(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "<html>bad gateway</html>", http.StatusNotFound)
	}))
	defer ts.Close()
	c, _ := client.New(client.WithBaseURL(ts.URL))
	_, err := c.SessionInspect(context.Background(), "s-1", client.SessionInspectOptions{})
	var apiErr *client.Error
	if !errors.Is(err, client.ErrNotFound) || !errors.As(err, &apiErr) || apiErr.Kind != "" || !strings.Contains(apiErr.Message, "bad gateway") {
		t.Fatalf("%#v", err)
	}
	// A kind the client does not know matches no sentinel.
	unknown := &client.Error{StatusCode: 418, Kind: "Teapot", Message: "short and stout"}
	if errors.Is(unknown, client.ErrNotFound) || errors.Unwrap(unknown) != nil || unknown.Error() != "short and stout (418 Teapot)" {
		t.Fatalf("%v", unknown)
	}
	if !errors.Is(&client.Error{Kind: "NotAFile"}, workspace.ErrNotAFile) {
		t.Fatal("a workspace kind does not match its workspace.Kind")
	}
}

func TestFiles(t *testing.T) {
	d := startDaemon(t, daemonConfig{})
	ctx := context.Background()
	c := d.client(t, acmeToken)
	id := create(t, c, writer)
	up, err := c.CopyToSession(ctx, id, client.CopyToSessionOptions{Path: "in dir", Content: tarOf(t, map[string]string{"sub/": "", "sub/a b.txt": "spaced\n", "top.txt": "top\n"})})
	if err != nil || up.Files != 2 || up.Dirs != 1 {
		t.Fatalf("upload: %+v, %v", up, err)
	}
	if r := call(t, c, id, "read", map[string]string{"path": "in dir/sub/a b.txt"}); r.IsError || !strings.Contains(r.Content[0].Text, "spaced") {
		t.Fatalf("read the upload: %+v", r)
	}
	got := func(p string) map[string]string {
		t.Helper()
		down, err := c.CopyFromSession(ctx, id, client.CopyFromSessionOptions{Path: p})
		if err != nil {
			t.Fatal(err)
		}
		defer down.Content.Close()
		files := map[string]string{}
		tr := tar.NewReader(down.Content)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				return files
			}
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(tr)
			files[hdr.Name] = string(data)
		}
	}
	if files := got("in dir"); files["sub/a b.txt"] != "spaced\n" || files["top.txt"] != "top\n" || len(files) != 3 {
		t.Fatalf("download of a directory: %v", files)
	}
	if files := got("in dir/sub/a b.txt"); len(files) != 1 || files["a b.txt"] != "spaced\n" {
		t.Fatalf("download of a file: %v", files)
	}
	if files := got(""); files["in dir/top.txt"] != "top\n" {
		t.Fatalf("download of the root: %v", files)
	}
}

func TestDiffAndProviderRun(t *testing.T) {
	d := startDaemon(t, daemonConfig{})
	ctx := context.Background()
	c := d.client(t, acmeToken)
	id := create(t, c, writer)
	diff := func(since *int) string {
		t.Helper()
		res, err := c.SessionDiff(ctx, id, client.SessionDiffOptions{Since: since})
		if err != nil {
			t.Fatal(err)
		}
		defer res.Patch.Close()
		data, err := io.ReadAll(res.Patch)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	if p := diff(nil); p != "" {
		t.Fatalf("diff of a new session: %q", p)
	}
	call(t, c, id, "write", map[string]any{"path": "a.txt", "content": "one\n"})
	if _, err := c.ProviderRunBegin(ctx, id, client.ProviderRunBeginOptions{Message: "the run"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ProviderRunBegin(ctx, id, client.ProviderRunBeginOptions{}); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("a second run: %v", err)
	}
	call(t, c, id, "write", map[string]any{"path": "b.txt", "content": "two\n"})
	end, err := c.ProviderRunEnd(ctx, id, client.ProviderRunEndOptions{Commit: true})
	if err != nil || !end.Committed || end.Commit == nil || end.Commit.Message != "the run" || end.Commit.ID != 2 {
		t.Fatalf("end: %+v, %v", end, err)
	}
	all := diff(nil)
	if !strings.Contains(all, "diff --git a/a.txt b/a.txt\nnew file mode 100644\n") || !strings.Contains(all, "+two\n") {
		t.Fatalf("diff since the start:\n%s", all)
	}
	one := 1
	if p := diff(&one); strings.Contains(p, "a.txt") || !strings.Contains(p, "b/b.txt") {
		t.Fatalf("diff since commit 1:\n%s", p)
	}

	// A new baseline: the diff is of what changed after it alone.
	if b, err := c.SessionBaseline(ctx, id, client.SessionBaselineOptions{}); err != nil || b.Baseline.Files != 2 {
		t.Fatalf("SessionBaseline: %+v, %v", b, err)
	}
	if p := diff(nil); p != "" {
		t.Fatalf("diff right after a new baseline:\n%s", p)
	}
	up, err := c.CopyToSession(ctx, id, client.CopyToSessionOptions{Content: tarOf(t, map[string]string{"c.txt": "three\n"}), Baseline: true})
	if err != nil || up.Files != 1 || up.Baseline == nil || up.Baseline.Files != 3 {
		t.Fatalf("an upload with a new baseline: %+v, %v", up, err)
	}
	call(t, c, id, "write", map[string]any{"path": "b.txt", "content": "deux\n"})
	if p := diff(nil); !strings.Contains(p, "-two\n+deux\n") || strings.Contains(p, "a.txt") || strings.Contains(p, "c.txt") {
		t.Fatalf("diff since the upload's baseline:\n%s", p)
	}
	if _, err := c.SessionBaseline(ctx, "s-none", client.SessionBaselineOptions{}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("SessionBaseline of no session: %v, want ErrNotFound", err)
	}
}

func scopeOf(glob string) scope.Rules { return scope.Rules{Visible: []string{glob}} }

// TestSentinelsAreTheRunners: an error kind the session host defines has
// one sentinel, runner's, which the client's is; a second definition would
// make errors.Is tell a daemon's answer from the same error of an embedded
// runner.Manager.
func TestSentinelsAreTheRunners(t *testing.T) {
	for _, pair := range []struct {
		name           string
		client, runner error
	}{
		{"SessionEnded", client.ErrSessionEnded, runner.ErrClosed},
		{"TooManySessions", client.ErrTooManySessions, runner.ErrTooManySessions},
		{"Busy", client.ErrBusy, runner.ErrBusy},
		{"ShuttingDown", client.ErrShuttingDown, runner.ErrShuttingDown},
		{"ResultNotKept", client.ErrResultNotKept, runner.ErrResultNotKept},
		{"Interrupted", client.ErrInterrupted, runner.ErrInterrupted},
	} {
		if pair.client != pair.runner {
			t.Errorf("%s: the client's sentinel is not runner's", pair.name)
		}
		if err := (&client.Error{Kind: pair.name}); !errors.Is(err, pair.runner) {
			t.Errorf("an answer of kind %s is not runner's sentinel", pair.name)
		}
	}
}
