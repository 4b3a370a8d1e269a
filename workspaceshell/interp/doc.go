// Package interp is the workspace shell's line interpreter: it runs one Bash
// command line over the workspace ports ([workspace.FileSystem]) in this
// process, starting no process, so it behaves the same on the memory, local
// and Docker backends. The profile around it (settings, catalogue, structured
// mutations, workspace_exec) is package workspaceshell.
//
// A line goes through three steps, each in its own place:
//
//   - parse ([Parse], check.go): the line is parsed as Bash with
//     mvdan.cc/sh/v3/syntax;
//   - check ([Check], check.go): every command and redirection in the whole
//     syntax tree is judged against the mode's allowlist before anything
//     runs: a refused line runs nothing and changes nothing;
//   - run ([Run], run.go): the statements are interpreted — pipes, lists,
//     loops, expansion, redirections written through the [Mutator] when
//     their command ends — and each command is dispatched to its
//     implementation, which checks the allowlist again on the expanded
//     arguments.
//
// The commands live in one file per family. Each parses its arguments before
// it does any work — into an options struct (lsOptions, catOptions,
// grepOptions, rgOptions, cpOptions …), find's into an expression —
// and reports a usage error there: listing.go (pwd, ls), text.go
// (cat, head, tail, wc), grep.go, rg.go and find.go (over [workspace.Walk]
// and [workspace.Grep]; search.go holds the searcher grep and rg share,
// pattern.go translates grep's regular expressions), write.go (mkdir,
// touch, cp, mv, rm in write mode, over the [Mutator]) and curl.go (curl
// to the workspace's API-backed sources). command.go holds what they
// share: the running command, GNU flag parsing and coreutils' wording of
// errors.
//
// # Why not mvdan.cc/sh/v3/interp
//
// The interpreter of mvdan.cc/sh (v3.14) was evaluated as the run step, with
// CallHandler refusing every name off the allowlist (builtins included: it
// runs for every simple command), ExecHandlers dispatching to the commands
// above, and OpenHandler, ReadDirHandler2, StatHandler and AccessHandler
// over the guarded view, the check above still run first. It is not used,
// because it would not keep these guarantees and behaviours:
//
//   - Redirections: Runner.open calls OpenHandler when the redirection is
//     applied, before the command runs, with os flags (O_TRUNC for ">"), and
//     the interpreter then streams the command's output into the file. Here
//     a redirected file is written when its command ends, through the
//     Mutator (write lock, atomic replace, the file-size bound), so
//     `cat f > f` keeps f. Worse, Runner.open treats any handler error that
//     is not an *os.PathError as fatal to the whole line (the guard's
//     *workspace.ProtectedError, a workspace.Error), and prints a PathError
//     in Go's words ("open src: is a directory"), where the line here goes
//     on with status 1 and says "shell: src: Is a directory".
//   - Process substitution: Runner creates a FIFO with mkfifo in TMPDIR of
//     the daemon's host and opens it with os.OpenFile, deliberately not
//     through OpenHandler (runner.go: "don't pass this along to the open
//     handler"). No handler can confine it; only the check can refuse it.
//   - CPU budget: Runner.stop checks only ctx between statements; there is
//     no per-statement hook, so Env.MaxSteps (statements, loop rounds
//     included) cannot be kept. CallHandler sees only simple commands with
//     arguments, not bare assignments or the rounds of an empty loop.
//   - Host state: Env(nil) gives the interpreter os.Environ() of the daemon,
//     Dir("") and Dir(path) consult the daemon's file system (os.Getwd,
//     os.Stat), $UID and $$ are the daemon's, and the cd builtin changes
//     Runner.Dir for later commands; each must be overridden or refused by
//     hand, and a new builtin in a later version would run unless the
//     CallHandler's refusal is kept complete.
//
// What it would give (globbing, expansion, pipes) this package already gets
// from mvdan.cc/sh/v3/expand and syntax; the statements it interprets are
// the few the check lets through.
//
// Run's guarantees are those of its doc comment; commit and rollback of the
// changes a line makes belong to the session around it.
package interp
