package localexec_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/proctree"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/workspace"
)

// run runs cmd in a fresh workspace and returns its result, stdout and stderr.
func run(t *testing.T, b *localexec.Bash, ctx context.Context, cmd workspace.Command) (workspace.Result, string, string, error) {
	t.Helper()
	var mu sync.Mutex
	var stdout, stderr bytes.Buffer
	cmd.Output = func(s workspace.Stream, p []byte) {
		mu.Lock()
		defer mu.Unlock()
		if s == workspace.Stdout {
			stdout.Write(p)
		} else {
			stderr.Write(p)
		}
	}
	res, err := b.Run(ctx, cmd)
	return res, stdout.String(), stderr.String(), err
}

func newBash(t *testing.T, opts ...localexec.Option) (*localexec.Bash, string) {
	t.Helper()
	dir := t.TempDir()
	b, err := localexec.New(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b, dir
}

func TestExitStatus(t *testing.T) {
	b, _ := newBash(t)
	tests := []struct {
		script string
		want   workspace.Result
		stdout string
	}{
		{"echo hi", workspace.Result{ExitCode: 0}, "hi\n"},
		{"exit 42", workspace.Result{ExitCode: 42}, ""},
		{"kill -TERM $$", workspace.Result{ExitCode: -1, Signal: "SIGTERM"}, ""},
		{"kill -KILL $$", workspace.Result{ExitCode: -1, Signal: "SIGKILL"}, ""},
		{"kill -INT $$; sleep 1", workspace.Result{ExitCode: -1, Signal: "SIGINT"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			res, stdout, _, err := run(t, b, t.Context(), workspace.Command{Script: tt.script})
			if err != nil {
				t.Fatal(err)
			}
			res.Duration = 0
			if res != tt.want || stdout != tt.stdout {
				t.Errorf("Run = %+v, %q; want %+v, %q", res, stdout, tt.want, tt.stdout)
			}
		})
	}
	noChildren(t)
}

func TestArgv(t *testing.T) {
	b, dir := newBash(t)
	must(t, os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "noshebang"), []byte("\x00\x01binary"), 0o755))
	tests := []struct {
		argv           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"printf", "%s|", "a b", "$HOME", "*"}, 0, "a b|$HOME|*|", ""},
		{[]string{"no-such-program-xyz"}, 127, "", "no-such-program-xyz: command not found\n"},
		{[]string{"./data"}, 126, "", "./data: permission denied\n"},
		{[]string{"./noshebang"}, 126, "", "./noshebang: cannot execute\n"},
	}
	for _, tt := range tests {
		t.Run(tt.argv[0], func(t *testing.T) {
			res, stdout, stderr, err := run(t, b, t.Context(), workspace.Command{Argv: tt.argv})
			if err != nil || res.ExitCode != tt.code || stdout != tt.stdout || stderr != tt.stderr {
				t.Errorf("Run = %+v, %v, %q, %q; want exit %d, %q, %q", res, err, stdout, stderr, tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}

func TestInvalidCommand(t *testing.T) {
	b, _ := newBash(t)
	for name, cmd := range map[string]workspace.Command{
		"neither":      {},
		"both":         {Script: "true", Argv: []string{"true"}},
		"empty argv0":  {Argv: []string{""}},
		"NUL":          {Script: "echo a\x00b"},
		"bad env name": {Script: "true", Env: map[string]string{"A=B": "c"}},
		"negative":     {Script: "true", Timeout: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := b.Run(t.Context(), cmd); !errors.Is(err, workspace.ErrInvalidArgument) {
				t.Errorf("Run = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func TestDir(t *testing.T) {
	b, root := newBash(t)
	must(t, os.MkdirAll(filepath.Join(root, "sub", "deep"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "file"), nil, 0o644))
	must(t, os.Symlink("sub", filepath.Join(root, "in")))
	must(t, os.Symlink(t.TempDir(), filepath.Join(root, "out")))
	tests := []struct {
		dir  string
		pwd  string
		kind *workspace.Kind
	}{
		{"", root, nil},
		{".", root, nil},
		{"sub/deep", filepath.Join(root, "sub", "deep"), nil},
		{filepath.Join(root, "sub"), filepath.Join(root, "sub"), nil},
		{"in", filepath.Join(root, "in"), nil},
		{"missing", "", workspace.ErrNotFound},
		{"file", "", workspace.ErrNotADirectory},
		{"file/x", "", workspace.ErrNotADirectory},
		{"..", "", workspace.ErrOutsideWorkspace},
		{"sub/../../x", "", workspace.ErrOutsideWorkspace},
		{"/etc", "", workspace.ErrOutsideWorkspace},
		{"out", "", workspace.ErrOutsideWorkspace},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			_, stdout, _, err := run(t, b, t.Context(), workspace.Command{Script: "pwd", Dir: tt.dir})
			if tt.kind != nil {
				if !errors.Is(err, tt.kind) {
					t.Errorf("Run = %v, want %s", err, tt.kind.Name())
				}
				return
			}
			if err != nil || stdout != tt.pwd+"\n" {
				t.Errorf("Run = %v, pwd %q; want %q", err, stdout, tt.pwd)
			}
		})
	}
}

func TestEnvironment(t *testing.T) {
	t.Setenv("SANDBOXD_TEST_SECRET", "hunter2")
	t.Setenv("LC_SANDBOXD_TEST", "allowed by prefix")
	const script = `echo "${SANDBOXD_TEST_SECRET-unset} ${LC_SANDBOXD_TEST-unset} ${SESSION-unset} ${CMD-unset}"`
	tests := []struct {
		name string
		opts []localexec.Option
		env  map[string]string
		want string
	}{
		{"default", nil, nil, "unset allowed by prefix unset unset"},
		{"inherit", []localexec.Option{localexec.WithInheritEnv(true)}, nil, "hunter2 allowed by prefix unset unset"},
		{"allow", []localexec.Option{localexec.WithEnvAllow([]string{"SANDBOXD_TEST_*"})}, nil, "hunter2 unset unset unset"},
		{"allow nil", []localexec.Option{localexec.WithEnvAllow(nil)}, nil, "unset allowed by prefix unset unset"},
		{"allow none", []localexec.Option{localexec.WithEnvAllow([]string{})}, nil, "unset unset unset unset"},
		{"session", []localexec.Option{localexec.WithEnv(map[string]string{"SESSION": "s", "CMD": "s"})}, map[string]string{"CMD": "c"}, "unset allowed by prefix s c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := newBash(t, tt.opts...)
			_, stdout, _, err := run(t, b, t.Context(), workspace.Command{Script: script, Env: tt.env})
			if err != nil || stdout != tt.want+"\n" {
				t.Errorf("Run = %v, %q; want %q", err, stdout, tt.want)
			}
		})
	}
	t.Run("whole", func(t *testing.T) {
		b, dir := newBash(t)
		_, stdout, _, err := run(t, b, t.Context(), workspace.Command{Argv: []string{"env"}})
		if err != nil {
			t.Fatal(err)
		}
		want := workspace.CommandEnv(os.Environ(), workspace.DefaultEnvAllow, false, map[string]string{"PWD": dir})
		if got := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("env = %q, want %q", got, want)
		}
	})
}

func TestStdin(t *testing.T) {
	b, _ := newBash(t)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB, more than a pipe holds
	tests := []struct {
		name   string
		script string
		stdin  io.Reader
		stdout string
	}{
		{"delivered then EOF", "cat", strings.NewReader("hello\x00world"), "hello\x00world"},
		{"nil is empty", "cat; echo end", nil, "end\n"},
		{"large", "wc -c", strings.NewReader(big), strconv.Itoa(len(big)) + "\n"},
		{"never read", "echo done", strings.NewReader(big), "done\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, stdout, _, err := run(t, b, t.Context(), workspace.Command{Script: tt.script, Stdin: tt.stdin, Timeout: time.Minute})
			if err != nil || res.ExitCode != 0 || strings.TrimLeft(stdout, " ") != tt.stdout {
				t.Errorf("Run = %+v, %v, %q; want %q", res, err, stdout, tt.stdout)
			}
		})
	}
}

// Output is binary-safe, complete, and on the right stream.
func TestLargeBinaryOutput(t *testing.T) {
	b, dir := newBash(t)
	data := make([]byte, 10<<20)
	rand.Read(data)
	must(t, os.WriteFile(filepath.Join(dir, "blob"), data, 0o644))
	res, stdout, stderr, err := run(t, b, t.Context(), workspace.Command{Script: "cat blob & cat blob >&2; wait"})
	if err != nil || res.ExitCode != 0 {
		t.Fatal(res, err)
	}
	if stdout != string(data) || stderr != string(data) {
		t.Errorf("got %d bytes on stdout and %d on stderr; want the %d bytes of blob on each", len(stdout), len(stderr), len(data))
	}
}

// Output calls never overlap, and p is passed while the command runs.
func TestOutputSerialAndStreaming(t *testing.T) {
	b, _ := newBash(t)
	var inFlight, overlaps atomic.Int32
	stdinR, stdinW := io.Pipe()
	var once sync.Once
	var got strings.Builder
	res, err := b.Run(t.Context(), workspace.Command{
		Script: `for i in $(seq 200); do echo out$i; echo err$i >&2; done; echo ready; read answer; echo "got $answer"`,
		Stdin:  stdinR,
		// If output only came at the end, the command would wait for its
		// answer until this timeout, which only bounds that failure.
		Timeout: time.Minute,
		Output: func(s workspace.Stream, p []byte) {
			if inFlight.Add(1) > 1 {
				overlaps.Add(1)
			}
			time.Sleep(50 * time.Microsecond)
			if s == workspace.Stdout {
				got.Write(p)
				if strings.Contains(got.String(), "ready\n") {
					once.Do(func() { go func() { io.WriteString(stdinW, "yes\n"); stdinW.Close() }() })
				}
			}
			inFlight.Add(-1)
		},
	})
	if err != nil || res.TimedOut || res.ExitCode != 0 {
		t.Fatalf("Run = %+v, %v; want the answer to arrive while it runs", res, err)
	}
	if !strings.HasSuffix(got.String(), "ready\ngot yes\n") {
		t.Errorf("stdout ends %q", got.String()[max(0, got.Len()-40):])
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d overlapping Output calls", n)
	}
}

// escapes starts "sleep 600" in every way a process can try to outlive its
// command, each writing its pid to a file; then it prints "started".
const escapes = `
	sleep 600 & echo $! > background
	nohup sleep 600 >/dev/null 2>&1 & echo $! > nohup
	setsid sleep 600 & echo $! > setsid
	(sleep 600 & echo $! > doublefork) &
	setsid bash -c 'sleep 600 & echo $! > setsid-child' &
	for f in background nohup setsid doublefork setsid-child; do
		# until it is sleep: a check that saw the forked shell would miss it
		until [ -s $f ] && [ "$(cat /proc/$(cat $f)/comm 2>/dev/null)" = sleep ]; do sleep 0.01; done
	done
	echo started
`

var escapeFiles = []string{"background", "nohup", "setsid", "doublefork", "setsid-child"}

func TestTreeKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the whole tree is killed on Linux; elsewhere the process group only")
	}
	tests := []struct {
		name    string
		script  string
		timeout time.Duration
		cancel  bool
		want    workspace.Result
		err     error
	}{
		{"main exits", escapes + "exit 3", 0, false, workspace.Result{ExitCode: 3}, nil},
		{"timeout", escapes + "sleep 600", 300 * time.Millisecond, false, workspace.Result{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}, nil},
		{"context", escapes + "sleep 600", 0, true, workspace.Result{ExitCode: -1, Signal: "SIGKILL"}, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A timeout may pass before the escapes have started on a loaded
			// machine: what did start must die, and the run is repeated with
			// twice the timeout until all have.
			for timeout := tt.timeout; ; timeout *= 2 {
				b, dir := newBash(t)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				var out strings.Builder
				res, err := b.Run(ctx, workspace.Command{Script: tt.script, Timeout: timeout, Output: func(s workspace.Stream, p []byte) {
					out.Write(p)
					if tt.cancel && strings.Contains(out.String(), "started\n") {
						cancel()
					}
				}})
				res.Duration = 0
				if res != tt.want || !errors.Is(err, tt.err) {
					t.Errorf("Run = %+v, %v; want %+v, %v", res, err, tt.want, tt.err)
				}
				started := strings.Contains(out.String(), "started\n")
				treeGone(t, dir, started)
				if started || timeout == 0 || timeout > 30*time.Second {
					if !started {
						t.Errorf("the escapes never started: output %q", out.String())
					}
					break
				}
				t.Logf("the escapes had not started within %v (a slow machine); again with %v", timeout, 2*timeout)
			}
		})
	}
	noChildren(t)
}

// treeGone fails the test unless every process whose pid an escape file in
// dir holds has ended (all of them must hold one when all started). Run
// promises the tree gone when it returns, so the check is immediate; a
// process still running is then watched for a minute, so that the failure
// says which it was: the tree survived, or Run returned before the kill
// completed.
func treeGone(t *testing.T, dir string, all bool) {
	t.Helper()
	alive := func(pid int) bool {
		// kill -0 fails for a process that is gone; a pid reused since is
		// not a sleep 600, nor is a zombie.
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return syscall.Kill(pid, 0) == nil && string(cmdline) == "sleep\x00600\x00"
	}
	for _, f := range escapeFiles {
		b, err := os.ReadFile(filepath.Join(dir, f))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			if all {
				t.Errorf("%s: no pid (%v)", f, err)
			}
			continue
		}
		if !alive(pid) {
			continue
		}
		deadline := time.Now().Add(time.Minute)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("%s: the tree survived: process %d still ran a minute after Run returned", f, pid)
		} else {
			t.Errorf("%s: Run returned before the kill completed: process %d still ran when it returned, and ended later", f, pid)
		}
	}
}

// A killed tree ends Run promptly, with the duration it ran.
func TestTimeoutDuration(t *testing.T) {
	b, _ := newBash(t)
	res, _, _, err := run(t, b, t.Context(), workspace.Command{Script: "sleep 600 & sleep 600", Timeout: 100 * time.Millisecond})
	if err != nil || !res.TimedOut || res.Duration < 100*time.Millisecond {
		t.Errorf("Run = %+v, %v; want timed out after at least 100ms", res, err)
	}
}

func TestContextDone(t *testing.T) {
	b, dir := newBash(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := b.Run(ctx, workspace.Command{Script: "true"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a done context = %v", err)
	}
	// The deadline must pass while the command runs: it is doubled until the
	// command had started (wrote its marker) before it passed.
	for limit := 100 * time.Millisecond; ; limit *= 2 {
		marker := filepath.Join(dir, fmt.Sprint("started-", limit))
		ctx, cancel := context.WithTimeout(t.Context(), limit)
		res, err := b.Run(ctx, workspace.Command{Script: ": > " + marker + "; sleep 600", Timeout: time.Minute})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || res.TimedOut {
			t.Fatalf("Run = %+v, %v; want ctx's error", res, err)
		}
		if _, serr := os.Stat(marker); serr == nil || limit > 30*time.Second {
			if res.Signal != "SIGKILL" {
				t.Errorf("Run = %+v, %v; want killed, with ctx's error", res, err)
			}
			return
		}
	}
}

func TestNoLeaks(t *testing.T) {
	b, _ := newBash(t)
	before := runtime.NumGoroutine()
	for range 5 {
		run(t, b, t.Context(), workspace.Command{Script: "sleep 600 & echo x; echo y >&2", Stdin: strings.NewReader("in")})
		run(t, b, t.Context(), workspace.Command{Script: "sleep 600", Timeout: 10 * time.Millisecond})
	}
	noChildren(t)
	var after int
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if after = runtime.NumGoroutine(); after <= before {
			return
		}
	}
	t.Errorf("%d goroutines before, %d after", before, after)
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "file"), nil, 0o644))
	if _, err := localexec.New(filepath.Join(dir, "missing")); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("New(missing) = %v", err)
	}
	if _, err := localexec.New(filepath.Join(dir, "file")); !errors.Is(err, workspace.ErrNotADirectory) {
		t.Errorf("New(file) = %v", err)
	}
	if _, err := localexec.New(dir, localexec.WithShell("no-such-shell-xyz")); !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("New(WithShell(missing)) = %v", err)
	}
	b, err := localexec.New(dir, localexec.WithShell("sh"))
	if err != nil {
		t.Fatal(err)
	}
	if _, out, _, err := run(t, b, t.Context(), workspace.Command{Script: `echo "$0"`}); err != nil || filepath.Base(strings.TrimSpace(out)) != "sh" {
		t.Errorf("WithShell(sh): $0 = %q, %v", out, err)
	}
}

// WithOOMScoreAdj reaches the command and what it starts.
func TestOOMScoreAdj(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("oom_score_adj is Linux's")
	}
	b, _ := newBash(t, localexec.WithOOMScoreAdj(1000))
	_, out, _, err := run(t, b, t.Context(), workspace.Command{Script: "cat /proc/$$/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"})
	if err != nil || out != "1000\n1000\n" {
		t.Errorf("oom_score_adj of the command and its child: %q, %v", out, err)
	}
}

// BenchmarkRun runs true, as a program and as a script, and reports the
// median wall time (p50-µs) and the CPU time per command (cpu-µs: this
// process's and its reaped children's), which a loaded machine disturbs
// less than wall time:
//
//	go test ./localexec -run '^$' -bench Run -benchtime 300x
func BenchmarkRun(b *testing.B) {
	sh, err := localexec.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for _, cmd := range []workspace.Command{{Argv: []string{"true"}}, {Script: "true"}} {
		b.Run(map[bool]string{true: "argv", false: "script"}[cmd.Script == ""], func(b *testing.B) {
			durs := make([]time.Duration, 0, b.N)
			cpu0 := cpuTime()
			for b.Loop() {
				t0 := time.Now()
				if _, err := sh.Run(b.Context(), cmd); err != nil {
					b.Fatal(err)
				}
				durs = append(durs, time.Since(t0))
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(len(durs)), "cpu-µs")
			slices.Sort(durs)
			b.ReportMetric(float64(durs[len(durs)/2].Microseconds()), "p50-µs")
		})
	}
}

// BenchmarkFloor measures issue 16's target in one run: a command through
// localexec against the floor of any command, a plain fork and exec of
// /bin/true and its wait, interleaved one for one so that the machine's load
// falls on both alike. It reports the median wall time of each (p50-µs is
// localexec's, floor-p50-µs the plain start's, bash-p50-µs a plain start of
// "bash -c true" for scale) and their ratio (x-floor; the target is 5 or
// less, and `bash true` within 5 ms):
//
//	go test ./localexec -run '^$' -bench Floor -benchtime 500x -count 5
func BenchmarkFloor(b *testing.B) {
	sh, err := localexec.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		b.Skip("no bash")
	}
	plain := func(argv ...string) time.Duration {
		t0 := time.Now()
		p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Wait(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for _, cmd := range []workspace.Command{{Argv: []string{"true"}}, {Script: "true"}} {
		b.Run(map[bool]string{true: "argv", false: "script"}[cmd.Script == ""], func(b *testing.B) {
			var runs, floors, bashes []time.Duration
			for b.Loop() {
				floors = append(floors, plain("/bin/true"))
				bashes = append(bashes, plain(bash, "-c", "true"))
				t0 := time.Now()
				if _, err := sh.Run(b.Context(), cmd); err != nil {
					b.Fatal(err)
				}
				runs = append(runs, time.Since(t0))
			}
			p50 := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Nanoseconds()) / 1e3
			}
			run, floor := p50(runs), p50(floors)
			b.ReportMetric(run, "p50-µs")
			b.ReportMetric(floor, "floor-p50-µs")
			b.ReportMetric(p50(bashes), "bash-p50-µs")
			b.ReportMetric(run/floor, "x-floor")
			b.ReportMetric(0, "ns/op") // three commands per op: not one figure
		})
	}
}

// cpuTime is the CPU time used so far by this process and its reaped
// descendants.
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	var ns int64
	for _, tv := range []syscall.Timeval{self.Utime, self.Stime, children.Utime, children.Stime} {
		ns += tv.Nano()
	}
	return time.Duration(ns)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// noChildren fails when the test process has children left: zombies Run did
// not reap, or shims that did not exit. The idle shims kept for reuse are
// ended first: a shim that is not idle is still there.
func noChildren(t *testing.T) {
	t.Helper()
	proctree.CloseIdle()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return // not Linux
	}
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		if s := strings.TrimSpace(string(b)); s != "" {
			t.Errorf("children left behind: %s", s)
		}
	}
}
