package interp

import (
	"path"
	"regexp"
	"strconv"
	"strings"

	"mvdan.cc/sh/v3/pattern"

	"github.com/sandboxd/sandboxd/workspace"
)

// grepFlags is the command line of grep: GNU grep's letters and long names,
// and what each sets.
var grepFlags = flagSpec[grepOptions]{
	bools: "rRnivlLcEFGPwxhHoqsaIUZyz", values: "efABCmd", numeric: "C",
	long: map[string]string{
		"recursive": "r", "dereference-recursive": "R", "line-number": "n", "ignore-case": "i",
		"no-ignore-case": "no-ignore-case", "invert-match": "v", "files-with-matches": "l",
		"files-without-match": "L", "count": "c", "extended-regexp": "E", "fixed-strings": "F",
		"basic-regexp": "G", "perl-regexp": "P", "word-regexp": "w", "line-regexp": "x",
		"no-filename": "h", "with-filename": "H", "only-matching": "o", "quiet": "q", "silent": "q",
		"no-messages": "s", "text": "a", "regexp": "e=", "file": "f=", "after-context": "A=",
		"before-context": "B=", "context": "C=", "max-count": "m=", "include": "include=",
		"exclude": "exclude=", "exclude-dir": "exclude-dir=", "color": "color?", "colour": "color?",
		"binary-files": "binary-files=", "directories": "d=", "null": "Z", "line-buffered": "line-buffered",
	},
	set: map[string]setter[grepOptions]{
		"r":              on(func(o *grepOptions) { o.recursive = true }),
		"R":              on(func(o *grepOptions) { o.recursive, o.follow = true, true }),
		"n":              on(func(o *grepOptions) { o.s.lineNumbers = true }),
		"i":              on(func(o *grepOptions) { o.ignoreCase = true }),
		"y":              on(func(o *grepOptions) { o.ignoreCase = true }),
		"no-ignore-case": on(func(o *grepOptions) { o.ignoreCase = false }),
		"v":              on(func(o *grepOptions) { o.s.invert = true }),
		"l":              on(func(o *grepOptions) { o.s.listMatch = true }),
		"L":              on(func(o *grepOptions) { o.s.listNo = true }),
		"c":              on(func(o *grepOptions) { o.s.count = true }),
		"E":              grepSyntax, "F": grepSyntax, "G": grepSyntax, "P": grepSyntax,
		"w": on(func(o *grepOptions) { o.word = true }),
		"x": on(func(o *grepOptions) { o.whole = true }),
		"h": on(func(o *grepOptions) { o.nameMode = -1 }),
		"H": on(func(o *grepOptions) { o.nameMode = 1 }),
		"o": on(func(o *grepOptions) { o.s.only = true }),
		"q": on(func(o *grepOptions) { o.s.quiet = true }),
		"s": on(func(o *grepOptions) { o.noMessages = true }),
		"a": on(func(o *grepOptions) { o.s.binary = 't' }),
		"I": on(func(o *grepOptions) { o.s.binary = 's' }),
		"e": withVal(func(o *grepOptions, v string) {
			o.patterns, o.havePatterns = append(o.patterns, strings.Split(v, "\n")...), true
		}),
		"f": func(c *call, o *grepOptions, _, v string) error {
			data, err := c.readInput(v)
			if err != nil {
				return failed(v, err, 2)
			}
			o.havePatterns = true
			for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
				if len(data) > 0 {
					o.patterns = append(o.patterns, l)
				}
			}
			return nil
		},
		"A": grepCount, "B": grepCount, "C": grepCount, "m": grepCount,
		"include":     withVal(func(o *grepOptions, v string) { o.include = append(o.include, v) }),
		"exclude":     withVal(func(o *grepOptions, v string) { o.exclude = append(o.exclude, v) }),
		"exclude-dir": withVal(func(o *grepOptions, v string) { o.excludeDir = append(o.excludeDir, v) }),
		"binary-files": func(_ *call, o *grepOptions, _, v string) error {
			switch v {
			case "binary":
				o.s.binary = 'r'
			case "text":
				o.s.binary = 't'
			case "without-match":
				o.s.binary = 's'
			default:
				return usagef("invalid argument '%s' for '--binary-files'", v)
			}
			return nil
		},
		"d": func(_ *call, o *grepOptions, _, v string) error {
			switch v {
			case "recurse":
				o.recursive = true
			case "read", "skip":
			default:
				return usagef("invalid argument '%s' for '--directories'", v)
			}
			return nil
		},
		"Z": notSupported[grepOptions], "z": notSupported[grepOptions], "U": notSupported[grepOptions],
	},
}

// grepSyntax is -E, -F, -G or -P: the patterns' syntax.
func grepSyntax(_ *call, o *grepOptions, name, _ string) error {
	o.syntax = name[0]
	return nil
}

// grepCount is -A, -B, -C or -m (see searcher.setCount).
func grepCount(_ *call, o *grepOptions, name, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return usagef("invalid argument '%s' to -%s", v, name)
	}
	o.s.setCount(name, n)
	return nil
}

// grepOptions are grep's arguments, parsed.
type grepOptions struct {
	s                                   *searcher // the output options; its matcher is set from the rest
	patterns                            []string
	havePatterns                        bool // -e or -f gave them
	syntax                              byte // 'G', 'E', 'F' or 'P'
	recursive, follow                   bool
	ignoreCase, word, whole, noMessages bool
	nameMode                            int // -1 -h, 1 -H
	include, exclude, excludeDir        []string
	operands                            []string
}

// parseGrep parses grep's arguments (reading -f's file); after an error,
// reported, it returns ok false and the status.
func parseGrep(c *call) (o grepOptions, status int, ok bool) {
	o = grepOptions{s: &searcher{maxCount: -1, binary: 'r'}, syntax: 'G'}
	ops, status, ok := parseFlags(c, &grepFlags, &o)
	if !ok {
		return o, status, false
	}
	if !o.havePatterns {
		if len(ops) == 0 {
			return o, c.usage("no pattern given (usage: grep [OPTION]... PATTERNS [FILE]...)"), false
		}
		o.patterns, ops = strings.Split(ops[0], "\n"), ops[1:]
	}
	o.operands = ops
	return o, 0, true
}

func cmdGrep(c *call) int {
	o, status, ok := parseGrep(c)
	if !ok {
		return status
	}
	s, ops := o.s, o.operands
	m, err := newLineMatcher(o.patterns, o.syntax, o.ignoreCase, o.word, o.whole)
	if err != nil {
		return c.usage("%v", err)
	}
	s.m = m
	bareRecursive := o.recursive && len(ops) == 0
	if len(ops) == 0 {
		ops = []string{"-"}
		if o.recursive {
			ops = []string{"."}
		}
	}
	s.withName = o.nameMode == 1 || (o.nameMode == 0 && (o.recursive || len(ops) > 1))
	run := &searchRun{c: c, s: s, noMessages: o.noMessages}
	for _, a := range ops {
		if c.stopped() || (s.quiet && run.matched) {
			break
		}
		if a == "-" {
			run.stdin("(standard input)")
			continue
		}
		ws, info, ok := run.operand(a)
		switch {
		case !ok:
		case !info.IsDir():
			if o.keep(a) {
				run.file(ws, a)
			}
		case !o.recursive:
			run.report(a, workspace.Errorf(workspace.ErrNotAFile, "%s: Is a directory", a))
		default:
			disp := a
			if bareRecursive {
				disp = ""
			}
			run.tree(ws, disp, o.follow, -1, o.skipDir, o.keep)
		}
	}
	return run.status()
}

// keep says whether grep -r searches the file rel: its base name matches an
// --include glob (when there is one) and no --exclude glob.
func (o *grepOptions) keep(rel string) bool {
	base := path.Base(rel)
	return (len(o.include) == 0 || anyGlob(o.include, base)) && !anyGlob(o.exclude, base)
}

// skipDir says whether grep -r leaves out the directory rel (--exclude-dir).
func (o *grepOptions) skipDir(rel string) bool { return anyGlob(o.excludeDir, path.Base(rel)) }

// anyGlob says whether name matches one of the shell patterns in list.
func anyGlob(list []string, name string) bool {
	for _, g := range list {
		if fnmatch(g, name) {
			return true
		}
	}
	return false
}

// fnmatch matches a name against a shell pattern (no special slash).
func fnmatch(pat, name string) bool {
	expr, err := pattern.Regexp(pat, pattern.EntireString|pattern.NoGlobStar)
	if err != nil {
		return false
	}
	re, err := regexp.Compile(expr)
	return err == nil && re.MatchString(name)
}
