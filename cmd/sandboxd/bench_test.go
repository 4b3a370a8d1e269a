package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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
	cmd := exec.CommandContext(ctx, sandboxdBin, append(args, "--backends", strings.Join(backends, ","))...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd bench: %v: %s", err, stderr.String())
	}
	out := stdout.String()
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
