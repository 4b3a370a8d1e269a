package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// TestBash checks a workspace.Bash adapter against the port's contract. Its
// subtests run in parallel, each on a fresh BashInstance from h.New, except
// the one that sets the host secret (see BashHarness.HostSecret): the test
// calling TestBash must therefore not call t.Parallel.
func TestBash(t *testing.T, h BashHarness) {
	t.Helper()
	begin(t, h.New != nil, h.Skip)
	for _, bt := range slices.Concat(bashTests, backgroundTests, terminalTests) {
		t.Run(bt.name, func(t *testing.T) {
			if !bt.serial {
				t.Parallel()
			}
			x := h.fixture(t, bt)
			bt.run(x)
		})
	}
}

type bashTest struct {
	name   string
	needs  []Capability
	serial bool // sets the process environment: must not run beside others
	run    func(x *bashFixture)
}

// bashFixture is one subtest's fresh Bash.
type bashFixture struct {
	t   *testing.T
	ctx context.Context
	BashInstance
	secret string // the host variable no command may see
}

const secretValue = "conformance-s3cret-value"

func (h BashHarness) fixture(t *testing.T, bt bashTest) *bashFixture {
	t.Helper()
	secret := cmpOr(h.HostSecret, "SANDBOXD_CONFORMANCE_SECRET")
	if bt.serial {
		t.Setenv(secret, secretValue)
	}
	inst := h.New(t)
	if inst.Bash == nil || inst.FS == nil || !path.IsAbs(inst.Root) {
		t.Fatalf("conformance: New returned a BashInstance without Bash or FS, or with a root %q that is not absolute", inst.Root)
	}
	require(t, h.Skip, inst.has, bt.needs...)
	return &bashFixture{t: t, ctx: t.Context(), BashInstance: inst, secret: secret}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (inst BashInstance) has(c Capability) bool {
	switch c {
	case CapSymlinks:
		_, ok := inst.FS.(workspace.SymlinkFS)
		return ok
	case CapConfiguredEnv:
		return len(inst.Env) > 0
	case CapProcessTree:
		return true
	case CapDurable:
		_, ok := inst.Bash.(workspace.BackgroundBash)
		return ok && inst.Reconnect != nil
	case CapTerminal:
		_, ok := inst.Bash.(workspace.TerminalBash)
		return ok
	}
	return false
}

// ran is what one Run gave.
type ran struct {
	res            workspace.Result
	err            error
	stdout, stderr []byte
	overlapped     bool // Output was called while a call was in progress
}

// runCtx runs cmd, capturing its output, and fails the test when Run does
// not return within limit.
func (x *bashFixture) runCtx(ctx context.Context, limit time.Duration, cmd workspace.Command) ran {
	x.t.Helper()
	return within(x.t, limit, fmt.Sprintf("Run(%s)", describe(cmd)), func() ran {
		var r ran
		var inside atomic.Int32
		user := cmd.Output
		cmd.Output = func(s workspace.Stream, p []byte) {
			if inside.Add(1) > 1 {
				r.overlapped = true
			}
			defer inside.Add(-1)
			switch s {
			case workspace.Stdout:
				r.stdout = append(r.stdout, p...)
			case workspace.Stderr:
				r.stderr = append(r.stderr, p...)
			}
			if user != nil {
				user(s, p)
			}
		}
		r.res, r.err = x.Bash.Run(ctx, cmd)
		return r
	})
}

func (x *bashFixture) run(cmd workspace.Command) ran {
	x.t.Helper()
	return x.runCtx(x.ctx, hangTimeout, cmd)
}

// sh runs a script and fails the test unless it exits 0 with nothing on
// standard error; it returns standard output.
func (x *bashFixture) sh(script string) string {
	x.t.Helper()
	r := x.run(workspace.Command{Script: script})
	if r.err != nil || r.res.ExitCode != 0 || len(r.stderr) > 0 {
		x.t.Fatalf("Run(%q) = %+v, %v; stderr %q", script, r.res, r.err, r.stderr)
	}
	return string(r.stdout)
}

func describe(cmd workspace.Command) string {
	s := fmt.Sprintf("%q", cmd.Script)
	if cmd.Argv != nil {
		s = fmt.Sprintf("argv %q", cmd.Argv)
	}
	if cmd.Dir != "" {
		s += fmt.Sprintf(" in %q", cmd.Dir)
	}
	if cmd.Timeout > 0 {
		s += fmt.Sprintf(" with timeout %v", cmd.Timeout)
	}
	return s
}

// expect fails the test unless r ended as want did (Duration aside) with no
// error.
func (x *bashFixture) expect(r ran, want workspace.Result) {
	x.t.Helper()
	got := r.res
	got.Duration = 0
	if r.err != nil || got != want {
		x.t.Errorf("Run = %+v, %v; want %+v (stdout %q, stderr %q)", got, r.err, want, clip(r.stdout), clip(r.stderr))
	}
	if r.overlapped {
		x.t.Error("Output was called concurrently")
	}
}

func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

func (x *bashFixture) expectOutput(r ran, stdout, stderr string) {
	x.t.Helper()
	if string(r.stdout) != stdout || string(r.stderr) != stderr {
		x.t.Errorf("output: stdout %q, stderr %q; want %q, %q", clip(r.stdout), clip(r.stderr), clip([]byte(stdout)), clip([]byte(stderr)))
	}
}

func exited(code int) workspace.Result { return workspace.Result{ExitCode: code} }

var bashTests = []bashTest{
	{name: "Exit/Zero", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "true"})
		x.expect(r, exited(0))
		x.expectOutput(r, "", "")
	}},
	{name: "Exit/NonZero", run: func(x *bashFixture) { x.expect(x.run(workspace.Command{Script: "exit 3"}), exited(3)) }},
	{name: "Exit/255", run: func(x *bashFixture) { x.expect(x.run(workspace.Command{Script: "exit 255"}), exited(255)) }},
	{name: "Exit/LastCommand", run: func(x *bashFixture) { x.expect(x.run(workspace.Command{Script: "true; false"}), exited(1)) }},
	{name: "Exit/Argv", run: func(x *bashFixture) { x.expect(x.run(workspace.Command{Argv: []string{"false"}}), exited(1)) }},
	{name: "Signal/TERM", run: func(x *bashFixture) {
		x.expect(x.run(workspace.Command{Script: "kill -TERM $$; sleep 5"}), workspace.Result{ExitCode: -1, Signal: "SIGTERM"})
	}},
	{name: "Signal/KILL", run: func(x *bashFixture) {
		x.expect(x.run(workspace.Command{Script: "kill -KILL $$; sleep 5"}), workspace.Result{ExitCode: -1, Signal: "SIGKILL"})
	}},
	{name: "Timeout/TimedOut", run: timedOut},
	{name: "Timeout/NotReached", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "echo hi", Timeout: hangTimeout / 2})
		x.expect(r, exited(0))
		x.expectOutput(r, "hi\n", "")
	}},
	{name: "Timeout/TreeDies", needs: needs(CapProcessTree), run: func(x *bashFixture) { treeDies(x, false) }},
	{name: "Context/Cancel", run: func(x *bashFixture) { ctxEnds(x, context.Canceled) }},
	{name: "Context/Deadline", run: func(x *bashFixture) { ctxEnds(x, context.DeadlineExceeded) }},
	{name: "Context/TreeDies", needs: needs(CapProcessTree), run: func(x *bashFixture) { treeDies(x, true) }},
	{name: "Stdin/Delivered", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "cat", Stdin: strings.NewReader("hello\nworld\n")})
		x.expect(r, exited(0))
		x.expectOutput(r, "hello\nworld\n", "")
	}},
	{name: "Stdin/ThenEOF", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "read a; read b; read c || echo eof:$a:$b", Stdin: strings.NewReader("1\n2\n")})
		x.expect(r, exited(0))
		x.expectOutput(r, "eof:1:2\n", "")
	}},
	{name: "Stdin/Nil", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "cat; read x || echo empty"})
		x.expect(r, exited(0))
		x.expectOutput(r, "empty\n", "")
	}},
	{name: "Stdin/LargeBinary", run: func(x *bashFixture) {
		data := randomBytes(3 << 20)
		r := x.run(workspace.Command{Script: "cat", Stdin: bytes.NewReader(data)})
		x.expect(r, exited(0))
		sameBytes(x, "stdout", r.stdout, data)
	}},
	{name: "Output/Separated", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "echo out; echo err >&2; echo out2; echo err2 >&2"})
		x.expect(r, exited(0))
		x.expectOutput(r, "out\nout2\n", "err\nerr2\n")
	}},
	{name: "Output/CombinedInOrder", run: func(x *bashFixture) {
		// Two pipes read apart interleave as the reader happens to wake;
		// Combined is one stream, so the lines come in the order written.
		const n = 300
		var want strings.Builder
		for i := range n {
			fmt.Fprintf(&want, "out%d\nerr%d\n", i, i)
		}
		r := x.run(workspace.Command{
			Script:   fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo out$i; echo err$i >&2; i=$((i+1)); done", n),
			Combined: true,
		})
		x.expect(r, exited(0))
		x.expectOutput(r, want.String(), "")
	}},
	{name: "Output/Large", run: func(x *bashFixture) {
		const n = 5 << 20
		r := x.run(workspace.Command{Script: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo done >&2", n)})
		x.expect(r, exited(0))
		sameBytes(x, "stdout", r.stdout, bytes.Repeat([]byte("x"), n))
		if string(r.stderr) != "done\n" {
			x.t.Errorf("stderr %q, want %q", clip(r.stderr), "done\n")
		}
	}},
	{name: "Output/BinaryBothStreams", run: func(x *bashFixture) {
		data := randomBytes(2 << 20)
		r := x.run(workspace.Command{Script: "tee /dev/stderr", Stdin: bytes.NewReader(data)})
		x.expect(r, exited(0))
		sameBytes(x, "stdout", r.stdout, data)
		sameBytes(x, "stderr", r.stderr, data)
	}},
	{name: "Output/Streamed", run: streamed},
	{name: "Output/Serial", run: func(x *bashFixture) {
		r := x.run(workspace.Command{
			Script: "i=0; while [ $i -lt 2000 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done",
			Output: func(workspace.Stream, []byte) { time.Sleep(20 * time.Microsecond) },
		})
		x.expect(r, exited(0)) // fails when Output overlapped
		var out, errs strings.Builder
		for i := range 2000 {
			fmt.Fprintf(&out, "o%d\n", i)
			fmt.Fprintf(&errs, "e%d\n", i)
		}
		x.expectOutput(r, out.String(), errs.String())
	}},
	{name: "Output/NilCallback", run: func(x *bashFixture) {
		res, err := within(x.t, hangTimeout, "Run with a nil Output", func() result[workspace.Result] {
			res, err := x.Bash.Run(x.ctx, workspace.Command{Script: "echo discarded; exit 4"})
			return result[workspace.Result]{res, err}
		}).unpack()
		if err != nil || res.ExitCode != 4 {
			x.t.Errorf("Run = %+v, %v; want exit 4", res, err)
		}
	}},
	{name: "Dir/Root", run: func(x *bashFixture) { inDir(x, "", "here") }},
	{name: "Dir/Subdir", run: func(x *bashFixture) { inDir(x, "sub", "sub/here", "sub/") }},
	{name: "Dir/LinkInside", needs: needs(CapSymlinks), run: func(x *bashFixture) { inDir(x, "ld", "d/here", "d/", "ld => d") }},
	{name: "Dir/NotFound", run: func(x *bashFixture) { dirFails(x, "nothere", notFound) }},
	{name: "Dir/File", run: func(x *bashFixture) { dirFails(x, "f", notADir, "f") }},
	{name: "Dir/LinkOut", needs: needs(CapSymlinks), run: func(x *bashFixture) { dirFails(x, "lo", outside, "lo => /") }},
	{name: "Dir/RelativeLinkOut", needs: needs(CapSymlinks), run: func(x *bashFixture) { dirFails(x, "d/up", outside, "d/up => ../..") }},
	{name: "Dir/DotDot", run: func(x *bashFixture) {
		dirFails(x, "../x", is(workspace.ErrInvalidArgument, workspace.ErrOutsideWorkspace))
	}},
	{name: "Dir/Absolute", run: func(x *bashFixture) {
		dirFails(x, "/tmp", is(workspace.ErrInvalidArgument, workspace.ErrOutsideWorkspace))
	}},
	{name: "Argv/NoShell", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Argv: []string{"printf", "%s|", "a b", "$HOME", "*", "`id`"}})
		x.expect(r, exited(0))
		x.expectOutput(r, "a b|$HOME|*|`id`|", "")
	}},
	{name: "Argv/AbsoluteProgram", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Argv: []string{"/bin/sh", "-c", `printf '%s' "$0"`, "x  y"}})
		x.expect(r, exited(0))
		x.expectOutput(r, "x  y", "")
	}},
	{name: "Command/ScriptAndArgv", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "true", Argv: []string{"true"}})
		if msg := invalid.check(r.err); msg != "" {
			x.t.Errorf("Run with Script and Argv: %s", msg)
		}
	}},
	{name: "Command/Empty", run: func(x *bashFixture) {
		if msg := invalid.check(x.run(workspace.Command{}).err); msg != "" {
			x.t.Errorf("Run with neither Script nor Argv: %s", msg)
		}
	}},
	{name: "Env/HostSecretHidden", serial: true, run: func(x *bashFixture) {
		out := x.sh(fmt.Sprintf(`printf '%%s\n' "${%s-unset}"; env`, x.secret))
		if first, _, _ := strings.Cut(out, "\n"); first != "unset" || strings.Contains(out, secretValue) || strings.Contains(out, x.secret) {
			x.t.Errorf("the host variable %s reached the command: %q", x.secret, clip([]byte(out)))
		}
	}},
	{name: "Env/Configured", needs: needs(CapConfiguredEnv), run: func(x *bashFixture) {
		env := parseEnv(x.sh("env"))
		for k, v := range x.Env {
			if got, ok := env[k]; !ok || got != v {
				x.t.Errorf("configured %s=%q; the command sees %q (set: %v)", k, v, got, ok)
			}
		}
	}},
	{name: "Env/Command", run: func(x *bashFixture) {
		vars := map[string]string{"CONFORMANCE_VAR": "a b  c", "CONFORMANCE_EMPTY": ""}
		for k := range x.Env {
			vars[k] = "overridden" // Command.Env replaces a configured variable
			break
		}
		r := x.run(workspace.Command{Script: "env", Env: vars})
		x.expect(r, exited(0))
		env := parseEnv(string(r.stdout))
		for k, v := range vars {
			if got, ok := env[k]; !ok || got != v {
				x.t.Errorf("Command.Env %s=%q; the command sees %q (set: %v)", k, v, got, ok)
			}
		}
	}},
	{name: "Env/PATH", run: func(x *bashFixture) {
		if out := x.sh(`printf '%s' "$PATH"`); out == "" {
			x.t.Error("commands run without PATH")
		}
	}},
	{name: "Duration", run: func(x *bashFixture) {
		r := x.run(workspace.Command{Script: "sleep 0.3"})
		x.expect(r, exited(0))
		if d := r.res.Duration; d < 300*time.Millisecond || d > hangTimeout {
			x.t.Errorf("Duration = %v for sleep 0.3", d)
		}
	}},
	{name: "Concurrent", run: func(x *bashFixture) {
		err := within(x.t, hangTimeout, "concurrent Runs", func() error {
			return inParallel(4, 1, func(w, _ int) error {
				var out bytes.Buffer
				res, err := x.Bash.Run(x.ctx, workspace.Command{
					Script: fmt.Sprintf("sleep 0.2; echo %d", w),
					Output: func(_ workspace.Stream, p []byte) { out.Write(p) },
				})
				if err != nil || res.ExitCode != 0 || out.String() != fmt.Sprintf("%d\n", w) {
					return fmt.Errorf("run %d = %+v, %v, output %q", w, res, err, out.String())
				}
				return nil
			})
		})
		if err != nil {
			x.t.Error(err)
		}
	}},
	{name: "Files/Shared", run: func(x *bashFixture) {
		if err := x.FS.WriteFile(x.ctx, "in", []byte("from the port\n"), 0o644); err != nil {
			x.t.Fatal(err)
		}
		x.sh("cat in > out; mkdir made")
		data, err := x.FS.ReadFile(x.ctx, "out", 100)
		if err != nil || string(data) != "from the port\n" {
			x.t.Errorf("a file the command wrote reads %q, %v through the FileSystem", data, err)
		}
		if info, err := x.FS.Stat(x.ctx, "made"); err != nil || !info.IsDir() {
			x.t.Errorf("a directory the command made: %v", err)
		}
	}},
}

func (r result[T]) unpack() (T, error) { return r.v, r.err }

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sameBytes(x *bashFixture, what string, got, want []byte) {
	x.t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		x.t.Errorf("%s: %d bytes, want %d; first difference at byte %d", what, len(got), len(want), i)
	}
}

func parseEnv(out string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}

// growing runs try with a limit — a command's timeout or a context's
// deadline — of first, then twice as long, and so on, until try reports that
// the command reached the point the limit was to cut short (a marker file it
// wrote: see marked), or the limit passes eventTimeout. On a loaded machine a
// short limit may pass before the command has even started; such a run
// proves nothing either way, so it is repeated with more time rather than
// failed. try is given the attempt's marker name and reports, by returning
// true, that the run was conclusive (its assertions are made).
func growing(x *bashFixture, first time.Duration, what string, try func(limit time.Duration, marker string) bool) {
	x.t.Helper()
	for i, limit := 0, first; ; i, limit = i+1, 2*limit {
		if try(limit, fmt.Sprintf("conformance-marker-%d", i)) {
			return
		}
		if limit >= eventTimeout {
			x.t.Fatalf("%s: the command never reached its marker before a limit of %v: it did not run", what, limit)
		}
		x.t.Logf("%s: the command had not reached its marker within %v (a slow machine); again with %v", what, limit, 2*limit)
	}
}

// marked reports whether the command wrote the marker file name.
func (x *bashFixture) marked(name string) bool {
	_, err := x.FS.Stat(x.ctx, name)
	return err == nil
}

// timedOut checks that a command past its timeout is killed and reported,
// with the output it wrote before: the outcome, not how soon Run returned
// (within hangTimeout, since the command would sleep for ten minutes).
func timedOut(x *bashFixture) {
	growing(x, 300*time.Millisecond, "Run past its timeout", func(limit time.Duration, marker string) bool {
		r := x.run(workspace.Command{Script: "echo before; : > " + marker + "; sleep 600; echo after", Timeout: limit})
		ok := r.res.TimedOut && r.err == nil
		if ok && !x.marked(marker) {
			return false
		}
		if !ok {
			x.t.Errorf("Run(sleep 600) with a %v timeout = %+v, %v; want TimedOut", limit, r.res, r.err)
		}
		x.expectOutput(r, "before\n", "")
		return true
	})
}

// ctxEnds checks that Run returns with ctx's error, and the output so far,
// when ctx ends while the command runs: cancelled once the command has said
// "started", or at a deadline (see growing).
func ctxEnds(x *bashFixture, want error) {
	const script = "echo started; : > %s; sleep 600; echo after"
	check := func(r ran) {
		x.t.Helper()
		if !errors.Is(r.err, want) {
			x.t.Errorf("Run when the context ends = %+v, %v; want %v", r.res, r.err, want)
		}
		x.expectOutput(r, "started\n", "")
	}
	if want == context.DeadlineExceeded {
		growing(x, 300*time.Millisecond, "Run past its context's deadline", func(limit time.Duration, marker string) bool {
			ctx, cancel := context.WithTimeout(x.ctx, limit)
			defer cancel()
			r := x.runCtx(ctx, hangTimeout, workspace.Command{Script: fmt.Sprintf(script, marker)})
			if errors.Is(r.err, want) && !x.marked(marker) {
				return false
			}
			check(r)
			return true
		})
		return
	}
	ctx, cancel := context.WithCancel(x.ctx)
	defer cancel()
	check(x.runCtx(ctx, hangTimeout, workspace.Command{Script: fmt.Sprintf(script, "marker"), Output: onLine("started", cancel)}))
}

// onLine returns an Output that calls f once, when the output so far holds
// line.
func onLine(line string, f func()) func(workspace.Stream, []byte) {
	var seen []byte
	var once sync.Once
	return func(_ workspace.Stream, p []byte) {
		seen = append(seen, p...)
		if bytes.Contains(seen, []byte(line+"\n")) {
			once.Do(f)
		}
	}
}

// spawner starts processes that try to outlive the command — a background
// job, nohup, setsid, a double fork, and a job the shell waits for — writes
// their pids to the file pids, says "ready" and waits.
const spawner = `: > pids
sleep 600 &
echo $! >> pids
nohup sh -c 'echo $$ >> pids; exec sleep 600' > /dev/null 2>&1 &
setsid sh -c 'echo $$ >> pids; exec sleep 600' &
sh -c 'sleep 600 & echo $! >> pids' &
sleep 600 &
echo $! >> pids
n=$(wc -l < pids)
while [ $n -lt 5 ]; do sleep 0.05; n=$(wc -l < pids); done
echo ready
wait
`

// treeDies checks that nothing a command started survives its timeout (or,
// with cancel, its context, cancelled once the command said "ready").
func treeDies(x *bashFixture, cancel bool) {
	if cancel {
		ctx, stop := context.WithCancel(x.ctx)
		defer stop()
		var never atomic.Bool
		fallback := time.AfterFunc(eventTimeout, func() { never.Store(true); stop() })
		defer fallback.Stop()
		r := x.runCtx(ctx, hangTimeout, workspace.Command{Script: spawner, Output: onLine("ready", stop)})
		if !errors.Is(r.err, context.Canceled) {
			x.t.Errorf("Run = %+v, %v; want it cut short by its context", r.res, r.err)
		}
		if never.Load() {
			x.t.Errorf("the spawner did not say ready within %v: stdout %q, stderr %q", eventTimeout, r.stdout, r.stderr)
		}
		x.treeGone()
		return
	}
	growing(x, 1500*time.Millisecond, "the spawner", func(limit time.Duration, _ string) bool {
		r := x.run(workspace.Command{Script: spawner, Timeout: limit})
		if !r.res.TimedOut || r.err != nil {
			x.t.Errorf("Run = %+v, %v; want it cut short by its %v timeout", r.res, r.err, limit)
		}
		x.treeGone() // whatever had started by then
		return strings.Contains(string(r.stdout), "ready")
	})
}

// treeGone fails the test unless every process whose pid is in the file pids
// has ended (zombies count as dead: reaping them is the business of whoever
// their parent became). Run promises they are gone when it returns, so it
// looks at once; a process still running is then watched for up to
// eventTimeout, and the failure says which it was: the tree survived, or Run
// returned before the kill had completed.
func (x *bashFixture) treeGone() {
	x.t.Helper()
	data, err := x.FS.ReadFile(x.ctx, "pids", 1000)
	if errors.Is(err, workspace.ErrNotFound) {
		return // the command had not started
	}
	if err != nil {
		x.t.Fatalf("reading the pids: %v", err)
	}
	pids := strings.Fields(string(data))
	for _, p := range pids {
		if _, err := strconv.Atoi(p); err != nil {
			x.t.Fatalf("pids holds %q", data)
		}
	}
	if len(pids) == 0 {
		return
	}
	list := strings.Join(pids, " ")
	out := x.sh(fmt.Sprintf(`alive() {
  for p in %s; do
    if kill -0 "$p" 2>/dev/null; then
      s=$(sed -n 's/^.*) \(.\).*$/\1/p' /proc/$p/stat 2>/dev/null)
      [ "$s" = Z ] || printf '%%s ' "$p"
    fi
  done
}
first=$(alive); now=$first; start=$(date +%%s)
while [ -n "$now" ] && [ $(($(date +%%s) - start)) -lt %d ]; do sleep 0.1; now=$(alive); done
echo "$first"; echo "$now"`, list, int(eventTimeout/time.Second)))
	first, now, _ := strings.Cut(strings.TrimSuffix(out, "\n"), "\n")
	switch {
	case strings.TrimSpace(now) != "":
		x.t.Errorf("the tree survived: processes the command started outlived it by %v: pids %s of %s (background job, nohup, setsid, double fork)", eventTimeout, strings.Fields(now), list)
		x.run(workspace.Command{Script: "kill -KILL " + list + " 2>/dev/null"})
	case strings.TrimSpace(first) != "":
		x.t.Errorf("Run returned before the tree was dead: pids %s of %s still ran when it returned, and died later (the kill was under way; Run must wait for it)", strings.Fields(first), list)
	}
}

// streamed checks that output arrives while the command still runs: the
// command prints a line, then waits for its standard input to end, which
// happens when that line has reached Output.
func streamed(x *bashFixture) {
	stdin, release := io.Pipe()
	var never atomic.Bool
	fallback := time.AfterFunc(eventTimeout, func() { never.Store(true); release.Close() })
	defer fallback.Stop()
	r := x.run(workspace.Command{
		Script: "echo first; cat; echo second",
		Stdin:  stdin,
		Output: onLine("first", func() { release.Close() }),
	})
	x.expect(r, exited(0))
	x.expectOutput(r, "first\nsecond\n", "")
	if never.Load() {
		x.t.Errorf("the first line had not reached Output %v after the command wrote it, while the command waited: output is not streamed", eventTimeout)
	}
}

// inDir runs a command in dir, with the layout built first, and checks
// where it ran and where its file landed.
func inDir(x *bashFixture, dir, landed string, layout ...string) {
	x.build(layout...)
	r := x.run(workspace.Command{Script: "pwd; touch here", Dir: dir})
	x.expect(r, exited(0))
	// Through a link, pwd may name the link or its target.
	pwd := strings.TrimSuffix(string(r.stdout), "\n")
	if pwd != path.Join(x.Root, dir) && pwd != path.Join(x.Root, path.Dir(landed)) {
		x.t.Errorf("pwd in Dir %q = %q, want %q", dir, pwd, path.Join(x.Root, dir))
	}
	if _, err := x.FS.Stat(x.ctx, landed); err != nil {
		x.t.Errorf("touch here in Dir %q did not make %s: %v", dir, landed, err)
	}
}

// dirFails checks that Run refuses a bad Dir with the kind want, without
// running anything.
func dirFails(x *bashFixture, dir string, want errs, layout ...string) {
	x.build(layout...)
	r := x.run(workspace.Command{Script: "touch ran", Dir: dir})
	if msg := want.check(r.err); msg != "" {
		x.t.Errorf("Run in Dir %q: %s", dir, msg)
	}
	if _, err := x.FS.Lstat(x.ctx, "ran"); err == nil {
		x.t.Errorf("Run in Dir %q ran the command in the root", dir)
	}
}

func (x *bashFixture) build(layout ...string) {
	x.t.Helper()
	buildLayout(x.t, x.ctx, x.FS, nil, nil, layout)
}
