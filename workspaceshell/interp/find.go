package interp

import (
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"mvdan.cc/sh/v3/pattern"

	"github.com/sandboxd/sandboxd/workspace"
)

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
