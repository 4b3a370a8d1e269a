package e2b_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
)

// BenchmarkPTYEcho measures a terminal's echo round trip through E2B's
// protocol on the Docker backend: a keystroke line sent with envd's
// SendInput (pty) to a shell on a pseudo-terminal in the sandbox's
// container, until the terminal's echo of it arrives on the Start stream
// — the path of every keystroke of an interactive terminal (the HTTP
// call, the agent's stream into the container, the pty, and back). It
// reports the median in ms.
func BenchmarkPTYEcho(b *testing.B) {
	_, es := dockerE2B(b)
	srv := httptest.NewServer(es)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/sandboxes", strings.NewReader(`{"templateID":"base","timeout":3600}`))
	req.Header.Set("X-API-Key", "acme-key")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	var c created
	json.NewDecoder(res.Body).Decode(&c)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		b.Fatalf("create: %d %s", res.StatusCode, c.Message)
	}
	pc := processconnect.NewProcessClient(&http.Client{Transport: headers{c.SandboxID, c.EnvdAccessToken}}, srv.URL)
	pid, f := startPty(b, pc, 24, 80)
	defer sendPty(pc, pid, "exit\n")
	n := 0
	key := func() {
		n++
		line := "#k" + strconv.Itoa(n) + "\n" // a comment: the shell runs nothing
		if err := sendPty(pc, pid, line); err != nil {
			b.Fatal(err)
		}
		f.await(b, line[:len(line)-1])
	}
	key() // the connection made, the shell up
	var d []time.Duration
	for b.Loop() {
		t0 := time.Now()
		key()
		d = append(d, time.Since(t0))
	}
	b.ReportMetric(millis(median(d)), "echo-ms")
	b.Logf("load average %s", loadAvg())
}
