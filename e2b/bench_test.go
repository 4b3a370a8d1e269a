package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/e2b"
	pb "github.com/sandboxd/sandboxd/e2b/envdpb/process"
	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/agentbin"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// BenchmarkE2BvsNative measures what speaking E2B's protocol costs against
// sandboxd's own HTTP API, on one Docker manager, interleaved call by call
// in one run: a command's round trip (envd's Process.Start of `bash -c
// true`, its stream drained to the end, against POST tools/bash) and a
// 4 KB read (envd's GET /files against POST tools/read). Each E2B sandbox
// and native session has a container of its own. It reports each side's
// median in ms and their ratio (issue 27's goal: within 1.5×).
func BenchmarkE2BvsNative(b *testing.B) {
	ctx := context.Background()
	m, es := dockerE2B(b)
	const token = "sbx_bench"
	hs, err := httpapi.New(m, httpapi.WithTenants([]httpapi.Tenant{{Name: "acme", Tokens: []string{httpapi.HashToken(token)}}}))
	if err != nil {
		b.Fatal(err)
	}
	e2bURL, native := httptest.NewServer(es), httptest.NewServer(hs)
	defer e2bURL.Close()
	defer native.Close()

	post := func(c *http.Client, url, ctype string, body io.Reader, hdr map[string]string) []byte {
		b.Helper()
		req, _ := http.NewRequest("POST", url, body)
		req.Header.Set("Content-Type", ctype)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		if res.StatusCode/100 != 2 {
			b.Fatalf("POST %s: %d %s", url, res.StatusCode, data)
		}
		return data
	}
	auth2 := map[string]string{"Authorization": "Bearer " + token}
	// The native session, and its call.
	var info runner.Info
	settings, _ := json.Marshal(runner.Settings{Grants: []string{"fs.write", "shell.exec"}, Always: []string{"read", "edit", "shell"}})
	if err := json.Unmarshal(post(http.DefaultClient, native.URL+"/v1/sessions", "application/json", bytes.NewReader(settings), auth2), &info); err != nil {
		b.Fatal(err)
	}
	calls := 0
	call := func(tool, args string) { // each a run of its own: the per-run cap is not what is measured
		calls++
		data := post(http.DefaultClient, native.URL+"/v1/sessions/"+info.ID+"/tools/"+tool, "application/json",
			strings.NewReader(fmt.Sprintf(`{"runId":"r%d","arguments":%s}`, calls, args)), auth2)
		if bytes.Contains(data, []byte(`"isError":true`)) {
			b.Fatalf("%s: %s", tool, data)
		}
	}
	text := strings.Repeat(strings.Repeat("x", 63)+"\n", 64) // 4 KB in 64 lines
	arg, _ := json.Marshal(map[string]string{"path": "f4k", "content": text})
	call("write", string(arg))

	// The E2B sandbox, and its clients.
	var c created
	if err := json.Unmarshal(post(http.DefaultClient, e2bURL.URL+"/sandboxes", "application/json",
		strings.NewReader(`{"templateID":"base","timeout":3600}`), map[string]string{"X-API-Key": "acme-key"}), &c); err != nil {
		b.Fatal(err)
	}
	envd := &http.Client{Transport: headers{c.SandboxID, c.EnvdAccessToken}}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("file", "f4k")
	fw.Write([]byte(text))
	mw.Close()
	post(envd, e2bURL.URL+"/files?path=f4k", mw.FormDataContentType(), &form, nil)
	pc := processconnect.NewProcessClient(envd, e2bURL.URL)

	e2bCommand := func() {
		st, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "true"}}}))
		if err != nil {
			b.Fatal(err)
		}
		var end *pb.ProcessEvent_EndEvent
		for st.Receive() {
			if e := st.Msg().Event.GetEnd(); e != nil {
				end = e
			}
		}
		st.Close()
		if st.Err() != nil || end == nil || end.ExitCode != 0 {
			b.Fatalf("e2b true: %v %v", end, st.Err())
		}
	}
	e2bRead := func() {
		res, err := envd.Get(e2bURL.URL + "/files?path=/home/user/f4k")
		if err != nil {
			b.Fatal(err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || len(data) != len(text) {
			b.Fatalf("e2b read: %d, %d bytes", res.StatusCode, len(data))
		}
	}
	for _, op := range []struct {
		name         string
		e2b, sandbox func()
	}{
		{"command", e2bCommand, func() { call("bash", `{"command":"true"}`) }},
		{"read-4KB", e2bRead, func() { call("read", `{"path":"f4k"}`) }},
	} {
		b.Run(op.name, func(b *testing.B) {
			op.e2b() // one each before timing: connections made, the agent warm
			op.sandbox()
			var e, s []time.Duration
			for b.Loop() {
				t0 := time.Now()
				op.e2b()
				t1 := time.Now()
				op.sandbox()
				e, s = append(e, t1.Sub(t0)), append(s, time.Since(t1))
			}
			me, ms := median(e), median(s)
			b.ReportMetric(millis(me), "e2b-ms")
			b.ReportMetric(millis(ms), "native-ms")
			b.ReportMetric(float64(me)/float64(ms), "e2b/native")
			b.Logf("load average %s", loadAvg())
		})
	}
}

// dockerE2B is a manager on the Docker backend and E2B's API over it, for
// the tenants of keys; both end with b.
func dockerE2B(b *testing.B) (*runner.Manager, *e2b.Server) {
	agent, err := agentbin.Path()
	if err != nil {
		b.Fatal(err)
	}
	m, err := runner.New(context.Background(), &docker.Backend{Client: dockertest.Client(b), Agent: agent},
		runner.WithDaemonName(dockertest.DaemonName("e2b-bench")), runner.WithLabels(dockertest.Labels()),
		runner.WithPolicy(dockertest.Policy(policy.Policy{DefaultImage: dockertest.Image(b)})),
		runner.WithLifetime(time.Hour, 24*time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Shutdown(context.Background()) })
	auth := func(key string) (e2b.Tenant, bool) { tn, ok := keys[key]; return tn, ok }
	es, err := e2b.New(m, e2b.WithAuth(auth), e2b.WithTemplates(map[string]e2b.Template{"base": {}}))
	if err != nil {
		b.Fatal(err)
	}
	return m, es
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
