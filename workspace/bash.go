package workspace

import (
	"context"
	"io"
	"time"
)

// Bash runs commands in the workspace.
type Bash interface {
	// Run runs one command to its end and reports how it ended.
	//
	// The command runs in cmd.Dir with the adapter's base environment plus
	// cmd.Env, reads cmd.Stdin until it is exhausted and then sees end of
	// input, and its output is passed to cmd.Output as it arrives.
	//
	// A command that exits non-zero, is killed by a signal or runs past its
	// timeout is a Result, not an error. At the timeout, or when ctx ends, the
	// command's whole process tree is killed — children, background jobs and
	// processes that started a session of their own included, as far as the
	// adapter's isolation allows (each adapter documents its limits) — and Run
	// returns only once they are gone and their output has been delivered.
	// When ctx ends first, Run returns the Result so far and ctx's error.
	//
	// Errors: ErrNotFound or ErrNotADirectory for a bad cmd.Dir,
	// ErrInvalidArgument for a malformed Command, ErrForbidden when the host
	// permits no processes, ErrUnavailable when the backend is gone.
	Run(ctx context.Context, cmd Command) (Result, error)
}

// A ShellBash is a Bash that can say which program runs its scripts.
// Callers find it with ShellOf.
type ShellBash interface {
	Bash
	// Shell is the path of the program that runs Command.Script, such as
	// "/bin/bash" or "/bin/sh"; "" when it is not known.
	Shell() string
}

// ShellOf returns the program that runs b's scripts, or "" when b does not
// say (see ShellBash). A caller that promises bash checks it: a script run
// by a POSIX sh has no arrays and no [[ ]].
func ShellOf(b Bash) string {
	if sb, ok := b.(ShellBash); ok {
		return sb.Shell()
	}
	return ""
}

// Command is one command for Bash.Run. Exactly one of Script and Argv is set.
type Command struct {
	// Script is a shell command line, run by the adapter's shell (bash, or sh
	// where the sandbox has no bash).
	Script string
	// Argv is a program and its arguments, run without a shell. A program name
	// without a slash is looked up in the command's PATH.
	Argv []string
	// Dir is the working directory as a workspace name; "" is the root.
	Dir string
	// Env is added to the adapter's base environment, replacing variables of
	// the same name.
	Env map[string]string
	// Stdin is the command's standard input; nil is empty input.
	Stdin io.Reader
	// Timeout bounds the command's run; zero means only ctx bounds it.
	Timeout time.Duration
	// Output receives the command's output as it arrives. Calls are serial —
	// never concurrent — and p is only valid during the call. Nil discards.
	Output func(s Stream, p []byte)
	// Combined makes standard output and standard error one stream, as 2>&1
	// does: Output gets all of it, in the order the command wrote it, as
	// Stdout (an adapter's own notes may still come as Stderr). Without it
	// the two are read apart, and their order relative to each other is
	// not kept.
	Combined bool
}

// Stream names an output stream.
type Stream int

const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return "stream?"
}

// Result says how a command ended.
type Result struct {
	// ExitCode is the exit status; -1 when the command was killed by a signal.
	ExitCode int
	// Signal names the signal that killed the command ("SIGKILL"), or is empty.
	Signal string
	// TimedOut is set when the command ran past its timeout and was killed.
	TimedOut bool
	// Duration is how long the command ran.
	Duration time.Duration
}

// Session is the environment a tool call runs in.
type Session struct {
	// ID names the session; RunID names the current run (an agent's turn).
	ID, RunID string
	// Tenant names the session's owner, where a daemon has tenants.
	Tenant string
	// Root is the workspace root as an absolute path, as commands see it
	// ("/workspace" inside a container, the directory itself on local disk).
	Root string
	// Vars are variables the session adds to every command's environment.
	Vars map[string]string
}
