package tools_test

import (
	"context"
	"encoding/json"
	"io"
	"path"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// fakeBash runs a Go function in place of a shell, so the tool's handling of
// output, endings and spills is tested exactly and fast.
type fakeBash struct {
	mu   sync.Mutex
	last workspace.Command
	run  func(ctx context.Context, cmd workspace.Command) (workspace.Result, error)
}

func (b *fakeBash) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	b.mu.Lock()
	b.last = cmd
	b.mu.Unlock()
	return b.run(ctx, cmd)
}

func bashSet(t *testing.T, fsys workspace.FileSystem, run func(context.Context, workspace.Command) (workspace.Result, error), configure ...func(*tools.Config)) (*tools.Set, *fakeBash) {
	t.Helper()
	cfg := tools.DefaultConfig()
	cfg.Grants = []string{tools.GrantShellExec}
	cfg.Always = []string{"shell"}
	for _, c := range configure {
		c(&cfg)
	}
	fb := &fakeBash{run: run}
	set, err := tools.New(tools.Env{FS: fsys, Bash: fb, Session: workspace.Session{ID: "sess", RunID: "run", Root: "/workspace", Vars: map[string]string{"V": "session"}}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return set, fb
}

// prints returns a fake command that writes out to stdout and ends with res.
func prints(out string, res workspace.Result) func(context.Context, workspace.Command) (workspace.Result, error) {
	return func(_ context.Context, cmd workspace.Command) (workspace.Result, error) {
		cmd.Output(workspace.Stdout, []byte(out))
		return res, nil
	}
}

func TestBashEndings(t *testing.T) {
	tests := []struct {
		name string
		out  string
		res  workspace.Result
		text string
		want *tools.BashResult
	}{
		{"ok", "hi\n", workspace.Result{}, "hi\n\n[Exit code 0.]", &tools.BashResult{Output: "hi\n", OutputBytes: 3}},
		{"no output", "", workspace.Result{ExitCode: 3}, "(no output)\n\n[Exit code 3.]", &tools.BashResult{ExitCode: 3}},
		{"signal", "x", workspace.Result{ExitCode: -1, Signal: "SIGKILL"}, "x\n\n[Killed by signal SIGKILL.]",
			&tools.BashResult{ExitCode: -1, Signal: "SIGKILL", Output: "x", OutputBytes: 1}},
		{"timeout", "", workspace.Result{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}, "(no output)\n\n[Timed out after 120 s: the command and everything it started were killed.]",
			&tools.BashResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}},
	}
	for _, tt := range tests {
		set, _ := bashSet(t, memfs.New(), prints(tt.out, tt.res))
		r := set.Call(context.Background(), "bash", json.RawMessage(`{"command":"x"}`), tools.CallOptions{})
		if r.IsError || r.Text != tt.text || !reflect.DeepEqual(r.Structured, tt.want) {
			t.Errorf("%s: %q %+v", tt.name, r.Text, r.Structured)
		}
	}
}

func TestBashArguments(t *testing.T) {
	set, fb := bashSet(t, memfs.New(), func(_ context.Context, cmd workspace.Command) (workspace.Result, error) {
		if cmd.Stdin != nil {
			in, _ := io.ReadAll(cmd.Stdin)
			cmd.Output(workspace.Stdout, in)
		}
		return workspace.Result{}, nil
	}, func(c *tools.Config) {
		c.BashEnv = map[string]string{"A": "1", "V": "config"}
		c.BashSessionEnv = true
	})
	call := func(args string) tools.Result {
		return set.Call(context.Background(), "bash", json.RawMessage(args), tools.CallOptions{RunID: "turn7"})
	}
	if r := call(`{"command":"cat","stdin":"fed"}`); r.Structured.(*tools.BashResult).Output != "fed" {
		t.Errorf("stdin: %s", r.Text)
	}
	want := map[string]string{"A": "1", "V": "config", "SANDBOXD_SESSION_ID": "sess", "SANDBOXD_RUN_ID": "turn7", "SANDBOXD_WORKSPACE": "/workspace"}
	if !reflect.DeepEqual(fb.last.Env, want) || fb.last.Timeout != 120*time.Second || fb.last.Script != "cat" {
		t.Errorf("command %+v", fb.last)
	}
	if r := call(`{"command":"x","timeout":1.5}`); r.IsError || fb.last.Timeout != 1500*time.Millisecond {
		t.Errorf("timeout 1.5: %s %v", r.Text, fb.last.Timeout)
	}
	for _, args := range []string{`{"command":"x","timeout":601}`, `{"command":"x","timeout":0}`, `{"command":""}`, `{"command":"x","timeout":"5"}`} {
		if r := call(args); errKind(r) != "InvalidArgument" {
			t.Errorf("%s: %s", args, r.Text)
		}
	}
}

func TestBashSpill(t *testing.T) {
	var whole strings.Builder
	for i := range 3000 {
		whole.WriteString(strings.Repeat("y", i%10) + "\n")
	}
	fsys := memfs.New()
	set, _ := bashSet(t, fsys, prints(whole.String(), workspace.Result{}), func(c *tools.Config) { c.SpillKeep = 2 })
	var paths []string
	for range 3 {
		r := set.Call(context.Background(), "bash", json.RawMessage(`{"command":"seq"}`), tools.CallOptions{})
		b := r.Structured.(*tools.BashResult)
		lines := strings.Split(whole.String(), "\n")
		if !b.Truncated || b.Output != strings.Join(lines[1000:], "\n") || b.OutputBytes != int64(whole.Len()) {
			t.Fatalf("tail: %d bytes, truncated %v", len(b.Output), b.Truncated)
		}
		if path.Dir(b.OutputPath) != ".sandboxd/runtime/tool-output" || !strings.Contains(r.Text, b.OutputPath) {
			t.Fatalf("output path %q: %s", b.OutputPath, r.Text[len(r.Text)-200:])
		}
		saved, err := fsys.ReadFile(context.Background(), b.OutputPath, 1<<30)
		if err != nil || string(saved) != whole.String() {
			t.Fatalf("saved %d bytes, %v", len(saved), err)
		}
		paths = append(paths, b.OutputPath)
	}
	entries, _ := fsys.ReadDir(context.Background(), ".sandboxd/runtime/tool-output")
	var names []string
	for _, e := range entries {
		names = append(names, path.Join(".sandboxd/runtime/tool-output", e.Name()))
	}
	if !reflect.DeepEqual(names, paths[1:]) {
		t.Errorf("kept %v, want the newest two of %v", names, paths)
	}

	// Past maxFileBytes only the start is saved, and the result says so.
	set, _ = bashSet(t, fsys, prints(strings.Repeat("z", 5000), workspace.Result{}), func(c *tools.Config) { c.MaxFileBytes = 1000; c.MaxBytes = 100 })
	r := set.Call(context.Background(), "bash", json.RawMessage(`{"command":"z"}`), tools.CallOptions{})
	b := r.Structured.(*tools.BashResult)
	if b.SavedBytes != 1000 || b.OutputBytes != 5000 || len(b.Output) != 100 || !strings.Contains(r.Text, "was not saved") {
		t.Errorf("over maxFileBytes: %+v\n%s", b, r.Text)
	}
}

func TestBashProgress(t *testing.T) {
	// The command waits, after every other round of output, until a
	// progress event has come: events while it runs, not at its end.
	var mu sync.Mutex
	arrived := sync.NewCond(&mu)
	got := map[string]string{}
	events := 0
	done, gaveUp := false, false
	defer time.AfterFunc(time.Minute, func() { // only a hang lasts that long
		mu.Lock()
		defer mu.Unlock()
		gaveUp = true
		arrived.Broadcast()
	}).Stop()
	set, _ := bashSet(t, memfs.New(), func(_ context.Context, cmd workspace.Command) (workspace.Result, error) {
		for i := range 6 {
			cmd.Output(workspace.Stdout, []byte("out"))
			cmd.Output(workspace.Stderr, []byte("err\xc3")) // a rune split between writes
			cmd.Output(workspace.Stderr, []byte("\xa9"))
			if i%2 == 1 {
				mu.Lock()
				for want := events + 1; events < want && !gaveUp; {
					arrived.Wait()
				}
				mu.Unlock()
			}
		}
		return workspace.Result{}, nil
	}, func(c *tools.Config) { c.ProgressMs = 5 })
	r := set.Call(context.Background(), "bash", json.RawMessage(`{"command":"x"}`), tools.CallOptions{Progress: func(p tools.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if done || p.Tool != "bash" || p.Text == "" || strings.ContainsRune(p.Text, '\uFFFD') {
			t.Errorf("event %+v (after the call: %v)", p, done)
		}
		got[p.Stream] += p.Text
		events++
		arrived.Broadcast()
	}})
	mu.Lock()
	done = true
	mu.Unlock()
	if r.IsError || got["stdout"] != strings.Repeat("out", 6) || got["stderr"] != strings.Repeat("err\u00e9", 6) || events < 3 {
		t.Errorf("progress %q, %d events", got, events)
	}
}

func TestBashCanceled(t *testing.T) {
	set, _ := bashSet(t, memfs.New(), func(ctx context.Context, _ workspace.Command) (workspace.Result, error) {
		return workspace.Result{}, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := set.Call(ctx, "bash", json.RawMessage(`{"command":"x"}`), tools.CallOptions{}); errKind(r) != "Canceled" {
		t.Errorf("canceled: %s", r.Text)
	}
}

// A progress receiver that stops taking events holds up the command, not
// the daemon's memory: while it is blocked, the command's output callback
// returns for at most tools.ProgressCap bytes more, and no event carries
// more than tools.ProgressCap, whatever progressMs says.
func TestBashProgressBounded(t *testing.T) {
	const chunk, total = 16 << 10, 4 << 20
	var blocked, overrun atomic.Bool
	var whileBlocked atomic.Int64
	release := make(chan struct{})
	set, _ := bashSet(t, memfs.New(), func(_ context.Context, cmd workspace.Command) (workspace.Result, error) {
		p := []byte(strings.Repeat("y\n", chunk/2))
		for range total / chunk {
			cmd.Output(workspace.Stdout, p)
			if blocked.Load() && whileBlocked.Add(chunk) > tools.ProgressCap+chunk && !overrun.Swap(true) {
				close(release) // the bug: output piles up behind a blocked receiver
			}
		}
		return workspace.Result{}, nil
	}, func(c *tools.Config) { c.ProgressMs = 3_600_000; c.MaxFileBytes = 1 << 10 })
	var got, events int
	r := set.Call(context.Background(), "bash", json.RawMessage(`{"command":"yes"}`), tools.CallOptions{Progress: func(p tools.Progress) {
		if len(p.Text) > tools.ProgressCap {
			t.Errorf("an event of %d bytes, over the cap of %d", len(p.Text), tools.ProgressCap)
		}
		if events++; events == 1 {
			blocked.Store(true)
			select { // the receiver stalls: a second is long enough to see output pile up
			case <-release:
			case <-time.After(time.Second):
			}
			blocked.Store(false)
		}
		got += len(p.Text)
	}})
	if r.IsError || got != total {
		t.Errorf("published %d of %d bytes in %d events: %s", got, total, events, r.Text)
	}
	if overrun.Load() {
		t.Errorf("the command's output went on while the progress receiver was blocked")
	}
}

// shellBash is a fakeBash that names the shell running its scripts.
type shellBash struct {
	*fakeBash
	shell string
}

func (b shellBash) Shell() string { return b.shell }

// TestBashNamesItsShell: when the workspace says its scripts run in a shell
// that is not bash (an image without bash), the bash tool says so in its
// description, its schema, the environment section and every answer; when
// the shell is bash, or not named, nothing is added.
func TestBashNamesItsShell(t *testing.T) {
	for _, tt := range []struct {
		shell string
		warns bool
	}{
		{"", false},
		{"/bin/bash", false},
		{"/usr/local/bin/bash-static", false},
		{"/bin/sh", true},
		{"/bin/ash", true},
	} {
		cfg := tools.DefaultConfig()
		cfg.Grants = []string{tools.GrantShellExec}
		cfg.Always = []string{"shell"}
		sh := shellBash{&fakeBash{run: prints("ok\n", workspace.Result{})}, tt.shell}
		set, err := tools.New(tools.Env{FS: memfs.New(), Bash: sh}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var desc string
		for _, tool := range set.List() {
			if tool.Name == "bash" {
				desc = tool.Description + string(tool.InputSchema)
			}
		}
		r := set.Call(context.Background(), "bash", json.RawMessage(`{"command":"echo ok"}`), tools.CallOptions{})
		for what, text := range map[string]string{"description": desc, "environment": set.EnvironmentSection(), "answer": r.Text} {
			says := strings.Contains(text, "no bash") && strings.Contains(text, tt.shell)
			if says != tt.warns {
				t.Errorf("shell %q: the %s says no bash = %v, want %v:\n%s", tt.shell, what, says, tt.warns, text)
			}
		}
		if !strings.HasPrefix(r.Text, "ok\n") || r.IsError {
			t.Errorf("shell %q: answer %q", tt.shell, r.Text)
		}
	}
}

// TestFirstAnswerNamesTheFix: a refusal says in its first answer what to
// do, so a model does not need a second round trip to learn it.
func TestFirstAnswerNamesTheFix(t *testing.T) {
	ok := func(context.Context, workspace.Command) (workspace.Result, error) { return workspace.Result{}, nil }
	set, _ := bashSet(t, memfs.New(), ok)
	call := func(set *tools.Set, tool, args string) tools.Result {
		return set.Call(context.Background(), tool, json.RawMessage(args), tools.CallOptions{})
	}
	tests := []struct {
		set        *tools.Set
		tool, args string
		kind       string
		says       []string
	}{
		{set, "bash", `{"command":"x","timeout":900}`, "InvalidArgument", []string{"600", "bashMaxTimeoutMs", "background: true", "bash_output"}},
		{set, "bash", `{"command":"x","cwd":"src"}`, "InvalidArgument", []string{"unknown argument \"cwd\"", "background, command, stdin, timeout"}},
		{set, "ls", `{"recursive":true}`, "InvalidArgument", []string{"limit, path"}},
		{set, "bash_output", `{}`, "InvalidArgument", []string{"id is required"}},
		{set, "bash_kill", `{"id":""}`, "InvalidArgument", []string{"id is required"}},
		// A grant missing is said at once, not after load_skill.
		{set, "write", `{"path":"a","content":"x"}`, tools.KindToolUnavailable, []string{"workspace.edit", "grant fs.write", "load_skill cannot help"}},
	}
	for _, tt := range tests {
		r := call(tt.set, tt.tool, tt.args)
		if errKind(r) != tt.kind {
			t.Errorf("%s %s: %s, want %s", tt.tool, tt.args, r.Text, tt.kind)
			continue
		}
		for _, s := range tt.says {
			if !strings.Contains(r.Text, s) {
				t.Errorf("%s %s: %q does not say %q", tt.tool, tt.args, r.Text, s)
			}
		}
	}
	// Granted but not loaded: load_skill is the fix, as before.
	granted, _ := bashSet(t, memfs.New(), ok, func(c *tools.Config) { c.Grants = append(c.Grants, tools.GrantFSWrite) })
	if r := call(granted, "write", `{"path":"a","content":"x"}`); errKind(r) != tools.KindToolUnavailable || !strings.Contains(r.Text, "call load_skill") {
		t.Errorf("write granted, not loaded: %s", r.Text)
	}
}
