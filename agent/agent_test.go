package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/textedit"
	"github.com/sandboxd/sandboxd/workspace"
)

// connect serves fsys and bash over an in-process pipe and returns a client
// of it. The server must be gone when the test ends.
func connect(t testing.TB, fsys workspace.FileSystem, bash workspace.Bash, copts ...ClientOption) *Client {
	t.Helper()
	a, b := net.Pipe()
	srv := NewServer(fsys, bash, WithBuild("test"))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), b) }()
	c, err := NewClient(a, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		select {
		case err := <-served:
			if err != nil && !errors.Is(err, io.ErrClosedPipe) {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("Serve did not return after the client closed")
		}
	})
	return c
}

// bashFunc is a workspace.Bash made of a function.
type bashFunc func(ctx context.Context, cmd workspace.Command) (workspace.Result, error)

func (f bashFunc) Run(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
	return f(ctx, cmd)
}

func TestFileSystemOverPipe(t *testing.T) {
	ctx := context.Background()
	c := connect(t, memfs.New(), nil)
	if got := c.Agent(); got.Version != ProtocolVersion || got.Build != "test" {
		t.Errorf("Agent() = %+v", got)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.MkdirAll(ctx, "a/b", 0o755))
	must(c.WriteFile(ctx, "a/b/f.txt", []byte("hello\nworld\n"), 0o644))
	must(c.Mkdir(ctx, "d", 0o755))
	must(c.Symlink(ctx, "a/b/f.txt", "link"))

	data, err := c.ReadFile(ctx, "link", 100)
	must(err)
	if string(data) != "hello\nworld\n" {
		t.Errorf("ReadFile = %q", data)
	}
	if _, err := c.ReadFile(ctx, "a/b/f.txt", 3); !errors.Is(err, workspace.ErrFileTooLarge) {
		t.Errorf("ReadFile over max: %v", err)
	}
	fi, err := c.Stat(ctx, "link")
	must(err)
	if fi.Name() != "link" || fi.Size() != 12 || !fi.Mode().IsRegular() {
		t.Errorf("Stat = %v", fi)
	}
	fi, err = c.Lstat(ctx, "link")
	must(err)
	if fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("Lstat = %v", fi)
	}
	target, err := c.Readlink(ctx, "link")
	must(err)
	if target != "a/b/f.txt" {
		t.Errorf("Readlink = %q", target)
	}
	entries, err := c.ReadDir(ctx, ".")
	must(err)
	var names []string
	for _, e := range entries {
		info, err := e.Info()
		must(err)
		names = append(names, fmt.Sprintf("%s:%v:%v", e.Name(), e.Type(), info.Mode().Type() == e.Type()))
	}
	if got, want := strings.Join(names, " "), "a:d---------:true d:d---------:true link:L---------:true"; got != want {
		t.Errorf("ReadDir = %s, want %s", got, want)
	}

	walk, err := c.Walk(ctx, workspace.WalkRequest{Pattern: "**/*.txt"})
	must(err)
	generic, err := workspace.WalkGeneric(ctx, c, workspace.WalkRequest{Pattern: "**/*.txt"})
	must(err)
	if fmt.Sprint(walk) != fmt.Sprint(generic) || len(walk.Entries) != 1 {
		t.Errorf("Walk = %v, generic %v", walk, generic)
	}
	grep, err := c.Grep(ctx, workspace.GrepRequest{Pattern: "wor", Context: 1})
	must(err)
	if grep.Matches != 1 || len(grep.Lines) != 2 || grep.Lines[1].Text != "world" {
		t.Errorf("Grep = %+v", grep)
	}
	_, err = c.Grep(ctx, workspace.GrepRequest{Pattern: "("})
	if !errors.Is(err, workspace.ErrInvalidArgument) {
		t.Errorf("Grep with a bad pattern: %v", err)
	}

	must(c.Rename(ctx, "a/b/f.txt", "d/g.txt"))
	must(c.Remove(ctx, "link"))
	must(c.RemoveAll(ctx, "a"))
	_, err = c.Stat(ctx, "a")
	var pe *fs.PathError
	if !errors.Is(err, workspace.ErrNotFound) || !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &pe) || pe.Path != "a" {
		t.Errorf("Stat of a removed dir: %#v", err)
	}
	if err := c.Mkdir(ctx, "d", 0o755); !errors.Is(err, workspace.ErrExists) {
		t.Errorf("Mkdir of an existing dir: %v", err)
	}
	if err := c.Remove(ctx, "d"); !errors.Is(err, workspace.ErrNotEmpty) {
		t.Errorf("Remove of a full dir: %v", err)
	}
	if _, err := c.Run(ctx, workspace.Command{Script: "true"}); !errors.Is(err, workspace.ErrForbidden) {
		t.Errorf("Run without a Bash: %v", err)
	}
}

func TestLargeFileStreamsBesideOtherCalls(t *testing.T) {
	ctx := context.Background()
	c := connect(t, memfs.New(), nil)
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
	if err := c.WriteFile(ctx, "big", big, 0o644); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 50 {
			if _, err := c.Stat(ctx, "big"); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	got, err := c.ReadFile(ctx, "big", int64(len(big)))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("ReadFile: %d bytes, %v", len(got), err)
	}
	wg.Wait()
}

func TestManyCallsInFlight(t *testing.T) {
	ctx := context.Background()
	c := connect(t, memfs.New(), nil)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				name := fmt.Sprintf("f%d-%d", g, i)
				want := strings.Repeat(name, i*100)
				if err := c.WriteFile(ctx, name, []byte(want), 0o644); err != nil {
					t.Error(err)
					return
				}
				got, err := c.ReadFile(ctx, name, 1<<20)
				if err != nil || string(got) != want {
					t.Errorf("%s: %d bytes, %v", name, len(got), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	entries, err := c.ReadDir(ctx, ".")
	if err != nil || len(entries) != 32*20 {
		t.Fatalf("ReadDir: %d entries, %v", len(entries), err)
	}
	// A cancelled call leaves the table once the agent has answered it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.calls)
		c.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls left in the table after 30 s", n)
		}
	}
}

func TestBashStreams(t *testing.T) {
	ctx := context.Background()
	// The fake command echoes its input to stdout, interleaving a line on
	// stderr between chunks, then reports exit code 3.
	bash := bashFunc(func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		if cmd.Script != "echo" || cmd.Dir != "sub" || cmd.Env["X"] != "y" || cmd.Timeout != time.Second {
			return workspace.Result{}, workspace.PathError("run", cmd.Dir, workspace.ErrInvalidArgument)
		}
		if cmd.Stdin == nil {
			cmd.Stdin = strings.NewReader("")
		}
		buf := make([]byte, 100<<10)
		for {
			n, err := cmd.Stdin.Read(buf)
			cmd.Output(workspace.Stdout, buf[:n])
			cmd.Output(workspace.Stderr, []byte("|"))
			if err == io.EOF {
				return workspace.Result{ExitCode: 3, Duration: time.Millisecond}, nil
			}
			if err != nil {
				return workspace.Result{}, err
			}
		}
	})
	c := connect(t, nil, bash)
	in := bytes.Repeat([]byte("abcdefgh"), 1<<20) // 8 MiB: many windows
	var out, errOut bytes.Buffer
	calls := 0
	res, err := c.Run(ctx, workspace.Command{
		Script: "echo", Dir: "sub", Env: map[string]string{"X": "y"}, Timeout: time.Second,
		Stdin: bytes.NewReader(in),
		Output: func(s workspace.Stream, p []byte) {
			calls++
			if s == workspace.Stdout {
				out.Write(p)
			} else {
				errOut.Write(p)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Duration != time.Millisecond {
		t.Errorf("Result = %+v", res)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Errorf("stdout: %d bytes, want %d", out.Len(), len(in))
	}
	if errOut.Len() == 0 || strings.Trim(errOut.String(), "|") != "" {
		t.Errorf("stderr = %q", errOut.String())
	}

	// Without input the command sees end of input at once.
	res, err = c.Run(ctx, workspace.Command{Script: "echo", Dir: "sub", Env: map[string]string{"X": "y"}, Timeout: time.Second})
	if err != nil || res.ExitCode != 3 {
		t.Errorf("Run without input: %+v, %v", res, err)
	}
	// An error of the Bash crosses with its kind.
	_, err = c.Run(ctx, workspace.Command{Script: "other"})
	var pe *fs.PathError
	if !errors.Is(err, workspace.ErrInvalidArgument) || !errors.As(err, &pe) || pe.Op != "run" {
		t.Errorf("Run of a bad command: %v", err)
	}
}

func TestSlowOutputHoldsOnlyItsCall(t *testing.T) {
	ctx := context.Background()
	bash := bashFunc(func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 64 { // 4 MiB, four windows
			cmd.Output(workspace.Stdout, chunk)
		}
		return workspace.Result{}, nil
	})
	c := connect(t, memfs.New(), bash)
	release := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		_, err := c.Run(ctx, workspace.Command{Script: "x", Output: func(s workspace.Stream, p []byte) {
			<-release
			n += len(p)
		}})
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	// While the command's output waits, other calls go through.
	for range 20 {
		if _, err := c.Stat(ctx, "."); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	if n := <-done; n != 4<<20 {
		t.Errorf("delivered %d bytes", n)
	}
}

func TestRunCancelKillsAndReports(t *testing.T) {
	started, stopped := make(chan struct{}), make(chan struct{})
	bash := bashFunc(func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		cmd.Output(workspace.Stdout, []byte("partial"))
		close(started)
		<-ctx.Done()
		close(stopped)
		return workspace.Result{ExitCode: -1, Signal: "SIGKILL"}, ctx.Err()
	})
	c := connect(t, memfs.New(), bash)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	var out string
	res, err := c.Run(ctx, workspace.Command{Script: "sleep", Output: func(_ workspace.Stream, p []byte) { out += string(p) }})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
	select {
	case <-stopped:
	default:
		t.Error("Run returned before the agent stopped the command")
	}
	if res.Signal != "SIGKILL" || out != "partial" {
		t.Errorf("Result = %+v, output %q", res, out)
	}
	// The stream still works.
	if _, err := c.Stat(context.Background(), "."); err != nil {
		t.Error(err)
	}
}

func TestLockOverTheStream(t *testing.T) {
	ctx := context.Background()
	c := connect(t, memfs.New(), nil)
	unlock, err := c.Lock(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := c.Lock(short, "f"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Lock: %v", err)
	}
	unlock()
	unlock() // twice is harmless
	u2, err := c.Lock(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	u2()
}

func TestBrokenStreamFailsEveryCall(t *testing.T) {
	started := make(chan struct{})
	bash := bashFunc(func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		close(started)
		<-ctx.Done()
		return workspace.Result{}, ctx.Err()
	})
	a, b := net.Pipe()
	go NewServer(memfs.New(), bash).Serve(context.Background(), b)
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Run(context.Background(), workspace.Command{Script: "x"})
		errc <- err
	}()
	<-started
	b.Close() // the agent's end goes away mid-call
	expectBroken(t, c, errc)
	if _, err := c.Lock(context.Background(), "x"); !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("Lock after the break: %v", err)
	}
}

func TestServerEndsCallsWhenStreamEnds(t *testing.T) {
	stopped := make(chan struct{})
	started := make(chan struct{})
	bash := bashFunc(func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		close(started)
		<-ctx.Done()
		close(stopped)
		return workspace.Result{}, ctx.Err()
	})
	a, b := net.Pipe()
	served := make(chan error, 1)
	go func() { served <- NewServer(memfs.New(), bash).Serve(context.Background(), b) }()
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	go c.Run(context.Background(), workspace.Command{Script: "x"})
	<-started
	c.Close()
	if err := servedStopped(t, served, stopped); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Serve: %v", err)
	}
}

// servedStopped waits for Serve's end and returns its error, failing the
// test unless the command it ran (whose end closes stopped) ended first.
func servedStopped(t *testing.T, served <-chan error, stopped <-chan struct{}) error {
	t.Helper()
	var err error
	select {
	case err = <-served:
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return")
	}
	select {
	case <-stopped:
	default:
		t.Error("Serve returned with a command still running")
	}
	return err
}

// expectBroken waits for a call's error, which must be ErrUnavailable, and
// checks that the client is broken for later calls too.
func expectBroken(t *testing.T, c *Client, errc <-chan error) {
	t.Helper()
	select {
	case err := <-errc:
		if !errors.Is(err, workspace.ErrUnavailable) {
			t.Errorf("err = %v, want Unavailable", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the call hangs on a broken stream")
	}
	<-c.Done()
	if _, err := c.Stat(context.Background(), "x"); !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("a later call: %v", err)
	}
}

// fakeAgent is the agent's end of a pipe, driven by the test.
type fakeAgent struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

// newFake returns a client connected to a fake agent that has answered the
// handshake.
func newFake(t *testing.T, opts ...ClientOption) (*Client, *fakeAgent) {
	a, b := net.Pipe()
	f := &fakeAgent{t: t, conn: b, r: bufio.NewReader(b)}
	go func() {
		if _, err := readFrame(f.r); err == nil {
			h, _ := json.Marshal(hello{Version: ProtocolVersion, Build: "fake"})
			f.write(appendFrame(nil, frameHello, 0, 0, h, nil))
		}
	}()
	c, err := NewClient(a, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); b.Close() })
	return c, f
}

func (f *fakeAgent) write(b []byte) {
	f.conn.Write(b)
}

// next reads the client's next call.
func (f *fakeAgent) next() (frame, request) {
	for {
		fr, err := readFrame(f.r)
		if err != nil {
			f.t.Errorf("fake agent: %v", err)
			return frame{}, request{}
		}
		if fr.typ != frameCall {
			continue
		}
		var req request
		json.Unmarshal(fr.header, &req)
		return fr, req
	}
}

// answer reads a call and writes the frames answer makes for its ID.
func (f *fakeAgent) answer(answer func(id uint32) []byte) {
	go func() {
		fr, _ := f.next()
		f.write(answer(fr.id))
	}()
}

func replyFrame(id uint32, body string) []byte {
	return appendFrame(nil, frameReply, 0, id, nil, []byte(body))
}

func TestHostileAnswers(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		call func(c *Client) error
		body string
	}{
		{"dir entry with a slash", readDir, `[{"n":"a/b","y":0}]`},
		{"dir entry dotdot", readDir, `[{"n":"..","y":2147483648}]`},
		{"dir entry dot", readDir, `[{"n":".","y":0}]`},
		{"dir entry empty", readDir, `[{"n":"","y":0}]`},
		{"dir entry NUL", readDir, `[{"n":"a\u0000b","y":0}]`},
		{"dir entries unsorted", readDir, `[{"n":"b","y":0},{"n":"a","y":0}]`},
		{"dir entries twice", readDir, `[{"n":"a","y":0},{"n":"a","y":0}]`},
		{"dir entry bad type", readDir, `[{"n":"a","y":511}]`},
		{"dir entry info disagrees", readDir, `[{"n":"a","y":0,"i":{"n":"b","s":1,"m":420,"t":0}}]`},
		{"dir not JSON", readDir, `{{{`},
		{"stat name with slash", stat, `{"n":"../x","s":1,"m":420}`},
		{"stat negative size", stat, `{"n":"x","s":-1,"m":420}`},
		{"stat bad mode", stat, `{"n":"x","s":1,"m":4294967295}`},
		{"walk escapes", walk, `{"Entries":[{"Path":"../etc/passwd","Type":0}]}`},
		{"walk absolute", walk, `{"Entries":[{"Path":"/etc/passwd","Type":0}]}`},
		{"walk outside its dir", walk, `{"Entries":[{"Path":"subx/a","Type":0}]}`},
		{"walk dot", walk, `{"Entries":[{"Path":".","Type":0}]}`},
		{"walk over limit", walk, `{"Entries":[{"Path":"sub/a"},{"Path":"sub/b"},{"Path":"sub/c"}]}`},
		{"grep escapes", grep, `{"Lines":[{"Path":"sub/../../x","Line":1,"Text":"a","Match":true}],"Matches":1}`},
		{"grep line zero", grep, `{"Lines":[{"Path":"sub/x","Line":0,"Text":"a","Match":true}],"Matches":1}`},
		{"grep counts lie", grep, `{"Lines":[{"Path":"sub/x","Line":1,"Text":"a","Match":true}],"Matches":7}`},
		{"swap escapes", swap, `{"real":"../x"}`},
		{"swap root", swap, `{"real":"."}`},
		{"swap old contents over max", swap, `{"real":"f","old":{"n":"f","s":9,"m":420},"oldData":"MTIzNDU2Nzg5","hasData":true}`},
		{"swap old contents of a dir", swap, `{"real":"f","old":{"n":"f","s":0,"m":2147484141},"hasData":true}`},
		{"swap old contents of nothing", swap, `{"real":"f","hasData":true}`},
		{"swap info of another name", swap, `{"real":"f","new":{"n":"g","s":1,"m":420}}`},
		{"swap bad info", swap, `{"real":"f","old":{"n":"f","s":-1,"m":420}}`},
		{"swap unmet without conditions", swap, `{"real":"f","unmet":true}`},
		{"swap unmet with a new file", swapReal, `{"real":"g","unmet":true,"new":{"n":"g","s":1,"m":420}}`},
		{"swap written elsewhere", swapReal, `{"real":"g","new":{"n":"g","s":1,"m":420}}`},
		{"swap written over other contents", swapSum, `{"real":"f","old":{"n":"f","s":3,"m":420},"oldData":"b3Ro","hasData":true,"new":{"n":"f","s":1,"m":420}}`},
		{"swap written over nothing read", swapSum, `{"real":"f","old":{"n":"f","s":3,"m":420},"new":{"n":"f","s":1,"m":420}}`},
		{"edit written over contents it does not apply to", swapEdit, `{"real":"f","old":{"n":"f","s":3,"m":420},"oldData":"b3Ro","hasData":true,"new":{"n":"f","s":3,"m":420}}`},
		{"edit written over nothing read", swapEdit, `{"real":"f","old":{"n":"f","s":3,"m":420},"new":{"n":"f","s":3,"m":420}}`},
		{"edit written over no file", swapEdit, `{"real":"f","new":{"n":"f","s":3,"m":420}}`},
		{"edit written over a directory", swapEdit, `{"real":"f","old":{"n":"f","s":0,"m":2147484141},"new":{"n":"f","s":3,"m":420}}`},
		{"run bad signal", run, `{"exitCode":-1,"signal":"rm -rf /"}`},
		{"run bad exit", run, `{"exitCode":100000}`},
		{"run negative duration", run, `{"exitCode":0,"duration":-5}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, f := newFake(t)
			f.answer(func(id uint32) []byte { return replyFrame(id, tt.body) })
			err := tt.call(c)
			if !errors.Is(err, workspace.ErrUnavailable) {
				t.Fatalf("err = %v, want Unavailable", err)
			}
			// A bad answer fails the call, not the client.
			f.answer(func(id uint32) []byte { return replyFrame(id, `{"n":"x","s":1,"m":420}`) })
			if _, err := c.Stat(ctx, "x"); err != nil {
				t.Errorf("the next call: %v", err)
			}
		})
	}
}

func readDir(c *Client) error {
	_, err := c.ReadDir(context.Background(), "d")
	return err
}

func swap(c *Client) error {
	_, err := c.Swap(context.Background(), workspace.SwapRequest{Name: "f", Data: []byte("x"), Max: 4})
	return err
}

// swapReal is a swap on condition that f leads to f.
func swapReal(c *Client) error {
	_, err := c.Swap(context.Background(), workspace.SwapRequest{Name: "f", Data: []byte("x"), Max: 4, Real: "f"})
	return err
}

// swapSum is a swap on condition that f holds "old".
func swapSum(c *Client) error {
	_, err := c.Swap(context.Background(), workspace.SwapRequest{Name: "f", Data: []byte("x"), Max: 4, OldSum: workspace.Sum([]byte("old"))})
	return err
}

// swapEdit is a swap that edits f's "old" into "new".
func swapEdit(c *Client) error {
	_, err := c.Swap(context.Background(), workspace.SwapRequest{Name: "f", Max: 4,
		Edit: textedit.Edit{Replacements: []textedit.Replacement{{OldText: "old", NewText: "new"}}}})
	return err
}

func stat(c *Client) error {
	_, err := c.Stat(context.Background(), "x")
	return err
}

func walk(c *Client) error {
	_, err := c.Walk(context.Background(), workspace.WalkRequest{Dir: "sub", Limit: 2})
	return err
}

func grep(c *Client) error {
	_, err := c.Grep(context.Background(), workspace.GrepRequest{Dir: "sub", Pattern: "a"})
	return err
}

func run(c *Client) error {
	_, err := c.Run(context.Background(), workspace.Command{Script: "x"})
	return err
}

func TestBrokenFramesBreakTheClient(t *testing.T) {
	tests := []struct {
		name   string
		frames func(id uint32) []byte
	}{
		{"oversized frame", func(uint32) []byte { return []byte{0x7f, 0xff, 0xff, 0xff, 1, 2, 3} }},
		{"frame shorter than its fixed part", func(uint32) []byte { return []byte{0, 0, 0, 3, 4, 0, 0} }},
		{"unknown type", func(id uint32) []byte { return appendFrame(nil, 99, 0, id, nil, nil) }},
		{"call from the agent", func(id uint32) []byte { return appendFrame(nil, frameCall, 0, id, []byte("{}"), nil) }},
		{"header longer than the frame", func(id uint32) []byte {
			b := appendFrame(nil, frameReply, 0, id, nil, []byte("xx"))
			b[13] = 200
			return b
		}},
		{"truncated frame", func(id uint32) []byte { return appendFrame(nil, frameReply, 0, id, nil, []byte("xx"))[:12] }},
		{"body over max", func(id uint32) []byte {
			return appendFrame(nil, frameReply, 0, id, nil, bytes.Repeat([]byte("x"), 11))
		}},
		{"body over max in data", func(id uint32) []byte {
			return appendFrame(nil, frameData, 0, id, []byte(`{"size":5}`), bytes.Repeat([]byte("x"), 11))
		}},
		{"window for a call without input", func(id uint32) []byte {
			return appendFrame(nil, frameWindow, 0, id, nil, []byte{0, 0, 0, 1})
		}},
		{"garbage", func(uint32) []byte { return []byte("\x00\x00\x00\x0e this is not a frame at all") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, f := newFake(t)
			f.answer(tt.frames)
			errc := make(chan error, 1)
			go func() {
				_, err := c.ReadFile(context.Background(), "x", 10)
				errc <- err
			}()
			if tt.name == "truncated frame" {
				go func() { time.Sleep(10 * time.Millisecond); f.conn.Close() }()
			}
			expectBroken(t, c, errc)
		})
	}
}

func TestOutputOverWindowBreaksTheClient(t *testing.T) {
	c, f := newFake(t)
	go func() {
		fr, _ := f.next()
		chunk := bytes.Repeat([]byte("x"), chunkSize)
		for range window/chunkSize + 1 {
			f.write(appendFrame(nil, frameData, 0, fr.id, nil, chunk))
		}
	}()
	// Output holds on until the client breaks, so nothing returns credit.
	_, err := c.Run(context.Background(), workspace.Command{Script: "x", Output: func(workspace.Stream, []byte) { <-c.Done() }})
	if !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("err = %v", err)
	}
}

func TestHandshake(t *testing.T) {
	t.Run("no answer", func(t *testing.T) {
		a, b := net.Pipe()
		defer b.Close()
		go io.Copy(io.Discard, b)
		_, err := NewClient(a, WithHandshakeTimeout(50*time.Millisecond))
		if !errors.Is(err, workspace.ErrUnavailable) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("other version", func(t *testing.T) {
		a, b := net.Pipe()
		defer b.Close()
		go func() {
			r := bufio.NewReader(b)
			readFrame(r)
			b.Write(appendFrame(nil, frameHello, 0, 0, []byte(`{"version":99}`), nil))
		}()
		_, err := NewClient(a)
		if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "99") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("server refuses other version", func(t *testing.T) {
		a, b := net.Pipe()
		served := make(chan error, 1)
		go func() { served <- NewServer(memfs.New(), nil).Serve(context.Background(), b) }()
		go io.Copy(io.Discard, a)
		other := ProtocolVersion + 1
		a.Write(appendFrame(nil, frameHello, 0, 0, fmt.Appendf(nil, `{"version":%d}`, other), nil))
		if err := <-served; err == nil {
			t.Errorf("Serve accepted protocol %d", other)
		}
	})
	t.Run("server refuses garbage", func(t *testing.T) {
		a, b := net.Pipe()
		served := make(chan error, 1)
		go func() { served <- NewServer(memfs.New(), nil).Serve(context.Background(), b) }()
		a.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		if err := <-served; !errors.Is(err, errFrame) {
			t.Errorf("Serve: %v", err)
		}
	})
}

func TestCancelledCallsLeaveNoTrace(t *testing.T) {
	c := connect(t, memfs.New(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Stat(ctx, "."); !errors.Is(err, context.Canceled) {
		t.Errorf("Stat with a done context: %v", err)
	}
	// A write cancelled while its data streams.
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	err := c.WriteFile(ctx, "big", make([]byte, 64<<20), 0o644)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WriteFile: %v", err)
	}
	if _, err := c.Stat(context.Background(), "."); err != nil {
		t.Errorf("the stream after cancellations: %v", err)
	}
	// A cancelled call leaves the table once the agent has answered it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.calls)
		c.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls left in the table after 30 s", n)
		}
	}
}

// TestHungAgentIsHungUp: an agent that stops answering (frozen by a
// command, say) is hung up on the host side once a call is past its
// deadline and the grace, whatever the call's context says, and every call
// fails with ErrUnavailable naming why.
func TestHungAgentIsHungUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(c *Client) error
		want error // what the call itself returns
	}{
		{"RunPastItsTimeout", func(c *Client) error {
			_, err := c.Run(context.Background(), workspace.Command{Script: "sleep 600", Timeout: 50 * time.Millisecond})
			return err
		}, workspace.ErrUnavailable},
		{"RunCancelledNotReported", func(c *Client) error {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := c.Run(ctx, workspace.Command{Script: "sleep 600"})
			return err
		}, context.DeadlineExceeded},
		{"FileCallPastItsDeadline", func(c *Client) error {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := c.Stat(ctx, "x")
			return err
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hung := make(chan struct{})
			var f *fakeAgent
			c, f := newFake(t, WithHangGrace(50*time.Millisecond), WithCancelGrace(50*time.Millisecond),
				WithHangup(func() string {
					// As a killed container's: the stream ends before the
					// hangup returns; the errors still say why.
					f.conn.Close()
					close(hung)
					return "container killed"
				}))
			go func() {
				for { // read every call and answer none
					if _, err := readFrame(f.r); err != nil {
						return
					}
				}
			}()
			errc := make(chan error, 1)
			go func() { errc <- tc.call(c) }()
			select {
			case err := <-errc:
				if !errors.Is(err, tc.want) {
					t.Errorf("the call returned %v; want %v", err, tc.want)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the call did not return within 60 s of its deadline")
			}
			select {
			case <-hung:
			case <-time.After(60 * time.Second):
				t.Fatal("the hung agent was not hung up within 60 s")
			}
			<-c.Done()
			_, err := c.Stat(context.Background(), "y")
			if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "did not answer") || !strings.Contains(err.Error(), "container killed") {
				t.Errorf("a call after the hangup: %v", err)
			}
		})
	}
}

// TestStalledAgentIsNotHungUp: an agent kept from answering (its
// container paused: WithStall gives words) is not hung up: the late call
// fails as Unavailable with those words, and the client serves the next
// call once the agent answers again.
func TestStalledAgentIsNotHungUp(t *testing.T) {
	c, f := newFake(t, WithHangGrace(50*time.Millisecond), WithCancelGrace(50*time.Millisecond),
		WithHangup(func() string { t.Error("hung up"); return "" }),
		WithStall(func() string { return "container x is paused" }))
	late := make(chan struct{})
	go func() {
		f.next() // the run, never answered
		<-late
		f.answer(func(id uint32) []byte { return replyFrame(id, `{"n":"y","m":420}`) })
	}()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Run(context.Background(), workspace.Command{Script: "sleep 600", Timeout: 50 * time.Millisecond})
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, workspace.ErrUnavailable) || !strings.Contains(err.Error(), "is paused") {
			t.Fatalf("a run past its deadline in a paused container: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the run did not return within 60 s of its deadline")
	}
	if c.Err() != nil {
		t.Fatalf("the client ended: %v", c.Err())
	}
	close(late)
	if _, err := c.Stat(context.Background(), "y"); err != nil {
		t.Errorf("Stat once the agent answers again: %v", err)
	}
}

// TestAnsweringAgentIsNotHungUp: an agent that answers a cancelled call,
// however late the call was cancelled, is not taken for hung.
func TestAnsweringAgentIsNotHungUp(t *testing.T) {
	c, f := newFake(t, WithHangGrace(time.Hour), WithHangup(func() string { t.Error("hung up"); return "" }))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	answered := make(chan struct{})
	go func() {
		fr, _ := f.next()
		for { // answer once the client has given up and cancelled
			cf, err := readFrame(f.r)
			if err != nil || cf.typ == frameCancel && cf.id == fr.id {
				break
			}
		}
		f.write(replyFrame(fr.id, `{"n":"x","m":420}`))
		close(answered)
		f.answer(func(id uint32) []byte { return replyFrame(id, `{"n":"y","m":420}`) })
	}()
	if _, err := c.Stat(ctx, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stat: %v", err)
	}
	<-answered
	if _, err := c.Stat(context.Background(), "y"); err != nil {
		t.Errorf("Stat after a late answer: %v", err)
	}
}

// readGate is a FileSystem whose ReadFile counts the reads in progress and
// holds each until two are in progress at once, or a second has passed.
type readGate struct {
	workspace.FileSystem
	mu      sync.Mutex
	now, hi int
	two     chan struct{}
}

func (g *readGate) ReadFile(ctx context.Context, name string, limit int64) ([]byte, error) {
	g.mu.Lock()
	g.now++
	if g.hi = max(g.hi, g.now); g.now == 2 {
		close(g.two)
	}
	g.mu.Unlock()
	select {
	case <-g.two:
	case <-time.After(time.Second): // long enough for the other reads to arrive, were they let in
	}
	defer func() { g.mu.Lock(); g.now--; g.mu.Unlock() }()
	return g.FileSystem.ReadFile(ctx, name, limit)
}

// Concurrent reads of large files take their turn within the read budget,
// so the agent never holds more than it at once.
func TestReadsWithinBudget(t *testing.T) {
	ctx := context.Background()
	mem := memfs.New()
	big := bytes.Repeat([]byte("x"), 3<<20)
	if err := mem.WriteFile(ctx, "big", big, 0o644); err != nil {
		t.Fatal(err)
	}
	g := &readGate{FileSystem: mem, two: make(chan struct{})}
	a, b := net.Pipe()
	go NewServer(g, nil, WithReadBudget(4<<20)).Serve(ctx, b)
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if got, err := c.ReadFile(ctx, "big", 8<<20); err != nil || len(got) != len(big) {
				t.Errorf("ReadFile: %d bytes, %v", len(got), err)
			}
		})
	}
	wg.Wait()
	if g.hi != 1 {
		t.Errorf("%d reads of 3 MiB were in progress at once within a budget of 4 MiB", g.hi)
	}
}

// Output the command wrote before it was killed, but which reaches the
// agent only after the cancel (still in a pipe on a loaded machine), is
// delivered: Run returns the output so far with ctx's error.
func TestOutputAfterCancelDelivered(t *testing.T) {
	c := connect(t, memfs.New(), bashFunc(func(ctx context.Context, cmd workspace.Command) (workspace.Result, error) {
		cmd.Output(workspace.Stdout, []byte("started\n"))
		<-ctx.Done()
		cmd.Output(workspace.Stdout, []byte("written before the kill\n"))
		return workspace.Result{ExitCode: -1, Signal: "SIGKILL"}, ctx.Err()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out strings.Builder
	_, err := c.Run(ctx, workspace.Command{Script: "x", Output: func(_ workspace.Stream, p []byte) {
		out.Write(p)
		if out.String() == "started\n" {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) || out.String() != "started\nwritten before the kill\n" {
		t.Errorf("Run = %v, output %q; want Canceled and all the output", err, out.String())
	}
}

// shellFunc is a bashFunc that names its shell.
type shellFunc struct {
	bashFunc
	shell string
}

func (s shellFunc) Shell() string { return s.shell }

// TestHelloNamesTheShell: the client learns in the handshake which shell
// runs the agent's scripts, so the tools can say when it is not bash.
func TestHelloNamesTheShell(t *testing.T) {
	for _, tt := range []struct {
		bash workspace.Bash
		want string
	}{
		{nil, ""},
		{bashFunc(nil), ""},
		{shellFunc{nil, "/bin/sh"}, "/bin/sh"},
		{shellFunc{nil, "/bin/bash"}, "/bin/bash"},
	} {
		c := connect(t, memfs.New(), tt.bash)
		if got := workspace.ShellOf(c); got != tt.want || c.Agent().Shell != tt.want {
			t.Errorf("%T: the client says the shell is %q (%+v), want %q", tt.bash, got, c.Agent(), tt.want)
		}
	}
}

// TestSwapEditComputedHere: what an edit wrote is not taken from the agent
// (which sends none) but computed by the client from the old contents the
// agent reports, and the edit itself travels as the call's input.
func TestSwapEditComputedHere(t *testing.T) {
	c, f := newFake(t)
	edit := textedit.Edit{Replacements: []textedit.Replacement{{OldText: "old", NewText: "new"}}, Fuzzy: true}
	got := make(chan textedit.Edit, 1)
	go func() {
		fr, req := f.next()
		var e textedit.Edit
		if err := json.Unmarshal(fr.payload, &e); err != nil || !req.Edit || req.Size != int64(len(fr.payload)) {
			t.Errorf("the call: %+v with input %q (%v)", req, fr.payload, err)
		}
		got <- e
		f.write(replyFrame(fr.id, `{"real":"f","old":{"n":"f","s":5,"m":420},"oldData":"b2xkIGE=","hasData":true,"new":{"n":"f","s":5,"m":420}}`))
	}()
	res, err := c.Swap(context.Background(), workspace.SwapRequest{Name: "f", Max: 10, Edit: edit})
	if err != nil || string(res.OldData) != "old a" || string(res.Data) != "new a" {
		t.Fatalf("Swap = %+v, %v; want old %q, data %q", res, err, "old a", "new a")
	}
	if e := <-got; !reflect.DeepEqual(e, edit) {
		t.Errorf("the agent was sent %+v, want %+v", e, edit)
	}
}
