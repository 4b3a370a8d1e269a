package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/e2b"
	fspb "github.com/sandboxd/sandboxd/e2b/envdpb/filesystem"
	"github.com/sandboxd/sandboxd/e2b/envdpb/filesystem/filesystemconnect"
	pb "github.com/sandboxd/sandboxd/e2b/envdpb/process"
	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
	"github.com/sandboxd/sandboxd/runner"
)

var keys = map[string]e2b.Tenant{"acme-key": {Name: "acme"}, "bolt-key": {Name: "bolt"}}

type env struct {
	t   *testing.T
	url string
	m   *runner.Manager
}

// start serves E2B's API over a manager on the local backend, whose
// commands run on this host, for the tenants acme and bolt.
func start(t *testing.T, opts ...e2b.Option) *env {
	t.Helper()
	return startOn(t, &local.Backend{Dir: t.TempDir()}, opts...)
}

// startOn is start over the backend b.
func startOn(t *testing.T, b backend.Backend, opts ...e2b.Option) *env {
	t.Helper()
	m, srv := newServer(t, b, opts...)
	return &env{t: t, url: serveHTTP(t, srv), m: m}
}

// newServer is E2B's API over a manager on b, for the tenants acme and
// bolt; the manager is shut down when the test ends.
func newServer(t *testing.T, b backend.Backend, opts ...e2b.Option) (*runner.Manager, *e2b.Server) {
	t.Helper()
	m, err := runner.New(context.Background(), b, runner.WithLifetime(time.Hour, 24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	auth := func(key string) (e2b.Tenant, bool) { tn, ok := keys[key]; return tn, ok }
	srv, err := e2b.New(m, append([]e2b.Option{e2b.WithAuth(auth), e2b.WithTemplates(map[string]e2b.Template{"base": {}})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m, srv
}

// serveHTTP serves h until the test ends and returns its URL.
func serveHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// api sends a control-plane request and decodes its JSON answer into out.
func (e *env) api(key, method, path, body string, out any) int {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			e.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return res.StatusCode
}

// send sends req and answers its status and body.
func send(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(data)
}

type created struct {
	SandboxID       string `json:"sandboxID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	TrafficToken    string `json:"trafficAccessToken"`
	Code            int    `json:"code"`
	Message         string `json:"message"`
}

func (e *env) create(key, body string) created {
	e.t.Helper()
	var c created
	if st := e.api(key, "POST", "/sandboxes", body, &c); st != http.StatusCreated {
		e.t.Fatalf("create: %d %s", st, c.Message)
	}
	return c
}

// headers adds a sandbox's envd headers to every request.
type headers struct {
	id, token string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if h.id != "" {
		r.Header.Set(e2b.SandboxHeader, h.id)
	}
	if h.token != "" {
		r.Header.Set("X-Access-Token", h.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (e *env) envd(c created) *http.Client {
	return &http.Client{Transport: headers{c.SandboxID, c.EnvdAccessToken}}
}

// run starts a command and collects its stream.
func run(t *testing.T, pc processconnect.ProcessClient, cmd string, stdin bool) (pid uint32, out, errOut string, end *pb.ProcessEvent_EndEvent, err error) {
	t.Helper()
	st, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}}, Stdin: &stdin}))
	if err != nil {
		return 0, "", "", nil, err
	}
	defer st.Close()
	for st.Receive() {
		switch ev := st.Msg().Event.Event.(type) {
		case *pb.ProcessEvent_Start:
			pid = ev.Start.Pid
		case *pb.ProcessEvent_Data:
			out += string(ev.Data.GetStdout())
			errOut += string(ev.Data.GetStderr())
		case *pb.ProcessEvent_End:
			end = ev.End
		}
	}
	return pid, out, errOut, end, st.Err()
}

// TestCommandsAndFiles runs E2B's commonest calls, in both of Connect's
// codecs: create, a command's output and exit, its stdin, a signal, the
// files a command and /files see alike, and kill.
func TestCommandsAndFiles(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base","timeout":300,"envVars":{"GREETING":"hello"}}`)
	if c.EnvdVersion != e2b.EnvdVersion || c.EnvdAccessToken != "" {
		t.Fatalf("create: %+v", c)
	}
	for _, codec := range []struct {
		name string
		opts []connect.ClientOption
	}{{"proto", nil}, {"json", []connect.ClientOption{connect.WithProtoJSON()}}} {
		pc := processconnect.NewProcessClient(e.envd(c), e.url, codec.opts...)
		t.Run(codec.name, func(t *testing.T) {
			_, out, errOut, end, err := run(t, pc, `echo "$GREETING"; echo oops >&2; exit 3`, false)
			if err != nil || out != "hello\n" || errOut != "oops\n" || end.GetExitCode() != 3 || !end.GetExited() {
				t.Fatalf("run: out %q err %q end %v: %v", out, errOut, end, err)
			}
		})
	}
	pc := processconnect.NewProcessClient(e.envd(c), e.url)

	// stdin, then the process killed by a signal.
	st, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: ptr(true), Tag: ptr("cat")}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	pid := st.Msg().Event.GetStart().GetPid()
	if _, err := pc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "cat"}},
		Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("echoed")}}})); err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || string(st.Msg().Event.GetData().GetStdout()) != "echoed" {
		t.Fatalf("cat's output: %v %v", st.Msg(), st.Err())
	}
	list, err := pc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil || len(list.Msg.Processes) != 1 || list.Msg.Processes[0].Pid != pid {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := pc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
		if end := st.Msg().Event.GetEnd(); end != nil && (end.Exited || end.ExitCode != -1) {
			t.Fatalf("killed: %v", end)
		}
	}
	_, err = pc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to no process: %v", err)
	}

	// Files: written by /files, seen by a command and the Filesystem service.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "dir/a.txt")
	fw.Write([]byte("contents"))
	mw.Close()
	req, _ := http.NewRequest("POST", e.url+"/files?path=dir/a.txt", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	res, err := e.envd(c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(data), `"path":"/home/user/dir/a.txt"`) {
		t.Fatalf("upload: %d %s", res.StatusCode, data)
	}
	if _, out, _, _, err := run(t, pc, "cat dir/a.txt", false); err != nil || out != "contents" {
		t.Fatalf("cat: %q %v", out, err)
	}
	res, err = e.envd(c).Get(e.url + "/files?path=/home/user/dir/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(data) != "contents" {
		t.Fatalf("download: %d %q", res.StatusCode, data)
	}
	fc := filesystemconnect.NewFilesystemClient(e.envd(c), e.url)
	ctx := context.Background()
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "dir/sub/deeper"})); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "dir"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("mkdir of one there: %v", err)
	}
	ls, err := fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "dir", Depth: 2}))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, en := range ls.Msg.Entries {
		paths = append(paths, en.Path)
	}
	if strings.Join(paths, " ") != "/home/user/dir/a.txt /home/user/dir/sub /home/user/dir/sub/deeper" {
		t.Fatalf("list depth 2: %v", paths)
	}
	mv, err := fc.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "dir/a.txt", Destination: "/home/user/b.txt"}))
	if err != nil || mv.Msg.Entry.Path != "/home/user/b.txt" || mv.Msg.Entry.Size != 8 || mv.Msg.Entry.Type != fspb.FileType_FILE_TYPE_FILE {
		t.Fatalf("move: %v %v", mv, err)
	}
	if _, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "dir/a.txt"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat of the moved: %v", err)
	}
	if _, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/etc/passwd"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("stat outside the workspace: %v", err)
	}
	if _, err := fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "dir"})); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "dir/sub"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat of the removed: %v", err)
	}

	// Kill: the sandbox, its session and its envd are gone.
	if st := e.api("acme-key", "DELETE", "/sandboxes/"+c.SandboxID, "", nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	if st := e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", nil); st != http.StatusNotFound {
		t.Fatalf("get of the killed: %d", st)
	}
	if st := e.api("acme-key", "DELETE", "/sandboxes/"+c.SandboxID, "", nil); st != http.StatusNotFound {
		t.Fatalf("kill of the killed: %d", st)
	}
	if _, err := e.m.Get("acme", c.SandboxID); !errors.Is(err, runner.ErrNotFound) {
		t.Fatalf("the session of the killed: %v", err)
	}
	if _, _, _, _, err := run(t, pc, "true", false); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("envd of the killed: %v", err)
	}
}

// TestTenants: another tenant's sandbox is not there, for the control plane
// and for envd with its access token; a secure sandbox's envd needs its
// token; keys and templates are checked.
func TestTenants(t *testing.T) {
	e := start(t)
	if st := e.api("", "POST", "/sandboxes", `{"templateID":"base"}`, nil); st != http.StatusUnauthorized {
		t.Fatalf("no key: %d", st)
	}
	if st := e.api("nobody", "POST", "/sandboxes", `{"templateID":"base"}`, nil); st != http.StatusUnauthorized {
		t.Fatalf("bad key: %d", st)
	}
	var bad created
	if st := e.api("acme-key", "POST", "/sandboxes", `{"templateID":"nope"}`, &bad); st != http.StatusNotFound || bad.Code != 404 {
		t.Fatalf("unknown template: %d %+v", st, bad)
	}
	if st := e.api("acme-key", "POST", "/sandboxes", `{"templateID":"base","autoPause":true}`, &bad); st != http.StatusNotImplemented || !strings.Contains(bad.Message, "not supported") {
		t.Fatalf("autoPause: %d %+v", st, bad)
	}
	c := e.create("acme-key", `{"templateID":"base","secure":true,"metadata":{"app":"one"}}`)
	if c.EnvdAccessToken == "" {
		t.Fatal("a secure sandbox without an access token")
	}
	for _, path := range []string{"/sandboxes/" + c.SandboxID} {
		if st := e.api("bolt-key", "GET", path, "", nil); st != http.StatusNotFound {
			t.Fatalf("bolt gets acme's sandbox: %d", st)
		}
		if st := e.api("bolt-key", "DELETE", path, "", nil); st != http.StatusNotFound {
			t.Fatalf("bolt kills acme's sandbox: %d", st)
		}
	}
	var listed []map[string]any
	if e.api("bolt-key", "GET", "/v2/sandboxes", "", &listed); len(listed) != 0 {
		t.Fatalf("bolt lists %v", listed)
	}
	if e.api("acme-key", "GET", "/v2/sandboxes?metadata=app%3Done", "", &listed); len(listed) != 1 {
		t.Fatalf("acme lists %v", listed)
	}
	if e.api("acme-key", "GET", "/v2/sandboxes?metadata=app%3Dtwo", "", &listed); len(listed) != 0 {
		t.Fatalf("acme lists by other metadata %v", listed)
	}
	// Pages of one, newest first, as E2B lists them.
	newer := e.create("acme-key", `{"templateID":"base","metadata":{"app":"one"}}`)
	next := ""
	for i, want := range []string{newer.SandboxID, c.SandboxID} {
		req, _ := http.NewRequest("GET", e.url+"/v2/sandboxes?limit=1&metadata=app%3Done&nextToken="+next, nil)
		req.Header.Set("X-API-Key", "acme-key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page []created
		json.NewDecoder(res.Body).Decode(&page)
		res.Body.Close()
		next = res.Header.Get("X-Next-Token")
		if len(page) != 1 || page[0].SandboxID != want || (next == "") != (i == 1) {
			t.Fatalf("page %d: %+v, next %q; want %s", i, page, next, want)
		}
	}
	noToken := processconnect.NewProcessClient(&http.Client{Transport: headers{id: c.SandboxID}}, e.url)
	if _, _, _, _, err := run(t, noToken, "true", false); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("secure envd without its token: %v", err)
	}
	wrong := processconnect.NewProcessClient(&http.Client{Transport: headers{c.SandboxID, "ea_wrong"}}, e.url)
	if _, _, _, _, err := run(t, wrong, "true", false); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("secure envd with a wrong token: %v", err)
	}
	if _, out, _, _, err := run(t, processconnect.NewProcessClient(e.envd(c), e.url), "echo ok", false); err != nil || out != "ok\n" {
		t.Fatalf("secure envd with its token: %q %v", out, err)
	}
}

// TestTimeout: a sandbox ends at its timeout; setting one moves its end;
// connect never brings it forward.
func TestTimeout(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base","timeout":1}`)
	sess, err := e.m.Get("acme", c.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	<-sess.Done() // the runner's sweep ends it
	if st := e.api("acme-key", "GET", "/sandboxes/"+c.SandboxID, "", nil); st != http.StatusNotFound {
		t.Fatalf("get of the timed out: %d", st)
	}
	c = e.create("acme-key", `{"templateID":"base","timeout":60}`)
	sess, _ = e.m.Get("acme", c.SandboxID)
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":3600}`, nil); st != http.StatusNoContent {
		t.Fatalf("timeout: %d", st)
	}
	if until := time.Until(sess.ExpiresAt()); until < 59*time.Minute {
		t.Fatalf("after timeout 3600 the sandbox ends in %v", until)
	}
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/connect", `{"timeout":10}`, nil); st != http.StatusOK {
		t.Fatalf("connect: %d", st)
	}
	if until := time.Until(sess.ExpiresAt()); until < 59*time.Minute {
		t.Fatalf("connect brought the end forward, to %v", until)
	}
	// The SDK's connect names the sandbox as envd requests do: it is still
	// the control plane's.
	req, _ := http.NewRequest("POST", e.url+"/sandboxes/"+c.SandboxID+"/connect", strings.NewReader(`{"timeout":10}`))
	req.Header.Set("X-API-Key", "acme-key")
	req.Header.Set(e2b.SandboxHeader, c.SandboxID)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got created
	json.NewDecoder(res.Body).Decode(&got)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || got.SandboxID != c.SandboxID {
		t.Fatalf("connect naming its sandbox: %d %+v", res.StatusCode, got)
	}
	var bad created
	if st := e.api("acme-key", "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":100000000}`, &bad); st != http.StatusBadRequest {
		t.Fatalf("timeout past the operator's maximum: %d %+v", st, bad)
	}
}

// TestBadInput: a malformed envelope, an oversized message and a process of
// another sandbox are refused with Connect's codes, and nothing runs.
func TestBadInput(t *testing.T) {
	e := start(t, e2b.WithMaxMessageBytes(1<<10))
	c := e.create("acme-key", `{"templateID":"base"}`)
	other := e.create("bolt-key", `{"templateID":"base"}`)
	pc := processconnect.NewProcessClient(e.envd(c), e.url)

	// A malformed envelope: a length past the body.
	req, _ := http.NewRequest("POST", e.url+"/process.Process/Start", bytes.NewReader([]byte{0, 0, 0, 1, 0, 1, 2}))
	req.Header.Set("Content-Type", "application/connect+proto")
	res, err := e.envd(c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(data), `"code":"invalid_argument"`) && !strings.Contains(string(data), `"code":"internal"`) {
		t.Fatalf("malformed envelope: %d %s", res.StatusCode, data)
	}
	// An oversized message.
	big := strings.Repeat("x", 2<<10)
	if _, _, _, _, err := run(t, pc, "echo "+big, false); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("oversized message: %v", err)
	}
	// A process of bolt's sandbox, named from acme's.
	st, err := processconnect.NewProcessClient(e.envd(other), e.url).Start(context.Background(),
		connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"30"}}}))
	if err != nil || !st.Receive() {
		t.Fatal(err, st.Err())
	}
	defer st.Close()
	pid := st.Msg().Event.GetStart().GetPid()
	_, err = pc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to another sandbox's process: %v", err)
	}
	cs, err := pc.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	if err == nil {
		for cs.Receive() {
			t.Fatalf("connected to another sandbox's process: %v", cs.Msg())
		}
		err = cs.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("connect to another sandbox's process: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }
