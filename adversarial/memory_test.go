package adversarial

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/tools"
)

// The daemon's memory belongs to no tenant: each attack below runs against
// a real `sandboxd serve` under GOMEMLIMIT with a small memory budget, while
// another tenant keeps calling. The daemon's peak resident memory (VmHWM)
// must stay under memPeak, and every one of bolt's calls must succeed.
//
// Before the budget, the write deadlines and the bounded progress buffer,
// a stalled event stream grew the daemon ~80 MB/s, 24 large bodies or a few
// sparse uploads or downloads held hundreds of MB.
func TestDaemonMemory(t *testing.T) {
	const fileSize = 24 << 20 // under the transfer cap, and the tenant's share of the budget
	for _, a := range []struct {
		name   string
		attack func(t *testing.T, d *memDaemon, id string)
	}{
		{"StalledEventStream", func(t *testing.T, d *memDaemon, id string) {
			// bash `yes` streamed as events to a client that reads the first
			// one and then nothing: the command is slowed, then the call cut.
			resp := d.stream(t, id, "yes")
			defer resp.Body.Close()
			r := bufio.NewReaderSize(resp.Body, 512)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					t.Fatalf("the stream ended before its first output event: %v", err)
				}
				if line == "event: output\n" {
					break
				}
			}
			// Now read nothing until the daemon says it cut the call.
			d.waitLog(t, slowClientCut, 1, 90*time.Second)
			ended := make(chan error, 1)
			go func() { _, err := io.Copy(io.Discard, r); ended <- err }()
			select {
			case <-ended:
			case <-time.After(60 * time.Second):
				t.Error("the cut stream did not end within 60 s")
			}
		}},
		{"ConcurrentLargeBodies", func(t *testing.T, d *memDaemon, id string) {
			// 24 bodies near the body cap at once.
			content := strings.Repeat("a", 7<<20)
			codes := d.concurrently(t, 24, func(i int) (*http.Request, error) {
				body, _ := json.Marshal(map[string]any{"arguments": map[string]any{"path": fmt.Sprintf("big%d", i), "content": content}})
				return http.NewRequest("POST", d.url+"/v1/sessions/"+id+"/tools/write", bytes.NewReader(body))
			})
			t.Logf("24 large bodies: %v", codes)
		}},
		{"SparseUploads", func(t *testing.T, d *memDaemon, id string) {
			// A 3.5 KB archive whose one entry holds fileSize bytes, 8 at once.
			archive := sparseTar("big", fileSize)
			codes := d.concurrently(t, 8, func(i int) (*http.Request, error) {
				return http.NewRequest("PUT", fmt.Sprintf("%s/v1/sessions/%s/files/up%d", d.url, id, i), bytes.NewReader(archive))
			})
			t.Logf("8 sparse uploads of %d bytes in %d: %v", fileSize, len(archive), codes)
		}},
		{"ConcurrentDownloads", func(t *testing.T, d *memDaemon, id string) {
			if err := d.bash(acmeToken, id, fmt.Sprintf("head -c %d /dev/urandom > big.bin", fileSize)); err != nil {
				t.Fatal(err)
			}
			codes := d.concurrently(t, 8, func(int) (*http.Request, error) {
				return http.NewRequest("GET", d.url+"/v1/sessions/"+id+"/files/big.bin", nil)
			})
			t.Logf("8 downloads of %d bytes: %v", fileSize, codes)
		}},
		{"KeptDetachedResults", func(t *testing.T, d *memDaemon, id string) {
			// Detached reads of a 3.75 MiB image, 32 in each of 8 sessions
			// (960 MiB, were every result kept until its session ends), each
			// fetched once it ended and asked for again at the end. A result
			// past its session's cap or the tenant's share is not kept, and
			// its call says so, naming the limit.
			sessions := []string{id}
			for range 7 {
				sessions = append(sessions, d.create(t, acmeToken, map[string]any{}))
			}
			image := pngOfSize(tools.MaxImageBytes)
			var wg sync.WaitGroup
			calls := make([][]string, len(sessions))
			for i, sid := range sessions {
				if code, body := d.do(t, acmeToken, "PUT", "/v1/sessions/"+sid+"/files/", makeTar(t, &tar.Header{Name: "big.png", Typeflag: tar.TypeReg, Size: int64(len(image)), Mode: 0o644}, string(image))); code >= 300 {
					t.Fatalf("upload: %d %s", code, body)
				}
				wg.Go(func() {
					for range 32 {
						st, err := d.detach(acmeToken, sid, "read", map[string]any{"path": "big.png"})
						if err == nil {
							calls[i] = append(calls[i], st.ID)
							st, err = d.callStatus(acmeToken, sid, st.ID, 60)
						}
						if err == nil && !st.Done {
							err = fmt.Errorf("call %s not done after 60 s", st.ID)
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			kept, gone := 0, 0
			for i, sid := range sessions {
				for _, call := range calls[i] {
					st, err := d.callStatus(acmeToken, sid, call, 0)
					switch {
					case err != nil:
						t.Error(err)
					case st.Result != nil && len(st.Result.Content) == 2 && len(st.Result.Content[1].Data) == len(image):
						kept++
					case st.Error != nil && st.Error.Error == "ResultNotKept" && strings.Contains(st.Error.Message, "limits."):
						gone++
					default:
						t.Errorf("call %s: neither its result nor why it is gone: %+v", call, st)
					}
				}
			}
			t.Logf("%d detached image reads: %d results kept, %d not", kept+gone, kept, gone)
			if gone == 0 {
				t.Error("every result was kept")
			}
		}},
	} {
		t.Run(a.name, func(t *testing.T) {
			d := startMemDaemon(t)
			acme := d.create(t, acmeToken, map[string]any{"grants": []string{"fs.write", "shell.exec"}, "always": []string{"edit", "shell"}})
			bolt := d.create(t, boltToken, map[string]any{"grants": []string{"fs.write", "shell.exec"}, "always": []string{"edit", "shell"}})
			stop := make(chan struct{})
			var boltErrs []error
			var rounds int
			var wg sync.WaitGroup
			wg.Go(func() { rounds, boltErrs = d.keepWorking(bolt, stop) })
			a.attack(t, d, acme)
			close(stop)
			wg.Wait()
			for _, err := range boltErrs {
				t.Errorf("bolt, meanwhile: %v", err)
			}
			peak := d.peak(t)
			t.Logf("bolt made %d rounds of calls; the daemon's peak resident memory: %d MiB", rounds, peak>>20)
			if peak > memPeak {
				t.Errorf("the daemon's peak resident memory was %d MiB, over %d MiB", peak>>20, memPeak>>20)
			}
		})
	}
}

// pngOfSize is a PNG of size bytes: a header of 64×64 pixels, then
// padding, which is all read looks at before it sends an image.
func pngOfSize(size int) []byte {
	b := make([]byte, size)
	copy(b, "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x40\x00\x00\x00\x40\x08\x06\x00\x00\x00")
	return b
}

// detach starts a detached call, waiting for a slot of calls in flight
// while the session has none free (429).
func (d *memDaemon) detach(token, id, tool string, args map[string]any) (httpapi.CallStatus, error) {
	var st httpapi.CallStatus
	body, _ := json.Marshal(map[string]any{"arguments": args, "detach": true})
	err := d.sendUntil(token, "POST", "/v1/sessions/"+id+"/tools/"+tool, body, http.StatusTooManyRequests, http.StatusAccepted, &st)
	return st, err
}

// callStatus fetches a detached call's status, waiting up to wait seconds
// for it to end, and retrying while the daemon's memory is in use (503).
func (d *memDaemon) callStatus(token, id, call string, wait int) (httpapi.CallStatus, error) {
	var st httpapi.CallStatus
	err := d.sendUntil(token, "GET", fmt.Sprintf("/v1/sessions/%s/calls/%s?wait=%d", id, call, wait), nil, http.StatusServiceUnavailable, http.StatusOK, &st)
	return st, err
}

// sendUntil sends a request again while it is answered retry, and decodes
// an answer of want into out.
//
// A GET whose answer was cut short is asked again, three times at most:
// the daemon's 3 s write deadline cuts a client that leaves 64 KiB of it
// untaken that long, which a loaded machine's race-built test client,
// reading eight such answers at once, can do; asking again is what a
// client does, and the deadline is the daemon's defence under test.
func (d *memDaemon) sendUntil(token, method, path string, body []byte, retry, want int, out any) error {
	for cut := 0; ; {
		code, data, err := d.send(token, method, path, body)
		switch {
		case err != nil && method == "GET" && errors.Is(err, io.ErrUnexpectedEOF) && cut < 3:
			cut++
			continue
		case err != nil:
			return err
		case code == retry:
			time.Sleep(50 * time.Millisecond)
			continue
		case code != want:
			return fmt.Errorf("%s %s: %d %.300s", method, path, code, data)
		}
		return json.Unmarshal(data, out)
	}
}

// acmeClient has connections of its own, as another tenant's would.
var acmeClient = &http.Client{Transport: &http.Transport{}}

// send makes one request off the test's goroutine.
func (d *memDaemon) send(token, method, path string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, d.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := acmeClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		err = fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return resp.StatusCode, data, err
}

// stream starts acme's bash command as server-sent events and returns the
// response once its first event is sent.
func (d *daemon) stream(t *testing.T, id, command string) *http.Response {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"arguments": map[string]any{"command": command}})
	req, _ := http.NewRequest("POST", d.url+"/v1/sessions/"+id+"/tools/bash", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+acmeToken)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// The daemon under attack runs with these bounds; memPeak is the resident
// memory it must stay under: its own, a budget's worth of requests, and the
// slack of a collector that runs at GOMEMLIMIT.
const (
	memBudget = 64 << 20
	memLimit  = "96MiB"
	memPeak   = 192 << 20
)

// memDaemon is `sandboxd serve` on the local backend as a process under
// GOMEMLIMIT, with tenants acme and bolt, whose logs a test can wait on.
type memDaemon struct {
	daemon
	pid  int
	mu   sync.Mutex
	logs []string
	more chan struct{} // a log line arrived
}

func startMemDaemon(t *testing.T) *memDaemon {
	bin := sandboxdBinary(t)
	dir := t.TempDir()
	cfg := map[string]any{"listen": "127.0.0.1:0", "backend": "local", "dataDir": filepath.Join(dir, "data"), "daemon": "adv-memory",
		"tenants": []httpapi.Tenant{
			{Name: "acme", Tokens: []string{httpapi.HashToken(acmeToken)}},
			{Name: "bolt", Tokens: []string{httpapi.HashToken(boltToken)}},
		},
		"limits": map[string]any{"maxBodyBytes": 8 << 20, "maxTransferBytes": 48 << 20, "memoryBudgetBytes": memBudget},
		"http":   map[string]any{"writeTimeout": "3s"},
		"tools":  map[string]any{"maxFileBytes": 4 << 20, "maxCallsPerRun": 0}}
	raw, _ := json.Marshal(cfg)
	file := filepath.Join(dir, "config.json")
	os.WriteFile(file, raw, 0o600)
	cmd := exec.Command(bin, "serve", "--config", file)
	cmd.Env = append(os.Environ(), "GOMEMLIMIT="+memLimit, "TMPDIR="+dir)
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	d := &memDaemon{pid: cmd.Process.Pid, more: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.logs = append(d.logs, sc.Text())
			d.mu.Unlock()
			select {
			case d.more <- struct{}{}:
			default:
			}
		}
	}()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), "listening on "); ok {
			d.url = strings.Fields(rest)[0]
			go io.Copy(io.Discard, stdout)
			return d
		}
	}
	t.Fatal("sandboxd serve did not say where it listens")
	return nil
}

// peak returns the daemon's peak resident memory so far, in bytes.
func (d *memDaemon) peak(t *testing.T) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.pid))
	if err != nil {
		t.Fatalf("the daemon's status: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM: %q", line)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

// slowClientCut is what the daemon logs when it cuts a call or a download
// whose client took none of its response for the write timeout.
const slowClientCut = "call cut: its client stopped reading"

// waitLog waits until the daemon logs n lines holding s, failing after
// within, or as soon as the daemon's memory passes memPeak.
func (d *memDaemon) waitLog(t *testing.T, s string, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		d.mu.Lock()
		found := 0
		for _, l := range d.logs {
			if strings.Contains(l, s) {
				found++
			}
		}
		d.mu.Unlock()
		if found >= n {
			return
		}
		select {
		case <-d.more:
		case <-tick.C:
			if p := d.peak(t); p > memPeak {
				t.Fatalf("waiting for %q, the daemon's memory passed %d MiB", s, p>>20)
			}
		case <-deadline:
			t.Fatalf("the daemon did not log %q within %v", s, within)
		}
	}
}

// concurrently sends n of acme's requests at once and returns how many
// answered each status (0: the connection failed, as when the daemon
// refuses a body before reading it all). Every answer must be a success or
// a 503 with Retry-After, and every download a whole archive, unless the
// daemon cut it for a client that stopped reading: the write timeout is
// short here, and a client starved of the CPU for that long is cut, by
// design, mid-body. Such a cut must be logged as one.
func (d *memDaemon) concurrently(t *testing.T, n int, request func(i int) (*http.Request, error)) map[int]int {
	// acme's connections of its own, as another tenant's client would have:
	// bolt, on the default client, never reuses one the daemon broke off.
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	codes := map[int]int{}
	cut := 0 // downloads that began but broke off
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := request(i)
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Authorization", "Bearer "+acmeToken)
			code := 0
			if resp, err := client.Do(req); err == nil {
				body, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
				switch {
				case code == http.StatusOK && req.Method == "GET" && rerr != nil:
					t.Logf("a download cut after %d bytes: %v", len(body), rerr)
					mu.Lock()
					cut++
					mu.Unlock()
				case code == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "":
					t.Errorf("503 without Retry-After: %s", body)
				case code != http.StatusOK && code != http.StatusServiceUnavailable:
					t.Errorf("%s %s: %d %s", req.Method, req.URL.Path, code, body)
				case code == http.StatusOK && req.Method == "GET":
					if n := len(tarNames(t, body)); n != 1 {
						t.Errorf("a download of one file held %d entries", n)
					}
				}
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if cut > 0 {
		d.waitLog(t, slowClientCut, cut, 30*time.Second)
	}
	return codes
}

// keepWorking makes rounds of bolt's calls — a write, a read of it, a
// command — until stop is closed and at least three rounds are done, and
// returns the rounds and what failed.
func (d *memDaemon) keepWorking(id string, stop <-chan struct{}) (int, []error) {
	var errs []error
	for round := 0; ; round++ {
		select {
		case <-stop:
			if round >= 3 {
				return round, errs
			}
		default:
		}
		want := fmt.Sprintf("bolt round %d", round)
		for _, c := range []struct {
			tool string
			args map[string]any
			want string
		}{
			{"write", map[string]any{"path": "bolt.txt", "content": want}, ""},
			{"read", map[string]any{"path": "bolt.txt"}, want},
			{"bash", map[string]any{"command": "echo " + strconv.Quote(want)}, want},
		} {
			if err := d.tryCall(boltToken, id, c.tool, c.args, c.want); err != nil {
				errs = append(errs, fmt.Errorf("round %d: %w", round, err))
			}
		}
		if len(errs) > 5 {
			return round, errs
		}
	}
}

// tryCall makes one call and says what went wrong, for use off the test's
// goroutine.
func (d *memDaemon) tryCall(token, id, tool string, args map[string]any, want string) error {
	body, _ := json.Marshal(map[string]any{"arguments": args})
	req, _ := http.NewRequest("POST", d.url+"/v1/sessions/"+id+"/tools/"+tool, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var res apiResult
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &res) != nil || res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, want) {
		return fmt.Errorf("%s: %d %.300s", tool, resp.StatusCode, data)
	}
	return nil
}

func (d *memDaemon) bash(token, id, command string) error {
	return d.tryCall(token, id, "bash", map[string]any{"command": command}, "")
}

// sparseTar is an archive in GNU's PAX sparse format 1.0 (which
// archive/tar reads but does not write) of one file name of size bytes,
// all a hole but its last byte: about 3.5 KB on the wire.
func sparseTar(name string, size int64) []byte {
	pad := func(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }
	header := func(name string, typ byte, size int) []byte {
		h := make([]byte, 512)
		copy(h, name)
		copy(h[100:], "0000644\x00")
		copy(h[108:], "0000000\x000000000\x00")
		copy(h[124:], fmt.Sprintf("%011o\x00%011o\x00", size, 0))
		h[156] = typ
		copy(h[257:], "ustar\x0000")
		copy(h[148:], "        ")
		sum := 0
		for _, b := range h {
			sum += int(b)
		}
		copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
		return h
	}
	record := func(k, v string) string { // "LEN key=value\n", LEN counting itself
		s := " " + k + "=" + v + "\n"
		n := len(s) + 1
		for len(strconv.Itoa(n))+len(s) != n {
			n = len(strconv.Itoa(n)) + len(s)
		}
		return strconv.Itoa(n) + s
	}
	pax := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") +
		record("GNU.sparse.name", name) + record("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	data := append(pad(fmt.Appendf(nil, "1\n%d\n1\n", size-1)), 'x') // the map: one byte of data at the end
	var b bytes.Buffer
	b.Write(header("PaxHeaders/"+name, tar.TypeXHeader, len(pax)))
	b.Write(pad([]byte(pax)))
	b.Write(header("GNUSparseFile.0/"+name, tar.TypeReg, len(data)))
	b.Write(pad(data))
	b.Write(make([]byte, 1024))
	return b.Bytes()
}

// The smaller findings of the same review: /metrics shows every tenant's
// activity, so only a metrics token reads it; a download leaves out links
// that lead outside the workspace, as an upload refuses them; an upload may
// not write sandboxd's own directory under any case of its name.
func TestDaemonFindings(t *testing.T) {
	for _, backend := range []string{"local", "docker"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			d := newDaemon(t, daemonConfig{backend: backend, writeTimeout: 3 * time.Second})
			id := d.create(t, acmeToken, map[string]any{"grants": []string{"fs.write", "shell.exec"}, "always": []string{"edit", "shell"}})
			t.Run("StalledEventStreamIsCut", func(t *testing.T) {
				// `yes` streamed to a client that stops reading: the command is
				// held back (on Docker, through the agent's flow control) and
				// the call cut after the write timeout; the session lives on.
				resp := d.stream(t, id, "yes")
				defer resp.Body.Close()
				inFlight := func() int {
					var info struct{ CallsInFlight int }
					_, raw := d.do(t, acmeToken, "GET", "/v1/sessions/"+id, nil)
					json.Unmarshal(raw, &info)
					return info.CallsInFlight
				}
				deadline := time.Now().Add(90 * time.Second)
				for inFlight() != 0 {
					if time.Now().After(deadline) {
						t.Fatal("the call of a client that stopped reading was still running after 90 s")
					}
					time.Sleep(100 * time.Millisecond)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err == nil {
					t.Error("the cut stream ended as if whole")
				}
				if res := d.call(t, acmeToken, id, "bash", map[string]any{"command": "echo alive"}); res.IsError || !strings.Contains(res.Content[0].Text, "alive") {
					t.Errorf("the session after the cut: %+v", res)
				}
			})
			t.Run("MetricsNeedTheirToken", func(t *testing.T) {
				d.call(t, acmeToken, id, "ls", map[string]any{"path": "."})
				for _, tok := range []string{"", acmeToken, boltToken, metricsToken + "x"} {
					if code, body := d.do(t, tok, "GET", "/metrics", nil); code != http.StatusUnauthorized {
						t.Errorf("/metrics with token %q: %d %.200s", tok, code, body)
					}
				}
				code, body := d.do(t, metricsToken, "GET", "/metrics", nil)
				if code != http.StatusOK || !bytes.Contains(body, []byte("sandboxd_sessions 1")) {
					t.Errorf("/metrics with the metrics token: %d %.300s", code, body)
				}
			})
			t.Run("DownloadLeavesOutLinksOutside", func(t *testing.T) {
				res := d.call(t, acmeToken, id, "bash", map[string]any{"command": "mkdir -p dl/sub && cd dl && echo in > inside.txt && " +
					"ln -s inside.txt in && ln -s ../inside.txt sub/up && ln -s /etc/passwd abs && ln -s ../../../../../../etc out && ln -s ../../.. sub/top && echo ok"})
				if res.IsError || !strings.Contains(res.Content[0].Text, "ok") {
					t.Fatalf("making the links: %+v", res)
				}
				names := tarNames(t, d.download(t, id, "dl"))
				slices.Sort(names)
				if want := []string{"in", "inside.txt", "sub/", "sub/up"}; !slices.Equal(names, want) {
					t.Errorf("download of dl/: %q, want %q", names, want)
				}
			})
			t.Run("UploadRefusesSandboxdDirInAnyCase", func(t *testing.T) {
				for _, name := range []string{".sandboxd/x", ".SANDBOXD/x", ".Sandboxd/journal/x", "./.sAnDbOxD/runtime/x"} {
					archive := makeTar(t, &tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, "x")
					if code, body := d.do(t, acmeToken, "PUT", "/v1/sessions/"+id+"/files/", archive); code < 400 || code >= 500 {
						t.Errorf("upload of %s: %d %s", name, code, body)
					}
				}
				code, body := d.do(t, acmeToken, "PUT", "/v1/sessions/"+id+"/files/.SANDBOXD", makeTar(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, "x"))
				if code < 400 || code >= 500 {
					t.Errorf("upload into .SANDBOXD/: %d %s", code, body)
				}
				res := d.call(t, acmeToken, id, "bash", map[string]any{"command": "ls -a; ls -a .sandboxd 2>&1"})
				if strings.Contains(strings.ToLower(res.Content[0].Text), "\nx\n") || strings.Contains(res.Content[0].Text, "SANDBOXD") || strings.Contains(res.Content[0].Text, "Sandboxd") {
					t.Errorf("an upload wrote: %s", res.Content[0].Text)
				}
			})
			t.Run("UploadThroughALinkIntoSandboxd", func(t *testing.T) {
				// Links the session made into sandboxd's directory, by every
				// spelling: the upload is judged where it lands, not by its name.
				res := d.call(t, acmeToken, id, "bash", map[string]any{"command": "mkdir -p .sandboxd/runtime lk/sub && ln -s .sandboxd j && ln -s .sandboxd/runtime jr && " +
					"ln -s ../.sandboxd lk/up && ln -s \"$PWD/.sandboxd\" abs && ln -s ../j lk/sub/twice && ln -s lk/up/runtime deep && echo ok"})
				if res.IsError || !strings.Contains(res.Content[0].Text, "ok") {
					t.Fatalf("making the links: %+v", res)
				}
				file := func(name string) []byte {
					return makeTar(t, &tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 2, Mode: 0o644}, "x\n")
				}
				for _, u := range []struct{ dir, entry string }{
					{"j", "planted"}, {"jr", "planted"}, {"lk/up", "planted"}, {"abs", "planted"}, {"lk/sub/twice", "planted"}, {"deep", "planted"},
					{"", "j/planted"}, {"", "jr/planted"}, {"lk", "up/planted"}, {"", "abs/runtime/planted"}, {"lk/sub", "twice/planted"},
					{"j/runtime", "planted"}, {"", "deep/planted"},
				} {
					if code, body := d.do(t, acmeToken, "PUT", "/v1/sessions/"+id+"/files/"+u.dir, file(u.entry)); code < 400 || code >= 500 {
						t.Errorf("upload of %s into %q: %d %s", u.entry, u.dir, code, body)
					}
				}
				res = d.call(t, acmeToken, id, "bash", map[string]any{"command": "find .sandboxd -name planted"})
				if strings.Contains(res.Content[0].Text, "planted") {
					t.Errorf("an upload wrote into .sandboxd/: %s", res.Content[0].Text)
				}
				// A link that leads elsewhere in the workspace is still written through.
				d.call(t, acmeToken, id, "bash", map[string]any{"command": "mkdir -p real && ln -s real fine"})
				if code, body := d.do(t, acmeToken, "PUT", "/v1/sessions/"+id+"/files/fine", file("ok.txt")); code != http.StatusOK {
					t.Errorf("upload through a link to real/: %d %s", code, body)
				}
			})
		})
	}
}
