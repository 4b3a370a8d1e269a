package e2b_test

import (
	"bufio"
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/agentbin"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

func TestMain(m *testing.M) { dockertest.Main(m, "e2b") }

// sdkDir is E2B's Python SDK and its tests, and sdkSite the two libraries
// it needs newer than Debian's (see its README).
const (
	sdkDir  = "../../shared/e2b/sdk"
	sdkSite = "../../shared/e2b/site"
)

// sdkSuites are the parts of E2B's synchronous suite TestSDK runs.
var sdkSuites = []string{"tests/sync"}

// sdkPython is the interpreter the suite runs under: Debian's, with
// Debian's packages (.ci/run installs them).
const sdkPython = "/usr/bin/python3"

// sdkModules are what the suite imports from Debian's packages.
var sdkModules = []string{"attr", "google.protobuf", "dateutil", "typing_extensions", "packaging", "wcmatch",
	"h2", "h11", "anyio", "sniffio", "certifi", "idna", "rich", "pytest", "pytest_asyncio", "pytest_timeout"}

// expectation is one line of testdata/sdk-expected.txt: a test of E2B's
// suite and whether it passes here, or why not.
type expectation struct {
	pass   bool
	reason string
	line   int
}

// readExpected reads testdata/sdk-expected.txt: "pass ID" or
// "fail ID -- REASON" a line, # comments.
func readExpected(t *testing.T) map[string]expectation {
	t.Helper()
	f, err := os.Open("testdata/sdk-expected.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]expectation{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		verdict, rest, _ := strings.Cut(line, " ")
		id, reason, _ := strings.Cut(rest, " -- ")
		id, reason = strings.TrimSpace(id), strings.TrimSpace(reason)
		switch {
		case verdict == "pass" && reason == "":
		case verdict == "fail" && reason != "":
		default:
			t.Fatalf("testdata/sdk-expected.txt:%d: want \"pass ID\" or \"fail ID -- REASON\", got %q", n, line)
		}
		if _, dup := out[id]; dup {
			t.Fatalf("testdata/sdk-expected.txt:%d: %s is listed twice", n, id)
		}
		out[id] = expectation{pass: verdict == "pass", reason: reason, line: n}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// junit is what pytest's --junitxml writes, as far as TestSDK reads it.
type junit struct {
	Suites []struct {
		Cases []struct {
			Classname string    `xml:"classname,attr"`
			Name      string    `xml:"name,attr"`
			Failure   *junitMsg `xml:"failure"`
			Error     *junitMsg `xml:"error"`
			Skipped   *junitMsg `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitMsg struct {
	Message string `xml:"message,attr"`
}

// TestSDK runs E2B's own Python SDK test suite, unchanged, against `sandboxd
// serve --e2b` on the Docker backend, and holds its outcome to
// testdata/sdk-expected.txt: every test of the suite is listed there, as
// passing or as failing with the reason (not built here, or what this
// machine lacks), and the test fails when a test expected to pass fails or
// one expected to fail passes, so the list stays true.
// SANDBOXD_E2B_SDK_TESTS, when set, runs only the parts of the suite it
// names (pytest's paths or node IDs, separated by spaces), each held to
// the list as well.
func TestSDK(t *testing.T) {
	if _, err := os.Stat(sdkDir); err != nil {
		t.Skipf("E2B's SDK is not beside the project (%v): it is in the project's shared folder", err)
	}
	probe := exec.Command(sdkPython, "-c", "import "+strings.Join(sdkModules, ", "))
	probe.Env = sdkEnv(nil)
	if out, err := probe.CombinedOutput(); err != nil {
		msg := fmt.Sprintf("%s lacks the Python packages E2B's SDK needs (.ci/run installs them with apt-get; see ../shared/e2b/README.md): %v\n%s", sdkPython, err, out)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if out, err := exec.Command("getent", "hosts", "8001-probe."+sdkDomain).CombinedOutput(); err != nil {
		msg := fmt.Sprintf("*.localhost does not resolve here (getent hosts: %v %s): the suite's sandbox ports need libnss-myhostname (.ci/run installs it with apt-get)", err, out)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dockertest.Client(t)
	dockertest.NamedImage(t, "dev") // the template base
	want := readExpected(t)

	suites, subset := sdkSuites, false
	if only := strings.Fields(os.Getenv("SANDBOXD_E2B_SDK_TESTS")); len(only) > 0 {
		suites, subset = only, true // a part of the suite: the rest's expectations are not checked
	}

	url, key, caFile := serveE2B(t)
	dir := t.TempDir()
	report := filepath.Join(dir, "junit.xml")
	args := append([]string{"-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "timeout=120", "--junitxml=" + report}, suites...)
	cmd := exec.CommandContext(t.Context(), sdkPython, args...)
	cmd.Dir = sdkDir
	// The sandboxes' envd and ports are reached as E2B's SDK builds their
	// hosts from the domain create answers (PORT-ID.DOMAIN: no
	// E2B_SANDBOX_URL, as against E2B itself), over HTTPS with a
	// certificate of the test's own authority.
	cmd.Env = sdkEnv(map[string]string{"E2B_API_KEY": key, "E2B_API_URL": url + "/e2b", "SSL_CERT_FILE": caFile})
	log, _ := os.Create(filepath.Join(dir, "pytest.log"))
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	runErr := cmd.Run()
	log.Close()
	took := time.Since(start)

	data, err := os.ReadFile(report)
	if err != nil {
		out, _ := os.ReadFile(filepath.Join(dir, "pytest.log"))
		t.Fatalf("pytest wrote no report (%v): %v\n%s", runErr, err, out)
	}
	var res junit
	if err := xml.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{} // test ID -> "" when it passed, else why not
	for _, s := range res.Suites {
		for _, c := range s.Cases {
			id := strings.ReplaceAll(c.Classname, ".", "/") + ".py::" + c.Name
			switch {
			case c.Failure != nil:
				got[id] = "failed: " + c.Failure.Message
			case c.Error != nil:
				got[id] = "error: " + c.Error.Message
			case c.Skipped != nil:
				got[id] = "skipped: " + c.Skipped.Message
			default:
				got[id] = ""
			}
		}
	}
	passed := 0
	for _, id := range slices.Sorted(maps.Keys(got)) {
		why := got[id]
		if why == "" {
			passed++
		}
		e, ok := want[id]
		switch {
		case !ok:
			t.Errorf("%s is not in testdata/sdk-expected.txt (it %s): list it", id, cmp.Or(why, "passed"))
		case e.pass && why != "":
			t.Errorf("%s was expected to pass: %s", id, strings.SplitN(why, "\n", 2)[0])
		case !e.pass && why == "":
			t.Errorf("%s passes now (testdata/sdk-expected.txt:%d expected it to fail: %s): mark it pass", id, e.line, e.reason)
		}
	}
	for id, e := range want {
		if _, ok := got[id]; !ok && !subset {
			t.Errorf("testdata/sdk-expected.txt:%d: %s is not in E2B's suite", e.line, id)
		}
	}
	summary := fmt.Sprintf("E2B's SDK suite (%s) against sandboxd serve on Docker: %d of %d passed in %v (%d expected to fail, listed with their reasons in e2b/testdata/sdk-expected.txt)",
		strings.Join(suites, " "), passed, len(got), took.Round(time.Second), len(got)-passed)
	t.Log(summary)
	if f := os.Getenv("SANDBOXD_E2B_SDK_REPORT"); f != "" { // .ci/run prints it
		os.WriteFile(f, []byte(summary+"\n"), 0o644)
	}
	if t.Failed() {
		out, _ := os.ReadFile(filepath.Join(dir, "pytest.log"))
		t.Logf("pytest's output:\n%s", out)
	}
}

// sdkEnv is the environment of the suite's Python: this one's without
// E2B's variables (E2B_DEBUG would change what the SDK does), with set and
// the SDK's path.
func sdkEnv(set map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") && !strings.HasPrefix(kv, "PYTHON") {
			env = append(env, kv)
		}
	}
	site, _ := filepath.Abs(sdkSite)
	sdk, _ := filepath.Abs(sdkDir)
	env = append(env, "PYTHONPATH="+site+":"+sdk, "PYTHONDONTWRITEBYTECODE=1")
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

// sdkDomain is the domain of the suite's sandbox ports: a name under
// .localhost, which libnss-myhostname resolves to loopback.
const sdkDomain = "sbx.localhost"

// serveE2B builds sandboxd and runs `sandboxd serve --e2b` on the Docker
// backend until the test ends, with one tenant, whose sandboxes' ports it
// serves over HTTPS on PORT-ID.sdkDomain; it returns the daemon's URL, the
// tenant's key and the PEM file of the authority of the ports'
// certificate.
func serveE2B(t *testing.T) (url, key, caFile string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandboxd")
	build := exec.Command("go", "build", "-o", bin, "../cmd/sandboxd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as .ci/run builds bin/sandboxd: the cache has it
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sandboxd: %v\n%s", err, out)
	}
	agent, err := agentbin.Path()
	if err != nil {
		t.Fatal(err)
	}
	key = "e2b_sdk_test_key"
	caFile, certFile, keyFile := testCA(t, dir, "*."+sdkDomain)
	daemon := dockertest.DaemonName("e2b-sdk")
	cfg, _ := json.Marshal(map[string]any{
		"listen":  "127.0.0.1:0",
		"backend": "docker",
		"daemon":  daemon,
		// Sessions outlive a stopped daemon unless told otherwise: the
		// suite's interrupt at its end must end what its tests left.
		"endSessionsOnExit": true,
		"tenants":           []map[string]any{{"name": "sdk", "tokens": []string{httpapi.HashToken(key)}, "maxSessions": 50}},
		"limits":            map[string]any{"sessionsPerTenant": 50},
		"policy":            dockertest.Policy(policy.Policy{Images: []string{"sandboxd/*"}}),
		"e2b": map[string]any{"enabled": true, "domain": sdkDomain, "ports": map[string]any{
			"listen": "127.0.0.1:0", "certFile": certFile, "keyFile": keyFile, "tenants": []string{"sdk"}}},
	})
	cfgFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	serve := exec.Command(bin, "serve", "--config", cfgFile)
	serve.Env = append(os.Environ(), "SANDBOXD_AGENT="+agent, "XDG_STATE_HOME="+filepath.Join(dir, "state"))
	stdout, _ := serve.StdoutPipe()
	errLog, _ := os.Create(filepath.Join(dir, "serve.log"))
	serve.Stderr = errLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// An interrupt: serve ends its sessions (their containers) and
		// exits 0; past a minute, it is killed and the test fails.
		serve.Process.Signal(os.Interrupt)
		kill := time.AfterFunc(time.Minute, func() { serve.Process.Kill() })
		defer kill.Stop()
		if err := serve.Wait(); err != nil {
			out, _ := os.ReadFile(errLog.Name())
			t.Errorf("serve after its interrupt: %v\n%s", err, out)
		}
		errLog.Close()
		if left := dockertest.Leftovers(t, make(client.Filters).Add("label", backend.LabelDaemon+"="+daemon)); len(left) > 0 {
			t.Errorf("left on the engine after serve's stop: %v", left)
		}
	})
	listening := regexp.MustCompile(`listening on (http://\S+)`)
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if m := listening.FindStringSubmatch(lines.Text()); m != nil {
			go io.Copy(io.Discard, stdout)
			return m[1], key, caFile
		}
	}
	out, _ := os.ReadFile(errLog.Name())
	t.Fatalf("serve ended before it listened:\n%s", out)
	return "", "", ""
}

// testCA makes a certificate authority and a certificate of name signed
// by it, in dir: the authority's PEM, the certificate's and its key's.
func testCA(t *testing.T, dir, name string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandboxd e2b test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	caCert, _ := x509.ParseCertificate(caDER)
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(leafKey)
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string]*pem.Block{caFile: {Type: "CERTIFICATE", Bytes: caDER}, certFile: {Type: "CERTIFICATE", Bytes: leafDER}, keyFile: {Type: "PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(f, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}
