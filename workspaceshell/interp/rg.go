package interp

import (
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/bmatcuk/doublestar/v4"
)

// rgFlags is the command line of rg: ripgrep's letters and long names,
// and what each sets.
var rgFlags = flagSpec[rgOptions]{
	bools: "inNlcvwxFsSHIoqaLuU.0P", values: "egtTABCmMdjr",
	long: map[string]string{
		"ignore-case": "i", "case-sensitive": "s", "smart-case": "S", "line-number": "n",
		"no-line-number": "N", "files-with-matches": "l", "files-without-match": "files-without-match",
		"count": "c", "invert-match": "v", "word-regexp": "w", "line-regexp": "x", "fixed-strings": "F",
		"with-filename": "H", "no-filename": "I", "only-matching": "o", "quiet": "q", "text": "a",
		"hidden": ".", "no-ignore": "no-ignore", "unrestricted": "u", "regexp": "e=", "glob": "g=",
		"iglob": "iglob=", "type": "t=", "type-not": "T=", "after-context": "A=", "before-context": "B=",
		"context": "C=", "max-count": "m=", "max-depth": "d=", "maxdepth": "d=", "files": "files",
		"heading": "heading", "no-heading": "no-heading", "color": "color=", "colors": "colors=",
		"sort": "sort=", "sortr": "sortr=", "threads": "j=", "follow": "L", "multiline": "U",
		"pcre2": "P", "no-messages": "no-messages", "null": "0", "max-columns": "M=",
		"no-ignore-vcs": "no-ignore", "no-config": "no-config", "replace": "r=",
	},
	set: map[string]setter[rgOptions]{
		"i":                   on(func(o *rgOptions) { o.ignoreCase, o.smart = true, false }),
		"s":                   on(func(o *rgOptions) { o.ignoreCase, o.smart = false, false }),
		"S":                   on(func(o *rgOptions) { o.smart = true }),
		"n":                   on(func(o *rgOptions) { o.s.lineNumbers = true }),
		"N":                   on(func(o *rgOptions) { o.s.lineNumbers = false }),
		"l":                   on(func(o *rgOptions) { o.s.listMatch = true }),
		"files-without-match": on(func(o *rgOptions) { o.s.listNo = true }),
		"c":                   on(func(o *rgOptions) { o.s.count = true }),
		"v":                   on(func(o *rgOptions) { o.s.invert = true }),
		"w":                   on(func(o *rgOptions) { o.word = true }),
		"x":                   on(func(o *rgOptions) { o.whole = true }),
		"F":                   on(func(o *rgOptions) { o.fixed = true }),
		"H":                   on(func(o *rgOptions) { o.nameMode = 1 }),
		"I":                   on(func(o *rgOptions) { o.nameMode = -1 }),
		"o":                   on(func(o *rgOptions) { o.s.only = true }),
		"q":                   on(func(o *rgOptions) { o.s.quiet = true }),
		"a":                   on(func(o *rgOptions) { o.s.binary = 't' }),
		".":                   on(func(o *rgOptions) { o.hidden = true }),
		"u":                   on(func(o *rgOptions) { o.unrestricted++ }),
		"e":                   withVal(func(o *rgOptions, v string) { o.patterns, o.havePatterns = append(o.patterns, v), true }),
		"g":                   withVal(func(o *rgOptions, v string) { o.globs = append(o.globs, v) }),
		"iglob":               withVal(func(o *rgOptions, v string) { o.iglobs = append(o.iglobs, v) }),
		"t":                   rgType, "T": rgType,
		"A": rgCount, "B": rgCount, "C": rgCount, "m": rgCount, "d": rgCount,
		"r":           withVal(func(o *rgOptions, v string) { o.s.replace = &v }),
		"files":       on(func(o *rgOptions) { o.listFiles = true }),
		"no-messages": on(func(o *rgOptions) { o.noMessages = true }),
		"L":           notSupported[rgOptions], "U": notSupported[rgOptions], "0": notSupported[rgOptions],
	},
}

// rgType is -t or -T: a file type to search, or to leave out.
func rgType(_ *call, o *rgOptions, name, v string) error {
	if _, known := rgTypes[v]; !known {
		return usagef("unrecognized file type: %s", v)
	}
	if name == "t" {
		o.types = append(o.types, v)
	} else {
		o.notTypes = append(o.notTypes, v)
	}
	return nil
}

// rgCount is -A, -B, -C, -m (see searcher.setCount) or -d, the depth.
func rgCount(_ *call, o *rgOptions, name, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return usagef("invalid value '%s' for -%s", v, name)
	}
	if name == "d" {
		o.maxDepth = int(n)
	} else {
		o.s.setCount(name, n)
	}
	return nil
}

// rgTypes are the file types -t and -T know, by extension or name.
var rgTypes = map[string][]string{
	"go": {"*.go"}, "js": {"*.js", "*.jsx", "*.mjs", "*.cjs", "*.vue"}, "ts": {"*.ts", "*.tsx", "*.cts", "*.mts"},
	"py": {"*.py", "*.pyi"}, "rust": {"*.rs"}, "c": {"*.c", "*.h"}, "cpp": {"*.cpp", "*.cc", "*.cxx", "*.hpp", "*.hh", "*.h"},
	"java": {"*.java"}, "md": {"*.md", "*.markdown"}, "markdown": {"*.md", "*.markdown"}, "json": {"*.json"},
	"yaml": {"*.yaml", "*.yml"}, "toml": {"*.toml"}, "sh": {"*.sh", "*.bash", "*.zsh"}, "html": {"*.html", "*.htm"},
	"css": {"*.css", "*.scss", "*.sass", "*.less"}, "ruby": {"*.rb", "Gemfile", "*.gemspec"}, "php": {"*.php"},
	"txt": {"*.txt"}, "sql": {"*.sql"}, "proto": {"*.proto"}, "kotlin": {"*.kt", "*.kts"}, "swift": {"*.swift"},
	"csharp": {"*.cs"}, "make": {"Makefile", "makefile", "GNUmakefile", "*.mk"}, "docker": {"Dockerfile", "*.dockerfile"},
	"xml": {"*.xml"}, "lua": {"*.lua"}, "zig": {"*.zig"}, "svelte": {"*.svelte"},
}

// rgOptions are rg's arguments, parsed.
type rgOptions struct {
	s                                    *searcher // the output options; its matcher is set from the rest
	patterns                             []string
	ignoreCase, smart, word, whole       bool
	fixed, hidden, listFiles, noMessages bool
	nameMode                             int // -1 -I, 1 -H
	maxDepth                             int // -1: no limit
	// globs are -g's and --iglob's globs, in order; a "!" negates one, and
	// an --iglob's is lower-cased and marked with a "\x00i" suffix.
	globs           []string
	iglobs          []string // --iglob's, until they join globs
	types, notTypes []string
	operands        []string
	havePatterns    bool // -e gave them
	unrestricted    int  // how many -u
}

// parseRg parses rg's arguments; after a usage error, reported, it returns
// ok false and the status.
func parseRg(c *call) (o rgOptions, status int, ok bool) {
	o = rgOptions{s: &searcher{maxCount: -1, binary: 's'}, maxDepth: -1}
	ops, status, ok := parseFlags(c, &rgFlags, &o)
	if !ok {
		return o, status, false
	}
	s, havePatterns, unrestricted, iglobs := o.s, o.havePatterns, o.unrestricted, o.iglobs
	if unrestricted >= 2 {
		o.hidden = true
	}
	if unrestricted >= 3 {
		s.binary = 't'
	}
	if !havePatterns && !o.listFiles {
		if len(ops) == 0 {
			return o, c.usage("no pattern given (usage: rg [OPTIONS] PATTERN [PATH ...])"), false
		}
		o.patterns, ops = []string{ops[0]}, ops[1:]
	}
	if o.smart && !o.ignoreCase {
		o.ignoreCase = !slices.ContainsFunc(o.patterns, func(p string) bool { return strings.ContainsFunc(p, unicode.IsUpper) })
	}
	for _, g := range iglobs {
		o.globs = append(o.globs, strings.ToLower(g)+"\x00i")
	}
	o.operands = ops
	return o, 0, true
}

func cmdRg(c *call) int {
	o, status, ok := parseRg(c)
	if !ok {
		return status
	}
	s, ops := o.s, o.operands
	syntax := byte('P')
	if o.fixed {
		syntax = 'F'
	}
	m, err := newLineMatcher(o.patterns, syntax, o.ignoreCase, o.word, o.whole)
	if err != nil {
		return c.usage("regex parse error: %v", err)
	}
	s.m = m
	useStdin := len(ops) == 0 && !o.listFiles && c.in != c.r.noInput
	bare := len(ops) == 0
	if bare && !useStdin {
		ops = []string{"."}
	}
	s.withName = o.nameMode == 1 || (o.nameMode == 0 && !useStdin)
	run := &searchRun{c: c, s: s, noMessages: o.noMessages, listing: o.listFiles}
	if useStdin {
		run.stdin("<stdin>")
	}
	for _, a := range ops {
		if c.stopped() {
			break
		}
		ws, info, ok := run.operand(a)
		switch {
		case !ok:
		case !info.IsDir():
			if len(ops) == 1 && o.nameMode == 0 {
				s.withName = false
			}
			run.file(ws, a)
		default:
			disp := a
			if bare {
				disp = ""
			}
			run.tree(ws, disp, false, o.maxDepth, o.skipDir, o.keep)
		}
	}
	return run.status()
}

// skipDir says whether rg leaves out the directory rel: a hidden one
// without --hidden, or one a negated glob names.
func (o *rgOptions) skipDir(rel string) bool {
	if !o.hidden && strings.HasPrefix(path.Base(rel), ".") {
		return true
	}
	for _, g := range o.globs {
		if ok, neg := rgGlobMatch(g, rel, true); ok && neg {
			return true
		}
	}
	return false
}

// keep says whether rg searches the file rel: not hidden (without
// --hidden), of the types asked, and selected by the last glob that
// matches it (or by none, when every glob is negated).
func (o *rgOptions) keep(rel string) bool {
	base := path.Base(rel)
	if !o.hidden && strings.HasPrefix(base, ".") {
		return false
	}
	if (len(o.types) > 0 && !rgTypeMatch(o.types, base)) || rgTypeMatch(o.notTypes, base) {
		return false
	}
	in := !slices.ContainsFunc(o.globs, func(g string) bool { return !strings.HasPrefix(g, "!") })
	for _, g := range o.globs {
		if ok, neg := rgGlobMatch(g, rel, false); ok {
			in = !neg
		}
	}
	return in
}

// rgGlobMatch matches an rg glob (see rgOptions.globs) against rel, a
// directory's when dir is set.
func rgGlobMatch(g, rel string, dir bool) (matched, negated bool) {
	g, fold := strings.CutSuffix(g, "\x00i")
	g, negated = strings.CutPrefix(g, "!")
	if fold {
		rel = strings.ToLower(rel)
	}
	g = strings.TrimPrefix(g, "/")
	name := rel
	if !strings.Contains(g, "/") {
		name = path.Base(rel)
	}
	ok, _ := doublestar.Match(g, name)
	if !ok && dir && strings.HasSuffix(g, "/**") {
		ok, _ = doublestar.Match(strings.TrimSuffix(g, "/**"), name)
	}
	return ok, negated
}

// rgTypeMatch says whether base is of one of the rg types in list.
func rgTypeMatch(list []string, base string) bool {
	for _, t := range list {
		for _, g := range rgTypes[t] {
			if ok, _ := doublestar.Match(g, base); ok {
				return true
			}
		}
	}
	return false
}
