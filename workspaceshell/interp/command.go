package interp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/workspace"
)

// commands are the shell tool's commands, implemented over the FileSystem
// port. Each returns its exit status.
var commands map[string]func(*call) int

func init() {
	commands = map[string]func(*call) int{
		"pwd": cmdPwd, "ls": cmdLs, "find": cmdFind, "cat": cmdCat, "head": cmdHead,
		"tail": cmdTail, "wc": cmdWc, "grep": cmdGrep, "rg": cmdRg,
		"mkdir": cmdMkdir, "touch": cmdTouch, "cp": cmdCp, "mv": cmdMv, "rm": cmdRm,
		"curl": cmdCurl,
	}
}

// A flagSpec is a command's options: how they are spelt, GNU style —
// short options cluster ("-la"), a short option's value is attached or the
// next argument ("-n5", "-n 5"), long options take "--name=value" or
// "--name value", options and operands mix, and "--" ends the options —
// and what each does to the command's options O (set): the spelling and
// the meaning of an option in one place. An option spelt but not in set is
// accepted and does nothing (grep's --color).
type flagSpec[O any] struct {
	bools  string // short options without a value
	values string // short options with a value
	// long maps a long option to its canonical name; a canonical name ending
	// in "=" takes a value, one ending in "?" takes an optional "=value".
	long map[string]string
	// numeric, when set, reads "-5" as that option with the value "5"
	// ("n" for head and tail, "C" for grep's context).
	numeric string
	// set applies each option, by its canonical name.
	set map[string]setter[O]
}

// A setter applies one option to o: its canonical name, and its value for
// an option that takes one. An error from usagef is reported as a usage
// error (status 2), one from failed as the failure it names, with its
// status (curl -d @FILE's unreadable file: 26), any other as a failure on
// the value (status 2). Each ends the command.
type setter[O any] func(c *call, o *O, name, val string) error

// on is a setter that does f, whatever the option's name and value.
func on[O any](f func(o *O)) setter[O] {
	return func(_ *call, o *O, _, _ string) error { f(o); return nil }
}

// withVal is a setter that gives f the option's value.
func withVal[O any](f func(o *O, val string)) setter[O] {
	return func(_ *call, o *O, _, val string) error { f(o, val); return nil }
}

// notSupported is a setter that refuses the option.
func notSupported[O any](_ *call, _ *O, name, _ string) error {
	return usagef("-%s is not supported", name)
}

// usageError is a setter's usage error.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// failure is a setter's failure on arg, which ends the command with status.
type failure struct {
	arg    string
	err    error
	status int
}

func (f failure) Error() string { return f.err.Error() }

func failed(arg string, err error, status int) error { return failure{arg, err, status} }

// parseFlags reads c's arguments by f into o, which holds the options'
// defaults: it returns the operands, or reports the first mistake and
// returns ok false with the command's status.
func parseFlags[O any](c *call, f *flagSpec[O], o *O) (operands []string, status int, ok bool) {
	opts, operands, ok := c.lexFlags(f.bools, f.values, f.numeric, f.long)
	if !ok {
		return nil, 2, false
	}
	for _, op := range opts {
		set, ok := f.set[op.name]
		if !ok {
			continue
		}
		if err := set(c, o, op.name, op.val); err != nil {
			var u usageError
			var f failure
			switch {
			case errors.As(err, &u):
				return nil, c.usage("%s", u.msg), false
			case errors.As(err, &f):
				c.fail(f.arg, f.err)
				return nil, f.status, false
			}
			c.fail(op.val, err)
			return nil, 2, false
		}
	}
	return operands, 0, true
}

type opt struct{ name, val string }

// lexFlags splits c's arguments into options, by their canonical names, and
// operands (see flagSpec).
func (c *call) lexFlags(bools, values, numeric string, long map[string]string) (opts []opt, operands []string, ok bool) {
	args := c.args
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return opts, append(operands, args[i+1:]...), true
		case strings.HasPrefix(a, "--"):
			name, val, hasVal := strings.Cut(a[2:], "=")
			canon, known := long[name]
			if !known {
				c.usage("unrecognized option '--%s'", name)
				return nil, nil, false
			}
			switch {
			case strings.HasSuffix(canon, "="):
				canon = strings.TrimSuffix(canon, "=")
				if !hasVal {
					if i+1 == len(args) {
						c.usage("option '--%s' requires an argument", name)
						return nil, nil, false
					}
					i++
					val = args[i]
				}
			case strings.HasSuffix(canon, "?"):
				canon = strings.TrimSuffix(canon, "?")
			case hasVal:
				c.usage("option '--%s' doesn't allow an argument", name)
				return nil, nil, false
			}
			opts = append(opts, opt{canon, val})
		case len(a) > 1 && a[0] == '-':
			if numeric != "" && isDigits(a[1:]) {
				opts = append(opts, opt{numeric, a[1:]})
				continue
			}
		cluster:
			for j := 1; j < len(a); j++ {
				ch := a[j]
				switch {
				case strings.IndexByte(values, ch) >= 0:
					val := a[j+1:]
					if val == "" {
						if i+1 == len(args) {
							c.usage("option requires an argument -- '%c'", ch)
							return nil, nil, false
						}
						i++
						val = args[i]
					}
					opts = append(opts, opt{string(ch), val})
					break cluster
				case strings.IndexByte(bools, ch) >= 0 && ch < utf8.RuneSelf:
					opts = append(opts, opt{string(ch), ""})
				default:
					r, _ := utf8.DecodeRuneInString(a[j:])
					c.usage("invalid option -- '%c'", r)
					return nil, nil, false
				}
			}
		default:
			operands = append(operands, a)
		}
	}
	return opts, operands, true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ErrorText is an error's text as the shell's commands word it, the way
// coreutils does: "No such file or directory", or the message of an error
// this package or the guard worded itself.
func ErrorText(err error) string {
	if msg, ok := ownMessage(err); ok {
		return msg
	}
	if k := workspace.KindOf(err); k != nil {
		if t, ok := strerror[k]; ok {
			return t
		}
		t := k.Error()
		return strings.ToUpper(t[:1]) + t[1:]
	}
	return err.Error()
}

// ownMessage returns the message of an error this package (or the journal)
// worded itself: a *workspace.Error that no *fs.PathError carries, or the
// guard's *workspace.ProtectedError, which names the path itself. An
// adapter's error names an operation and a path, and is worded from its kind.
func ownMessage(err error) (string, bool) {
	var e *workspace.Error
	var pe *fs.PathError
	var pr *workspace.ProtectedError
	switch {
	case errors.As(err, &pr): // the guard's, naming the path
		return pr.Error(), true
	case errors.As(err, &e) && !errors.As(err, &pe):
		return e.Msg, true
	}
	return "", false
}

// strerror words kinds that have a C library counterpart the way the C
// library does, as coreutils messages show them.
var strerror = map[*workspace.Kind]string{
	workspace.ErrNotFound:      "No such file or directory",
	workspace.ErrExists:        "File exists",
	workspace.ErrNotADirectory: "Not a directory",
	workspace.ErrNotEmpty:      "Directory not empty",
	workspace.ErrForbidden:     "Operation not permitted",
	workspace.ErrFileTooLarge:  "File too large",
}

// call is one running command.
type call struct {
	r    *runner
	ctx  context.Context
	name string
	args []string
	in   io.Reader
	out  *bufio.Writer
	errw io.Writer
	werr error
}

// print writes to stdout; it reports false once stdout is gone (the reader
// of a pipe finished, or the output limit was reached).
func (c *call) print(s string) bool {
	if c.werr != nil {
		return false
	}
	_, c.werr = c.out.WriteString(s)
	return c.werr == nil
}

func (c *call) printf(format string, args ...any) bool {
	return c.print(fmt.Sprintf(format, args...))
}

func (c *call) write(p []byte) bool {
	if c.werr != nil {
		return false
	}
	_, c.werr = c.out.Write(p)
	return c.werr == nil
}

// stopped reports whether the command should stop: stdout is gone or the
// line is over.
func (c *call) stopped() bool { return c.werr != nil || c.ctx.Err() != nil }

// errorf writes "name: message" to stderr, after what stdout holds so far.
func (c *call) errorf(format string, args ...any) {
	c.out.Flush()
	fmt.Fprintf(c.errw, c.name+": "+format+"\n", args...)
}

// fail reports an error about a path the way coreutils does
// ("cat: x: No such file or directory").
func (c *call) fail(arg string, err error) {
	c.errorf("%s", describeErr(arg, err))
}

// usage reports a usage error; commands return status 2 for it.
func (c *call) usage(format string, args ...any) int {
	c.errorf(format, args...)
	return 2
}

// resolve turns an argument into a workspace name.
func (c *call) resolve(arg string) (string, error) {
	return workspace.Resolve(c.r.root, arg)
}

// readInput reads a file operand, or stdin for "-".
func (c *call) readInput(arg string) ([]byte, error) {
	if arg == "-" {
		return readAll(c.ctx, c.in, c.r.env.maxFileBytes())
	}
	name, err := c.resolve(arg)
	if err != nil {
		return nil, err
	}
	return c.r.env.FS.ReadFile(c.ctx, name, c.r.env.maxFileBytes())
}

func readAll(ctx context.Context, r io.Reader, max int64) ([]byte, error) {
	var b bytes.Buffer
	n, err := copyCtx(ctx, &b, io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, workspace.Errorf(workspace.ErrFileTooLarge, "input over %d bytes", max)
	}
	return b.Bytes(), nil
}

func copyCtx(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	buf := make([]byte, 32<<10)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// describeErr words an error about arg the way coreutils does: the kind's
// text with a capital, "x: No such file or directory"; messages of this
// package are passed as they are.
func describeErr(arg string, err error) string {
	if msg, ok := ownMessage(err); ok {
		return msg
	}
	return arg + ": " + ErrorText(err)
}

// display joins a path as the user wrote it with a name below it.
func display(base, rel string) string {
	if rel == "" || rel == "." {
		return base
	}
	if base == "" {
		return rel
	}
	if strings.HasSuffix(base, "/") {
		return base + rel
	}
	return base + "/" + rel
}

// baseName is the last element of a path as written ("." for ".", "/" for "/").
func baseName(p string) string {
	t := strings.TrimRight(p, "/")
	if t == "" {
		return "/"
	}
	return path.Base(t)
}
