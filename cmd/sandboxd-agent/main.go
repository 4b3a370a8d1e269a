// Command sandboxd-agent serves a workspace over its standard input and
// output, for the sandboxd host on the other end (see package agent). It runs
// as PID 1 of every session container:
//
//	sandboxd-agent serve --root /workspace
//
// It serves the FileSystem of localfs and the Bash of localexec over the
// directory, with the agent's own environment (the container's, which the
// host chose) as the base environment of commands. Standard output carries
// protocol frames only; the agent logs to standard error.
//
// As PID 1 it never exits while its standard input is open: SIGTERM, SIGINT,
// SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGPIPE are logged and otherwise
// ignored (SIGKILL sent from inside the container does not reach PID 1, so
// no command can end the session by signal), and it reaps the orphans the
// kernel hands it. It makes itself not dumpable (PR_SET_DUMPABLE 0), so a
// command running as the same user cannot ptrace it, read its memory or
// take its descriptors; commands, which it execs, are dumpable again.
//
// Its clients follow one another on its standard input and output
// (agent.Server.ServeShared): the engine keeps a container's input open
// when an attached client goes, so the agent runs on with no client, its
// background commands too, and serves the next client to attach, which
// announces itself with a resync line; a frame it cannot act on (one a
// dying client cut short) ends a connection, never the agent. When its
// input closes it ends every command, background ones included, waits for
// them, and exits with status 0; a broken stream exits with status 1.
//
// With --listen ADDR it serves TCP clients instead of its standard input,
// one at a time, each presenting the token of $SANDBOXD_AGENT_TOKEN
// (agent.Server.ServeListener): the Kubernetes backend's direct stream. It
// then never exits by itself; its pod is deleted.
//
// It needs no shell, no C library and no writable root file system: it is a
// static binary (CGO_ENABLED=0) that writes only inside the workspace and the
// lock directory under $TMPDIR. Without a shell in the image the FileSystem
// works and every command fails with workspace.ErrUnavailable.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/internal/proctree"
	"github.com/sandboxd/sandboxd/localexec"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// build is the build identifier announced in the handshake; set it with
// -ldflags "-X main.build=ID", or it is taken from the Go build information.
var build string

func main() {
	if os.Getenv(probeEnv) != "" {
		os.Exit(0) // the reaper's probe child (see reap_linux.go)
	}
	if len(os.Args) == 5 && os.Args[1] == "sparse" {
		if err := writeSparse(os.Args[2], os.Args[3], os.Args[4], os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent sparse:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) == 3 && os.Args[1] == "install" {
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-agent install:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: sandboxd-agent serve [--root DIR] [--env-allow NAMES] [--shell PATH] [--sync] [--listen ADDR]\n"+
			"       sandboxd-agent sparse ROOT NAME SIZE < extents\n"+
			"       sandboxd-agent install DEST")
		os.Exit(2)
	}
	flags := flag.NewFlagSet("serve", flag.ExitOnError)
	root := flags.String("root", "/workspace", "the workspace `directory`")
	envAllow := flags.String("env-allow", "", "comma-separated `names` of the agent's variables commands see (NAME* is a prefix); default: all of them")
	shell := flags.String("shell", "", "the shell that runs scripts (default bash, else sh)")
	sync := flags.Bool("sync", false, "flush every write to stable storage before it returns")
	listen := flags.String("listen", "", "serve clients that connect to this TCP `address` (see listen.go), not standard input")
	flags.Parse(os.Args[2:])
	os.Exit(serve(*root, *envAllow, *shell, *sync, *listen))
}

func serve(root, envAllow, shell string, sync bool, listen string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("agent", os.Getpid())
	// Before anything reads the environment: commands never see the token.
	token, err := listenToken(listen)
	if err != nil {
		log.Error("cannot listen", "err", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ignoreSignals(log)
	if err := undumpable(); err != nil {
		log.Warn("commands may ptrace the agent", "err", err)
	}
	if os.Getpid() == 1 {
		// PID 1 of the container adopts every orphan in it and reaps them,
		// so a command that runs alone needs no proctree shim: its end kills
		// all it left (see proctree.AdoptOrphans). The probe runs first: it
		// is the agent's one child not started through proctree.
		byPidfd := probePidfds()
		reserveThreads(8)
		if err := proctree.AdoptOrphans(); err != nil {
			log.Warn("every command runs under a shim", "err", err)
		}
		go reapOrphans(ctx, log, byPidfd)
	}

	// The agent is the one writer in the container that locks: its locks
	// need no lock files.
	fsys, err := localfs.New(root, localfs.WithSync(sync), localfs.WithProcessLocks())
	if err != nil {
		log.Error("cannot open the workspace", "err", err)
		return 1
	}
	defer fsys.Close()
	// Commands are the OOM killer's first choice, never the agent.
	opts := []localexec.Option{localexec.WithOOMScoreAdj(1000), localexec.WithInheritEnv(envAllow == "")}
	if envAllow != "" {
		opts = append(opts, localexec.WithEnvAllow(strings.Split(envAllow, ",")))
	}
	if shell != "" {
		opts = append(opts, localexec.WithShell(shell))
	}
	var bash workspace.Bash
	if b, err := localexec.New(root, opts...); err == nil {
		bash = b
	} else {
		log.Warn("commands are unavailable", "err", err)
		bash = noShell{err}
	}

	srv := agent.NewServer(fsys, bash, agent.WithBuild(buildID()), agent.WithLogger(log))
	log.Info("serving", "root", root, "build", buildID())
	if listen != "" {
		return serveListener(ctx, log, srv, listen, token)
	}
	defer srv.Close(context.Background()) // the background commands end with the agent
	err = srv.ServeShared(ctx, pollable(os.Stdin), pollable(os.Stdout))
	if err != nil {
		log.Error("stream ended", "err", err)
		return 1
	}
	log.Info("input closed; exiting")
	return 0
}

// writeSparse writes the file name under root (which must exist; a link
// is followed only while it stays under root) from extents, keeping its
// holes: extents is a sequence of "OFFSET LENGTH\n" lines, each followed by
// LENGTH bytes of data; everything between them stays a hole, and the file
// is cut or extended to size. The Docker backend uses it for the sparse files of an
// initial workspace, which the engine's archive API would write in full.
func writeSparse(root, name, size string, extents io.Reader) error {
	n, err := strconv.ParseInt(size, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("size %q", size)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := r.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return err
	}
	br := bufio.NewReader(extents)
	for {
		var off, length int64
		if _, err := fmt.Fscanf(br, "%d %d\n", &off, &length); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("extent: %w", err)
		}
		if off < 0 || length < 0 || off+length > n {
			return fmt.Errorf("extent %d+%d outside the file's %d bytes", off, length, n)
		}
		if _, err := io.CopyN(io.NewOffsetWriter(f, off), br, length); err != nil {
			return err
		}
	}
	if err := f.Truncate(n); err != nil {
		return err
	}
	return f.Close()
}

// install copies the running agent's own binary to dest, mode 0555: the
// Kubernetes backend's init container runs it from a FROM-scratch image that
// has no cp, to put the agent into a volume that the session's image then
// runs it from. The copy is written beside dest and renamed over it, so dest
// is never seen half written.
func install(dest string) error {
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer self.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".sandboxd-agent-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, self); err != nil {
		tmp.Close()
		return err
	}
	if err := errors.Join(tmp.Chmod(0o555), tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dest)
}

// pollable returns f made non-blocking, so that Go waits for it in its
// poller rather than in a thread of its own (where f allows it: pipes and
// sockets, which the agent's standard streams are in a container).
func pollable(f *os.File) *os.File {
	if err := syscall.SetNonblock(int(f.Fd()), true); err != nil {
		return f
	}
	return os.NewFile(f.Fd(), f.Name())
}

// reserveThreads makes the Go runtime start n more threads now, which it
// then keeps, idle, for reuse. A container's pids limit counts threads, and
// a command may use up the rest of it (a fork bomb): the runtime cannot
// start a thread then, and a Go program that needs one dies. PID 1 adopts
// the command's orphans, so their exits wake it (signals, reaping, the
// sweep of what a command left) just then; the reserve covers that.
func reserveThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread() // a thread of its own while it waits
			locked.Done()
			<-release
			runtime.UnlockOSThread() // back to the runtime's idle list
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}

// ignoreSignals keeps the signals that would end a Go program from ending
// the agent. They are caught, not ignored (SIG_IGN would be inherited by
// every command), so commands start with the default dispositions.
func ignoreSignals(log *slog.Logger) {
	c := make(chan os.Signal, 8)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	go func() {
		for s := range c {
			log.Info("signal ignored", "signal", s)
		}
	}()
}

// noShell is the Bash of an image without a shell.
type noShell struct{ err error }

func (n noShell) Run(context.Context, workspace.Command) (workspace.Result, error) {
	return workspace.Result{}, n.err
}

func buildID() string {
	if build != "" {
		return build
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	id := info.GoVersion
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			id = s.Value[:min(12, len(s.Value))] + " " + id
		case s.Key == "vcs.modified" && s.Value == "true":
			id = "dirty " + id
		}
	}
	return id
}
