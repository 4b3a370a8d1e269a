package adversarial

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// daemonBackends runs f per backend of the daemon: memory always, docker
// (failing under CI when the engine is missing).
func daemonBackends(t *testing.T, f func(t *testing.T, backend string)) {
	for _, b := range []string{"memory", "docker"} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// Another tenant's sessions do not exist for a caller: guessed IDs, reused
// tokens and a session's ID with the wrong token are 404 for every route,
// and settings asking for privileges are 403 with nothing started.
func TestTenants(t *testing.T) {
	daemonBackends(t, func(t *testing.T, backend string) {
		d := newDaemon(t, daemonConfig{backend: backend})
		id := d.create(t, acmeToken, map[string]any{"grants": []string{"fs.write"}, "always": []string{"edit"}})
		if res := d.call(t, acmeToken, id, "write", map[string]any{"path": "mine.txt", "content": "acme's"}); res.IsError {
			t.Fatalf("write: %+v", res)
		}
		t.Run("IDsGuessedAndTokensReused", func(t *testing.T) {
			guesses := []string{id, strings.ToUpper(id), id + "x", id[:len(id)-1], "../" + id, "s-0", "*"}
			tar := makeTar(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, "x")
			for _, g := range guesses {
				for _, r := range []struct {
					method, path string
					body         any
				}{
					{"GET", "/v1/sessions/" + g, nil},
					{"GET", "/v1/sessions/" + g + "/tools", nil},
					{"POST", "/v1/sessions/" + g + "/tools/read", map[string]any{"arguments": map[string]any{"path": "mine.txt"}}},
					{"GET", "/v1/sessions/" + g + "/files/mine.txt", nil},
					{"PUT", "/v1/sessions/" + g + "/files/up", tar},
					{"DELETE", "/v1/sessions/" + g, nil},
				} {
					code, body := d.do(t, boltToken, r.method, r.path, r.body)
					if code != http.StatusNotFound && code != http.StatusBadRequest {
						t.Errorf("bolt %s %s: %d %s", r.method, r.path, code, body)
					}
					if bytes.Contains(body, []byte("acme's")) {
						t.Errorf("bolt saw acme's file: %s", body)
					}
				}
			}
			for _, tok := range []string{"", "Bearer", acmeToken + " ", strings.ToUpper(acmeToken), acmeToken[:len(acmeToken)-1], httpapi.HashToken(acmeToken)} {
				code, _ := d.do(t, tok, "GET", "/v1/sessions/"+id, nil)
				if code != http.StatusUnauthorized && !(tok == acmeToken+" " && code == http.StatusOK) {
					t.Errorf("token %q: %d", tok, code)
				}
			}
			code, body := d.do(t, boltToken, "GET", "/v1/sessions", nil)
			if code != http.StatusOK || bytes.Contains(body, []byte(id)) {
				t.Errorf("bolt's list: %d %s", code, body)
			}
			// acme's session is untouched.
			res := d.call(t, acmeToken, id, "read", map[string]any{"path": "mine.txt"})
			if res.IsError || !strings.Contains(res.Content[0].Text, "acme's") {
				t.Errorf("acme's file after bolt's attempts: %+v", res)
			}
		})
		t.Run("PrivilegesRefused", func(t *testing.T) {
			before := d.m.Stats().Sessions["bolt"]
			for _, s := range []map[string]any{
				{"privileged": true},
				{"capAdd": []string{"SYS_ADMIN"}},
				{"capAdd": []string{"cap_net_raw"}},
				{"capAdd": []string{"ALL"}},
				{"network": "host"},
				{"network": "bridge"},
				{"network": "container:" + id},
				{"hostMounts": []map[string]any{{"source": "/var/run/docker.sock", "target": "/var/run/docker.sock"}}},
				{"hostMounts": []map[string]any{{"source": "/", "target": "/host"}}},
				{"hostMounts": []map[string]any{{"source": "/etc", "target": "/workspace/etc", "readOnly": true}}},
				{"rootUser": true},
				{"writableRootfs": true},
				{"runtime": "io.containerd.runc.v2"},
				{"image": "alpine:latest"},
				{"image": "docker.io/sandboxd/../library/alpine"},
				{"limits": map[string]any{"memoryBytes": int64(1) << 40}},
				{"limits": map[string]any{"pids": 1 << 20}},
				{"limits": map[string]any{"pids": -1}},
				{"options": map[string]any{"bashInheritEnv": true}},
				{"options": map[string]any{"bashEnvAllow": []string{"*"}}},
				{"options": map[string]any{"confine": false}},
			} {
				code, body := d.do(t, boltToken, "POST", "/v1/sessions", s)
				if code != http.StatusForbidden && code != http.StatusBadRequest {
					t.Errorf("settings %v: %d %s", s, code, body)
				}
			}
			if after := d.m.Stats().Sessions["bolt"]; after != before {
				t.Errorf("bolt had %d sessions before, %d after refused creations", before, after)
			}
			if backend == "docker" {
				if n := labelledContainers(t, "bolt"); n != 0 {
					t.Errorf("%d containers of bolt after refused creations", n)
				}
			}
		})
	})
}

// labelledContainers counts the engine's containers of tenant made by this
// test binary.
func labelledContainers(t *testing.T, tenant string) int {
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label="+dockertest.LabelTest+"="+dockertest.Label(), "--filter", "label=sandboxd.tenant="+tenant).Output()
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return len(strings.Fields(string(out)))
}

func makeTar(t *testing.T, h *tar.Header, data string) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tw, data)
	tw.Close()
	return b.Bytes()
}

// The API holds against its callers: bodies over their caps are 413 with
// nothing written, a flood of creations meets 429, and a tar swapped under
// by a command in the session leaks nothing.
func TestDaemon(t *testing.T) {
	t.Run("HugeBodies", func(t *testing.T) {
		t.Parallel()
		d := newDaemon(t, daemonConfig{backend: "memory", maxBody: 1 << 20, maxTransfer: 2 << 20})
		id := d.create(t, acmeToken, map[string]any{"grants": []string{"fs.write"}, "always": []string{"edit"}})
		big := strings.Repeat("a", 2<<20)
		code, _ := d.do(t, acmeToken, "POST", "/v1/sessions/"+id+"/tools/write", map[string]any{"arguments": map[string]any{"path": "big", "content": big}})
		if code != http.StatusRequestEntityTooLarge {
			t.Errorf("a 2 MB JSON body: %d", code)
		}
		code, _ = d.do(t, acmeToken, "POST", "/v1/sessions", io.MultiReader(strings.NewReader(`{"vars":{"a":"`), strings.NewReader(big), strings.NewReader(`"}}`)))
		if code != http.StatusRequestEntityTooLarge {
			t.Errorf("a 2 MB create body: %d", code)
		}
		// A tar whose header claims far more than it sends, and one that sends it.
		for _, size := range []int64{1 << 40, 3 << 20} {
			pr, pw := io.Pipe()
			go func() {
				tw := tar.NewWriter(pw)
				tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: size, Mode: 0o644})
				chunk := make([]byte, 64<<10)
				for sent := int64(0); sent < 4<<20; sent += int64(len(chunk)) {
					if _, err := tw.Write(chunk); err != nil {
						break
					}
				}
				pw.Close()
			}()
			code, body := d.do(t, acmeToken, "PUT", "/v1/sessions/"+id+"/files/up", pr)
			pr.Close()
			if code != http.StatusRequestEntityTooLarge {
				t.Errorf("a tar of %d bytes: %d %s", size, code, body)
			}
		}
		if res := d.call(t, acmeToken, id, "ls", map[string]any{"path": "."}); strings.Contains(res.Content[0].Text, "big") || strings.Contains(res.Content[0].Text, "up") {
			t.Errorf("something was written: %s", res.Content[0].Text)
		}
	})
	t.Run("SessionFlood", func(t *testing.T) {
		t.Parallel()
		d := newDaemon(t, daemonConfig{backend: "memory", maxSessions: 5})
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				req, _ := http.NewRequest("POST", d.url+"/v1/sessions", strings.NewReader(`{}`))
				req.Header.Set("Authorization", "Bearer "+acmeToken)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
				}
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if codes[http.StatusCreated] != 5 || codes[http.StatusTooManyRequests] != 45 {
			t.Errorf("50 creations at a cap of 5: %v", codes)
		}
		// The other tenant is not starved by acme's flood.
		d.create(t, boltToken, nil)
		if st := d.m.Stats().Sessions; st["acme"] != 5 || st["bolt"] != 1 {
			t.Errorf("sessions %v, want acme 5 and bolt 1", st)
		}
	})
	t.Run("SymlinkSwapDuringTransfer", func(t *testing.T) {
		t.Parallel()
		daemonBackends(t, func(t *testing.T, backend string) {
			d := newDaemon(t, daemonConfig{backend: map[string]string{"memory": "local", "docker": "docker"}[backend]})
			id := d.create(t, acmeToken, map[string]any{"grants": []string{"fs.write", "shell.exec"}, "always": []string{"shell"}})
			out := "/tmp/outside-" + id
			if backend == "memory" {
				out = filepath.Join(t.TempDir(), "outside")
			}
			res := d.call(t, acmeToken, id, "bash", map[string]any{"command": fmt.Sprintf(`mkdir -p %[1]s && printf %[2]s > %[1]s/f && printf %[2]s > %[1]s/secret && cd %[1]s && find . | grep -v '/swap\.[a-z]*\.tmp' | sort; find . -type f | xargs md5sum`, out, outsideSecret)})
			before := res.Content[0].Text
			// The swapper runs as a command of the session itself.
			ctx, cancel := context.WithCancel(context.Background())
			swapDone := make(chan struct{})
			go func() {
				defer close(swapDone)
				body, _ := json.Marshal(map[string]any{"arguments": map[string]any{"command": fmt.Sprintf(`OUT=%s; `+`while :; do rm -rf swap.dir.tmp; mkdir swap.dir.tmp; printf inside > swap.dir.tmp/f; rm -rf d; mv swap.dir.tmp d; rm -f swap.link.tmp; ln -s "$OUT" swap.link.tmp; rm -rf d; mv swap.link.tmp d; done`, out), "timeout": 60}})
				req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/sessions/"+id+"/tools/bash", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+acmeToken)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			time.Sleep(300 * time.Millisecond)
			for range 40 {
				tarball := makeTar(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 5, Mode: 0o644}, "pwned")
				d.do(t, acmeToken, "PUT", "/v1/sessions/"+id+"/files/d", tarball)
				for _, p := range []string{"d", ""} {
					// A download whose plan changes under it is cut (the
					// client sees a broken stream): that is a safe outcome.
					if body := d.download(t, id, p); bytes.Contains(body, []byte(outsideSecret)) {
						t.Fatalf("download of %q mid-swap carried the outside", p)
					}
				}
			}
			cancel()
			<-swapDone
			// Cancelling the request ends the command; wait for the slot.
			deadline := time.Now().Add(20 * time.Second)
			for {
				code, body := d.do(t, acmeToken, "POST", "/v1/sessions/"+id+"/tools/bash", map[string]any{"arguments": map[string]any{"command": "cd " + out + " && find . | grep -v '/swap\\.[a-z]*\\.tmp' | sort; find . -type f | xargs md5sum"}})
				if code == http.StatusOK {
					var r apiResult
					json.Unmarshal(body, &r)
					if after := r.Content[0].Text; after != before {
						t.Errorf("outside changed:\n%s\n---\n%s", before, after)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("session still busy: %d %s", code, body)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	})
}

// download returns what a download sent, even when it was cut.
func (d *daemon) download(t *testing.T, id, name string) []byte {
	req, _ := http.NewRequest("GET", d.url+"/v1/sessions/"+id+"/files/"+name, nil)
	req.Header.Set("Authorization", "Bearer "+acmeToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return body
}

// serveProcess is `sandboxd serve` as a process, for what only its own
// HTTP server and environment decide.
func serveProcess(t *testing.T) (url string) {
	bin := sandboxdBinary(t)
	dir := t.TempDir()
	cfg := map[string]any{"listen": "127.0.0.1:0", "backend": "memory", "daemon": "adv-serve",
		"tenants": []httpapi.Tenant{{Name: "acme", Tokens: []string{httpapi.HashToken(acmeToken)}}, {Name: "bolt", Tokens: []string{httpapi.HashToken(boltToken)}}},
		// Short bounds, so the slow-client attacks below end within seconds.
		"http": map[string]any{"headerTimeout": "3s", "idleTimeout": "2s", "minBodyRate": 1024, "bodyGrace": "2s"}}
	raw, _ := json.Marshal(cfg)
	file := filepath.Join(dir, "config.json")
	os.WriteFile(file, raw, 0o600)
	cmd := exec.Command(bin, "serve", "--config", file)
	cmd.Env = append(os.Environ(), "SANDBOXD_PROCESS_SECRET="+fakeSecret)
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), "listening on "); ok {
			url = strings.Fields(rest)[0]
			go io.Copy(io.Discard, stdout)
			return url
		}
	}
	t.Fatal("sandboxd serve did not say where it listens")
	return ""
}

func TestServeProcess(t *testing.T) {
	url := serveProcess(t)
	d := &daemon{url: url}
	t.Run("SlowlorisHeaders", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := time.Now()
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		// One header byte every second: the server must give up on us.
		closed := make(chan time.Duration, 1)
		go func() {
			buf := make([]byte, 512)
			for {
				if _, err := conn.Read(buf); err != nil {
					closed <- time.Since(start)
					return
				}
			}
		}()
		for i := 0; ; i++ {
			select {
			case d := <-closed:
				t.Logf("the server closed a slow client after %v", d.Round(time.Second))
				return
			case <-time.After(time.Second):
				if time.Since(start) > 30*time.Second {
					t.Fatal("a client sending a header byte a second held its connection for 30 s")
				}
				conn.Write([]byte("X"))
			}
		}
	})
	// A keep-alive connection left idle, and a body sent a byte at a time,
	// must not hold a connection and a goroutine for ever: serve closes
	// idle connections after http.idleTimeout and fails a body that falls
	// below http.minBodyRate after http.bodyGrace.
	for _, c := range []struct {
		name    string
		request string
		drip    bool
	}{
		{"IdleKeepAlive", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"SlowBody", "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + acmeToken + "\r\nContent-Length: 100000\r\n\r\n{", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, c.request)
			closed := make(chan struct{})
			go func() { io.Copy(io.Discard, conn); close(closed) }()
			limit := time.After(30 * time.Second)
			for {
				select {
				case <-closed:
					return
				case <-limit:
					t.Fatal("the server still holds the connection after 30 s")
				case <-time.After(time.Second):
					if c.drip {
						conn.Write([]byte(" "))
					}
				}
			}
		})
	}
	// A daemon configured with no ceilings has them: a session's lifetime
	// and idle timeout are bounded, and so are a tenant's sessions.
	t.Run("DefaultCeilings", func(t *testing.T) {
		t.Parallel()
		for _, s := range []map[string]any{{"lifetime": "87600h"}, {"idleTimeout": "87600h"}} {
			if code, body := d.do(t, boltToken, "POST", "/v1/sessions", s); code != http.StatusBadRequest || !strings.Contains(string(body), "maximum") {
				t.Errorf("%v: %d %s", s, code, body)
			}
		}
		var ids []string
		defer func() {
			for _, id := range ids {
				d.do(t, boltToken, "DELETE", "/v1/sessions/"+id, nil)
			}
		}()
		for len(ids) <= 1000 {
			code, body := d.do(t, boltToken, "POST", "/v1/sessions", map[string]any{})
			if code == http.StatusTooManyRequests {
				break
			}
			var info struct {
				ID          string
				Created     time.Time
				ExpiresAt   *time.Time
				IdleTimeout runner.Duration
			}
			if code != http.StatusCreated || json.Unmarshal(body, &info) != nil {
				t.Fatalf("create: %d %s", code, body)
			}
			ids = append(ids, info.ID)
			if info.ExpiresAt == nil || info.ExpiresAt.Sub(info.Created) > 24*time.Hour || info.IdleTimeout <= 0 || time.Duration(info.IdleTimeout) > 4*time.Hour {
				t.Fatalf("a session asking for nothing: %s", body)
			}
		}
		if len(ids) != 32 {
			t.Errorf("bolt got %d sessions before 429, want the default cap of 32", len(ids))
		}
	})
	t.Run("HostSecretNotInCommands", func(t *testing.T) {
		t.Parallel()
		id := d.create(t, acmeToken, map[string]any{"grants": []string{"shell.exec"}, "always": []string{"shell"}})
		res := d.call(t, acmeToken, id, "bash", map[string]any{"command": "env; echo done"}) // call checks for the secret
		if res.IsError || !strings.Contains(res.Content[0].Text, "done") || strings.Contains(res.Content[0].Text, "SANDBOXD_PROCESS_SECRET") {
			t.Errorf("bash env: %+v", res)
		}
	})
}
