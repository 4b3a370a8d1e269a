package runner_test

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/tools"
)

// names is a resolver from a table: the daemon's lookups in these tests
// never reach a real DNS, and every name leads to a loopback server the
// test started, or to an address the policy must refuse.
type names map[string]string

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := n[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// goproxyTree is a GOPROXY file tree serving one module,
// sandboxd.test/greet v1.0.0.
func goproxyTree(t *testing.T) fstest.MapFS {
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	for name, body := range map[string]string{
		"go.mod":   "module sandboxd.test/greet\n\ngo 1.19\n",
		"greet.go": "package greet\n\n// Hello greets.\nfunc Hello() string { return \"hello from a module fetched through sandboxd\" }\n",
	} {
		w, err := zw.Create("sandboxd.test/greet@v1.0.0/" + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return fstest.MapFS{
		"sandboxd.test/greet/@v/list":        {Data: []byte("v1.0.0\n")},
		"sandboxd.test/greet/@v/v1.0.0.info": {Data: []byte(`{"Version":"v1.0.0","Time":"2026-01-01T00:00:00Z"}`)},
		"sandboxd.test/greet/@v/v1.0.0.mod":  {Data: []byte("module sandboxd.test/greet\n\ngo 1.19\n")},
		"sandboxd.test/greet/@v/v1.0.0.zip":  {Data: zb.Bytes()},
	}
}

// TestDockerEgress: on the dev image, a session's commands reach the
// daemon's loopback servers through the egress proxy only because the
// policy lists them — an HTTPS server with a test CA the session trusts,
// and a Go module proxy that `go mod download` and `go run` use — while a
// host no rule allows, an allowed name that resolves to a refused private
// address, and a connection that ignores the proxy all fail, and every
// connection is audited. A session that narrows its egress to nothing
// gets no proxy.
//
// It runs on both paths a program's connection can take to the daemon:
// handed off over a Unix socket in a directory shared with the container
// (the socket is there, so the agent reached it), and carried on the
// agent's stream.
func TestDockerEgress(t *testing.T) {
	t.Run("Handoff", func(t *testing.T) { testDockerEgress(t, handoffDir(t)) })
	t.Run("Stream", func(t *testing.T) { testDockerEgress(t, "") })
}

// handoffDir is a directory for docker.Backend.HandoffDir, short enough a
// path for the sockets in it.
func handoffDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "sbx-h")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// handedOff reports whether a connection was handed off in dir: a socket
// is left in a container's directory only once its agent reached it.
func handedOff(t testing.TB, dir string) bool {
	socks, _ := filepath.Glob(filepath.Join(dir, "h-*", "s"))
	for _, s := range socks {
		if fi, err := os.Lstat(s); err == nil && fi.Mode().Type() == fs.ModeSocket {
			return true
		}
	}
	return false
}

func testDockerEgress(t *testing.T, handoff string) {
	dev := dockertest.NamedImage(t, "dev")
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello through the proxy")
	}))
	defer tlsSrv.Close()
	goproxy := httptest.NewServer(http.FileServerFS(goproxyTree(t)))
	defer goproxy.Close()
	portOf := func(s *httptest.Server) string { u, _ := url.Parse(s.URL); return u.Port() }
	tlsPort, gpPort := portOf(tlsSrv), portOf(goproxy)

	logs := &lockedBuffer{}
	m, _ := dockerManagerOn(t, &docker.Backend{HandoffDir: handoff},
		runner.WithPolicy(dockertest.Policy(policy.Policy{DefaultImage: dev})),
		runner.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		runner.WithEgress(egress.Policy{
			Allow:        []string{"example.com:" + tlsPort, "goproxy.test:" + gpPort, "metadata.test:80"},
			AllowPrivate: []string{"127.0.0.1"},
		}, egress.WithResolver(names{"example.com": "127.0.0.1", "goproxy.test": "127.0.0.1", "metadata.test": "169.254.169.254", "other.test": "127.0.0.1"})))
	defer m.Shutdown(context.Background())
	ctx := context.Background()
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Grants: []string{tools.GrantShellExec, tools.GrantFSWrite}, Always: []string{"shell"}}})
	if err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw})
	if err := s.FS().WriteFile(ctx, "ca.pem", ca, 0o644); err != nil {
		t.Fatal(err)
	}

	runFor := func(t *testing.T, script string, timeout int) string {
		t.Helper()
		br, res := bashFor(t, s, script, timeout)
		if br == nil {
			t.Fatalf("%s: %+v", script, res)
		}
		return br.Output
	}
	run := func(t *testing.T, script string) string { t.Helper(); return runFor(t, script, 20) }
	t.Run("HTTPSAllowed", func(t *testing.T) {
		out := run(t, `curl -sS --cacert ca.pem https://example.com:`+tlsPort+`/ && echo`)
		if out != "hello through the proxy\n" {
			t.Errorf("curl through the proxy: %q", out)
		}
	})
	t.Run("Path", func(t *testing.T) {
		// gVisor's sandbox reaches no host socket: there connections are
		// carried on the stream, handoff directory or not.
		want := handoff != "" && !dockertest.GVisor()
		if got := handedOff(t, handoff); got != want {
			t.Errorf("connections handed off: %v; want %v", got, want)
		}
	})
	t.Run("HostNotAllowed", func(t *testing.T) {
		// Over HTTPS the refusal is the destination's answer, inside TLS
		// the session trusts (its own authority's), so curl prints it.
		for _, target := range []string{"https://other.test:" + tlsPort + "/", "http://other.test:" + tlsPort + "/"} {
			out := run(t, `curl -sS -w 'status %{http_code}\n' `+target)
			if !strings.Contains(out, "status 403") || !strings.Contains(out, "other.test:"+tlsPort+" refused") || !strings.Contains(out, "egress.allow") {
				t.Errorf("%s, no rule allows it: %q; want a 403 naming it and egress.allow", target, out)
			}
		}
	})
	t.Run("PrivateAddressRefused", func(t *testing.T) {
		out := run(t, `curl -sS http://metadata.test/latest/meta-data/`)
		if !strings.Contains(out, "169.254.169.254") || !strings.Contains(out, "egress.allowPrivate") {
			t.Errorf("an allowed name resolving to a private address: %q", out)
		}
	})
	t.Run("IgnoringTheProxy", func(t *testing.T) {
		out := run(t, `curl -sS --noproxy '*' --max-time 20 --cacert ca.pem https://example.com:`+tlsPort+`/ >/dev/null 2>&1 && echo curl reached it
(exec 3<>/dev/tcp/172.17.0.1/`+tlsPort+`) 2>/dev/null && echo tcp reached it
echo done`)
		if out != "done\n" {
			t.Errorf("a connection that ignores the proxy: %q", out)
		}
	})
	t.Run("GoModDownload", func(t *testing.T) {
		// The first build of a session compiles the standard library (a
		// current Go ships none compiled): tens of seconds on a loaded host.
		out := runFor(t, `set -e; export GOPROXY=http://goproxy.test:`+gpPort+` GOSUMDB=off GOMODCACHE=$PWD/.modcache GOCACHE=$PWD/.gocache GOFLAGS=-modcacherw
mkdir -p app && cd app
printf 'module app\n\ngo 1.19\n\nrequire sandboxd.test/greet v1.0.0\n' > go.mod
printf 'package main\n\nimport (\n\t"fmt"\n\n\t"sandboxd.test/greet"\n)\n\nfunc main() { fmt.Println(greet.Hello()) }\n' > main.go
go mod download sandboxd.test/greet && go run . 2>&1`, 300)
		if !strings.Contains(out, "hello from a module fetched through sandboxd") {
			t.Errorf("go mod download and go run through the proxy: %q", out)
		}
	})
	t.Run("Audited", func(t *testing.T) {
		log := logs.String()
		var ok, refused bool
		for line := range strings.SplitSeq(log, "\n") {
			if !strings.Contains(line, "msg=egress") || !strings.Contains(line, "session="+s.ID()) || !strings.Contains(line, "tenant=acme") {
				continue
			}
			ok = ok || strings.Contains(line, "host=example.com") && strings.Contains(line, "outcome=ok") && !strings.Contains(line, "bytes_down=0 ")
			refused = refused || strings.Contains(line, "host=metadata.test") && strings.Contains(line, "outcome=refused")
		}
		if !ok || !refused {
			t.Errorf("audit lines (ok %v, refused %v):\n%s", ok, refused, log)
		}
		if st := m.Stats().Egress; st.Connections[egress.OutcomeOK] == 0 || st.Connections[egress.OutcomeRefused] == 0 || st.BytesDown == 0 {
			t.Errorf("egress stats: %+v", st)
		}
	})
	t.Run("NarrowedToNothing", func(t *testing.T) {
		closed, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Grants: []string{tools.GrantShellExec}, Always: []string{"shell"}, Egress: []string{}}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Delete(ctx, "acme", closed.ID())
		br, res := bash(t, closed, `echo "${HTTPS_PROXY-no proxy}"; curl -sS --max-time 20 http://goproxy.test:`+gpPort+`/ >/dev/null 2>&1 || echo unreached`)
		if br == nil || br.Output != "no proxy\nunreached\n" {
			t.Errorf("a session without egress: %+v", res)
		}
		if _, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Egress: []string{"proxy.golang.org:443"}}}); err == nil {
			t.Error("a session widened egress past the operator's")
		}
	})
}

// BenchmarkDockerEgress measures the egress proxy, one run: a 100 MB
// download by curl in a dev session through the proxy against the same
// download by the host's curl straight from the same loopback server
// (throughput, and their ratio: the target is at least 0.5), the same over
// HTTPS (a CONNECT tunnel; tls-*) and through inspection (tls-inspected-*:
// the destination of a secret, whose TLS the proxy terminates with the
// session's authority and opens again), and the median time of 200 small
// requests each way, plain and over HTTPS (the differences are what the
// proxy, and its inspection, add; the target is at most 2 ms for each).
// Run it with -benchtime 1x.
//
// Handoff is the path a daemon sharing the engine's host takes (the
// program's socket handed to the daemon); Stream, the agent's stream.
func BenchmarkDockerEgress(b *testing.B) {
	b.Run("Handoff", func(b *testing.B) { benchmarkDockerEgress(b, handoffDir(b)) })
	b.Run("Stream", func(b *testing.B) { benchmarkDockerEgress(b, "") })
}

func benchmarkDockerEgress(b *testing.B, handoff string) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		b.Skip("the host has no curl to measure the direct path with")
	}
	dev := dockertest.NamedImage(b, "dev")
	const size = 100 << 20
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		io.CopyN(w, zeros{}, size)
	})
	srv := httptest.NewServer(handler)
	defer srv.Close()
	tlsSrv := httptest.NewTLSServer(handler) // its certificate names example.com
	defer tlsSrv.Close()
	u, _ := url.Parse(srv.URL)
	tu, _ := url.Parse(tlsSrv.URL)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw})
	// api.example.com is the same server as a secret's destination: the
	// proxy inspects its HTTPS (the daemon trusts the server's certificate,
	// caCerts; the session, its own authority).
	b.Setenv("SANDBOXD_BENCH_TOKEN", "bench-token-value")
	m, _ := dockerManagerOn(b, &docker.Backend{HandoffDir: handoff}, runner.WithPolicy(dockertest.Policy(policy.Policy{DefaultImage: dev})), runner.WithDaemonName(dockertest.DaemonName("bench-egress")),
		runner.WithEgress(egress.Policy{Allow: []string{"bulk.test:" + u.Port(), "example.com:" + tu.Port(), "api.example.com:" + tu.Port()}, AllowPrivate: []string{"127.0.0.1"}},
			egress.WithResolver(names{"bulk.test": "127.0.0.1", "example.com": "127.0.0.1", "api.example.com": "127.0.0.1"})),
		runner.WithSecrets(runner.Secret{Name: "BENCH_TOKEN", Secret: sources.Secret{Env: "SANDBOXD_BENCH_TOKEN"}, Allow: []string{"api.example.com:" + tu.Port()}}),
		runner.WithCACerts(ca))
	defer m.Shutdown(context.Background())
	s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "bench", Settings: runner.Settings{Grants: []string{tools.GrantShellExec}, Always: []string{"shell"}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.FS().WriteFile(context.Background(), "ca.pem", ca, 0o644); err != nil {
		b.Fatal(err)
	}
	hostCA := filepath.Join(b.TempDir(), "ca.pem")
	if err := os.WriteFile(hostCA, ca, 0o644); err != nil {
		b.Fatal(err)
	}
	const requests = 200
	inside := func(script string) string {
		args, _ := json.Marshal(map[string]any{"command": script, "timeout": 600})
		res, err := s.Call(context.Background(), "bash", args, tools.CallOptions{})
		br, _ := res.Structured.(*tools.BashResult)
		if err != nil || br == nil || br.ExitCode != 0 {
			b.Fatalf("%s: %v %+v", script, err, res)
		}
		return br.Output
	}
	outside := func(args ...string) string {
		out, err := exec.Command(curl, args...).Output()
		if err != nil {
			b.Fatalf("curl %q: %v", args, err)
		}
		return string(out)
	}
	proxied := "http://bulk.test:" + u.Port()
	b.ResetTimer()
	for range b.N {
		viaProxy := number(b, inside(`curl -sS -o /dev/null -w '%{speed_download}' `+proxied+`/100m`))
		direct := number(b, outside("-sS", "-o", "/dev/null", "-w", "%{speed_download}", srv.URL+"/100m"))
		tlsViaProxy := number(b, inside(`curl -sS --cacert ca.pem -o /dev/null -w '%{speed_download}' https://example.com:`+tu.Port()+`/100m`))
		tlsDirect := number(b, outside("-sS", "--cacert", hostCA, "--resolve", "example.com:"+tu.Port()+":127.0.0.1", "-o", "/dev/null", "-w", "%{speed_download}", "https://example.com:"+tu.Port()+"/100m"))
		inspectedURL := "https://api.example.com:" + tu.Port()
		inspected := number(b, inside(`curl -sS -H "Authorization: Bearer $BENCH_TOKEN" -o /dev/null -w '%{speed_download}' `+inspectedURL+`/100m`))
		loop := func(base string) string {
			return fmt.Sprintf(`for i in $(seq %d); do curl -sS -o /dev/null -w '%%{time_total}\n' %s/small; done`, requests, base)
		}
		proxiedMedian := median(b, inside(loop(proxied)))
		directMedian := median(b, string(must(exec.Command("bash", "-c", loop(srv.URL)).Output())))
		// HTTPS, a new curl, connection and handshake per request: direct
		// from the host, through the tunnel, through inspection with the
		// secret; interleaved, 20 of each at a time, so that the machine's
		// load weighs on all three alike. Each curl trusts a small bundle
		// (the server's certificate; in the session, the session's
		// authority beside it): a system bundle's loading would be most
		// of its time, and all of the noise.
		tlsLoop := func(n int, curlArgs string) string {
			return fmt.Sprintf(`for i in $(seq %d); do curl -sS %s -o /dev/null -w '%%{time_total}\n'; done`, n, curlArgs)
		}
		var tlsDirectTimes, tunnel, inspectedTimes strings.Builder
		for range requests / 20 {
			tlsDirectTimes.Write(must(exec.Command("bash", "-c", tlsLoop(20, "--cacert "+hostCA+" --resolve example.com:"+tu.Port()+":127.0.0.1 https://example.com:"+tu.Port()+"/small")).Output()))
			tunnel.WriteString(inside(tlsLoop(20, "--cacert /tmp/.sandboxd/extra-ca.crt https://example.com:"+tu.Port()+"/small")))
			inspectedTimes.WriteString(inside(tlsLoop(20, `--cacert /tmp/.sandboxd/extra-ca.crt -H "Authorization: Bearer $BENCH_TOKEN" `+inspectedURL+"/small")))
		}
		tlsDirectMedian, tunnelMedian, inspectedMedian := median(b, tlsDirectTimes.String()), median(b, tunnel.String()), median(b, inspectedTimes.String())
		// The agent's stream alone, the same way (host to container): the
		// proxy's ceiling.
		start := time.Now()
		if err := s.FS().WriteFile(context.Background(), "bulk", make([]byte, size), 0o644); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(size/time.Since(start).Seconds()/1e6, "stream-write-MB/s")
		s.FS().Remove(context.Background(), "bulk")
		b.ReportMetric(viaProxy/1e6, "proxied-MB/s")
		b.ReportMetric(direct/1e6, "direct-MB/s")
		b.ReportMetric(viaProxy/direct, "throughput-ratio")
		b.ReportMetric(tlsViaProxy/1e6, "tls-proxied-MB/s")
		b.ReportMetric(tlsDirect/1e6, "tls-direct-MB/s")
		b.ReportMetric(tlsViaProxy/tlsDirect, "tls-throughput-ratio")
		b.ReportMetric(proxiedMedian*1e3, "proxied-median-ms")
		b.ReportMetric(directMedian*1e3, "direct-median-ms")
		b.ReportMetric((proxiedMedian-directMedian)*1e3, "added-median-ms")
		b.ReportMetric(inspected/1e6, "tls-inspected-MB/s")
		b.ReportMetric(tlsDirectMedian*1e3, "tls-direct-median-ms")
		b.ReportMetric(tunnelMedian*1e3, "tls-tunnel-median-ms")
		b.ReportMetric(inspectedMedian*1e3, "tls-inspected-median-ms")
		b.ReportMetric((inspectedMedian-tunnelMedian)*1e3, "inspection-over-tunnel-median-ms")
		b.ReportMetric((inspectedMedian-tlsDirectMedian)*1e3, "inspection-over-direct-median-ms")
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func number(b *testing.B, s string) float64 {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		b.Fatalf("not a number: %q", s)
	}
	return f
}

// median is the median of the numbers on the lines of s.
func median(b *testing.B, s string) float64 {
	var xs []float64
	for line := range strings.FieldsSeq(s) {
		xs = append(xs, number(b, line))
	}
	slices.Sort(xs)
	if len(xs) == 0 {
		b.Fatal("no times")
	}
	return xs[len(xs)/2]
}

// loopbackBackend is the memory backend whose workspaces take the egress
// proxy's connections on a loopback listener of the test's, as the
// agent's Accept does in a container.
type loopbackBackend struct {
	memory.Backend
	addrs   chan string  // each workspace's listener
	listens atomic.Int32 // Listen calls on the proxy's address
}

func (b *loopbackBackend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	inst, err := b.Backend.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	closeMem := inst.Close
	inst.Close = func(ctx context.Context) error { ln.Close(); return closeMem(ctx) }
	// No commands: the memory backend's run on this host, where the
	// session's trust (/tmp/.sandboxd) must not be written.
	inst.Bash = nil
	inst.Accept = func(ctx context.Context, addr string) (net.Conn, error) {
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		return ln.Accept()
	}
	inst.Listen = func(ctx context.Context, addr string) error {
		if addr == egress.ListenAddr {
			b.listens.Add(1)
		}
		return nil
	}
	b.addrs <- ln.Addr().String()
	return inst, nil
}

// TestEgressListensBeforeCreateReturns: a session's workspace listens on
// the proxy's address before the session is handed out, so that its first
// command, run at once, finds the proxy (the kubernetes TestEgress was
// refused under load when only the proxy's Accept loop, started meanwhile,
// made the agent listen).
func TestEgressListensBeforeCreateReturns(t *testing.T) {
	b := &loopbackBackend{addrs: make(chan string, 4)}
	m, err := runner.New(context.Background(), b, runner.WithEgress(egress.Policy{Allow: []string{"a.test:80"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	s, err := m.Create(t.Context(), runner.CreateRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Delete(context.Background(), "acme", s.ID())
	if n := b.listens.Load(); n != 1 {
		t.Errorf("Listen was called %d times before Create returned; want once", n)
	}
}

// TestEgressNarrowedByTenantAndSession: the operator allows two hosts, a
// tenant narrows them to one and its session keeps it; the session's proxy
// reaches that host and refuses the other, and a session asking for the
// other is refused naming its setting.
func TestEgressNarrowedByTenantAndSession(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") }))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	b := &loopbackBackend{addrs: make(chan string, 4)}
	m, err := runner.New(context.Background(), b, runner.WithEgress(
		egress.Policy{Allow: []string{"a.test:" + u.Port(), "b.test:" + u.Port()}, AllowPrivate: []string{"127.0.0.1"}},
		egress.WithResolver(names{"a.test": "127.0.0.1", "b.test": "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	ctx := context.Background()
	tenant := []string{"a.test:" + u.Port()}
	if _, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Egress: tenant, Settings: runner.Settings{Egress: []string{"b.test:" + u.Port()}}}); err == nil ||
		!strings.Contains(err.Error(), "egress") || !strings.Contains(err.Error(), "b.test:"+u.Port()) || !strings.Contains(err.Error(), "the tenant's egress") {
		t.Errorf("a session widening its tenant's egress: %v", err)
	}
	if _, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Egress: []string{"c.test:443"}}); err == nil || !strings.Contains(err.Error(), "the tenant's egress") {
		t.Errorf("a tenant widening the operator's egress: %v", err)
	}
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Egress: tenant, Settings: runner.Settings{Egress: tenant}})
	if err != nil {
		t.Fatal(err)
	}
	proxy := &url.URL{Scheme: "http", Host: <-b.addrs}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	for host, want := range map[string]int{"a.test": 200, "b.test": 403} {
		resp, err := c.Get("http://" + host + ":" + u.Port() + "/")
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s through the session's proxy: %d, want %d", host, resp.StatusCode, want)
		}
	}
	c.CloseIdleConnections()
	if err := m.Delete(ctx, "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("http://a.test:" + u.Port() + "/"); err == nil {
		t.Error("the proxy outlived its session")
	}
}
