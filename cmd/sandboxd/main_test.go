package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sandboxdBin is the sandboxd binary the end-to-end tests run, built once by
// TestMain.
var sandboxdBin string

func TestMain(m *testing.M) {
	if os.Getenv(fakePeerEnv) != "" && len(os.Args) == 2 { // bench's stand-in peer: see serveFakePeer
		if err := serveFakePeer(os.Args[1]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "sandboxd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sandboxdBin = filepath.Join(dir, "sandboxd")
	// Patches of sessions' work (sandboxd mcp's default delivery outside a
	// git repository) go here, not under the user's home.
	os.Setenv("XDG_STATE_HOME", filepath.Join(dir, "state"))
	// The agent goes beside sandboxd, where the docker backend finds it; it
	// runs in images without a C library, so it is built static.
	for _, b := range []struct{ out, pkg, cgo string }{{sandboxdBin, ".", ""}, {filepath.Join(dir, "sandboxd-agent"), "../sandboxd-agent", "CGO_ENABLED=0"}} {
		build := exec.Command("go", "build", "-o", b.out, b.pkg)
		build.Env = append(os.Environ(), b.cgo)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n", b.pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runInProcess runs sandboxd's main logic with args and returns its exit
// status, standard output and standard error.
func runInProcess(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), stdio{in: strings.NewReader(""), out: &out, err: &errb}, args)
	return code, out.String(), errb.String()
}

func TestUsage(t *testing.T) {
	ws := t.TempDir()
	badConfig := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(badConfig, []byte(`{"maxLines": -1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	caseConfig := filepath.Join(t.TempDir(), "case.json")
	if err := os.WriteFile(caseConfig, []byte(`{"workspaceShell": {"Mode": "read"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args     []string
		code     int
		out, err string // substrings of standard output and error
	}{
		{args: nil, code: 2, err: "Commands:"},
		{args: []string{"frobnicate"}, code: 2, err: `unknown command "frobnicate"`},
		{args: []string{"help"}, code: 0, out: "mcp "},
		{args: []string{"help", "tools"}, code: 0, out: "-json"},
		{args: []string{"help", "nope"}, code: 2, err: `unknown command "nope"`},
		{args: []string{"mcp", "-h"}, code: 0, out: "-always"},
		{args: []string{"--help"}, code: 0, out: "Commands:"},
		{args: []string{"-h"}, code: 0, out: "every command takes --help and --version"},
		{args: []string{"--version"}, code: 0, out: "sandboxd "},
		{args: []string{"serve", "--version"}, code: 0, out: "sandboxd "},
		{args: []string{"session", "call", "--version"}, code: 0, out: "sandboxd "},
		{args: []string{"session", "call", "--help"}, code: 0, out: "usage: sandboxd session call [--json] ID TOOL"},
		{args: []string{"token", "new", "-h"}, code: 0, out: "-version"},
		{args: []string{"help", "session", "ls"}, code: 0, out: "-json"},
		{args: []string{"help", "session"}, code: 0, out: "session call"},
		{args: []string{"session"}, code: 2, err: "sandboxd session: name one of its commands:\n\tsession create"},
		{args: []string{"session", "call", "only-an-id"}, code: 2, err: "sandboxd session call: want a session ID"},
		{args: []string{"session", "ls", "--token", ""}, code: 1, err: "sandboxd session ls: "},
		{args: []string{"version"}, code: 0, out: "sandboxd "},
		{args: []string{"bench", "--backends", "memory", "--floor-server", "floorserver"}, code: 2, err: "--floor-server holds Docker calls to the floor: add docker to --backends"},
		{args: []string{"bench", "--cpuprofile", "cpu.prof"}, code: 2, err: "--cpuprofile profiles the calls against the floor: give --floor-server too"},
		{args: []string{"version", "x"}, code: 2, err: "no arguments"},
		{args: []string{"mcp", "--frob"}, code: 2, err: "sandboxd mcp: flag provided but not defined: -frob"},
		{args: []string{"mcp", "--workspace", ws, "extra"}, code: 2, err: "unexpected arguments"},
		{args: []string{"mcp", "--backend", "cloud", "--workspace", ws}, code: 2, err: `unknown backend "cloud"`},
		{args: []string{"tools", "--workspace", ws, "--grant", "root"}, code: 2, err: `unknown grant "root"`},
		{args: []string{"tools", "--workspace", ws, "--always", "fly"}, code: 2, err: `unknown skill "fly"`},
		{args: []string{"tools", "--workspace", ws, "--image", "alpine"}, code: 2, err: "--image applies to --backend docker only"},
		{args: []string{"tools", "--workspace", ws, "--egress", "go"}, code: 2, err: "--egress applies to --backend docker only: local and memory commands use the host's network"},
		{args: []string{"tools", "--backend", "docker", "--workspace", ws, "--egress", "proxy.golang.org"}, code: 2, err: `--egress: egress rule "proxy.golang.org": want HOST:PORT`},
		{args: []string{"tools", "--backend", "docker", "--workspace", ws, "--ca-cert", filepath.Join(ws, "missing.pem")}, code: 2, err: "--ca-cert: caCerts: open " + filepath.Join(ws, "missing.pem")},
		{args: []string{"tools", "--backend", "docker", "--workspace", ws, "--ca-cert", badConfig}, code: 2, err: "--ca-cert: caCerts: " + badConfig + ": "},
		{args: []string{"tools", "--workspace", filepath.Join(ws, "missing")}, code: 1, err: "workspace"},
		{args: []string{"tools", "--workspace", ws, "--config", badConfig}, code: 1, err: badConfig + ": maxLines: must be positive, got -1"},
		{args: []string{"tools", "--workspace", ws, "--config", caseConfig}, code: 1, err: caseConfig + `: workspaceShell.Mode: unknown key; did you mean "workspaceShell.mode"?`},
		{args: []string{"tools", "--workspace", ws, "--always", "read,edit"}, code: 1, err: "needs the grant fs.write"},
		{args: []string{"tools", "--workspace", ws, "--grant", "fs.write", "--always", "edit,shell"}, code: 1, err: "needs the grant shell.exec"},
		{args: []string{"tools", "--backend", "memory", "--workspace", ws, "--grant", "shell.exec", "--always", "shell"}, code: 0, out: "bash         workspace.shell  true"},
		{args: []string{"tools", "--workspace", ws}, code: 0, out: "load_skill"},
		{args: []string{"image", "build", "huge"}, code: 2, err: `no image definition "huge" (known: dev, minimal)`},
		{args: []string{"doctor", "now"}, code: 2, err: "unexpected arguments"},
		{args: []string{"help", "image", "build"}, code: 0, out: "-rebuild"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := runInProcess(t, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errs, tc.err) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					code, out, errs, tc.code, tc.out, tc.err)
			}
		})
	}
}

func TestLookupPrefersLongestName(t *testing.T) {
	saved := commands
	t.Cleanup(func() { commands = saved })
	image := &command{name: "image"}
	build := &command{name: "image build"}
	commands = []*command{image, build}
	for _, tc := range []struct {
		args []string
		want *command
		rest int
	}{
		{[]string{"image", "build", "--tag", "x"}, build, 2},
		{[]string{"image", "ls"}, image, 1},
		{[]string{"images"}, nil, 0},
	} {
		got, rest := lookup(tc.args)
		if got != tc.want || len(rest) != tc.rest {
			t.Errorf("lookup(%q) = %v, %q", tc.args, got, rest)
		}
	}
}

// runBinary runs the built sandboxd with args and no input.
func runBinary(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, sandboxdBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errb.String()
}

// TestReadmeCommands runs every sandboxd command line the README shows —
// in its shell blocks and in its inline code — through the command's own
// flag parsing: each names a command that exists, with flags it takes and
// values of their kind. (Synopses' [optional] brackets are read as the
// flags they hold, and a|b as a.) What the commands then do is tested by
// the tests of each: e2e_test.go, serve_test.go, the integration package.
func TestReadmeCommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var snippets []string
	inBlock := false
	var block strings.Builder
	for line := range strings.Lines(string(readme)) {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inBlock = true
			block.Reset()
		case inBlock && strings.HasPrefix(line, "```"):
			inBlock = false
			snippets = append(snippets, block.String())
		case inBlock:
			block.WriteString(line)
		default:
			for i, span := range strings.Split(line, "`") {
				if i%2 == 1 {
					snippets = append(snippets, span)
				}
			}
		}
	}
	checked := 0
	for _, snippet := range snippets {
		for _, args := range sandboxdCalls(snippet) {
			checked++
			cmd, rest := lookup(args)
			if cmd == nil && len(args) == 1 && len(commandsUnder(args[0])) > 0 {
				continue // a group of commands named in prose: "the sandboxd session commands"
			}
			if cmd == nil {
				t.Errorf("the README shows sandboxd %s: no such command", strings.Join(args, " "))
				continue
			}
			fs, _, _ := cmd.flags()
			fs.SetOutput(io.Discard)
			if err := fs.Parse(rest); err != nil {
				t.Errorf("the README shows sandboxd %s: %v", strings.Join(args, " "), err)
			}
		}
	}
	if checked < 40 {
		t.Errorf("checked %d commands of the README; it shows more", checked)
	}
}

// sandboxdCalls finds the calls of sandboxd (or bin/sandboxd) in a shell
// snippet, as their arguments.
func sandboxdCalls(snippet string) [][]string {
	snippet = strings.NewReplacer("[", " ", "]", " ", "…", " ").Replace(snippet)
	var calls [][]string
	for line := range strings.Lines(strings.ReplaceAll(snippet, "\\\n", " ")) {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		for _, seg := range regexp.MustCompile(`&&|\|\||[;|()<>]|\$\(`).Split(line, -1) {
			words := strings.Fields(seg)
			i := slices.IndexFunc(words, func(w string) bool { return w == "sandboxd" || strings.HasSuffix(w, "/sandboxd") })
			if i < 0 || i+1 >= len(words) || !regexp.MustCompile(`^-|^[a-z]+$`).MatchString(words[i+1]) {
				continue // prose ("sandboxd's"), or the name alone
			}
			if slices.ContainsFunc(words, func(w string) bool { return strings.HasSuffix(w, ":") }) {
				continue // an error message quoted: "sandboxd session call: …"
			}
			var args []string
			for _, w := range words[i+1:] {
				if w == "..." || w == "-" && len(args) == 0 {
					continue
				}
				if a, _, ok := strings.Cut(w, "|"); ok && !strings.ContainsAny(w, `'"{`) {
					w = a
				}
				args = append(args, strings.Trim(w, `'"`))
			}
			calls = append(calls, args)
		}
	}
	return calls
}
