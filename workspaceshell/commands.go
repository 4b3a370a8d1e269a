package workspaceshell

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"mvdan.cc/sh/v3/pattern"

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

// flagSpec describes a command's options, GNU style: short options cluster
// ("-la"), a short option's value is attached or the next argument ("-n5",
// "-n 5"), long options take "--name=value" or "--name value", options and
// operands mix, and "--" ends the options.
type flagSpec struct {
	bools  string // short options without a value
	values string // short options with a value
	// long maps a long option to its canonical name; a canonical name ending
	// in "=" takes a value, one ending in "?" takes an optional "=value".
	long map[string]string
	// numeric, when set, reads "-5" as that option with the value "5"
	// ("n" for head and tail, "C" for grep's context).
	numeric string
}

type opt struct{ name, val string }

func (c *call) parseFlags(f flagSpec) (opts []opt, operands []string, ok bool) {
	args := c.args
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return opts, append(operands, args[i+1:]...), true
		case strings.HasPrefix(a, "--"):
			name, val, hasVal := strings.Cut(a[2:], "=")
			canon, known := f.long[name]
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
			if f.numeric != "" && isDigits(a[1:]) {
				opts = append(opts, opt{f.numeric, a[1:]})
				continue
			}
		cluster:
			for j := 1; j < len(a); j++ {
				ch := a[j]
				switch {
				case strings.IndexByte(f.values, ch) >= 0:
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
				case strings.IndexByte(f.bools, ch) >= 0 && ch < utf8.RuneSelf:
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

// errText is an error's text as coreutils words it: "No such file or
// directory".
func errText(err error) string {
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

func cmdPwd(c *call) int {
	if _, _, ok := c.parseFlags(flagSpec{bools: "LP"}); !ok {
		return 2
	}
	c.print(c.r.root + "\n")
	return 0
}

// ---- ls

var lsFlags = flagSpec{
	bools: "aAlR1dFphrtSU",
	long: map[string]string{"all": "a", "almost-all": "A", "recursive": "R", "directory": "d", "classify": "F",
		"human-readable": "h", "reverse": "r", "color": "color?", "group-directories-first": "gdf"},
}

type lsOpts struct {
	all, almost, long, recursive, dirOnly, classify, slash, human, reverse, byTime, bySize, unsorted, dirsFirst bool
}

type lsEntry struct {
	name string // as shown
	ws   string // workspace name
	info fs.FileInfo
}

func cmdLs(c *call) int {
	opts, ops, ok := c.parseFlags(lsFlags)
	if !ok {
		return 2
	}
	var o lsOpts
	for _, f := range opts {
		switch f.name {
		case "a":
			o.all = true
		case "A":
			o.almost = true
		case "l":
			o.long = true
		case "R":
			o.recursive = true
		case "d":
			o.dirOnly = true
		case "F":
			o.classify = true
		case "p":
			o.slash = true
		case "h":
			o.human = true
		case "r":
			o.reverse = true
		case "t":
			o.byTime = true
		case "S":
			o.bySize = true
		case "U":
			o.unsorted = true
		case "gdf":
			o.dirsFirst = true
		}
	}
	if len(ops) == 0 {
		ops = []string{"."}
	}
	status := 0
	var files, dirs []lsEntry
	for _, a := range ops {
		name, err := c.resolve(a)
		var info fs.FileInfo
		if err == nil {
			info, err = c.r.env.FS.Lstat(c.ctx, name)
		}
		if err != nil {
			c.errorf("cannot access '%s': %s", a, errText(err))
			status = 2
			continue
		}
		if info.Mode()&fs.ModeSymlink != 0 && !o.long && !o.dirOnly && !o.classify {
			if ti, err := c.r.env.FS.Stat(c.ctx, name); err == nil && ti.IsDir() {
				info = ti
			}
		}
		e := lsEntry{name: a, ws: name, info: info}
		if info.IsDir() && !o.dirOnly {
			dirs = append(dirs, e)
		} else {
			files = append(files, e)
		}
	}
	o.sort(files)
	o.sort(dirs)
	c.lsPrint(files, o)
	for i, d := range dirs {
		if len(ops) > 1 || o.recursive {
			if i > 0 || len(files) > 0 {
				c.print("\n")
			}
			c.print(d.name + ":\n")
		}
		if s := c.lsDir(d, o); s > status {
			status = s
		}
		if c.stopped() {
			break
		}
	}
	return status
}

func (o lsOpts) sort(es []lsEntry) {
	if o.unsorted {
		return
	}
	slices.SortStableFunc(es, func(a, b lsEntry) int {
		if o.dirsFirst && a.info.IsDir() != b.info.IsDir() {
			if a.info.IsDir() {
				return -1
			}
			return 1
		}
		r := strings.Compare(a.name, b.name)
		switch {
		case o.byTime:
			if d := b.info.ModTime().Compare(a.info.ModTime()); d != 0 {
				r = d
			}
		case o.bySize:
			if d := b.info.Size() - a.info.Size(); d != 0 {
				r = int(max(-1, min(1, d)))
			}
		}
		if o.reverse {
			r = -r
		}
		return r
	})
}

// lsDir lists one directory (and, with -R, those below it, an excluded
// name listed but not entered), all described by one workspace.Walk.
func (c *call) lsDir(d lsEntry, o lsOpts) int {
	req := workspace.WalkRequest{Dir: d.ws, Info: true, Errors: true, MaxDepth: 1}
	if o.recursive {
		req.MaxDepth, req.Exclude, req.ListExcluded = 0, c.r.env.exclude(), true
	}
	w, err := workspace.Walk(c.ctx, c.r.env.FS, req)
	if err != nil {
		c.errorf("cannot open directory '%s': %s", d.name, errText(err))
		return 2
	}
	t := lsTree{entries: map[string][]workspace.WalkEntry{}, failed: map[string]error{}}
	for _, e := range w.Entries {
		if e.Err != nil {
			t.failed[e.Path] = e.Err
			continue
		}
		t.entries[path.Dir(e.Path)] = append(t.entries[path.Dir(e.Path)], e)
	}
	return c.lsList(d, o, t)
}

// lsTree is what a walk found: the entries of each directory, and the
// directories that could not be read.
type lsTree struct {
	entries map[string][]workspace.WalkEntry
	failed  map[string]error
}

// lsList prints the directory d from t (and, with -R, those below it).
func (c *call) lsList(d lsEntry, o lsOpts, t lsTree) int {
	fsys := c.r.env.FS
	if err := t.failed[d.ws]; err != nil {
		c.errorf("cannot open directory '%s': %s", d.name, errText(err))
		return 2
	}
	var list []lsEntry
	if o.all {
		for _, n := range []string{".", ".."} {
			ws := path.Join(d.ws, n)
			if n == ".." && d.ws == "." {
				ws = "."
			}
			info, err := fsys.Stat(c.ctx, ws)
			if err != nil {
				continue
			}
			list = append(list, lsEntry{name: n, ws: ws, info: info})
		}
	}
	status := 0
	for _, e := range t.entries[d.ws] {
		name := path.Base(e.Path)
		if strings.HasPrefix(name, ".") && !o.all && !o.almost {
			continue
		}
		info, ok := e.FileInfo()
		if !ok { // changed since the listing
			var err error
			if info, err = fsys.Lstat(c.ctx, e.Path); err != nil {
				c.errorf("cannot access '%s': %s", display(d.name, name), errText(err))
				status = 1
				continue
			}
		}
		list = append(list, lsEntry{name: name, ws: e.Path, info: info})
	}
	o.sort(list)
	c.lsPrint(list, o)
	if !o.recursive {
		return status
	}
	for _, e := range list {
		if !e.info.IsDir() || e.name == "." || e.name == ".." || c.r.env.exclude().Skip(e.ws) || c.stopped() {
			continue
		}
		sub := lsEntry{name: display(d.name, e.name), ws: e.ws, info: e.info}
		c.print("\n" + sub.name + ":\n")
		if s := c.lsList(sub, o, t); s > status {
			status = s
		}
	}
	return status
}

func (c *call) lsPrint(list []lsEntry, o lsOpts) {
	if !o.long {
		for _, e := range list {
			if !c.print(e.name + lsSuffix(e.info, o) + "\n") {
				return
			}
		}
		return
	}
	width := 0
	sizes := make([]string, len(list))
	for i, e := range list {
		sizes[i] = strconv.FormatInt(e.info.Size(), 10)
		if o.human {
			sizes[i] = humanSize(e.info.Size())
		}
		width = max(width, len(sizes[i]))
	}
	now := time.Now()
	for i, e := range list {
		name := e.name
		if e.info.Mode()&fs.ModeSymlink != 0 {
			if sl, ok := c.r.env.FS.(workspace.SymlinkFS); ok {
				if t, err := sl.Readlink(c.ctx, e.ws); err == nil {
					name += " -> " + t
				}
			}
		} else {
			name += lsSuffix(e.info, o)
		}
		mt := e.info.ModTime()
		stamp := mt.Format("Jan _2 15:04")
		if mt.Before(now.AddDate(0, -6, 0)) || mt.After(now.Add(time.Hour)) {
			stamp = mt.Format("Jan _2  2006")
		}
		if !c.printf("%s %*s %s %s\n", modeString(e.info.Mode()), width, sizes[i], stamp, name) {
			return
		}
	}
}

func lsSuffix(info fs.FileInfo, o lsOpts) string {
	m := info.Mode()
	switch {
	case m.IsDir() && (o.classify || o.slash):
		return "/"
	case !o.classify:
		return ""
	case m&fs.ModeSymlink != 0:
		return "@"
	case m&fs.ModeNamedPipe != 0:
		return "|"
	case m&fs.ModeSocket != 0:
		return "="
	case m.IsRegular() && m&0o111 != 0:
		return "*"
	}
	return ""
}

// modeString formats mode as ls -l does ("drwxr-xr-x", "lrwxrwxrwx").
func modeString(m fs.FileMode) string {
	b := []byte("-rwxrwxrwx")
	switch {
	case m.IsDir():
		b[0] = 'd'
	case m&fs.ModeSymlink != 0:
		b[0] = 'l'
	case m&fs.ModeNamedPipe != 0:
		b[0] = 'p'
	case m&fs.ModeSocket != 0:
		b[0] = 's'
	case m&fs.ModeCharDevice != 0:
		b[0] = 'c'
	case m&fs.ModeDevice != 0:
		b[0] = 'b'
	}
	for i := 0; i < 9; i++ {
		if m&(1<<(8-i)) == 0 {
			b[i+1] = '-'
		}
	}
	special := func(i int, set bool, lower, upper byte) {
		if set {
			if b[i] == '-' {
				b[i] = upper
			} else {
				b[i] = lower
			}
		}
	}
	special(3, m&fs.ModeSetuid != 0, 's', 'S')
	special(6, m&fs.ModeSetgid != 0, 's', 'S')
	special(9, m&fs.ModeSticky != 0, 't', 'T')
	return string(b)
}

func humanSize(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10)
	}
	f := float64(n)
	for _, u := range "KMGTPE" {
		f /= 1024
		if f < 1024 || u == 'E' {
			if f < 10 {
				return fmt.Sprintf("%.1f%c", float64(int(f*10+0.999))/10, u)
			}
			return fmt.Sprintf("%d%c", int(f+0.999), u)
		}
	}
	return strconv.FormatInt(n, 10)
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
			return p.fail("'%s': %s", v, errText(err))
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
			c.errorf("'%s': %s", s, errText(err))
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
		c.errorf("'%s': %s", start.disp, errText(err))
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
			c.errorf("'%s': %s", display(start.disp, rel), errText(we.Err))
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

// ---- cat

var catFlags = flagSpec{bools: "nbsETAvet", long: map[string]string{"number": "n", "number-nonblank": "b",
	"squeeze-blank": "s", "show-ends": "E", "show-tabs": "T", "show-all": "A", "show-nonprinting": "v"}}

func cmdCat(c *call) int {
	opts, ops, ok := c.parseFlags(catFlags)
	if !ok {
		return 2
	}
	var number, nonblank, squeeze, ends, tabs, nonprint bool
	for _, f := range opts {
		switch f.name {
		case "n":
			number = true
		case "b":
			nonblank = true
		case "s":
			squeeze = true
		case "E":
			ends = true
		case "T":
			tabs = true
		case "v":
			nonprint = true
		case "A":
			nonprint, ends, tabs = true, true, true
		case "e":
			nonprint, ends = true, true
		case "t":
			nonprint, tabs = true, true
		}
	}
	plain := !number && !nonblank && !squeeze && !ends && !tabs && !nonprint
	if len(ops) == 0 {
		ops = []string{"-"}
	}
	status, lineNo, prevBlank := 0, 0, false
	for _, a := range ops {
		if c.stopped() {
			break
		}
		if plain && a == "-" {
			c.out.Flush()
			if _, err := copyCtx(c.ctx, c.out, c.in); err != nil && c.ctx.Err() == nil && !errors.Is(err, io.ErrClosedPipe) {
				c.errorf("-: %s", errText(err))
				status = 1
			}
			continue
		}
		data, err := c.readInput(a)
		if err != nil {
			c.fail(a, err)
			status = 1
			continue
		}
		if plain {
			c.write(data)
			continue
		}
		for line := range bytes.SplitAfterSeq(data, []byte("\n")) {
			if len(line) == 0 {
				continue // after the last newline
			}
			body, nl := bytes.CutSuffix(line, []byte("\n"))
			blank := len(body) == 0
			if squeeze && blank && prevBlank {
				continue
			}
			prevBlank = blank
			var b strings.Builder
			if (number && !nonblank) || (nonblank && !blank) {
				lineNo++
				fmt.Fprintf(&b, "%6d\t", lineNo)
			}
			for _, ch := range body {
				switch {
				case ch == '\t' && tabs:
					b.WriteString("^I")
				case ch == '\t':
					b.WriteByte(ch)
				case nonprint && ch >= 128:
					b.WriteString("M-")
					ch -= 128
					fallthrough
				case nonprint && (ch < 32 || ch == 127):
					if ch < 32 {
						b.WriteByte('^')
						b.WriteByte(ch + 64)
					} else if ch == 127 {
						b.WriteString("^?")
					} else {
						b.WriteByte(ch)
					}
				default:
					b.WriteByte(ch)
				}
			}
			if nl {
				if ends {
					b.WriteByte('$')
				}
				b.WriteByte('\n')
			}
			if !c.print(b.String()) {
				break
			}
		}
	}
	return status
}

// ---- head and tail

var headTailFlags = flagSpec{bools: "qvf", values: "nc", numeric: "n",
	long: map[string]string{"lines": "n=", "bytes": "c=", "quiet": "q", "silent": "q", "verbose": "v"}}

// count is head's or tail's -n/-c argument: a number, "+N" (tail: from N)
// or "-N" (head: all but the last N).
type count struct {
	n           int64
	bytes       bool
	plus, minus bool
}

func parseCount(v string, bytes bool) (count, bool) {
	ct := count{bytes: bytes}
	switch {
	case strings.HasPrefix(v, "+"):
		ct.plus, v = true, v[1:]
	case strings.HasPrefix(v, "-"):
		ct.minus, v = true, v[1:]
	}
	mult := int64(1)
	for suf, m := range map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "k": 1 << 10, "KB": 1000, "MB": 1000 * 1000} {
		if s, ok := strings.CutSuffix(v, suf); ok && isDigits(s) {
			v, mult = s, m
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return ct, false
	}
	ct.n = n * mult
	return ct, true
}

func cmdHead(c *call) int { return headTail(c, true) }
func cmdTail(c *call) int { return headTail(c, false) }

func headTail(c *call, head bool) int {
	opts, ops, ok := c.parseFlags(headTailFlags)
	if !ok {
		return 2
	}
	ct := count{n: 10}
	headers := 0 // 0: when several files; -1 never; 1 always
	for _, f := range opts {
		switch f.name {
		case "n", "c":
			if ct, ok = parseCount(f.val, f.name == "c"); !ok {
				what := "lines"
				if f.name == "c" {
					what = "bytes"
				}
				return c.usage("invalid number of %s: '%s'", what, f.val)
			}
		case "q":
			headers = -1
		case "v":
			headers = 1
		case "f":
			return c.usage("-f is not supported: the shell tool does not follow files")
		}
	}
	if len(ops) == 0 {
		ops = []string{"-"}
	}
	show := headers == 1 || (headers == 0 && len(ops) > 1)
	status := 0
	for i, a := range ops {
		if c.stopped() {
			break
		}
		name := a
		if a == "-" {
			name = "standard input"
		}
		if head && a == "-" && !ct.minus && !ct.bytes {
			if show {
				c.headerLine(i, name)
			}
			c.headLinesStream(ct.n)
			continue
		}
		data, err := c.readInput(a)
		if err != nil {
			c.errorf("cannot open '%s' for reading: %s", a, errText(err))
			status = 1
			continue
		}
		if show {
			c.headerLine(i, name)
		}
		c.write(cutHeadTail(data, ct, head))
	}
	return status
}

func (c *call) headerLine(i int, name string) {
	if i > 0 {
		c.print("\n")
	}
	c.print("==> " + name + " <==\n")
}

// headLinesStream copies the first n lines of stdin without reading further,
// so head ends a pipeline early.
func (c *call) headLinesStream(n int64) {
	br := bufio.NewReader(c.in)
	for ; n > 0 && !c.stopped(); n-- {
		line, err := br.ReadBytes('\n')
		c.write(line)
		if err != nil {
			return
		}
	}
}

// cutHeadTail returns the part of data head or tail shows.
func cutHeadTail(data []byte, ct count, head bool) []byte {
	if ct.bytes {
		n := int(min(ct.n, int64(len(data))))
		switch {
		case head && ct.minus:
			return data[:len(data)-n]
		case head:
			return data[:n]
		case ct.plus:
			return data[max(0, min(int(ct.n)-1, len(data))):]
		default:
			return data[len(data)-n:]
		}
	}
	// lineStart(k) is the offset of line k (0-based); len(data) past the end.
	var starts []int
	starts = append(starts, 0)
	for i, b := range data {
		if b == '\n' && i+1 < len(data) {
			starts = append(starts, i+1)
		}
	}
	lines := int64(len(starts))
	if len(data) == 0 {
		lines = 0
	}
	at := func(k int64) int {
		if k >= lines {
			return len(data)
		}
		if k <= 0 {
			return 0
		}
		return starts[k]
	}
	switch {
	case head && ct.minus:
		return data[:at(lines-ct.n)]
	case head:
		return data[:at(ct.n)]
	case ct.plus:
		return data[at(ct.n-1):]
	default:
		return data[at(lines-ct.n):]
	}
}

// ---- wc

var wcFlags = flagSpec{bools: "lwcmL", long: map[string]string{"lines": "l", "words": "w", "bytes": "c",
	"chars": "m", "max-line-length": "L"}}

func cmdWc(c *call) int {
	opts, ops, ok := c.parseFlags(wcFlags)
	if !ok {
		return 2
	}
	show := map[string]bool{}
	for _, f := range opts {
		show[f.name] = true
	}
	if len(show) == 0 {
		show = map[string]bool{"l": true, "w": true, "c": true}
	}
	stdin := len(ops) == 0
	if stdin {
		ops = []string{"-"}
	}
	type counts struct {
		vals [5]int64 // l w m c L
		name string
		ok   bool
	}
	order := []string{"l", "w", "m", "c", "L"}
	var rows []counts
	var total counts
	status, regularBytes, minWidth := 0, int64(0), 1
	for _, a := range ops {
		data, err := c.readInput(a)
		if err != nil {
			c.fail(a, err)
			status = 1
			continue
		}
		if a == "-" {
			minWidth = 7
		} else {
			regularBytes += int64(len(data))
		}
		var k counts
		k.name, k.ok = a, true
		if stdin {
			k.name = ""
		}
		k.vals = wcCount(data)
		for i := range k.vals {
			if i == 4 {
				total.vals[i] = max(total.vals[i], k.vals[i])
			} else {
				total.vals[i] += k.vals[i]
			}
		}
		rows = append(rows, k)
	}
	if len(ops) > 1 {
		total.name, total.ok = "total", true
		rows = append(rows, total)
	}
	width := len(strconv.FormatInt(regularBytes, 10))
	width = max(width, minWidth)
	if len(show) == 1 && len(ops) == 1 {
		width = 1
	}
	for _, k := range rows {
		var fields []string
		for i, o := range order {
			if show[o] {
				fields = append(fields, fmt.Sprintf("%*d", width, k.vals[i]))
			}
		}
		line := strings.Join(fields, " ")
		if k.name != "" {
			line += " " + k.name
		}
		c.print(line + "\n")
	}
	return status
}

func wcCount(data []byte) [5]int64 {
	var v [5]int64
	v[3] = int64(len(data))
	inWord := false
	lineLen := int64(0)
	for len(data) > 0 {
		r, size := utf8.DecodeRune(data)
		data = data[size:]
		v[2]++
		switch {
		case r == '\n':
			v[0]++
			v[4] = max(v[4], lineLen)
			lineLen = 0
		case r == '\t':
			lineLen += 8 - lineLen%8
		default:
			lineLen++
		}
		if unicode.IsSpace(r) {
			inWord = false
		} else if !inWord {
			inWord = true
			v[1]++
		}
	}
	v[4] = max(v[4], lineLen)
	return v
}
