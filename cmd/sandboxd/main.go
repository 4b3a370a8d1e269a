// Command sandboxd gives AI coding agents a workspace: the workspace tools
// (read, ls, find, grep, write, edit, bash) over a memory, local or Docker
// backend, served over the Model Context Protocol.
//
// Usage:
//
//	sandboxd <command> [flags]
//
// Run "sandboxd help" for the commands and "sandboxd help <command>" for one
// command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
)

// A command is one subcommand of sandboxd. Adding a subcommand is a file that
// defines one and a line in commands.
type command struct {
	name    string // as typed: "mcp", "tools", "image build"
	args    string // the synopsis after the name: "[flags]"
	summary string // one line for "sandboxd help"
	// setup declares the command's flags on fs and returns the function that
	// runs the command once they are parsed, with the arguments left over.
	setup func(fs *flag.FlagSet) runFunc
}

// flags declares the command's flags, and --version, which every command
// takes, on a new flag set; it returns the set, the function that runs the
// command once they are parsed, and the --version flag.
func (c *command) flags() (*flag.FlagSet, runFunc, *bool) {
	fs := flag.NewFlagSet("sandboxd "+c.name, flag.ContinueOnError)
	run := c.setup(fs)
	return fs, run, fs.Bool("version", false, "print sandboxd's version and exit")
}

type runFunc func(ctx context.Context, sio stdio, args []string) error

// stdio is a command's standard streams, passed in so tests can run commands
// in-process.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// commands lists every subcommand in the order "sandboxd help" shows them.
var commands []*command

func init() {
	commands = []*command{cmdMCP, cmdTools, cmdServe, cmdSessionCreate, cmdSessionList, cmdSessionRemove, cmdSessionCall, cmdSessionEgress, cmdSessionDiff, cmdSessionBaseline, cmdSessionGet, cmdSessionPut, cmdSessionSnapshot, cmdSessionFork, cmdSessionPause, cmdSessionResume, cmdSnapshotList, cmdSnapshotRemove, cmdImageBuild, cmdDoctor, cmdTokenNew, cmdTokenHash, cmdSoak, cmdBench, cmdVersion, cmdHelp}
}

// usageError is a mistake in how sandboxd was invoked; it exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// exitStatus ends a command with a status of its own: "session call" passes
// on the exit status of the command it ran. Err, when not nil, is shown.
type exitStatus struct {
	code int
	err  error
}

func (e *exitStatus) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

// self is how the user ran sandboxd, for the commands it prints for them
// to run: "bin/sandboxd" when run as that, "sandboxd" when found on PATH
// (and in tests, which call run).
var self = "sandboxd"

func main() {
	if a := os.Args[0]; strings.Contains(a, "/") {
		if p, err := exec.LookPath("sandboxd"); err != nil || p != a {
			self = a
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, stdio{os.Stdin, os.Stdout, os.Stderr}, os.Args[1:])
	stop()
	os.Exit(code)
}

// run runs sandboxd with args (without the program name) and returns the exit
// status: 0 on success, 1 when the command failed, 2 for a usage error, or
// the status the command chose (an *exitStatus). Every command takes -h,
// --help and --version; help and the version go to standard output, errors
// to standard error prefixed with the command they came from.
func run(ctx context.Context, sio stdio, args []string) int {
	if len(args) == 0 {
		printUsage(sio.err)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printUsage(sio.out)
		return 0
	case "-version", "--version":
		printVersion(sio.out)
		return 0
	}
	cmd, rest := lookup(args)
	if cmd == nil {
		if group := commandsUnder(args[0]); len(group) > 0 {
			fmt.Fprintf(sio.err, "sandboxd %s: name one of its commands:\n", args[0])
			printCommands(sio.err, group)
			return 2
		}
		fmt.Fprintf(sio.err, "sandboxd: unknown command %q\nRun 'sandboxd help' for usage.\n", args[0])
		return 2
	}
	fs, runCmd, showVersion := cmd.flags()
	// The flag package prints a parse error, then the usage; both are
	// gathered here, so the error can name the command and help can go to
	// standard output.
	var usage strings.Builder
	setUsage(fs, cmd, &usage)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			io.WriteString(sio.out, usage.String()) // the usage alone
			return 0
		}
		fmt.Fprintf(sio.err, "sandboxd %s: %v\n", cmd.name, err)
		setUsage(fs, cmd, sio.err)
		fs.Usage()
		return 2
	}
	if *showVersion {
		printVersion(sio.out)
		return 0
	}
	setUsage(fs, cmd, sio.err)
	err := runCmd(ctx, sio, fs.Args())
	var ue *usageError
	var es *exitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &es):
		if es.err != nil {
			fmt.Fprintf(sio.err, "sandboxd %s: %v\n", cmd.name, es.err)
		}
		return es.code
	case errors.As(err, &ue):
		fmt.Fprintf(sio.err, "sandboxd %s: %v\n", cmd.name, err)
		fs.Usage()
		return 2
	default:
		fmt.Fprintf(sio.err, "sandboxd %s: %v\n", cmd.name, err)
		return 1
	}
}

// lookup finds the command args start with, preferring the longest name (so
// "image build" wins over a command "image"), and returns the arguments after it.
func lookup(args []string) (*command, []string) {
	var best *command
	var bestWords int
	for _, c := range commands {
		words := strings.Fields(c.name)
		if len(words) > len(args) || len(words) <= bestWords {
			continue
		}
		match := true
		for i, w := range words {
			if args[i] != w {
				match = false
				break
			}
		}
		if match {
			best, bestWords = c, len(words)
		}
	}
	if best == nil {
		return nil, nil
	}
	return best, args[bestWords:]
}

// setUsage makes fs print the command's synopsis and flags to w.
func setUsage(fs *flag.FlagSet, cmd *command, w io.Writer) {
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "usage: %s\n\n%s\n", strings.TrimSpace("sandboxd "+cmd.name+" "+cmd.args), cmd.summary)
		if hasFlags(fs) {
			fmt.Fprintln(w, "\nFlags:")
			printFlags(w, fs)
		}
	}
}

// printFlags lists fs's flags as flag.PrintDefaults does, but spelled as the
// synopses and the README spell them, --name (the flag package takes -name
// and --name alike).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		var b strings.Builder
		fmt.Fprintf(&b, "  --%s", f.Name)
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch d := f.DefValue; {
		case d == "" || d == "false" || d == "0":
		case name == "string":
			fmt.Fprintf(&b, " (default %q)", d)
		default:
			fmt.Fprintf(&b, " (default %v)", d)
		}
		fmt.Fprintln(w, b.String())
	})
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, "sandboxd gives AI coding agents a workspace: files and a shell, served over MCP.\n\n")
	fmt.Fprint(w, "Usage:\n\n\tsandboxd <command> [flags]\n\nCommands:\n\n")
	printCommands(w, commands)
	fmt.Fprint(w, "\nRun 'sandboxd help <command>' for a command's flags; every command takes --help and --version.\n")
}

func printCommands(w io.Writer, cmds []*command) {
	for _, c := range cmds {
		fmt.Fprintf(w, "\t%-15s %s\n", c.name, c.summary)
	}
}

// commandsUnder are the commands whose name starts with the word group
// ("session": session create, session ls, …).
func commandsUnder(group string) []*command {
	var under []*command
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			under = append(under, c)
		}
	}
	return under
}

var cmdHelp = &command{
	name:    "help",
	args:    "[command]",
	summary: "show the commands, or one command's flags",
	setup: func(*flag.FlagSet) runFunc {
		return func(_ context.Context, sio stdio, args []string) error {
			if len(args) == 0 {
				printUsage(sio.out)
				return nil
			}
			cmd, rest := lookup(args)
			if cmd == nil && len(args) == 1 {
				if group := commandsUnder(args[0]); len(group) > 0 {
					printCommands(sio.out, group)
					return nil
				}
			}
			if cmd == nil || len(rest) > 0 {
				return usagef("unknown command %q", strings.Join(args, " "))
			}
			fs, _, _ := cmd.flags()
			setUsage(fs, cmd, sio.out)
			fs.Usage()
			return nil
		}
	},
}
