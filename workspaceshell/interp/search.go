package interp

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/bmatcuk/doublestar/v4"
	"mvdan.cc/sh/v3/pattern"

	"github.com/sandboxd/sandboxd/workspace"
)

// searcher prints what grep or rg found in one input.
type searcher struct {
	m                         *lineMatcher
	invert, only, lineNumbers bool
	count, listMatch, listNo  bool
	quiet                     bool
	withName                  bool
	before, after             int
	maxCount                  int64 // < 0: no limit
	binary                    byte  // 'r' report (grep), 's' skip, 't' text
	replace                   *string
	printedGroup              bool // a group was printed: the next one is separated by "--"
}

// setCount applies a numeric option grep and rg share: -A, -B and -C (lines
// of context after, before, around) and -m (the most matches per file).
func (s *searcher) setCount(name string, n int64) {
	switch name {
	case "A":
		s.after = int(n)
	case "B":
		s.before = int(n)
	case "C":
		s.before, s.after = int(n), int(n)
	case "m":
		s.maxCount = n
	}
}

// search searches data (the input called name) and reports whether a line
// was selected.
func (s *searcher) search(c *call, name string, data []byte) bool {
	isBinary := s.binary != 't' && bytes.IndexByte(data, 0) >= 0
	if isBinary && s.binary == 's' {
		return false
	}
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return s.searchLines(c, name, lines, nil, isBinary)
}

// searchLines is search over the lines of an input. known, when not nil,
// says which lines it holds: the others are taken as lines that do not
// match, and are never shown (the input is what a workspace.Grep reported,
// with enough context around each match).
func (s *searcher) searchLines(c *call, name string, lines [][]byte, known []bool, isBinary bool) bool {
	match := func(i int) bool { return (known == nil || known[i]) && s.m.match(lines[i]) }
	quietOut := s.quiet || s.count || s.listMatch || s.listNo || isBinary
	var selected int64
	lastPrinted, afterLeft := -1, 0
	prefix := func(i int, sep byte) string {
		var b strings.Builder
		if s.withName {
			b.WriteString(name)
			b.WriteByte(sep)
		}
		if s.lineNumbers {
			b.WriteString(strconv.Itoa(i + 1))
			b.WriteByte(sep)
		}
		return b.String()
	}
	context := s.before > 0 || s.after > 0
	printLine := func(i int, sep byte) {
		c.print(prefix(i, sep))
		c.write(lines[i])
		c.print("\n")
		lastPrinted = i
	}
	for i, line := range lines {
		if c.stopped() {
			break
		}
		if s.maxCount >= 0 && selected >= s.maxCount {
			if quietOut || afterLeft == 0 || match(i) != s.invert {
				break
			}
		}
		if match(i) == s.invert {
			if !quietOut && afterLeft > 0 && !s.only {
				printLine(i, '-')
				afterLeft--
			}
			continue
		}
		selected++
		if s.quiet || s.listMatch {
			break
		}
		if quietOut {
			continue
		}
		if context {
			from := max(i-s.before, lastPrinted+1)
			if s.printedGroup && (lastPrinted < 0 || from > lastPrinted+1) {
				c.print("--\n")
			}
			s.printedGroup = true
			if !s.only {
				for k := from; k < i; k++ {
					printLine(k, '-')
				}
			}
			afterLeft = s.after
		}
		switch {
		case s.only:
			if !s.invert {
				for _, sp := range s.m.spans(line) {
					c.print(prefix(i, ':'))
					c.write(line[sp[0]:sp[1]])
					c.print("\n")
				}
			}
			lastPrinted = i
		case s.replace != nil && !s.m.word:
			c.print(prefix(i, ':'))
			c.write(s.m.re.ReplaceAll(line, []byte(*s.replace)))
			c.print("\n")
			lastPrinted = i
		default:
			printLine(i, ':')
		}
	}
	switch {
	case s.count:
		if s.withName {
			c.print(name + ":")
		}
		c.print(strconv.FormatInt(selected, 10) + "\n")
	case s.listMatch && selected > 0:
		c.print(name + "\n")
	case s.listNo && selected == 0:
		c.print(name + "\n")
	case isBinary && selected > 0 && !s.quiet && !s.listMatch && !s.listNo:
		c.out.Flush()
		fmt.Fprintf(c.errw, "%s: %s: binary file matches\n", c.name, name)
	}
	return selected > 0
}

// treeFile is a file a recursive search visits.
type treeFile struct {
	ws, disp string
	size     int64
	link     bool // a link to a regular file, followed
}

// treeFiles lists the files below the directory ws (shown as disp) in one
// workspace.Walk, depth first and sorted, skipping the workspace's exclude
// names. skipDir prunes directories and keep selects files (rel is the path
// below ws, depth 1 for ws's entries); links are listed only with follow,
// and then only links to files. A start that cannot be listed, and each
// directory below it that cannot be read, is reported with onErr.
func (c *call) treeFiles(ws, disp string, follow bool, maxDepth int,
	skipDir func(rel string) bool, keep func(rel string) bool, onErr func(disp string, err error)) []treeFile {
	w, err := workspace.Walk(c.ctx, c.r.env.FS, workspace.WalkRequest{Dir: ws, Exclude: c.r.env.exclude(), Info: true, Errors: true})
	if err != nil {
		onErr(disp, err)
		return nil
	}
	prefix := ws + "/"
	if ws == "." {
		prefix = ""
	}
	var out []treeFile
	pruned := "" // a directory whose entries are left out, with a trailing "/"
	for _, e := range w.Entries {
		if c.stopped() {
			break
		}
		rel, ok := strings.CutPrefix(e.Path, prefix)
		if e.Err != nil { // a directory below the start that could not be read
			if ok && rel+"/" != pruned && (pruned == "" || !strings.HasPrefix(rel, pruned)) {
				onErr(display(disp, rel), e.Err)
			}
			continue
		}
		if !ok || (pruned != "" && strings.HasPrefix(rel, pruned)) {
			continue
		}
		pruned = ""
		depth := strings.Count(rel, "/") + 1
		switch e.Type {
		case fs.ModeDir:
			if (maxDepth >= 0 && depth >= maxDepth) || skipDir(rel) {
				pruned = rel + "/"
			}
		case fs.ModeSymlink:
			if !follow {
				continue
			}
			if info, err := c.r.env.FS.Stat(c.ctx, e.Path); err == nil && info.Mode().IsRegular() && keep(rel) {
				out = append(out, treeFile{ws: e.Path, disp: display(disp, rel), size: info.Size(), link: true})
			}
		case 0:
			if keep(rel) {
				out = append(out, treeFile{ws: e.Path, disp: display(disp, rel), size: e.Size})
			}
		}
	}
	return out
}

// ---- grep

var grepFlags = flagSpec{
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
}

// grepOptions are grep's arguments, parsed.
type grepOptions struct {
	s                                   *searcher // the output options; its matcher is set from the rest
	patterns                            []string
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
	opts, ops, ok := c.parseFlags(grepFlags)
	if !ok {
		return o, 2, false
	}
	o = grepOptions{s: &searcher{maxCount: -1, binary: 'r'}, syntax: 'G'}
	s := o.s
	havePatterns := false
	for _, f := range opts {
		switch f.name {
		case "r":
			o.recursive = true
		case "R":
			o.recursive, o.follow = true, true
		case "n":
			s.lineNumbers = true
		case "i", "y":
			o.ignoreCase = true
		case "no-ignore-case":
			o.ignoreCase = false
		case "v":
			s.invert = true
		case "l":
			s.listMatch = true
		case "L":
			s.listNo = true
		case "c":
			s.count = true
		case "E", "F", "G", "P":
			o.syntax = f.name[0]
		case "w":
			o.word = true
		case "x":
			o.whole = true
		case "h":
			o.nameMode = -1
		case "H":
			o.nameMode = 1
		case "o":
			s.only = true
		case "q":
			s.quiet = true
		case "s":
			o.noMessages = true
		case "a":
			s.binary = 't'
		case "I":
			s.binary = 's'
		case "e":
			o.patterns, havePatterns = append(o.patterns, strings.Split(f.val, "\n")...), true
		case "f":
			data, err := c.readInput(f.val)
			if err != nil {
				c.fail(f.val, err)
				return o, 2, false
			}
			havePatterns = true
			for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
				if len(data) > 0 {
					o.patterns = append(o.patterns, l)
				}
			}
		case "A", "B", "C", "m":
			n, err := strconv.ParseInt(f.val, 10, 64)
			if err != nil || n < 0 {
				return o, c.usage("invalid argument '%s' to -%s", f.val, f.name), false
			}
			s.setCount(f.name, n)
		case "include":
			o.include = append(o.include, f.val)
		case "exclude":
			o.exclude = append(o.exclude, f.val)
		case "exclude-dir":
			o.excludeDir = append(o.excludeDir, f.val)
		case "binary-files":
			switch f.val {
			case "binary":
				s.binary = 'r'
			case "text":
				s.binary = 't'
			case "without-match":
				s.binary = 's'
			default:
				return o, c.usage("invalid argument '%s' for '--binary-files'", f.val), false
			}
		case "d":
			switch f.val {
			case "recurse":
				o.recursive = true
			case "read", "skip":
			default:
				return o, c.usage("invalid argument '%s' for '--directories'", f.val), false
			}
		case "Z", "z", "U":
			return o, c.usage("-%s is not supported", f.name), false
		}
	}
	if !havePatterns {
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

// searchRun is one grep or rg: the searcher and what happened so far.
type searchRun struct {
	c                   *call
	s                   *searcher
	matched, failed     bool
	noMessages, listing bool // listing: rg --files, print the files instead
}

// tree searches the files below the directory ws (see treeFiles). When
// the searcher can work from the lines that match and their context (not
// -v, not -a), one workspace.Grep finds them, so an adapter's own search
// (one round trip to a container's agent) serves the whole tree; only the
// files it cannot speak for are read one by one: binary files that match,
// and links followed with -R.
func (r *searchRun) tree(ws, disp string, follow bool, maxDepth int, skipDir, keep func(rel string) bool) {
	c, s := r.c, r.s
	files := c.treeFiles(ws, disp, follow, maxDepth, skipDir, keep, r.report)
	var found map[string][]workspace.GrepLine
	if !r.listing && !s.invert && s.binary != 't' && len(files) > 0 {
		g, err := workspace.Grep(c.ctx, c.r.env.FS, workspace.GrepRequest{
			Pattern: s.m.re.String(), Dir: ws, Exclude: c.r.env.exclude(), Context: max(s.before, s.after),
			MaxFileBytes: c.r.env.maxFileBytes(), KeepCR: true, Binary: true,
		})
		if err == nil { // otherwise every file is read
			found = make(map[string][]workspace.GrepLine)
			for _, l := range g.Lines {
				found[l.Path] = append(found[l.Path], l)
			}
		}
	}
	for _, f := range files {
		if c.stopped() || (s.quiet && r.matched) {
			return
		}
		lines := found[f.ws]
		switch {
		case found == nil || f.link || (len(lines) > 0 && lines[0].Binary):
			r.file(f.ws, f.disp)
		case f.size > c.r.env.maxFileBytes():
			r.report(f.disp, workspace.PathError("read", f.ws, workspace.ErrFileTooLarge))
		default:
			r.found(f.disp, lines)
		}
	}
}

// found searches a file through the lines a workspace.Grep reported of it.
func (r *searchRun) found(disp string, lines []workspace.GrepLine) {
	var text [][]byte
	var known []bool
	if n := len(lines); n > 0 {
		text, known = make([][]byte, lines[n-1].Line), make([]bool, lines[n-1].Line)
	}
	for _, l := range lines {
		text[l.Line-1], known[l.Line-1] = []byte(l.Text), true
	}
	if r.s.searchLines(r.c, disp, text, known, false) {
		r.matched = true
	}
}

func (r *searchRun) report(disp string, err error) {
	r.failed = true
	if !r.noMessages {
		r.c.fail(disp, err)
	}
}

// operand resolves and stats a path operand, reporting a failure.
func (r *searchRun) operand(a string) (string, fs.FileInfo, bool) {
	ws, err := r.c.resolve(a)
	var info fs.FileInfo
	if err == nil {
		info, err = r.c.r.env.FS.Stat(r.c.ctx, ws)
	}
	if err != nil {
		r.report(a, err)
		return "", nil, false
	}
	return ws, info, true
}

func (r *searchRun) file(ws, disp string) {
	if r.s.quiet && r.matched {
		return
	}
	if r.listing {
		r.c.print(disp + "\n")
		return
	}
	data, err := r.c.r.env.FS.ReadFile(r.c.ctx, ws, r.c.r.env.maxFileBytes())
	if err != nil {
		r.report(disp, err)
		return
	}
	if r.s.search(r.c, disp, data) {
		r.matched = true
	}
}

func (r *searchRun) stdin(name string) {
	data, err := readAll(r.c.ctx, r.c.in, r.c.r.env.maxFileBytes())
	if err != nil {
		r.report(name, err)
		return
	}
	if r.s.search(r.c, name, data) {
		r.matched = true
	}
}

// status is the exit status grep and rg share: 0 when a line was selected,
// 1 when none was, 2 after an error (unless -q found a match).
func (r *searchRun) status() int {
	switch {
	case r.listing:
		return boolStatus(!r.failed)
	case r.c.ctx.Err() != nil:
		return 2
	case r.failed && !(r.s.quiet && r.matched):
		return 2
	case r.matched:
		return 0
	}
	return 1
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

// ---- rg

var rgFlags = flagSpec{
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
	types, notTypes []string
	operands        []string
}

// parseRg parses rg's arguments; after a usage error, reported, it returns
// ok false and the status.
func parseRg(c *call) (o rgOptions, status int, ok bool) {
	opts, ops, ok := c.parseFlags(rgFlags)
	if !ok {
		return o, 2, false
	}
	o = rgOptions{s: &searcher{maxCount: -1, binary: 's'}, maxDepth: -1}
	s := o.s
	havePatterns, unrestricted := false, 0
	var iglobs []string
	for _, f := range opts {
		switch f.name {
		case "i":
			o.ignoreCase, o.smart = true, false
		case "s":
			o.ignoreCase, o.smart = false, false
		case "S":
			o.smart = true
		case "n":
			s.lineNumbers = true
		case "N":
			s.lineNumbers = false
		case "l":
			s.listMatch = true
		case "files-without-match":
			s.listNo = true
		case "c":
			s.count = true
		case "v":
			s.invert = true
		case "w":
			o.word = true
		case "x":
			o.whole = true
		case "F":
			o.fixed = true
		case "H":
			o.nameMode = 1
		case "I":
			o.nameMode = -1
		case "o":
			s.only = true
		case "q":
			s.quiet = true
		case "a":
			s.binary = 't'
		case ".":
			o.hidden = true
		case "u":
			unrestricted++
		case "e":
			o.patterns, havePatterns = append(o.patterns, f.val), true
		case "g":
			o.globs = append(o.globs, f.val)
		case "iglob":
			iglobs = append(iglobs, f.val)
		case "t", "T":
			if _, known := rgTypes[f.val]; !known {
				return o, c.usage("unrecognized file type: %s", f.val), false
			}
			if f.name == "t" {
				o.types = append(o.types, f.val)
			} else {
				o.notTypes = append(o.notTypes, f.val)
			}
		case "A", "B", "C", "m", "d":
			n, err := strconv.ParseInt(f.val, 10, 64)
			if err != nil || n < 0 {
				return o, c.usage("invalid value '%s' for -%s", f.val, f.name), false
			}
			if f.name == "d" {
				o.maxDepth = int(n)
			} else {
				s.setCount(f.name, n)
			}
		case "r":
			v := f.val
			s.replace = &v
		case "files":
			o.listFiles = true
		case "no-messages":
			o.noMessages = true
		case "L", "U", "0":
			return o, c.usage("-%s is not supported", f.name), false
		}
	}
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

// ---- find

// findEntry is one entry a find visits.
type findEntry struct {
	c     *call
	ws    string // workspace name
	disp  string // as printed
	depth int
	typ   fs.FileMode
	info  fs.FileInfo // loaded when a test needs it
	prune bool
}

func (e *findEntry) stat() fs.FileInfo {
	if e.info == nil {
		info, err := e.c.r.env.FS.Lstat(e.c.ctx, e.ws)
		if err != nil {
			return nil
		}
		e.info = info
	}
	return e.info
}

type findExpr func(e *findEntry) bool

type findParser struct {
	c         *call
	toks      []string
	i         int
	hasAction bool
	maxDepth  int
	minDepth  int
	depthLast bool
	err       string
}

func (p *findParser) fail(format string, args ...any) findExpr {
	if p.err == "" {
		p.err = fmt.Sprintf(format, args...)
	}
	return func(*findEntry) bool { return false }
}

func (p *findParser) peek() string {
	if p.i < len(p.toks) {
		return p.toks[p.i]
	}
	return ""
}

func (p *findParser) or() findExpr {
	left := p.and()
	for p.peek() == "-o" || p.peek() == "-or" {
		p.i++
		l, r := left, p.and()
		left = func(e *findEntry) bool { return l(e) || r(e) }
	}
	return left
}

func (p *findParser) and() findExpr {
	left := p.unary()
	for p.i < len(p.toks) && p.err == "" {
		switch p.peek() {
		case "-o", "-or", ")", ",":
			return left
		case "-a", "-and":
			p.i++
		}
		l, r := left, p.unary()
		left = func(e *findEntry) bool { return l(e) && r(e) }
	}
	return left
}

func (p *findParser) unary() findExpr {
	switch t := p.peek(); t {
	case "!", "-not":
		p.i++
		x := p.unary()
		return func(e *findEntry) bool { return !x(e) }
	case "(":
		p.i++
		x := p.or()
		if p.peek() != ")" {
			return p.fail("invalid expression; I was expecting to find a ')' somewhere but did not see one.")
		}
		p.i++
		return x
	case "":
		return p.fail("invalid expression: an operator is missing its operand")
	}
	return p.primary()
}

func (p *findParser) arg(name string) (string, bool) {
	if p.i >= len(p.toks) {
		p.fail("missing argument to '%s'", name)
		return "", false
	}
	p.i++
	return p.toks[p.i-1], true
}

func (p *findParser) primary() findExpr {
	t := p.toks[p.i]
	p.i++
	if why := forbiddenArg("find", t); why != "" {
		p.c.r.refuse("find "+t, why)
		return p.fail("%s", why)
	}
	switch t {
	case "-print", "-print0":
		p.hasAction = true
		end := "\n"
		if t == "-print0" {
			end = "\x00"
		}
		return func(e *findEntry) bool { e.c.print(e.disp + end); return true }
	case "-prune":
		return func(e *findEntry) bool { e.prune = true; return true }
	case "-true":
		return func(*findEntry) bool { return true }
	case "-false":
		return func(*findEntry) bool { return false }
	case "-maxdepth", "-mindepth":
		v, ok := p.arg(t)
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 {
			return p.fail("invalid argument '%s' to '%s'", v, t)
		}
		if t == "-maxdepth" {
			p.maxDepth = n
		} else {
			p.minDepth = n
		}
		return func(*findEntry) bool { return true }
	case "-depth", "-d":
		p.depthLast = true
		return func(*findEntry) bool { return true }
	case "-xdev", "-mount", "-noleaf", "-nowarn", "-warn", "-ignore_readdir_race", "-follow-never":
		return func(*findEntry) bool { return true }
	case "-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename":
		v, ok := p.arg(t)
		if !ok {
			return nil
		}
		mode := pattern.EntireString | pattern.NoGlobStar
		if strings.HasPrefix(t, "-i") {
			mode |= pattern.NoGlobCase
		}
		expr, err := pattern.Regexp(v, mode)
		re, rerr := regexp.Compile(expr)
		if err != nil || rerr != nil {
			return p.fail("invalid pattern '%s' for '%s'", v, t)
		}
		if strings.HasSuffix(t, "name") && !strings.HasSuffix(t, "wholename") {
			return func(e *findEntry) bool { return re.MatchString(baseName(e.disp)) }
		}
		return func(e *findEntry) bool { return re.MatchString(e.disp) }
	case "-regex", "-iregex":
		v, ok := p.arg(t)
		flags := ""
		if t == "-iregex" {
			flags = "(?i)"
		}
		re, err := regexp.Compile(flags + `^(?:` + v + `)$`)
		if !ok || err != nil {
			return p.fail("invalid regular expression '%s' (patterns are RE2)", v)
		}
		return func(e *findEntry) bool { return re.MatchString(e.disp) }
	case "-type":
		v, ok := p.arg(t)
		var want []fs.FileMode
		for _, k := range strings.Split(v, ",") {
			m, known := map[string]fs.FileMode{"f": 0, "d": fs.ModeDir, "l": fs.ModeSymlink, "p": fs.ModeNamedPipe,
				"s": fs.ModeSocket, "c": fs.ModeDevice | fs.ModeCharDevice, "b": fs.ModeDevice}[k]
			if !known {
				return p.fail("Unknown argument to -type: %s", k)
			}
			want = append(want, m)
		}
		if !ok {
			return nil
		}
		return func(e *findEntry) bool { return slices.Contains(want, e.typ) }
	case "-empty":
		return func(e *findEntry) bool {
			switch {
			case e.typ == fs.ModeDir:
				entries, err := e.c.r.env.FS.ReadDir(e.c.ctx, e.ws)
				return err == nil && len(entries) == 0
			case e.typ == 0:
				info := e.stat()
				return info != nil && info.Size() == 0
			}
			return false
		}
	case "-size":
		v, ok := p.arg(t)
		cmp, num, unit := splitFindNumber(v)
		size := map[byte]int64{'c': 1, 'w': 2, 'b': 512, 'k': 1024, 'M': 1 << 20, 'G': 1 << 30}[unit]
		n, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || size == 0 {
			return p.fail("invalid -size argument '%s'", v)
		}
		return func(e *findEntry) bool {
			info := e.stat()
			if info == nil {
				return false
			}
			return compareFind(cmp, (info.Size()+size-1)/size, n)
		}
	case "-mtime", "-mmin":
		v, ok := p.arg(t)
		cmp, num, unit := splitFindNumber(v)
		n, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || unit != 0 {
			return p.fail("invalid argument '%s' to '%s'", v, t)
		}
		per := 24 * time.Hour
		if t == "-mmin" {
			per = time.Minute
		}
		now := time.Now()
		return func(e *findEntry) bool {
			info := e.stat()
			return info != nil && compareFind(cmp, int64(now.Sub(info.ModTime())/per), n)
		}
	case "-newer":
		v, ok := p.arg(t)
		name, err := p.c.resolve(v)
		var ref fs.FileInfo
		if err == nil {
			ref, err = p.c.r.env.FS.Stat(p.c.ctx, name)
		}
		if !ok || err != nil {
			return p.fail("'%s': %s", v, ErrorText(err))
		}
		return func(e *findEntry) bool {
			info := e.stat()
			return info != nil && info.ModTime().After(ref.ModTime())
		}
	}
	if strings.HasPrefix(t, "-") {
		return p.fail("unknown predicate '%s'", t)
	}
	return p.fail("paths must precede expression: '%s'", t)
}

// splitFindNumber splits find's "+N", "-N", "N" and a unit letter.
func splitFindNumber(v string) (cmp byte, num string, unit byte) {
	if v != "" && (v[0] == '+' || v[0] == '-') {
		cmp, v = v[0], v[1:]
	}
	if v != "" && !unicode.IsDigit(rune(v[len(v)-1])) {
		unit, v = v[len(v)-1], v[:len(v)-1]
	}
	return cmp, v, unit
}

func compareFind(cmp byte, have, want int64) bool {
	switch cmp {
	case '+':
		return have > want
	case '-':
		return have < want
	}
	return have == want
}

func cmdFind(c *call) int {
	args := c.args
	for len(args) > 0 && (args[0] == "-P" || args[0] == "-H") {
		args = args[1:]
	}
	if len(args) > 0 && args[0] == "-L" {
		c.errorf("-L is not supported: find never follows links into directories")
		return 2
	}
	var starts []string
	for len(args) > 0 && args[0] != "(" && args[0] != "!" && (!strings.HasPrefix(args[0], "-") || args[0] == "-") {
		starts = append(starts, args[0])
		args = args[1:]
	}
	if len(starts) == 0 {
		starts = []string{"."}
	}
	p := &findParser{c: c, toks: args, maxDepth: -1}
	expr := findExpr(func(*findEntry) bool { return true })
	if len(args) > 0 {
		expr = p.or()
		if p.err == "" && p.i < len(p.toks) {
			p.fail("unexpected '%s' in the expression", p.toks[p.i])
		}
	}
	if c.ctx.Err() != nil {
		return 126 // refused
	}
	if p.err != "" {
		c.errorf("%s", p.err)
		return 2
	}
	status := 0
	for _, s := range starts {
		name, err := c.resolve(s)
		var info fs.FileInfo
		if err == nil {
			info, err = c.r.env.FS.Lstat(c.ctx, name)
		}
		if err != nil {
			c.errorf("'%s': %s", s, ErrorText(err))
			status = 1
			continue
		}
		status = max(status, c.findTree(&findEntry{c: c, ws: name, disp: s, typ: info.Mode().Type(), info: info}, p, expr))
	}
	return status
}

// findTree evaluates expr on start and, when it is a directory, on the tree
// below it, listed by one workspace.Walk: each directory before its entries,
// or after them with -depth. A directory that cannot be read is named on
// stderr, and the status is then 1.
func (c *call) findTree(start *findEntry, p *findParser, expr findExpr) int {
	eval := func(e *findEntry) {
		if e.depth >= p.minDepth && expr(e) && !p.hasAction {
			c.print(e.disp + "\n")
		}
	}
	// entered says whether the walk goes below the directory e: with -depth
	// it is evaluated later, when the walk leaves it; else now, and -prune
	// keeps the walk out.
	var open []*findEntry // with -depth: directories entered, outermost first
	entered := func(e *findEntry) bool {
		if e.typ != fs.ModeDir || (p.maxDepth >= 0 && e.depth >= p.maxDepth) {
			eval(e)
			return false
		}
		if p.depthLast {
			open = append(open, e)
			return true
		}
		eval(e)
		return !e.prune
	}
	leave := func(ws string) { // evaluates the open directories ws is not below
		for len(open) > 0 && !isBelow(ws, open[len(open)-1].ws) {
			eval(open[len(open)-1])
			open = open[:len(open)-1]
		}
	}
	if !entered(start) {
		return 0
	}
	status := 0
	w, err := workspace.Walk(c.ctx, c.r.env.FS, workspace.WalkRequest{Dir: start.ws, Exclude: c.r.env.exclude(), Errors: true, MaxDepth: max(p.maxDepth, 0)})
	if err != nil {
		c.errorf("'%s': %s", start.disp, ErrorText(err))
		status = 1
	}
	pruned := "" // a directory the walk is kept out of, with a trailing "/"
	for _, we := range w.Entries {
		if c.stopped() {
			return status
		}
		rel := strings.TrimPrefix(we.Path, start.ws+"/")
		if start.ws == "." {
			rel = we.Path
		}
		if pruned != "" && strings.HasPrefix(rel+"/", pruned) {
			continue // below a pruned directory, or its error
		}
		pruned = ""
		if we.Err != nil {
			c.errorf("'%s': %s", display(start.disp, rel), ErrorText(we.Err))
			status = 1
			continue
		}
		e := &findEntry{c: c, ws: we.Path, disp: display(start.disp, rel), depth: strings.Count(rel, "/") + 1, typ: we.Type}
		leave(e.ws)
		if !entered(e) && e.typ == fs.ModeDir {
			pruned = rel + "/"
		}
	}
	leave("")
	return status
}

// isBelow says whether the workspace name lies below the directory dir.
func isBelow(name, dir string) bool {
	if dir == "." {
		return name != "." && name != ""
	}
	return strings.HasPrefix(name, dir+"/")
}
