package adversarial

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sessionContainer is the ID of the container of a daemon's session.
func sessionContainer(t *testing.T, session string) string {
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=sandboxd.session="+session).Output()
	ids := strings.Fields(string(out))
	if err != nil || len(ids) != 1 {
		t.Fatalf("container of %s: %v %q", session, err, out)
	}
	return ids[0]
}

// callWithin calls a tool and fails when the answer takes longer than d;
// it returns the HTTP status and body.
func (d *daemon) callWithin(t *testing.T, dur time.Duration, id, tool string, args any) (int, []byte) {
	t.Helper()
	var code int
	var body []byte
	within(t, dur, tool+" on a broken session", func() {
		code, body = d.do(t, acmeToken, "POST", "/v1/sessions/"+id+"/tools/"+tool, map[string]any{"arguments": args})
	})
	return code, body
}

// endsClean deletes a session and checks that its container is gone.
func (d *daemon) endsClean(t *testing.T, id string) {
	t.Helper()
	within(t, 60*time.Second, "deleting a broken session", func() {
		code, body := d.do(t, acmeToken, "DELETE", "/v1/sessions/"+id, nil)
		if code != http.StatusNoContent && code != http.StatusNotFound && code != http.StatusGone {
			t.Errorf("delete: %d %s", code, body)
		}
	})
	if out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=sandboxd.session="+id).Output(); len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("container of %s left after delete: %s", id, out)
	}
}

// brokenSessionFails checks that a session whose container or agent died
// ends at once — every call answers 410 SessionEnded — and without a leak.
func (d *daemon) brokenSessionFails(t *testing.T, id string) {
	for tool, args := range map[string]any{"bash": map[string]any{"command": "echo hi"}, "read": map[string]any{"path": "x"}} {
		code, body := d.callWithin(t, 15*time.Second, id, tool, args)
		if code != http.StatusGone || !bytes.Contains(body, []byte(`"SessionEnded"`)) {
			t.Errorf("%s after the kill: %d %s", tool, code, body)
		}
		// File calls as well as commands say how the container ended.
		if !bytes.Contains(body, []byte("(container exited, exit code 137")) {
			t.Errorf("%s after the kill does not say how the container ended: %s", tool, body)
		}
	}
	d.endsClean(t, id)
}

// Faults end in a clear error or a recovered session, never a hang or a
// leak.
func TestFaults(t *testing.T) {
	shell := map[string]any{"grants": []string{"fs.write", "shell.exec"}, "always": []string{"edit", "shell"}}
	for _, kill := range []struct {
		name string
		do   func(t *testing.T, container string) error
	}{
		{"ContainerKilledFromOutside", func(t *testing.T, container string) error {
			out, err := exec.Command("docker", "kill", container).CombinedOutput()
			if err != nil {
				err = fmt.Errorf("docker kill: %v %s", err, out)
			}
			return err
		}},
		{"AgentKilledFromHost", func(t *testing.T, container string) error {
			// The agent is PID 1 of its namespace; from the host it is an
			// ordinary process, and SIGKILL reaches it.
			out, err := exec.Command("docker", "inspect", "-f", "{{.State.Pid}}", container).Output()
			if err != nil {
				return err
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
			if err != nil {
				return err
			}
			return syscall.Kill(pid, syscall.SIGKILL)
		}},
	} {
		t.Run(kill.name, func(t *testing.T) {
			t.Parallel()
			d := newDaemon(t, daemonConfig{backend: "docker"})
			id := d.create(t, acmeToken, shell)
			if err := kill.do(t, sessionContainer(t, id)); err != nil {
				t.Fatal(err)
			}
			d.brokenSessionFails(t, id)
		})
	}
	t.Run("AgentStreamForged", func(t *testing.T) {
		t.Parallel()
		// A command writes garbage into PID 1's standard output: the
		// agent's stream to the host. The host's client must see a broken
		// stream, never trust a forged answer, and end the session.
		d := newDaemon(t, daemonConfig{backend: "docker"})
		id := d.create(t, acmeToken, shell)
		code, body := d.callWithin(t, 30*time.Second, id, "bash", map[string]any{"command": `printf '\000\000\000\030\003\000\000\000\000\000\000\001\000\000\000\010{"x":1}garbage-frames-from-a-command' > /proc/1/fd/1; sleep 2; echo done`})
		t.Logf("the forging command: %d %.300s", code, body)
		code, body = d.callWithin(t, 15*time.Second, id, "read", map[string]any{"path": "x"})
		if !bytes.Contains(body, []byte("Unavailable")) && !bytes.Contains(body, []byte("NotFound")) && !bytes.Contains(body, []byte("SessionEnded")) {
			t.Errorf("after the forged frames: %d %s", code, body)
		}
		d.endsClean(t, id)
	})
	t.Run("TmpfsFull", func(t *testing.T) {
		t.Parallel()
		d := newDaemon(t, daemonConfig{backend: "docker"})
		id := d.create(t, acmeToken, shell)
		res := d.call(t, acmeToken, id, "bash", map[string]any{"command": "head -c 400000000 /dev/zero > /tmp/fill; echo status=$?; df /tmp | tail -1", "timeout": 60})
		if !strings.Contains(res.Content[0].Text, "status=1") {
			t.Errorf("filling /tmp (256 MB) with 400 MB: %s", res.Content[0].Text)
		}
		// The workspace and the agent still work with /tmp full.
		if res := d.call(t, acmeToken, id, "write", map[string]any{"path": "after.txt", "content": "ok"}); res.IsError {
			t.Errorf("write with /tmp full: %+v", res)
		}
		res = d.call(t, acmeToken, id, "bash", map[string]any{"command": "cat after.txt && rm /tmp/fill && echo freed"})
		if !strings.Contains(res.Content[0].Text, "okfreed") {
			t.Errorf("after freeing /tmp: %s", res.Content[0].Text)
		}
		d.endsClean(t, id)
	})
	t.Run("ClientDisconnectsMidStream", func(t *testing.T) {
		t.Parallel()
		daemonBackends(t, func(t *testing.T, backend string) {
			d := newDaemon(t, daemonConfig{backend: map[string]string{"memory": "local", "docker": "docker"}[backend]})
			id := d.create(t, acmeToken, shell)
			mark := map[string]string{"memory": "5901", "docker": "5902"}[backend]
			ctx, cancel := context.WithCancel(context.Background())
			body, _ := json.Marshal(map[string]any{"arguments": map[string]any{"command": "echo started; sleep " + mark + "; echo never", "timeout": 600}})
			req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/sessions/"+id+"/tools/bash", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+acmeToken)
			req.Header.Set("Accept", "text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && !strings.Contains(sc.Text(), "started") {
			}
			cancel() // the client goes away mid-stream
			resp.Body.Close()
			// The command dies and the session takes calls again.
			deadline := time.Now().Add(20 * time.Second)
			for {
				code, out := d.do(t, acmeToken, "POST", "/v1/sessions/"+id+"/tools/bash", map[string]any{"arguments": map[string]any{
					"command": `n=0; for p in /proc/[0-9]*; do case "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" in "sleep ` + mark + `"*) n=$((n+1));; esac; done; echo survivors=$n`}})
				if code == http.StatusOK && bytes.Contains(out, []byte("survivors=0")) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("20 s after the client left: %d %s", code, out)
				}
				time.Sleep(200 * time.Millisecond)
			}
			d.endsClean(t, id)
		})
	})
}
