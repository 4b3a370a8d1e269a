package conformance

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// Background commands: every Bash has them through workspace.Background —
// its own when it is a workspace.BackgroundBash, and otherwise the
// workspace.Jobs fallback over it — so the first cases run on every
// adapter. The durable ones run where the harness says the commands
// outlive the Bash's connection (BashInstance.Reconnect, CapDurable).

// bg is the fixture's background commands.
func (x *bashFixture) bg() workspace.BackgroundBash {
	bg, _ := workspace.Background(x.Bash)
	if j, ok := bg.(*workspace.Jobs); ok {
		x.t.Cleanup(func() { j.Close(x.t.Context()) })
	}
	return bg
}

// startBg starts script in the background, combined, keeping keep bytes.
func startBg(x *bashFixture, bg workspace.BackgroundBash, script string, keep int64) workspace.BackgroundStatus {
	x.t.Helper()
	st, err := bg.StartBackground(x.ctx, workspace.BackgroundRequest{Command: workspace.Command{Script: script, Combined: true}, Keep: keep})
	if err != nil {
		x.t.Fatalf("StartBackground(%q): %v", script, err)
	}
	if !st.Running || st.ID == "" {
		x.t.Fatalf("StartBackground(%q) = %+v; want a running command with an ID", script, st)
	}
	return st
}

// waitBg reads id until it has ended (within eventTimeout), and returns
// all it read and the last read.
func waitBg(x *bashFixture, bg workspace.BackgroundBash, id string) (string, workspace.BackgroundRead) {
	x.t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(eventTimeout)
	for {
		r, err := bg.ReadBackground(x.ctx, id, time.Second)
		if err != nil {
			x.t.Fatalf("ReadBackground(%s): %v", id, err)
		}
		out.Write(r.Output)
		if !r.Running {
			return out.String(), r
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("background command %s still runs after %v; output %q", id, eventTimeout, out.String())
		}
	}
}

// readBgUntil reads id until what it read holds line, and returns it.
func readBgUntil(x *bashFixture, bg workspace.BackgroundBash, id, line string) string {
	x.t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(eventTimeout)
	for !strings.Contains(out.String(), line+"\n") {
		r, err := bg.ReadBackground(x.ctx, id, 50*time.Millisecond)
		if err != nil {
			x.t.Fatalf("ReadBackground(%s): %v", id, err)
		}
		out.Write(r.Output)
		if !r.Running && !strings.Contains(out.String(), line+"\n") || time.Now().After(deadline) {
			x.t.Fatalf("background command %s did not say %q: output %q, state %+v", id, line, out.String(), r.BackgroundStatus)
		}
	}
	return out.String()
}

var backgroundTests = []bashTest{
	{name: "Background/OutputAndExit", run: func(x *bashFixture) {
		bg := x.bg()
		st := startBg(x, bg, "echo one; echo two >&2; echo three; exit 7", 1<<20)
		out, r := waitBg(x, bg, st.ID)
		if out != "one\ntwo\nthree\n" || r.Result.ExitCode != 7 || r.Killed || r.Err != "" || r.Ended.IsZero() {
			x.t.Errorf("background command: output %q, end %+v; want one two three in order, exit 7", out, r.BackgroundStatus)
		}
		again, err := bg.ReadBackground(x.ctx, st.ID, 0)
		if err != nil || len(again.Output) != 0 || again.OutputBytes != int64(len(out)) || again.Unread != 0 {
			x.t.Errorf("a second read = %q, %+v, %v; want nothing new", again.Output, again.BackgroundStatus, err)
		}
	}},
	{name: "Background/KeepsNewest", run: func(x *bashFixture) {
		bg := x.bg()
		st := startBg(x, bg, "i=0; while [ $i -lt 100 ]; do printf '%02d\\n' $i; i=$((i+1)); done", 30)
		out, r := waitBg(x, bg, st.ID)
		if out != "90\n91\n92\n93\n94\n95\n96\n97\n98\n99\n" || r.Dropped != 270 || r.OutputBytes != 300 {
			x.t.Errorf("kept %q with %d dropped of %d; want the newest 30 bytes, 270 dropped", out, r.Dropped, r.OutputBytes)
		}
	}},
	{name: "Background/Stdin", run: func(x *bashFixture) {
		bg := x.bg()
		st, err := bg.StartBackground(x.ctx, workspace.BackgroundRequest{Command: workspace.Command{Script: "cat; echo end"}, Stdin: []byte("in\n"), Keep: 100})
		if err != nil {
			x.t.Fatal(err)
		}
		if out, _ := waitBg(x, bg, st.ID); out != "in\nend\n" {
			x.t.Errorf("output %q; want the input, then end", out)
		}
	}},
	{name: "Background/Timeout", run: func(x *bashFixture) {
		bg := x.bg()
		st, err := bg.StartBackground(x.ctx, workspace.BackgroundRequest{Command: workspace.Command{Script: "echo started; sleep 600", Timeout: 300 * time.Millisecond}, Keep: 100})
		if err != nil {
			x.t.Fatal(err)
		}
		if out, r := waitBg(x, bg, st.ID); !r.Result.TimedOut || out != "started\n" || r.Killed {
			x.t.Errorf("past its timeout: output %q, end %+v; want TimedOut", out, r.BackgroundStatus)
		}
	}},
	{name: "Background/KillTree", needs: needs(CapProcessTree), run: func(x *bashFixture) {
		bg := x.bg()
		st := startBg(x, bg, spawner, 1<<16)
		readBgUntil(x, bg, st.ID, "ready")
		killBg(x, bg, st.ID)
	}},
	{name: "Background/Bounds", run: func(x *bashFixture) {
		bg := x.bg()
		long := func() (workspace.BackgroundStatus, error) {
			return bg.StartBackground(x.ctx, workspace.BackgroundRequest{Command: workspace.Command{Script: "sleep 600"}, Keep: 10, Max: 1})
		}
		first, err := long()
		if err != nil {
			x.t.Fatal(err)
		}
		if _, err := long(); !errors.Is(err, workspace.ErrForbidden) {
			x.t.Errorf("a second command over Max 1 while the first runs: %v; want Forbidden", err)
		}
		if _, err := bg.KillBackground(x.ctx, first.ID); err != nil {
			x.t.Fatal(err)
		}
		second, err := long() // the ended one makes room
		if err != nil {
			x.t.Fatalf("a command once the first ended: %v", err)
		}
		defer bg.KillBackground(x.ctx, second.ID)
		if _, err := bg.ReadBackground(x.ctx, first.ID, 0); !errors.Is(err, workspace.ErrNotFound) {
			x.t.Errorf("reading the command forgotten to make room: %v; want NotFound", err)
		}
		if list, err := bg.ListBackground(x.ctx); err != nil || len(list) != 1 || list[0].ID != second.ID || !list[0].Running {
			x.t.Errorf("ListBackground = %+v, %v; want the second, running", list, err)
		}
		if _, err := bg.ReadBackground(x.ctx, "bg999999", 0); !errors.Is(err, workspace.ErrNotFound) {
			x.t.Errorf("reading an unknown command: %v; want NotFound", err)
		}
		if _, err := bg.StartBackground(x.ctx, workspace.BackgroundRequest{Command: workspace.Command{Script: "true"}}); !errors.Is(err, workspace.ErrInvalidArgument) {
			x.t.Errorf("a command that keeps no output: %v; want InvalidArgument", err)
		}
	}},
	{name: "Durable/SurvivesReconnect", needs: needs(CapDurable), run: func(x *bashFixture) {
		bg := x.bg()
		st := startBg(x, bg, `echo before
until [ -e go ]; do sleep 0.02; done
echo meanwhile; : > wrote
until [ -e end ]; do sleep 0.02; done
echo after; exit 3`, 1<<16)
		readBgUntil(x, bg, st.ID, "before")
		if err := x.FS.WriteFile(x.ctx, "go", nil, 0o644); err != nil {
			x.t.Fatal(err)
		}
		x.reconnect(func(exists func(string) bool) {
			// The command writes while no client is connected.
			deadline := time.Now().Add(eventTimeout)
			for !exists("wrote") {
				if time.Now().After(deadline) {
					x.t.Fatalf("the command did not go on while no client was connected (no %q after %v)", "wrote", eventTimeout)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
		bg = x.bg()
		list, err := bg.ListBackground(x.ctx)
		if err != nil || len(list) != 1 || list[0].ID != st.ID || !list[0].Running {
			x.t.Fatalf("after the reconnect ListBackground = %+v, %v; want %s, running", list, err, st.ID)
		}
		if err := x.FS.WriteFile(x.ctx, "end", nil, 0o644); err != nil {
			x.t.Fatal(err)
		}
		out, r := waitBg(x, bg, st.ID)
		if out != "meanwhile\nafter\n" || r.Result.ExitCode != 3 || r.Killed || r.Err != "" {
			x.t.Errorf("after the reconnect: output %q, end %+v; want what it wrote meanwhile and after, exit 3", out, r.BackgroundStatus)
		}
	}},
	{name: "Durable/KillAfterReconnect", needs: needs(CapDurable, CapProcessTree), run: func(x *bashFixture) {
		bg := x.bg()
		st := startBg(x, bg, spawner, 1<<16)
		readBgUntil(x, bg, st.ID, "ready")
		x.reconnect(func(func(string) bool) {})
		killBg(x, x.bg(), st.ID)
	}},
}

// killBg kills id and checks that it ended killed, its whole tree (the
// spawner's pids) gone.
func killBg(x *bashFixture, bg workspace.BackgroundBash, id string) {
	x.t.Helper()
	r, err := within(x.t, hangTimeout, "KillBackground", func() result[workspace.BackgroundRead] {
		r, err := bg.KillBackground(x.ctx, id)
		return result[workspace.BackgroundRead]{r, err}
	}).unpack()
	if err != nil || r.Running || !r.Killed {
		x.t.Fatalf("KillBackground(%s) = %+v, %v; want it ended, killed", id, r.BackgroundStatus, err)
	}
	x.treeGone()
}

// reconnect drops the fixture's connection and takes the new one
// (BashInstance.Reconnect).
func (x *bashFixture) reconnect(meanwhile func(exists func(string) bool)) {
	x.t.Helper()
	b, fsys := x.Reconnect(x.t, meanwhile)
	if b == nil || fsys == nil {
		x.t.Fatal(fmt.Errorf("conformance: Reconnect returned no Bash or FileSystem"))
	}
	x.Bash, x.FS = b, fsys
}
