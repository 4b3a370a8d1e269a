package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestBench runs `sandboxd bench` briefly — a few calls on the memory and
// local backends, and on docker with its floors under CI — and checks the
// shape of what it prints: the load, a row per tool with a median and a
// 90th percentile for each backend, the ratios, and the floors with docker;
// with docker, also the calls held to the floor server (built here, as
// BENCHMARKS.md's rerun builds it), each on its three paths with the ratios.
func TestBench(t *testing.T) {
	backends := []string{"local", "memory"}
	args := []string{"bench", "--calls", "3", "--floor-calls", "1"}
	if os.Getenv("CI") != "" {
		backends = append(backends, "docker")
		floor := filepath.Join(t.TempDir(), "floorserver")
		build := exec.Command("go", "build", "-o", floor, "./testdata/floorserver")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building the floor server: %v: %s", err, out)
		}
		args = append(args, "--floor-server", floor)
	}
	// Docker's floors start containers: more than runBinary's bound on a
	// loaded machine.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	// The pairs against mcp-filesystem-server would build it from the
	// module proxy: TestBenchAgainstPeer has them, against a stand-in.
	cmd := exec.CommandContext(ctx, sandboxdBin, append(args, "--backends", strings.Join(backends, ","), "--fsserver", "none")...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd bench: %v: %s", err, stderr.String())
	}
	out := stdout.String()
	if strings.Contains(out, "mcp-filesystem-server") {
		t.Errorf("--fsserver none, and the pairs against mcp-filesystem-server were run:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^Load average \(1 min\): (\d+\.\d+|unknown) before, (\d+\.\d+|unknown) after`).MatchString(out) {
		t.Errorf("no load average in:\n%s", out)
	}
	cells := func(row string) []string { return strings.Split(strings.Trim(row, "| "), " | ") }
	rows := map[string][]string{}
	var header []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| ---") {
			continue
		}
		c := cells(line)
		if c[0] == "operation" {
			header = c
		}
		rows[c[0]] = c[1:]
	}
	var want []string
	for _, b := range backends {
		want = append(want, b+" median", b+" p90")
	}
	if got := header; len(got) != len(want)+1 || strings.Join(got[1:], ",") != strings.Join(want, ",") {
		t.Fatalf("table header %q, want the operation and %q", header, want)
	}
	duration := regexp.MustCompile(`^\d+\.\d\d ms$`)
	for _, op := range []string{"read small file", "write small file", "edit small file", "grep, 200 files", "bash `true`"} {
		row, ok := rows[op]
		if !ok || len(row) != len(want) {
			t.Errorf("row %q: %q", op, row)
			continue
		}
		for _, c := range row {
			if !duration.MatchString(c) {
				t.Errorf("row %q: cell %q is not a duration in ms", op, c)
			}
		}
	}
	factor := regexp.MustCompile(`^\d+\.\d\d×$`)
	for _, r := range []string{"write / read", "edit / read"} {
		row := rows[r]
		if len(row) != len(backends) {
			t.Errorf("ratio row %q: %q", r, row)
		}
		for _, c := range row {
			if !factor.MatchString(c) {
				t.Errorf("ratio row %q: cell %q", r, c)
			}
		}
	}
	floors := []string{"`docker exec CONTAINER true`", "`docker run --rm IMAGE true`",
		"cold session: create, start, first call (`ls`)", "warm-pool claim: create, first call (`ls`)"}
	for _, f := range floors {
		row, ok := rows[f]
		if ok != (len(backends) == 3) {
			t.Errorf("floor %q shown: %v, with backends %q", f, ok, backends)
		}
		if ok && (len(row) != 2 || !duration.MatchString(row[0]) || !duration.MatchString(row[1])) {
			t.Errorf("floor %q: %q", f, row)
		}
	}
	for _, c := range floorCalls {
		row, ok := rows[c.name]
		if ok != (len(backends) == 3) {
			t.Errorf("floor call %q shown: %v, with backends %q", c.name, ok, backends)
		}
		if !ok {
			continue
		}
		if len(row) != 7 {
			t.Errorf("floor call %q: %q", c.name, row)
			continue
		}
		timed := regexp.MustCompile(`^\d+\.\d\d ms / \d+\.\d\d ms$`)
		for i, cell := range row {
			re := map[bool]*regexp.Regexp{true: timed, false: factor}[i < 5]
			if i == 1 && c.port == nil {
				re = regexp.MustCompile(`^–$`) // bash has no port call
			}
			if !re.MatchString(cell) {
				t.Errorf("floor call %q: cell %d is %q", c.name, i, cell)
			}
		}
	}
}

// fakePeerEnv, set, makes the test binary a stand-in for
// mcp-filesystem-server (TestMain): an MCP server on standard input and
// output with its read_file, write_file and modify_file, over the
// directory named by its argument.
const fakePeerEnv = "SANDBOXD_TEST_FAKE_FSSERVER"

// serveFakePeer is the stand-in: each tool takes an absolute path, which
// must be inside dir, as the peer's do; modify_file fails when the text to
// find is not there.
func serveFakePeer(dir string) error {
	s := mcp.NewServer(&mcp.Implementation{Name: "fake-fsserver", Version: "v0"}, nil)
	type pathArgs struct {
		Path string `json:"path"`
	}
	inside := func(p string) (string, error) {
		if rel, err := filepath.Rel(dir, p); err != nil || !filepath.IsLocal(rel) {
			return "", fmt.Errorf("%s is outside %s", p, dir)
		}
		return p, nil
	}
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	mcp.AddTool(s, &mcp.Tool{Name: "read_file"}, func(_ context.Context, _ *mcp.CallToolRequest, a pathArgs) (*mcp.CallToolResult, any, error) {
		p, err := inside(a.Path)
		if err != nil {
			return nil, nil, err
		}
		data, err := os.ReadFile(p)
		return text(string(data)), nil, err
	})
	mcp.AddTool(s, &mcp.Tool{Name: "write_file"}, func(_ context.Context, _ *mcp.CallToolRequest, a struct {
		Path    string `json:"path"`
		Content string `json:"content"`
	}) (*mcp.CallToolResult, any, error) {
		p, err := inside(a.Path)
		if err != nil {
			return nil, nil, err
		}
		return text("written"), nil, os.WriteFile(p, []byte(a.Content), 0o644)
	})
	mcp.AddTool(s, &mcp.Tool{Name: "modify_file"}, func(_ context.Context, _ *mcp.CallToolRequest, a struct {
		Path           string `json:"path"`
		Find           string `json:"find"`
		Replace        string `json:"replace"`
		AllOccurrences bool   `json:"all_occurrences"`
	}) (*mcp.CallToolResult, any, error) {
		p, err := inside(a.Path)
		if err != nil {
			return nil, nil, err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, nil, err
		}
		if !strings.Contains(string(data), a.Find) {
			return nil, nil, fmt.Errorf("%q not found", a.Find)
		}
		return text("modified"), nil, os.WriteFile(p, []byte(strings.Replace(string(data), a.Find, a.Replace, 1)), 0o644)
	})
	return s.Run(context.Background(), &mcp.StdioTransport{})
}

// TestBenchAgainstPeer runs the pairs of the local backend against
// mcp-filesystem-server — here the stand-in (fakePeerEnv), given as a
// binary — and checks what bench prints: the peer's tools as found in its
// tools/list, a row per call with both medians and the ratio, and the
// write's floors timed beside it. The stand-in fails an edit whose text is
// not in its file, so the two servers' files are also seen to be changed
// in step.
func TestBenchAgainstPeer(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sandboxdBin, "bench", "--calls", "3", "--backends", "local", "--fsserver", exe)
	cmd.Env = append(os.Environ(), fakePeerEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd bench: %v: %s", err, stderr.String())
	}
	out := stdout.String()
	if want := "The local backend against " + exe + " (its read_file, write_file, modify_file), a 4 KB file, calls interleaved:"; !strings.Contains(out, want) {
		t.Errorf("no line %q in:\n%s", want, out)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if c := strings.Split(strings.Trim(line, "| "), " | "); strings.HasPrefix(line, "| ") {
			rows[c[0]] = c[1:]
		}
	}
	duration := regexp.MustCompile(`^\d+\.\d\d ms$`)
	for _, op := range []string{"read a 4 KB file", "write a 4 KB file", "edit one line of it"} {
		row := rows[op]
		if len(row) != 5 || !regexp.MustCompile(`^\d+\.\d\d×$`).MatchString(row[4]) {
			t.Errorf("row %q: %q, want 4 durations and a ratio", op, row)
			continue
		}
		for _, c := range row[:4] {
			if !duration.MatchString(c) {
				t.Errorf("row %q: cell %q is not a duration in ms", op, c)
			}
		}
	}
	for _, f := range []string{"4 KB `os.WriteFile` (in place, not flushed: the peer's write)",
		"4 KB temporary file renamed over the target, not flushed",
		"4 KB temporary file, fsync, rename",
		"4 KB temporary file, fsync, rename, fsync of the directory (localfs's write)"} {
		if row := rows[f]; len(row) != 2 || !duration.MatchString(row[0]) || !duration.MatchString(row[1]) {
			t.Errorf("floor %q: %q", f, row)
		}
	}
}
