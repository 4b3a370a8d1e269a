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

// TestDetachedResultsInTheBudget: a detached call's kept result counts
// against its tenant's share of the memory budget (its kept results a
// quarter of the budget): a second image that does not fit beside the
// first displaces it, and that call says why; another tenant's results
// are kept in its own share; a kept result is fetched whole.
func TestDetachedResultsInTheBudget(t *testing.T) {
	const budget = 8 << 20 // kept results: 2 MiB a tenant
	e := start(t, config{api: []httpapi.Option{httpapi.WithMemoryBudget(budget), httpapi.WithMaxBodyBytes(1 << 20)}})
	const size = 1_500_000
	makeImage := fmt.Sprintf(`printf '\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0@\0\0\0@\b\6\0\0\0' > i.png && truncate -s %d i.png`, size)
	detachRead := func(token, id string) httpapi.CallStatus {
		var st httpapi.CallStatus
		e.json(token, "POST", "/v1/sessions/"+id+"/tools/read", map[string]any{"arguments": map[string]any{"path": "i.png"}, "detach": true}, http.StatusAccepted, &st)
		e.json(token, "GET", "/v1/sessions/"+id+"/calls/"+st.ID+"?wait=60", nil, http.StatusOK, &st)
		return st
	}
	image := func(st httpapi.CallStatus) bool {
		return st.Result != nil && len(st.Result.Content) == 2 && len(st.Result.Content[1].Data) == size
	}
	var ids []string
	for _, token := range []string{acmeToken, boltToken} {
		id := e.create(token, writer).ID
		if r := e.call(token, id, "bash", map[string]any{"command": makeImage}); r.IsError {
			t.Fatal(r.Content)
		}
		ids = append(ids, id)
	}
	first := detachRead(acmeToken, ids[0])
	if !image(first) {
		t.Fatalf("the first image read: %+v", first.Error)
	}
	second := detachRead(acmeToken, ids[0])
	if !image(second) {
		t.Fatalf("the second image read: %+v", second.Error)
	}
	var gone httpapi.CallStatus
	e.json(acmeToken, "GET", "/v1/sessions/"+ids[0]+"/calls/"+first.ID, nil, http.StatusOK, &gone)
	if !gone.Done || gone.Result != nil || gone.Error == nil || gone.Error.Error != "ResultNotKept" || !strings.Contains(gone.Error.Message, "limits.memoryBudgetBytes") {
		t.Errorf("the first result, displaced: %+v", gone.Error)
	}
	if bolt := detachRead(boltToken, ids[1]); !image(bolt) {
		t.Errorf("bolt's image read, beside acme's: %+v", bolt.Error)
	}
	var again httpapi.CallStatus
	if e.json(acmeToken, "GET", "/v1/sessions/"+ids[0]+"/calls/"+second.ID, nil, http.StatusOK, &again); !image(again) {
		t.Errorf("the second result, fetched again: %+v", again.Error)
	}
}
