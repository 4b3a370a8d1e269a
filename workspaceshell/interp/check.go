package interp

import (
	"fmt"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"

	"github.com/sandboxd/sandboxd/workspace"
)

// Mode selects what a line may do: inspect only, or inspect and change files.
type Mode string

const (
	// Read gives the shell tool with the inspection commands. It is the
	// default, and needs only read access to the workspace.
	Read Mode = "read"
	// Write adds mkdir, touch, cp, mv and rm and output redirections (and,
	// in the profile, the structured mutation tools). It needs write access.
	Write Mode = "write"
)

// OrRead returns m, or Read when m is empty.
func (m Mode) OrRead() Mode {
	if m == "" {
		return Read
	}
	return m
}

// The shell tool's commands, in catalogue order.
var (
	readCommands  = []string{"pwd", "ls", "find", "rg", "grep", "cat", "head", "tail", "wc"}
	writeCommands = []string{"mkdir", "touch", "cp", "mv", "rm"}
)

// ShellCommands returns the commands the shell tool runs in mode, in the
// order the catalogue lists them.
func ShellCommands(mode Mode) []string {
	if mode.OrRead() == Write {
		return slices.Concat(readCommands, writeCommands)
	}
	return slices.Clone(readCommands)
}

// Refusal is one thing in a command line the shell tool will not run.
type Refusal struct {
	Pos  string // "line:column" in the command line; empty when found while running
	What string // what was refused, as written: "rm", "> out.txt", "find -delete"
	Why  string // why, in words
}

func (r Refusal) String() string {
	if r.Pos == "" {
		return fmt.Sprintf("%s: %s", r.What, r.Why)
	}
	return fmt.Sprintf("%s (at %s): %s", r.What, r.Pos, r.Why)
}

// RefusedError is a command line the shell tool refuses. It matches
// workspace.ErrForbidden; nothing of a refused line has run.
type RefusedError struct {
	Refusals []Refusal
}

func (e *RefusedError) Error() string {
	parts := make([]string, len(e.Refusals))
	for i, r := range e.Refusals {
		parts[i] = r.String()
	}
	return "shell refused the command line: " + strings.Join(parts, "; ")
}

func (e *RefusedError) Unwrap() error { return workspace.ErrForbidden }

func refused(what, why string) *RefusedError {
	return &RefusedError{Refusals: []Refusal{{What: what, Why: why}}}
}

// maxLineBytes bounds a command line; longer lines are refused unparsed.
const maxLineBytes = 64 << 10

// Parse parses a command line in the Bash dialect. A syntax error fails with
// workspace.ErrInvalidArgument.
func Parse(line string) (*syntax.File, error) {
	if len(line) > maxLineBytes {
		return nil, workspace.Errorf(workspace.ErrInvalidArgument, "the command line is %d bytes; the shell tool takes at most %d", len(line), maxLineBytes)
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(line), "")
	if err != nil {
		return nil, workspace.Errorf(workspace.ErrInvalidArgument, "shell: syntax error: %v", err)
	}
	return f, nil
}

// Check parses line and checks every command in it against mode's allowlist
// without running anything. It returns nil, a syntax error
// (workspace.ErrInvalidArgument) or a *RefusedError listing everything
// refused (workspace.ErrForbidden).
func Check(line string, mode Mode) error {
	f, err := Parse(line)
	if err != nil {
		return err
	}
	return check(f, mode.OrRead(), false)
}

// check walks the whole syntax tree and refuses, by default, every kind of
// node it does not know to be safe: it is an allowlist of constructs as well
// as of commands. It keeps walking after a refusal so that the error lists
// every one, a forbidden command inside an unsupported construct included.
//
// curl is allowed only when the workspace has API-backed sources (curl).
func check(f *syntax.File, mode Mode, curl bool) error {
	c := checker{mode: mode, curl: curl}
	syntax.Walk(f, c.visit)
	if len(c.refusals) > 0 {
		return &RefusedError{Refusals: c.refusals}
	}
	return nil
}

type checker struct {
	mode     Mode
	curl     bool
	refusals []Refusal
}

func (c *checker) refuse(pos syntax.Pos, what, why string) {
	c.refusals = append(c.refusals, Refusal{Pos: pos.String(), What: what, Why: why})
}

// unsupported names the constructs the interpreter does not run.
var unsupported = map[string]string{
	"*syntax.FuncDecl":     "function definitions are not allowed: a function could stand in for an allowed command",
	"*syntax.DeclClause":   "declare, local, export, readonly and typeset set variables, which the shell tool does not allow",
	"*syntax.TestClause":   "[[ … ]] tests are not supported",
	"*syntax.ArithmCmd":    "(( … )) commands are not supported",
	"*syntax.LetClause":    "let sets variables, which the shell tool does not allow",
	"*syntax.CaseClause":   "case statements are not supported",
	"*syntax.CStyleLoop":   "C-style for loops are not supported",
	"*syntax.TimeClause":   "time is not supported",
	"*syntax.CoprocClause": "coprocesses are not supported",
	"*syntax.ExtGlob":      "extended globs are not supported",
	"*syntax.ProcSubst":    "process substitution is not supported",
	"*syntax.ArrayExpr":    "arrays are not supported",
	"*syntax.TestDecl":     "test declarations are not supported",
	"*syntax.FlagsArithm":  "zsh flags are not supported",
}

// describe names a construct for a refusal.
var describe = map[string]string{
	"*syntax.FuncDecl": "function definition", "*syntax.DeclClause": "declaration",
	"*syntax.TestClause": "[[ … ]]", "*syntax.ArithmCmd": "(( … ))", "*syntax.LetClause": "let",
	"*syntax.CaseClause": "case", "*syntax.CStyleLoop": "for (( … ))", "*syntax.TimeClause": "time",
	"*syntax.CoprocClause": "coproc", "*syntax.ExtGlob": "extended glob", "*syntax.ProcSubst": "process substitution",
	"*syntax.ArrayExpr": "array", "*syntax.TestDecl": "@test", "*syntax.FlagsArithm": "zsh flags",
}

// reservedVars are names a for loop may not assign: they steer expansion (IFS,
// HOME, PWD) or, for a process, what runs (PATH, loader variables).
var reservedVars = []string{"PATH", "IFS", "HOME", "PWD", "OLDPWD", "CDPATH", "GLOBIGNORE", "BASH_ENV", "ENV"}

func (c *checker) visit(n syntax.Node) bool {
	switch n := n.(type) {
	case nil, *syntax.File, *syntax.Comment, *syntax.Word, *syntax.Lit, *syntax.SglQuoted,
		*syntax.DblQuoted, *syntax.CmdSubst, *syntax.ArithmExp, *syntax.ParenArithm,
		*syntax.Subshell, *syntax.Block,
		*syntax.WhileClause, *syntax.IfClause,
		// Parts of constructs refused as a whole: walked for the commands
		// inside, not refused twice.
		*syntax.CaseItem, *syntax.ArrayElem, *syntax.BinaryTest, *syntax.UnaryTest, *syntax.ParenTest:
		if cs, ok := n.(*syntax.CmdSubst); ok && (cs.TempFile || cs.ReplyVar) {
			c.refuse(cs.Pos(), "${ …; }", "this form of command substitution is not supported")
		}
	case *syntax.Stmt:
		switch {
		case n.Background:
			c.refuse(n.Pos(), "&", "background jobs are not supported")
		case n.Coprocess, n.Disown:
			c.refuse(n.Pos(), "|&", "coprocesses are not supported")
		}
	case *syntax.BinaryCmd:
		switch n.Op {
		case syntax.AndStmt, syntax.OrStmt, syntax.Pipe, syntax.PipeAll:
		default:
			c.refuse(n.OpPos, n.Op.String(), "this operator is not supported")
		}
	case *syntax.ForClause:
		if n.Select {
			c.refuse(n.Pos(), "select", "select loops are not supported")
		}
	case *syntax.WordIter:
		if slices.Contains(reservedVars, n.Name.Value) || isLoaderVar(n.Name.Value) {
			c.refuse(n.Name.Pos(), "for "+n.Name.Value, "a loop may not assign "+n.Name.Value)
		}
	case *syntax.ParamExp:
		if n.Exp != nil && (n.Exp.Op == syntax.AssignUnset || n.Exp.Op == syntax.AssignUnsetOrNull) {
			c.refuse(n.Pos(), "${…"+n.Exp.Op.String()+"…}", "assigning variables is not allowed")
		}
		if n.NestedParam != nil || n.Flags != nil || n.Width || n.IsSet {
			c.refuse(n.Pos(), "${…}", "this form of parameter expansion is not supported")
		}
	case *syntax.BinaryArithm:
		if isArithmAssign(n.Op) {
			c.refuse(n.OpPos, n.Op.String(), "assigning variables is not allowed")
		}
	case *syntax.UnaryArithm:
		if n.Op == syntax.Inc || n.Op == syntax.Dec {
			c.refuse(n.OpPos, n.Op.String(), "assigning variables is not allowed")
		}
	case *syntax.Assign:
		name := "assignment"
		if n.Name != nil {
			name = n.Name.Value + "=…"
		}
		c.refuse(n.Pos(), name, "variable assignments are not allowed")
	case *syntax.Redirect:
		c.redirect(n)
	case *syntax.CallExpr:
		c.call(n)
	default:
		t := fmt.Sprintf("%T", n)
		what, why := describe[t], unsupported[t]
		if why == "" {
			what, why = t, "this construct is not supported"
		}
		c.refuse(n.Pos(), what, why)
	}
	return true
}

func isLoaderVar(name string) bool {
	return strings.HasPrefix(name, "LD_") || strings.HasPrefix(name, "DYLD_")
}

func isArithmAssign(op syntax.BinAritOperator) bool {
	switch op {
	case syntax.Assgn, syntax.AddAssgn, syntax.SubAssgn, syntax.MulAssgn, syntax.QuoAssgn,
		syntax.RemAssgn, syntax.AndAssgn, syntax.OrAssgn, syntax.XorAssgn, syntax.ShlAssgn,
		syntax.ShrAssgn, syntax.AndBoolAssgn, syntax.OrBoolAssgn, syntax.XorBoolAssgn, syntax.PowAssgn:
		return true
	}
	return false
}

// devNull is the one file every mode may redirect output to.
const devNull = "/dev/null"

func (c *checker) redirect(rd *syntax.Redirect) {
	what := rd.Op.String()
	if rd.N != nil {
		what = rd.N.Value + what
		if rd.N.Value != "0" && rd.N.Value != "1" && rd.N.Value != "2" {
			c.refuse(rd.Pos(), what, "only file descriptors 0, 1 and 2 can be redirected")
			return
		}
	}
	target, static := literal(rd.Word)
	if rd.Word != nil {
		what += " " + wordText(rd.Word)
	}
	switch rd.Op {
	case syntax.RdrIn, syntax.Hdoc, syntax.DashHdoc, syntax.WordHdoc:
	case syntax.RdrOut, syntax.AppOut, syntax.RdrClob, syntax.RdrAll, syntax.AppAll:
		if c.mode == Read && (!static || target != devNull) {
			c.refuse(rd.Pos(), what, "output redirection writes a file, and read mode changes no file (only "+devNull+" and 2>&1-style duplications are allowed)")
		}
	case syntax.DplOut:
		if !static || (target != "1" && target != "2" && target != "-") {
			c.refuse(rd.Pos(), what, "only >&1, >&2 and >&- are supported (>&FILE writes a file)")
		}
	case syntax.DplIn:
		if !static || (target != "0" && target != "-") {
			c.refuse(rd.Pos(), what, "only <&0 and <&- are supported")
		}
	case syntax.RdrInOut:
		c.refuse(rd.Pos(), what, "<> opens a file for writing")
	default:
		c.refuse(rd.Pos(), what, "this redirection is not supported")
	}
}

// builtinWhy explains why a well-known command that is not on the allowlist
// is refused, beyond "not allowed".
var builtinWhy = map[string]string{
	"eval": "it runs a string as a command line", "exec": "it replaces the shell with another program",
	"source": "it runs a file as a command line", ".": "it runs a file as a command line",
	"sh": "it runs another shell", "bash": "it runs another shell", "zsh": "it runs another shell",
	"dash": "it runs another shell", "env": "it runs another program", "xargs": "it runs another program",
	"command": "it runs another program", "builtin": "it runs another program", "sudo": "it runs another program",
	"curl": "it reaches the network (the workspace has no API-backed sources)", "wget": "it reaches the network",
	"alias": "aliases could stand in for allowed commands", "cd": "the working directory is always the workspace root",
}

func (c *checker) call(ce *syntax.CallExpr) {
	if len(ce.Args) == 0 {
		return
	}
	name, static := literal(ce.Args[0])
	if !static {
		c.refuse(ce.Args[0].Pos(), wordText(ce.Args[0]), "a command name must be a literal word, not an expansion")
		return
	}
	if !allowed(name, c.mode, c.curl) {
		c.refuse(ce.Args[0].Pos(), name, notAllowedWhy(name, c.mode))
		return
	}
	for _, w := range ce.Args[1:] {
		arg, ok := literal(w)
		if !ok {
			continue // checked again when the command runs
		}
		if why := forbiddenArg(name, arg); why != "" {
			c.refuse(w.Pos(), name+" "+arg, why)
		}
	}
}

func notAllowedWhy(name string, mode Mode) string {
	list := strings.Join(ShellCommands(mode), ", ")
	if mode == Read && slices.Contains(writeCommands, name) {
		return name + " changes files, and read mode changes no file; read mode runs only " + list
	}
	why := name + " is not one of the shell tool's commands (" + list + ")"
	if extra, ok := builtinWhy[name]; ok {
		why = name + " is not allowed: " + extra + "; the shell tool runs only " + list
	}
	return why
}

func allowed(name string, mode Mode, curl bool) bool {
	return slices.Contains(readCommands, name) || (mode == Write && slices.Contains(writeCommands, name)) ||
		(curl && name == "curl")
}

// forbiddenArg says why an argument is refused for a command, or "". The
// commands refuse these again when they run, for arguments that are not
// literal in the command line.
func forbiddenArg(cmd, arg string) string {
	switch cmd {
	case "find":
		switch arg {
		case "-delete":
			return "find -delete deletes files; the shell tool's find only lists (use rm in write mode)"
		case "-exec", "-execdir", "-ok", "-okdir":
			return "find " + arg + " runs commands; the shell tool's find only lists"
		case "-fprint", "-fprint0", "-fprintf", "-fls":
			return "find " + arg + " writes a file; the shell tool's find only prints"
		}
	case "rg":
		if arg == "--pre" || strings.HasPrefix(arg, "--pre=") || arg == "--pre-glob" || strings.HasPrefix(arg, "--pre-glob=") {
			return "rg --pre runs a program on every file"
		}
		if arg == "-z" || arg == "--search-zip" {
			return "rg --search-zip runs decompression programs"
		}
	}
	return ""
}

// literal returns the value of a word that expands to exactly one known
// string: plain, escaped and quoted text, with no expansion of any kind.
// Unquoted glob characters and braces are kept as written, so a word that
// globs never equals a command name.
func literal(w *syntax.Word) (string, bool) {
	if w == nil {
		return "", false
	}
	var b strings.Builder
	for _, p := range w.Parts {
		switch p := p.(type) {
		case *syntax.Lit:
			b.WriteString(unescape(p.Value, false))
		case *syntax.SglQuoted:
			if p.Dollar {
				return "", false
			}
			b.WriteString(p.Value)
		case *syntax.DblQuoted:
			if p.Dollar {
				return "", false
			}
			for _, q := range p.Parts {
				lit, ok := q.(*syntax.Lit)
				if !ok {
					return "", false
				}
				b.WriteString(unescape(lit.Value, true))
			}
		default:
			return "", false
		}
	}
	return b.String(), true
}

// unescape removes the backslashes quote removal removes: every one outside
// quotes, and inside double quotes those before $ ` " \ and a newline.
func unescape(s string, dquoted bool) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		next := s[i+1]
		switch {
		case next == '\n':
			i++ // a line continuation
		case !dquoted || strings.IndexByte("$`\"\\", next) >= 0:
			b.WriteByte(next)
			i++
		default:
			b.WriteByte('\\')
		}
	}
	return b.String()
}

// wordText prints a word as it was written, for messages.
func wordText(w *syntax.Word) string {
	var b strings.Builder
	if err := syntax.NewPrinter().Print(&b, w); err != nil {
		return "?"
	}
	return b.String()
}
