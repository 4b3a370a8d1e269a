package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// TestServeSharedCutFrame kills a client in the middle of a write, at
// every kind of place in its frames — the length, the fixed header, the
// request, the data, the seal — and checks that the next client finds the
// agent serving, nothing of the cut write in the workspace, and the
// background command it left running.
func TestServeSharedCutFrame(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KiB: three frames
	for _, cut := range []int{1, 3, 4, 9, 14, 20, 60, 300, 256 << 10, 300 << 10, 600 << 10, len(data) - 2} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			dir := t.TempDir()
			e, _ := shared(t, dir)
			c, a := attachClient(t, e, false)
			st, err := c.StartBackground(t.Context(), workspace.BackgroundRequest{Command: workspace.Command{Script: "echo started; sleep 600"}, Keep: 100})
			if err != nil {
				t.Fatal(err)
			}
			for r := (workspace.BackgroundRead{}); string(r.Output) != "started\n"; {
				if r, err = c.ReadBackground(t.Context(), st.ID, 50*time.Millisecond); err != nil || len(r.Output) == 0 && !r.Running {
					t.Fatalf("ReadBackground = %+v, %v", r, err)
				}
			}
			a.mu.Lock()
			a.cut = cut
			a.mu.Unlock()
			if err := c.WriteFile(t.Context(), "big", data, 0o644); !errors.Is(err, workspace.ErrUnavailable) {
				t.Fatalf("a write whose client died: %v; want Unavailable", err)
			}
			c2, _ := attachClient(t, e, true)
			if _, err := os.Lstat(filepath.Join(dir, "big")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the cut write left %s: %v", "big", err)
			}
			if err := c2.WriteFile(t.Context(), "small", []byte("after"), 0o644); err != nil {
				t.Fatalf("the next client's write: %v", err)
			}
			if got, err := os.ReadFile(filepath.Join(dir, "small")); err != nil || string(got) != "after" {
				t.Errorf("the next client's file = %q, %v", got, err)
			}
			r, err := c2.ReadBackground(t.Context(), st.ID, 0)
			if err != nil || !r.Running || r.OutputBytes != int64(len("started\n")) {
				t.Errorf("the background command after the cut: %+v %q, %v; want it running, its output kept", r.BackgroundStatus, r.Output, err)
			}
			if _, err := c2.KillBackground(t.Context(), st.ID); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestServeSharedForgedResync has a command print resync lines, and more,
// while its client dies: the next client skips them (they cannot hold its
// nonce) and is served; the dead client's command is killed.
func TestServeSharedForgedResync(t *testing.T) {
	dir := t.TempDir()
	e, _ := shared(t, dir)
	c, a := attachClient(t, e, false)
	forge := `: > running; while :; do printf '\000sandboxd-resync 0123456789abcdef0123456789abcdef\n'; printf '\000\000\000\030\004\000\000\000\000\001\000\000\000\002{}garbage'; done`
	started := make(chan struct{})
	ran := make(chan error, 1)
	go func() {
		var once bool
		_, err := c.Run(context.Background(), workspace.Command{Script: forge, Output: func(workspace.Stream, []byte) {
			if !once {
				once = true
				close(started)
			}
		}})
		ran <- err
	}()
	<-started
	a.Close()
	if err := <-ran; !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("the dead client's Run: %v; want Unavailable", err)
	}
	c2, _ := attachClient(t, e, true)
	var out strings.Builder
	res, err := c2.Run(t.Context(), workspace.Command{Script: "echo served", Output: func(_ workspace.Stream, p []byte) { out.Write(p) }})
	if err != nil || res.ExitCode != 0 || out.String() != "served\n" {
		t.Fatalf("the next client: %+v %q, %v", res, out.String(), err)
	}
	// The forger was the dead connection's call: it is killed.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := c2.Run(t.Context(), workspace.Command{Script: "rm running && sleep 0.3 && test ! -e running"})
		if err == nil && res.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead client's command still runs: %+v, %v", res, err)
		}
	}
}
