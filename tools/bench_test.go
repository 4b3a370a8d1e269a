package tools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// The benchmarks search a copy of the Go distribution's src (about 11,500
// files, 128 MB) on the local adapter, beside ripgrep and GNU grep on the
// same tree in the same run:
//
//	go test -run '^$' -bench 'Grep|Find' -benchtime 10x ./tools/
//
// rg and grep must be on PATH (apt-get install ripgrep); a missing one is
// skipped.

var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchDir != "" {
		os.RemoveAll(benchDir)
	}
	os.Exit(code)
}

// benchTree copies GOROOT/src to a temporary directory once per process.
func benchTree(b *testing.B) string {
	b.Helper()
	benchOnce.Do(func() {
		benchDir, benchErr = os.MkdirTemp("", "sandboxd-bench-")
		if benchErr != nil {
			return
		}
		goroot, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			benchErr = fmt.Errorf("go env GOROOT: %w", err)
			return
		}
		benchErr = copyTree(filepath.Join(strings.TrimSpace(string(goroot)), "src"), filepath.Join(benchDir, "src"))
		syscall.Sync() // write the copy back now, not while the first benchmark runs
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return filepath.Join(benchDir, "src")
}

func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		case d.Type().IsRegular():
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.Create(dst)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		}
		return nil
	})
}

// benchSet is a tool set over the tree on the local adapter (or, with
// plain, on hostFS) whose caps do not stop a search early, so it does the
// same work as rg and grep.
func benchSet(b *testing.B, dir string, plain bool) *tools.Set {
	b.Helper()
	var fsys workspace.FileSystem = hostFS(dir)
	if !plain {
		lfs, err := localfs.New(dir)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { lfs.Close() })
		fsys = lfs
	}
	cfg := tools.DefaultConfig()
	cfg.GrepMatches, cfg.FindResults, cfg.MaxLines, cfg.MaxBytes = 1<<30, 1<<30, 1<<30, 1<<30
	set, err := tools.New(tools.Env{FS: fsys, Session: workspace.Session{Root: dir}}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return set
}

// The benchmarks report, besides wall time, the CPU time (user and system,
// all threads) per operation as cpu-ms/op: on a shared machine it is the
// steadier measure of the work each tool does.

func runTool(b *testing.B, set *tools.Set, tool, args string) {
	b.Helper()
	before := cpuTime(syscall.RUSAGE_SELF)
	for b.Loop() {
		if r := set.Call(context.Background(), tool, json.RawMessage(args), tools.CallOptions{}); r.IsError {
			b.Fatal(r.Text)
		}
	}
	b.ReportMetric(float64(cpuTime(syscall.RUSAGE_SELF)-before)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
}

func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func runCommand(b *testing.B, dir string, argv ...string) {
	b.Helper()
	if _, err := exec.LookPath(argv[0]); err != nil {
		b.Skipf("%s not installed", argv[0])
	}
	var cpu time.Duration
	for b.Loop() {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		err := cmd.Run() // output to /dev/null
		if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() > 1) {
			b.Fatal(err)
		}
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	b.ReportMetric(float64(cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
}

func BenchmarkGrep(b *testing.B) {
	dir := benchTree(b)
	for _, pat := range []struct{ name, re string }{
		{"literal", "ErrUnexpectedEOF"},
		{"regex", `func \(\w+ \*\w+\) Close\(`},
		{"ignorecase", `(?i)deadline exceeded`},
	} {
		args, _ := json.Marshal(map[string]any{"pattern": pat.re})
		b.Run(pat.name+"/sandboxd", func(b *testing.B) { runTool(b, benchSet(b, dir, false), "grep", string(args)) })
		b.Run(pat.name+"/sandboxd-hostfs", func(b *testing.B) { runTool(b, benchSet(b, dir, true), "grep", string(args)) })
		b.Run(pat.name+"/rg", func(b *testing.B) { runCommand(b, dir, "rg", "-n", "--no-ignore", "--hidden", "-e", pat.re, ".") })
		b.Run(pat.name+"/grep-rn", func(b *testing.B) {
			re, args := pat.re, []string{"grep", "-rn", "-E"}
			if r, ok := strings.CutPrefix(re, "(?i)"); ok {
				re, args = r, append(args, "-i")
			}
			runCommand(b, dir, append(args, "-e", perlClasses(re), ".")...)
		})
	}
}

func BenchmarkFind(b *testing.B) {
	dir := benchTree(b)
	b.Run("sandboxd", func(b *testing.B) { runTool(b, benchSet(b, dir, false), "find", `{"pattern":"**/*_test.go"}`) })
	b.Run("sandboxd-hostfs", func(b *testing.B) { runTool(b, benchSet(b, dir, true), "find", `{"pattern":"**/*_test.go"}`) })
	b.Run("rg-files", func(b *testing.B) {
		runCommand(b, dir, "rg", "--files", "--no-ignore", "--hidden", "-g", "*_test.go", ".")
	})
	b.Run("find", func(b *testing.B) { runCommand(b, dir, "find", ".", "-name", "*_test.go", "-type", "f") })
}

// perlClasses rewrites \w for grep -E (GNU grep knows \w too, but be plain).
func perlClasses(re string) string {
	out := make([]byte, 0, len(re))
	for i := 0; i < len(re); i++ {
		if re[i] == '\\' && i+1 < len(re) && re[i+1] == 'w' {
			out = append(out, "[[:alnum:]_]"...)
			i++
			continue
		}
		out = append(out, re[i])
	}
	return string(out)
}

// hostFS is a bare, unconfined FileSystem over a host directory (plain os
// calls, no os.Root), for telling the tool layer's own cost from the local
// adapter's: benchmark only. It cannot change anything.
type hostFS string

var _ workspace.FileSystem = hostFS("")

func (h hostFS) path(name string) string { return filepath.Join(string(h), filepath.FromSlash(name)) }

func (h hostFS) Stat(_ context.Context, name string) (fs.FileInfo, error) {
	return os.Stat(h.path(name))
}
func (h hostFS) Lstat(_ context.Context, name string) (fs.FileInfo, error) {
	return os.Lstat(h.path(name))
}
func (h hostFS) ReadDir(_ context.Context, name string) ([]fs.DirEntry, error) {
	return os.ReadDir(h.path(name))
}
func (h hostFS) ReadFile(_ context.Context, name string, max int64) ([]byte, error) {
	data, err := os.ReadFile(h.path(name))
	if err == nil && int64(len(data)) > max {
		return nil, workspace.PathError("read", name, workspace.ErrFileTooLarge)
	}
	return data, err
}
func (h hostFS) WriteFile(_ context.Context, name string, _ []byte, _ fs.FileMode) error {
	return workspace.PathError("write", name, workspace.ErrForbidden)
}
func (h hostFS) Mkdir(_ context.Context, name string, _ fs.FileMode) error {
	return workspace.PathError("mkdir", name, workspace.ErrForbidden)
}
func (h hostFS) Remove(_ context.Context, name string) error {
	return workspace.PathError("remove", name, workspace.ErrForbidden)
}
func (h hostFS) Rename(_ context.Context, name, _ string) error {
	return workspace.PathError("rename", name, workspace.ErrForbidden)
}
