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
	commands = []*command{cmdMCP, cmdTools, cmdServe, cmdSessionCreate, cmdSessionList, cmdSessionRemove, cmdSessionCall, cmdImageBuild, cmdDoctor, cmdTokenNew, cmdTokenHash, cmdSoak, cmdVersion, cmdHelp}
}

// usageError is a mistake in how sandboxd was invoked; it exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, stdio{os.Stdin, os.Stdout, os.Stderr}, os.Args[1:])
	stop()
	os.Exit(code)
}

// run runs sandboxd with args (without the program name) and returns the exit
// status: 0 on success, 1 when the command failed, 2 for a usage error.
func run(ctx context.Context, sio stdio, args []string) int {
	if len(args) == 0 {
		printUsage(sio.err)
		return 2
	}
	cmd, rest := lookup(args)
	if cmd == nil {
		fmt.Fprintf(sio.err, "sandboxd: unknown command %q\nRun 'sandboxd help' for usage.\n", args[0])
		return 2
	}
	fs := flag.NewFlagSet("sandboxd "+cmd.name, flag.ContinueOnError)
	runCmd := cmd.setup(fs)
	setUsage(fs, cmd, sio.err)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package has printed the error and the usage
	}
	err := runCmd(ctx, sio, fs.Args())
	var ue *usageError
	switch {
	case err == nil:
		return 0
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
		fmt.Fprintf(w, "usage: sandboxd %s %s\n\n%s\n", cmd.name, cmd.args, cmd.summary)
		if hasFlags(fs) {
			fmt.Fprintln(w, "\nFlags:")
			fs.PrintDefaults()
		}
	}
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, "sandboxd gives AI coding agents a workspace: files and a shell, served over MCP.\n\n")
	fmt.Fprint(w, "Usage:\n\n\tsandboxd <command> [flags]\n\nCommands:\n\n")
	for _, c := range commands {
		fmt.Fprintf(w, "\t%-12s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'sandboxd help <command>' for a command's flags.\n")
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
			if cmd == nil || len(rest) > 0 {
				return usagef("unknown command %q", strings.Join(args, " "))
			}
			fs := flag.NewFlagSet("sandboxd "+cmd.name, flag.ContinueOnError)
			cmd.setup(fs)
			setUsage(fs, cmd, sio.out)
			fs.Usage()
			return nil
		}
	},
}
