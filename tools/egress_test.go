package tools_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// fakeTracer hands out traces whose decisions a test sets; it records the
// calls traced and closed.
type fakeTracer struct {
	mu     sync.Mutex
	traces map[string]*fakeTrace
	off    string
}

type fakeTrace struct {
	t         *fakeTracer
	call      string
	decisions []tools.EgressDecision
	closed    bool
	endedTake bool
}

func (f *fakeTracer) TraceEgress(call string) tools.EgressTrace {
	f.mu.Lock()
	defer f.mu.Unlock()
	tr := &fakeTrace{t: f, call: call}
	f.traces[call] = tr
	return tr
}

// decide adds a decision to every open trace, as the proxy does for the
// connections of a call's commands.
func (f *fakeTracer) decide(d tools.EgressDecision) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tr := range f.traces {
		if !tr.closed {
			tr.decisions = append(tr.decisions, d)
		}
	}
}

func (tr *fakeTrace) Env() map[string]string {
	return map[string]string{"HTTPS_PROXY": "http://" + tr.call + ":egress@127.0.0.1:3128", "V": "trace"}
}

func (tr *fakeTrace) Take(_ context.Context, ended bool) []tools.EgressDecision {
	tr.t.mu.Lock()
	defer tr.t.mu.Unlock()
	d := tr.decisions
	tr.decisions = nil
	tr.endedTake = tr.endedTake || ended
	return d
}

func (tr *fakeTrace) Off() string { return tr.t.off }

func (tr *fakeTrace) Close() {
	tr.t.mu.Lock()
	tr.closed = true
	tr.t.mu.Unlock()
}

// TestEgressInResults: bash, a background command's output and
// workspace_exec each carry the decisions made for their call's
// connections, named by the call's ID in the command's environment (the
// session's variables win over the trace's), with a note for the model;
// a foreground call's trace is closed when it answers.
func TestEgressInResults(t *testing.T) {
	refused := tools.EgressDecision{Host: "evil.example", Port: 443, Outcome: "refused", Reason: "no rule allows it", Connections: 1}
	ok := tools.EgressDecision{Host: "api.example", Port: 443, Outcome: "ok", Connections: 1, BytesUp: 10, BytesDown: 20, Inspected: true, Secrets: []string{"API_TOKEN"}}
	ft := &fakeTracer{traces: map[string]*fakeTrace{}, off: "This sandbox reaches the network only through its egress proxy."}
	fb := &fakeBash{}
	fb.run = func(_ context.Context, cmd workspace.Command) (workspace.Result, error) {
		ft.decide(ok)
		ft.decide(refused)
		cmd.Output(workspace.Stdout, []byte("curl: (6) Could not resolve host: x\n"))
		return workspace.Result{}, nil
	}
	newSet := func(configure func(*tools.Config)) *tools.Set {
		cfg := tools.DefaultConfig()
		configure(&cfg)
		set, err := tools.New(tools.Env{FS: memfs.New(), Bash: fb, Egress: ft,
			Session: workspace.Session{ID: "s", Root: "/workspace", Vars: map[string]string{"V": "session"}}}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { set.Close(context.Background()) })
		return set
	}
	set := newSet(func(c *tools.Config) { c.Grants, c.Always = []string{tools.GrantShellExec}, []string{"shell"} })
	provider := newSet(func(c *tools.Config) {
		c.Grants = []string{tools.GrantFSWrite}
		c.Profile = tools.Profiles{tools.ProfileWorkspaceShell}
		c.Driver = workspaceshell.DriverProvider
		c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write, Commands: workspaceshell.Commands{Names: []string{"curl"}}}
	})

	check := func(name string, text string, got []tools.EgressDecision) {
		t.Helper()
		if len(got) != 2 || got[0].Host != "api.example" || got[1].Outcome != "refused" {
			t.Errorf("%s: egress %+v", name, got)
		}
		for _, want := range []string{"api.example:443 ok", "secret API_TOKEN put in", "evil.example:443 refused: no rule allows it", "egress.allow", "retrying another way will not work", ft.off} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: the text lacks %q:\n%s", name, want, text)
			}
		}
	}

	res := set.Call(context.Background(), "bash", []byte(`{"command":"curl x"}`), tools.CallOptions{CallID: "call-one"})
	br, isBash := res.Structured.(*tools.BashResult)
	if res.IsError || !isBash {
		t.Fatalf("bash: %s", res.Text)
	}
	check("bash", res.Text, br.Egress)
	if env := fb.last.Env; env["HTTPS_PROXY"] != "http://call-one:egress@127.0.0.1:3128" || env["V"] != "session" {
		t.Errorf("the command's environment: %v", env)
	}
	if tr := ft.traces["call-one"]; !tr.closed || !tr.endedTake {
		t.Errorf("bash's trace: closed %v, taken at the end %v", tr.closed, tr.endedTake)
	}

	res = provider.Call(context.Background(), workspaceshell.ToolExec, []byte(`{"command":"curl","args":["x"]}`), tools.CallOptions{CallID: "call-two"})
	er, isExec := res.Structured.(*tools.ExecResult)
	if !isExec {
		t.Fatalf("workspace_exec: %s", res.Text)
	}
	check("workspace_exec", res.Text, er.Egress)

	res = set.Call(context.Background(), "bash", []byte(`{"command":"curl x","background":true}`), tools.CallOptions{CallID: "call-three"})
	bg, isBg := res.Structured.(*tools.BackgroundResult)
	if !isBg {
		t.Fatalf("bash in the background: %s", res.Text)
	}
	res = set.Call(context.Background(), "bash_output", []byte(`{"id":"`+bg.ID+`","wait":60}`), tools.CallOptions{CallID: "call-four"})
	out, _ := res.Structured.(*tools.BackgroundResult)
	if out == nil {
		t.Fatalf("bash_output: %s", res.Text)
	}
	check("bash_output", res.Text, out.Egress)
	if ft.traces["call-three"].closed {
		t.Error("a background command's trace is closed while it is kept")
	}
	set.Close(context.Background())
	if !ft.traces["call-three"].closed {
		t.Error("a background command's trace is not closed with the set")
	}
}
