package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
)

// TestDetachedCall: a call started detached by a client that hangs up at
// once still runs to its end — its command waits for a file written after
// the client is gone — and its result is fetched by its ID; the session's
// description lists it.
func TestDetachedCall(t *testing.T) {
	e := start(t, config{})
	id := e.create(acmeToken, writer).ID

	// The client sends its request and closes the connection without
	// reading the answer.
	body := `{"arguments":{"command":"while [ ! -e gate ]; do sleep 0.02; done; echo finished $(cat gate)"},"detach":true}`
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/sessions/%s/tools/bash HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		id, acmeToken, len(body), body)
	conn.Close()

	var call runner.CallInfo
	for deadline := time.Now().Add(30 * time.Second); ; {
		var info runner.Info
		e.json(acmeToken, "GET", "/v1/sessions/"+id, nil, http.StatusOK, &info)
		if len(info.Detached) == 1 {
			call = info.Detached[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no detached call in the session's description: %+v", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if call.Tool != "bash" || call.Ended != nil {
		t.Fatalf("detached call %+v", call)
	}
	var st httpapi.CallStatus
	e.json(acmeToken, "GET", "/v1/sessions/"+id+"/calls/"+call.ID, nil, http.StatusOK, &st)
	if st.Done || st.Result != nil {
		t.Fatalf("before the gate: %+v", st)
	}
	if r := e.call(acmeToken, id, "bash", map[string]any{"command": "echo open > gate"}); r.IsError {
		t.Fatal(r.Content)
	}
	e.json(acmeToken, "GET", "/v1/sessions/"+id+"/calls/"+call.ID+"?wait=60", nil, http.StatusOK, &st)
	out, _ := json.Marshal(st.Result)
	if !st.Done || st.Ended == nil || st.Error != nil || st.Result == nil || st.Result.IsError || !strings.Contains(string(out), `"output":"finished open\n"`) {
		t.Fatalf("after the gate: %+v %s", st, out)
	}

	// Started and answered at once over a connection that stays.
	var started httpapi.CallStatus
	e.json(acmeToken, "POST", "/v1/sessions/"+id+"/tools/bash", map[string]any{"arguments": map[string]any{"command": "exit 3"}, "detach": true}, http.StatusAccepted, &started)
	e.json(acmeToken, "GET", "/v1/sessions/"+id+"/calls/"+started.ID+"?wait=60", nil, http.StatusOK, &st)
	if out, _ := json.Marshal(st.Result); !st.Done || !strings.Contains(string(out), `"exitCode":3`) {
		t.Errorf("exit 3: %+v %s", st, out)
	}
	for path, want := range map[string]int{
		"/calls/call-none":                     http.StatusNotFound,
		"/calls/" + started.ID + "?wait=-1":    http.StatusBadRequest,
		"/calls/" + started.ID + "?wait=1e9":   http.StatusBadRequest,
		"/calls/" + started.ID + "?wait=never": http.StatusBadRequest,
	} {
		if status, data, _ := e.do(acmeToken, "GET", "/v1/sessions/"+id+path, nil); status != want {
			t.Errorf("GET %s: %d, want %d: %s", path, status, want, data)
		}
	}
	// Another tenant does not see it.
	if status, _, _ := e.do(boltToken, "GET", "/v1/sessions/"+id+"/calls/"+started.ID, nil); status != http.StatusNotFound {
		t.Errorf("another tenant: %d", status)
	}
}
