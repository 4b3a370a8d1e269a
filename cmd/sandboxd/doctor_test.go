package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/system"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/sessionca"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// fakeEngine is a Docker Engine API on a unix socket, answering what
// doctor and serve's start ask: ping, version, info, image inspect, import
// and tag, and empty container and volume lists.
type fakeEngine struct {
	api  string // the API version it speaks
	info system.Info

	mu       sync.Mutex
	images   map[string]int64 // reference → size
	imported []string         // references imported, in order
}

// start serves e and points DOCKER_HOST at it for the rest of the test.
func (e *fakeEngine) start(t *testing.T) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	version := regexp.MustCompile(`^/v[0-9.]+`)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := version.ReplaceAllString(r.URL.Path, "")
		w.Header().Set("Api-Version", e.api)
		w.Header().Set("Ostype", "linux")
		switch {
		case p == "/_ping":
			io.WriteString(w, "OK")
		case p == "/version":
			json.NewEncoder(w).Encode(map[string]string{"Version": "99.0-fake", "ApiVersion": e.api, "MinAPIVersion": "1.12", "Os": "linux", "Arch": "amd64"})
		case p == "/info":
			json.NewEncoder(w).Encode(e.info)
		case strings.HasPrefix(p, "/images/") && strings.HasSuffix(p, "/json"):
			e.mu.Lock()
			size, ok := e.images[strings.TrimSuffix(strings.TrimPrefix(p, "/images/"), "/json")]
			e.mu.Unlock()
			if !ok {
				w.WriteHeader(http.StatusNotFound)
				io.WriteString(w, `{"message":"No such image"}`)
				return
			}
			json.NewEncoder(w).Encode(map[string]any{"Id": "sha256:fake", "Size": size})
		case p == "/images/create":
			n, _ := io.Copy(io.Discard, r.Body)
			ref := r.URL.Query().Get("repo")
			e.mu.Lock()
			e.images[ref] = n
			e.imported = append(e.imported, ref)
			e.mu.Unlock()
			io.WriteString(w, `{"status":"sha256:fake"}`+"\n")
		case strings.HasPrefix(p, "/images/") && strings.HasSuffix(p, "/tag"):
			w.WriteHeader(http.StatusCreated)
		case p == "/containers/json":
			io.WriteString(w, "[]")
		case p == "/volumes":
			io.WriteString(w, `{"Volumes":[]}`)
		case p == "/containers/create": // serve's marker (backend.Claimer)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"Id":"fake-marker"}`)
		case r.Method == http.MethodDelete && p == "/containers/fake-marker":
			w.WriteHeader(http.StatusNoContent)
		default:
			t.Errorf("fake engine: unexpected %s %s", r.Method, r.URL)
			w.WriteHeader(http.StatusNotImplemented)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	t.Setenv("DOCKER_HOST", "unix://"+sock)
}

// healthyInfo is what a well set up engine reports.
func healthyInfo() system.Info {
	return system.Info{
		MemoryLimit: true, SwapLimit: true, PidsLimit: true, CPUCfsQuota: true,
		CgroupVersion: "2", CgroupDriver: "systemd", DefaultRuntime: "runc",
		Runtimes:        map[string]system.RuntimeWithStatus{"runc": {}},
		SecurityOptions: []string{"name=seccomp,profile=builtin", "name=cgroupns"},
	}
}

// agentHere points SANDBOXD_AGENT at a static binary so the agent check
// passes (it only reads the ELF header).
func agentHere(t *testing.T) {
	t.Setenv("SANDBOXD_AGENT", filepath.Join(filepath.Dir(sandboxdBin), "sandboxd-agent"))
}

// doctorLines runs doctor in process and returns its exit status and its
// report as status and detail by check name, failing on a warning or
// failure printed without a fix.
func doctorLines(t *testing.T, args ...string) (int, map[string]string, string) {
	t.Helper()
	code, out, errs := runInProcess(t, append([]string{"doctor"}, args...)...)
	lines := map[string]string{}
	rows := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i, row := range rows {
		f := strings.Fields(row)
		if len(f) < 2 || f[0] == "fix:" {
			continue
		}
		name := f[1]
		if f[1] == "image" && len(f) > 2 && !strings.Contains(f[2], "/") {
			name += " " + f[2]
		}
		lines[name] = row
		if (f[0] == "warn" || f[0] == "fail") && (i+1 == len(rows) || !strings.HasPrefix(strings.TrimSpace(rows[i+1]), "fix: ")) {
			t.Errorf("%q has no fix line after it", row)
		}
	}
	return code, lines, out + errs
}

func wantCheck(t *testing.T, lines map[string]string, name, status, detail string) {
	t.Helper()
	row, ok := lines[name]
	if !ok || !strings.HasPrefix(row, status+" ") || !strings.Contains(row, detail) {
		t.Errorf("check %s: %q, want %s with %q", name, row, status, detail)
	}
}

func TestDoctorUnreachable(t *testing.T) {
	agentHere(t)
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no.sock"))
	code, lines, out := doctorLines(t)
	if code != 1 || !strings.Contains(out, "start the engine") {
		t.Errorf("exit %d, want 1 with a fix that starts the engine:\n%s", code, out)
	}
	wantCheck(t, lines, "docker", "fail", "cannot reach the engine")
	wantCheck(t, lines, "agent", "ok", "sandboxd-agent")
	wantCheck(t, lines, "cgroups", "skip", "needs a reachable engine")
	wantCheck(t, lines, "disk", "ok", "free for image build cache")
	if _, ok := lines["engine"]; !ok {
		t.Error("no engine line")
	}

	t.Setenv("DOCKER_HOST", "bogus://x")
	_, lines, _ = doctorLines(t)
	wantCheck(t, lines, "docker", "fail", "bogus://x")
}

// TestDoctorSources: each declared source gets a line, checked without the
// engine; a missing credential fails with where to put it, never printed.
func TestDoctorSources(t *testing.T) {
	agentHere(t)
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no.sock"))
	t.Setenv("SANDBOXD_DOCTOR_TOKEN", "doctor-s3cret")
	docs := t.TempDir()
	cfg := `{"tools": {"sources": [
		{"name": "docs", "kind": "dir", "path": "` + docs + `"},
		{"name": "gone", "kind": "dir", "path": "` + filepath.Join(docs, "gone") + `"},
		{"name": "api", "kind": "http", "url": "https://api.example.com", "requests": [{"method": "GET", "path": "/x"}],
		 "credential": {"header": "Authorization", "env": "SANDBOXD_DOCTOR_TOKEN"}},
		{"name": "api2", "kind": "http", "url": "https://api.example.com/2", "requests": [{"method": "GET", "path": "/x"}],
		 "credential": {"header": "Authorization", "env": "SANDBOXD_DOCTOR_UNSET"}}]}}`
	file := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	_, lines, out := doctorLines(t, "--config", file)
	wantCheck(t, lines, "source:docs", "ok", "dir "+docs)
	wantCheck(t, lines, "source:gone", "fail", "no such file")
	wantCheck(t, lines, "source:api", "ok", "credential from SANDBOXD_DOCTOR_TOKEN")
	wantCheck(t, lines, "source:api2", "fail", "SANDBOXD_DOCTOR_UNSET is unset")
	if !strings.Contains(out, "fix: set SANDBOXD_DOCTOR_UNSET in the daemon's environment") || strings.Contains(out, "doctor-s3cret") {
		t.Errorf("doctor's report:\n%s", out)
	}
}

// doctorCase is a case of TestDoctorFakeEngine.
type doctorCase struct {
	name   string
	api    string
	info   func(*system.Info)
	config string
	code   int
	want   [][3]string // check, status, detail
}

func TestDoctorFakeEngine(t *testing.T) {
	agentHere(t)
	minimal, _ := images.Lookup("minimal")
	for _, tc := range []doctorCase{
		{name: "healthy", api: "1.47", code: 0, want: [][3]string{
			{"docker", "ok", "reachable at unix://"}, {"engine", "ok", "API 1.47"},
			{"image minimal", "ok", minimal.Ref()}, {"image dev", "warn", "is not built"},
			{"runtime", "ok", "sessions use runc"}, {"cgroups", "ok", "v2 (systemd driver)"},
			{"seccomp", "ok", "profile=builtin"}, {"userns", "ok", "no remapping"},
		}},
		{name: "old engine, no limits, no seccomp", api: "1.40", code: 1, info: func(i *system.Info) {
			i.CgroupVersion, i.PidsLimit, i.SwapLimit, i.SecurityOptions = "1", false, false, []string{"name=userns"}
		}, want: [][3]string{
			{"engine", "warn", "tested with API 1.41"}, {"cgroups", "fail", "cannot limit pids"},
			{"seccomp", "warn", "no seccomp"}, {"userns", "ok", "userns-remap"},
		}},
		{name: "runsc configured, missing", api: "1.47", code: 1,
			config: `{"policy": {"runtimes": ["runsc"], "defaultImage": "example/tools:1"}}`,
			want:   [][3]string{{"runtime", "fail", "no runsc runtime"}, {"image", "fail", "example/tools:1 (policy.defaultImage)"}}},
		{name: "no memory cgroup, no cpu quota", api: "1.41", code: 1, info: func(i *system.Info) {
			i.MemoryLimit, i.CPUCfsQuota = false, false
		}, want: [][3]string{{"cgroups", "fail", "cannot limit memory"}}},
		{name: "workspace disk off", api: "1.47", code: 0,
			want: [][3]string{{"workspace-disk", "warn", "disk is not bounded (limits.workspaceDisk is off)"}}},
		diskCase(),
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &fakeEngine{api: tc.api, info: healthyInfo(), images: map[string]int64{minimal.Ref(): 2e6}}
			if tc.info != nil {
				tc.info(&e.info)
			}
			e.start(t)
			var args []string
			if tc.config != "" {
				file := filepath.Join(t.TempDir(), "sandboxd.json")
				if err := os.WriteFile(file, []byte(tc.config), 0o644); err != nil {
					t.Fatal(err)
				}
				args = []string{"--config", file}
			}
			code, lines, out := doctorLines(t, args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				wantCheck(t, lines, w[0], w[1], w[2])
			}
			if t.Failed() {
				t.Log(out)
			}
		})
	}
}

// diskCase is TestDoctorFakeEngine's case of limits.workspaceDisk loop:
// it works for root (CI), and fails naming root for anyone else.
func diskCase() (c doctorCase) {
	c.name, c.api, c.config = "workspace disk loop", "1.47", `{"limits": {"workspaceDisk": "loop", "workspaceBytes": 67108864}}`
	if os.Geteuid() == 0 {
		c.want = [][3]string{{"workspace-disk", "ok", "a file system of 67108864 bytes of its own"}}
	} else {
		c.code, c.want = 1, [][3]string{{"workspace-disk", "fail", "needs root"}}
	}
	return c
}

// TestDoctorRealEngine runs doctor, as built, against the engine of this
// machine: Docker, the engine and the agent must pass, and the exit status
// must agree with the report.
func TestDoctorRealEngine(t *testing.T) {
	dockertest.Client(t)
	code, out, errs := runBinary(t, "doctor")
	for _, name := range []string{"agent", "docker", "engine", "image minimal", "runtime", "seccomp"} {
		if !regexp.MustCompile(`(?m)^ok +`+name+` `).MatchString(out) && !(name == "image minimal" && strings.Contains(out, "warn  image minimal")) {
			t.Errorf("no ok line for %s:\n%s", name, out)
		}
	}
	failed := regexp.MustCompile(`(?m)^fail `).MatchString(out)
	if failed != (code != 0) {
		t.Errorf("exit %d with a report that fails: %v\n%s%s", code, failed, out, errs)
	}
}

// TestDoctorTrust: doctor warns when the host trusts a certificate
// authority its administrator added that sessions do not (caCerts names
// others), says so when they do (caCerts left out: the host's), and fails
// a caCerts file that is not certificates; a secret's line says where it
// is read from, and fails, naming the fix, when it cannot be — never
// printing it.
func TestDoctorTrust(t *testing.T) {
	agentHere(t)
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no.sock"))
	t.Setenv("SANDBOXD_DOCTOR_SECRET", "doctor-s3cret-value")
	hostDir := t.TempDir()
	old := hostCADirs
	hostCADirs = []string{hostDir}
	t.Cleanup(func() { hostCADirs = old })
	writeCA := func(dir, name string) string {
		ca, err := sessionca.New(name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		defer ca.Close()
		file := filepath.Join(dir, name+".crt")
		if err := os.WriteFile(file, ca.CertPEM(), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	writeCA(hostDir, "corporate")
	other := writeCA(t.TempDir(), "other")
	notPEM := filepath.Join(t.TempDir(), "x.crt")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o644)
	config := func(body string) string {
		file := filepath.Join(t.TempDir(), "sandboxd.json")
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}

	_, lines, out := doctorLines(t, "--config", config(`{"caCerts": [`+strconv.Quote(other)+`]}`))
	wantCheck(t, lines, "trust", "warn", `"sandboxd session corporate"`)
	if !strings.Contains(out, "fix: add their files to caCerts") {
		t.Errorf("doctor's report:\n%s", out)
	}
	_, lines, _ = doctorLines(t)
	wantCheck(t, lines, "trust", "ok", "sessions trust the 1 certificate authorities this host's administrator added")
	_, lines, _ = doctorLines(t, "--config", config(`{"caCerts": [`+strconv.Quote(notPEM)+`]}`))
	wantCheck(t, lines, "trust", "fail", "want PEM certificates")

	_, lines, out = doctorLines(t, "--config", config(`{"egress": {"allow": ["api.example.com:443"]}, "secrets": [
		{"name": "API_TOKEN", "env": "SANDBOXD_DOCTOR_SECRET", "allow": ["api.example.com:443"]},
		{"name": "OTHER", "env": "SANDBOXD_DOCTOR_UNSET", "allow": ["api.example.com:443"]}]}`))
	wantCheck(t, lines, "secret:API_TOKEN", "ok", "from SANDBOXD_DOCTOR_SECRET, for api.example.com:443")
	wantCheck(t, lines, "secret:OTHER", "fail", "SANDBOXD_DOCTOR_UNSET is unset")
	if !strings.Contains(out, "fix: set SANDBOXD_DOCTOR_UNSET in the daemon's environment") || strings.Contains(out, "doctor-s3cret-value") {
		t.Errorf("doctor's report:\n%s", out)
	}
}

// TestDoctorGVisor starts a session under each runtime doctor checks: runc
// serves, and on the gVisor engine (dockertest.EnvGVisorHost) runsc, with
// the fix, serves on gVisor's kernel while Debian's runsc, whose kernel
// follows links open(2) is told not to, is refused by the agent — and
// doctor names the fix.
func TestDoctorGVisor(t *testing.T) {
	cli := dockertest.Client(t)
	img := dockertest.Image(t)
	agentHere(t)
	if c := probeRuntime(t.Context(), cli, img, policy.RuntimeRunc); c.status != statusOK || !strings.Contains(c.detail, "Linux") {
		t.Errorf("runc: %+v", c)
	}
	if !dockertest.GVisor() {
		return
	}
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(host.Release[:])
	if c := probeRuntime(t.Context(), cli, img, policy.RuntimeRunsc); c.status != statusOK || !strings.Contains(c.detail, "Linux ") || strings.Contains(c.detail, release) {
		t.Errorf("runsc built with the fix: %+v; want a session on gVisor's kernel, not the host's (%s)", c, release)
	}
	c := probeRuntime(t.Context(), cli, img, "runsc-debian")
	if c.status != statusFail || !strings.Contains(c.detail, "follows symbolic links") || c.fix != runscFixed {
		t.Errorf("Debian's runsc (.ci/gvisor.sh registers it as runsc-debian): %+v; want a failure naming the link bug and the fix", c)
	}
	if !strings.Contains(localfs.ErrKernelFollowsLinks.Error(), followsLinks) {
		t.Errorf("localfs.ErrKernelFollowsLinks %q does not say %q, which doctor looks for", localfs.ErrKernelFollowsLinks, followsLinks)
	}
}
