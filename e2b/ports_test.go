package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/e2b"
	"github.com/sandboxd/sandboxd/memfs"
)

// dialBackend is the memory backend with workspaces that can be dialled:
// through a real agent (over a pipe) whose world is this host's, so that
// a server the test starts on loopback stands for one a command started
// in a container.
type dialBackend struct {
	memory.Backend
	agent *agent.Client
}

func (b dialBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.Backend.Open(ctx, spec)
	if err == nil {
		inst.Dial = b.agent.Dial
	}
	return inst, err
}

func newDialBackend(t *testing.T) dialBackend {
	t.Helper()
	a, b := net.Pipe()
	srv := agent.NewServer(memfs.New(), nil)
	go srv.Serve(context.Background(), b)
	c, err := agent.NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return dialBackend{Backend: memory.Backend{TempDir: t.TempDir()}, agent: c}
}

// program is what a sandbox's command would serve on a port: echo of a
// body, its digest, a large answer, and a WebSocket-like upgrade that
// echoes.
func program(t *testing.T) (port int) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s, host %s", r.URL.Path, r.Host)
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) { io.Copy(w, r.Body) })
	mux.HandleFunc("GET /ws", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		io.Copy(conn, rw) // echo until the other side ends
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// logBuffer collects what the server logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

const testDomain = "sbx.test"

func TestPorts(t *testing.T) {
	var logs logBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	allowed := func(tenant string) bool { return tenant == "acme" }
	m, srv := newServer(t, newDialBackend(t), e2b.WithPorts(allowed), e2b.WithDomain(testDomain+":443"), e2b.WithLogger(logger))
	e := &env{t: t, url: serveHTTP(t, srv), m: m}
	ports := httptest.NewServer(srv.Ports())
	t.Cleanup(ports.Close)

	acme := e.create("acme-key", `{"templateID":"base"}`)
	bolt := e.create("bolt-key", `{"templateID":"base"}`)
	private := e.create("acme-key", `{"templateID":"base","network":{"allowPublicTraffic":false}}`)
	other := e.create("acme-key", `{"templateID":"base","network":{"allowPublicTraffic":false}}`)
	if private.TrafficToken == "" || other.TrafficToken == "" || acme.TrafficToken != "" {
		t.Fatalf("traffic tokens: %q, %q of the private sandboxes, %q of a public one", private.TrafficToken, other.TrafficToken, acme.TrafficToken)
	}
	port := program(t)

	get := func(host, path string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", ports.URL+path, nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return send(t, req)
	}
	host := func(port int, id string) string { return fmt.Sprintf("%d-%s.%s:443", port, id, testDomain) }

	for _, tc := range []struct {
		name   string
		host   string
		hdr    map[string]string
		status int
		want   string // in the body
	}{
		{"served", host(port, acme.SandboxID), nil, 200, "hello from /x, host " + host(port, acme.SandboxID)},
		{"a tenant not allowed", host(port, bolt.SandboxID), nil, 403, `ports are not allowed for tenant \"bolt\"`},
		{"private without its token", host(port, private.SandboxID), nil, 403, "traffic access token"},
		{"private with another's token", host(port, private.SandboxID), map[string]string{e2b.TrafficTokenHeader: other.TrafficToken}, 403, "traffic access token"},
		{"private with its token", host(port, private.SandboxID), map[string]string{e2b.TrafficTokenHeader: private.TrafficToken}, 200, "hello from /x"},
		{"a closed port", host(1, acme.SandboxID), nil, 502, "port is not open"},
		{"no such sandbox", host(port, "nosuchsandbox"), nil, 502, "sandbox was not found"},
		{"not a sandbox's host", "example.com", nil, 400, "no sandbox's"},
		{"no port", "x-" + acme.SandboxID + "." + testDomain, nil, 400, "no sandbox's"},
		{"envd", host(e2b.EnvdPort, acme.SandboxID), nil, 204, ""},
	} {
		path := "/x"
		if tc.name == "envd" {
			path = "/health"
		}
		st, body := get(tc.host, path, tc.hdr)
		if st != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s; want %d with %q", tc.name, st, body, tc.status, tc.want)
		}
		if st == 502 || st == 403 {
			var pe struct {
				Code      int    `json:"code"`
				Message   string `json:"message"`
				SandboxID string `json:"sandboxId"`
			}
			if err := json.Unmarshal([]byte(body), &pe); err != nil || pe.Code != st || pe.Message == "" || pe.SandboxID == "" {
				t.Errorf("%s: the body is not E2B's error shape: %s", tc.name, body)
			}
		}
	}
	t.Run("large both ways", func(t *testing.T) {
		up := make([]byte, 8<<20)
		rand.Read(up)
		req, _ := http.NewRequest("POST", ports.URL+"/echo", bytes.NewReader(up))
		req.Host = host(port, acme.SandboxID)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		h := sha256.New()
		n, err := io.Copy(h, res.Body)
		want := sha256.Sum256(up)
		if err != nil || res.StatusCode != 200 || n != int64(len(up)) || hex.EncodeToString(h.Sum(nil)) != hex.EncodeToString(want[:]) {
			t.Errorf("echo of %d bytes: %d, %d bytes back, %v", len(up), res.StatusCode, n, err)
		}
	})

	t.Run("upgrade passes through", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(ports.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(time.Minute))
		fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", host(port, acme.SandboxID))
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", res, err)
		}
		for _, msg := range []string{"ping", strings.Repeat("z", 300<<10)} {
			if _, err := io.WriteString(conn, msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
				t.Fatalf("echo over the upgraded connection: %d bytes, %v", len(got), err)
			}
		}
	})

	// Each connection is audited when it ends.
	ports.CloseClientConnections()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(logs.String(), `"msg":"e2b port","tenant":"acme"`) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{`"msg":"e2b port","tenant":"acme","sandbox":"` + acme.SandboxID, `"msg":"e2b port refused","tenant":"bolt"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, logs.String())
		}
	}
}

// TestPortConnections: a tenant's open requests to its ports are capped
// (WithPortConnections), an upgraded connection counting until it closes:
// one past the cap is 429 in E2B's shape, with Retry-After, while another
// tenant is served; once the connection closes the tenant is served again.
func TestPortConnections(t *testing.T) {
	_, srv := newServer(t, newDialBackend(t), e2b.WithPorts(func(string) bool { return true }), e2b.WithPortConnections(1), e2b.WithDomain(testDomain))
	e := &env{t: t, url: serveHTTP(t, srv)}
	acme, bolt := e.create("acme-key", `{"templateID":"base"}`), e.create("bolt-key", `{"templateID":"base"}`)
	ports := httptest.NewServer(srv.Ports())
	t.Cleanup(ports.Close)
	port := program(t)
	host := func(id string) string { return fmt.Sprintf("%d-%s.%s", port, id, testDomain) }
	get := func(id string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", ports.URL+"/x", nil)
		req.Host = host(id)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		return res, string(data)
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(ports.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", host(acme.SandboxID))
	if res, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", res, err)
	}
	res, body := get(acme.SandboxID)
	var pe struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal([]byte(body), &pe); res.StatusCode != http.StatusTooManyRequests || pe.Code != 429 ||
		!strings.Contains(pe.Message, "e2b.ports.maxConnections") || res.Header.Get("Retry-After") == "" {
		t.Errorf("a request past the cap, its connection upgraded: %d %s (Retry-After %q); want 429 naming e2b.ports.maxConnections", res.StatusCode, body, res.Header.Get("Retry-After"))
	}
	if res, body := get(bolt.SandboxID); res.StatusCode != http.StatusOK {
		t.Errorf("another tenant at acme's cap: %d %s; want 200", res.StatusCode, body)
	}
	conn.Close()
	for deadline := time.Now().Add(time.Minute); ; {
		res, body := get(acme.SandboxID)
		if res.StatusCode == http.StatusOK {
			break
		}
		if res.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("after the upgraded connection closed: %d %s; want 200", res.StatusCode, body)
		}
		time.Sleep(10 * time.Millisecond) // until the proxy has seen the close
	}
}

func TestPortsOffByDefault(t *testing.T) {
	_, srv := newServer(t, newDialBackend(t), e2b.WithDomain(testDomain))
	e := &env{t: t, url: serveHTTP(t, srv)}
	c := e.create("acme-key", `{"templateID":"base"}`)
	ports := httptest.NewServer(srv.Ports())
	t.Cleanup(ports.Close)
	req, _ := http.NewRequest("GET", ports.URL, nil)
	req.Host = fmt.Sprintf("%d-%s.%s", program(t), c.SandboxID, testDomain)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("a port without WithPorts: %d; want 403", res.StatusCode)
	}
}

func TestNetworkRefusals(t *testing.T) {
	e := start(t)
	for _, tc := range []struct {
		network string
		status  int
	}{
		{`{"allowPublicTraffic":true}`, 201},
		{`{"allowOut":["1.1.1.1"]}`, 501},
		{`{"maskRequestHost":"x"}`, 501},
		{`{"allowPublicTrafic":false}`, 400}, // misspelt: never ignored
	} {
		var c created
		if st := e.api("acme-key", "POST", "/sandboxes", `{"templateID":"base","network":`+tc.network+`}`, &c); st != tc.status {
			t.Errorf("network %s: %d %s; want %d", tc.network, st, c.Message, tc.status)
		}
	}
}
