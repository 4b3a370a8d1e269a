package interp

import (
	"bytes"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// What grep and rg share: the searcher of one input, the files of a tree,
// the run over operands.

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
