package integration

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
)

// testLongCommands: through the daemon, bash's output keeps the order of
// stdout and stderr; a background command is read while it runs, listed
// in the session's description, stopped, and nothing of its tree survives;
// a call detached by a client that hung up at once finishes, and its result
// is fetched by its ID.
func testLongCommands(t *testing.T, d *daemon) {
	d.t = t
	var s runner.Info
	d.do(acmeToken, "POST", "/v1/sessions", everything, http.StatusCreated, &s)
	defer d.do(acmeToken, "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent, nil)

	var want strings.Builder
	for i := range 100 {
		fmt.Fprintf(&want, "out%d\nerr%d\n", i, i)
	}
	r := d.call(acmeToken, s.ID, "bash", map[string]any{"command": "i=0; while [ $i -lt 100 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done"})
	if out, _ := r.StructuredContent["output"].(string); r.IsError || out != want.String() {
		t.Errorf("output order: %+v", r.StructuredContent)
	}

	// A background command, its tree, and its end.
	r = d.call(acmeToken, s.ID, "bash", map[string]any{"background": true,
		"command": "sleep 1000 & echo pid $!\n(setsid sleep 1000 & echo pid $!; wait) &\necho pid $$; sleep 0.2; echo ready\nwhile :; do echo tick; sleep 0.05; done"})
	id, _ := r.StructuredContent["id"].(string)
	if r.IsError || id == "" || r.StructuredContent["running"] != true {
		t.Fatalf("background: %+v", r)
	}
	var out strings.Builder
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "tick\n"); {
		r := d.call(acmeToken, s.ID, "bash_output", map[string]any{"id": id, "wait": 0.1})
		o, _ := r.StructuredContent["output"].(string)
		out.WriteString(o)
		if r.IsError || r.StructuredContent["running"] != true || time.Now().After(deadline) {
			t.Fatalf("bash_output: %+v (read %q)", r, out.String())
		}
	}
	var info runner.Info
	d.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &info)
	if len(info.Background) != 1 || info.Background[0].ID != id || !info.Background[0].Running {
		t.Errorf("the session's description: %+v", info.Background)
	}
	if r := d.call(acmeToken, s.ID, "bash_kill", map[string]any{"id": id}); r.IsError || r.StructuredContent["killed"] != true {
		t.Fatalf("bash_kill: %+v", r)
	}
	var pids []string
	for _, m := range regexp.MustCompile(`(?m)^pid (\d+)$`).FindAllStringSubmatch(out.String(), -1) {
		pids = append(pids, m[1])
	}
	if len(pids) != 3 {
		t.Fatalf("pids in %q", out.String())
	}
	check := "for p in " + strings.Join(pids, " ") + "; do kill -0 $p 2>/dev/null && echo alive $p; done; true"
	for deadline := time.Now().Add(30 * time.Second); ; {
		r := d.call(acmeToken, s.ID, "bash", map[string]any{"command": check})
		if o, _ := r.StructuredContent["output"].(string); o == "" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("survived bash_kill: %s", o)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A detached call whose client hangs up at once.
	body := `{"arguments":{"command":"while [ ! -e gate ]; do sleep 0.02; done; echo finished $(cat gate)"},"detach":true}`
	conn, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/sessions/%s/tools/bash HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		s.ID, acmeToken, len(body), body)
	conn.Close()
	for deadline := time.Now().Add(30 * time.Second); len(info.Detached) == 0; time.Sleep(10 * time.Millisecond) {
		d.do(acmeToken, "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK, &info)
		if time.Now().After(deadline) {
			t.Fatalf("no detached call in the session's description: %+v", info)
		}
	}
	// By a command: on memory a running command sees other commands'
	// files at once, and the tools' only from its next run.
	if r := d.call(acmeToken, s.ID, "bash", map[string]any{"command": "echo open > gate"}); r.IsError {
		t.Fatal(r.Content)
	}
	var st httpapi.CallStatus
	d.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/calls/"+info.Detached[0].ID+"?wait=60", nil, http.StatusOK, &st)
	if !st.Done || st.Result == nil || st.Result.IsError || !strings.Contains(fmt.Sprint(st.Result.StructuredContent), "finished open") {
		t.Errorf("the detached call: %+v", st)
	}
}
