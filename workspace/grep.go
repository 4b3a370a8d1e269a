package workspace

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"regexp/syntax"
	"runtime"
	"slices"
	"sync"
	"unicode"
	"unicode/utf8"
)

// GrepRequest asks for the lines of files that match a pattern.
type GrepRequest struct {
	// Pattern is a regular expression in Go's RE2 syntax (linear time: no
	// pattern can hold the search), or a plain string when Literal is set.
	Pattern    string
	Literal    bool
	IgnoreCase bool
	// Dir is where the search starts, a workspace name; "" is the root. A file
	// is searched alone, whatever Glob says.
	Dir string
	// Glob selects files by name (see GlobMatch); "" selects all.
	Glob string
	// Exclude names what the search never enters.
	Exclude Exclude
	// Context is how many lines to show before and after each match.
	Context int
	// Limit stops the search after that many matching lines, with Truncated
	// set; zero means no limit.
	Limit int
	// MaxLineChars cuts every line to that many characters before it is
	// matched and shown; zero means no cut.
	MaxLineChars int
	// MaxFileBytes skips larger files; zero means no limit.
	MaxFileBytes int64
	// KeepCR matches and shows lines with the "\r" of a "\r\n" line end,
	// as grep(1) does; by default it is dropped.
	KeepCR bool `json:",omitempty"`
	// Binary searches binary files too rather than skip them, as grep(1)
	// does: a file that holds a NUL byte anywhere is binary, and is
	// reported, when a line of it matches, by one GrepLine with Binary set
	// (its first matching line's number, no text, no context), which counts
	// as one match.
	Binary bool `json:",omitempty"`
}

// GrepLine is one line of a grep result: a match, or context around one.
type GrepLine struct {
	Path  string
	Line  int // 1-based
	Text  string
	Match bool
	// Binary says the file is binary and Line is its first match (see
	// GrepRequest.Binary).
	Binary bool `json:",omitempty"`
}

// GrepResult holds matching lines and their context, in walk order and then
// line order. Files that hold a NUL byte in their first 8 KiB are taken as
// binary and skipped, as are files over MaxFileBytes and special files.
type GrepResult struct {
	Lines []GrepLine
	// Matches counts the matching lines in Lines.
	Matches int
	// Truncated says the search stopped at Limit with more matches to go.
	Truncated bool
}

// Grep searches file contents: through the adapter's GrepFS when it has one,
// otherwise with GrepGeneric.
func Grep(ctx context.Context, fsys FileSystem, req GrepRequest) (GrepResult, error) {
	if g, ok := fsys.(GrepFS); ok {
		return g.Grep(ctx, req)
	}
	return GrepGeneric(ctx, fsys, req)
}

// binarySniff is how much of a file is checked for a NUL byte.
const binarySniff = 8 << 10

// GrepGeneric is Grep over Walk and ReadFile. It reads files in parallel and
// reports them in walk order.
func GrepGeneric(ctx context.Context, fsys FileSystem, req GrepRequest) (GrepResult, error) {
	return GrepWithReader(ctx, fsys, req, fsys.ReadFile)
}

// GrepWithReader is GrepGeneric reading files with read, which must behave
// as fsys.ReadFile does. An adapter whose ReadFile costs much per call (a
// confined path walk for every file, say) can implement GrepFS with it and a
// cheaper reader (one directory handle per directory), and so keep exactly
// GrepGeneric's results. read is called from several goroutines at once.
func GrepWithReader(ctx context.Context, fsys FileSystem, req GrepRequest, read func(ctx context.Context, name string, max int64) ([]byte, error)) (GrepResult, error) {
	return GrepWithBuffers(ctx, fsys, req, func(ctx context.Context, name string, max int64, _ []byte) ([]byte, error) {
		return read(ctx, name, max)
	})
}

// keptBuffer is the largest buffer GrepWithBuffers hands back for reuse.
const keptBuffer = 1 << 20

// GrepWithBuffers is GrepWithReader for a reader that can reuse memory
// rather than allocate a buffer for every file. With each name, read gets a
// buffer that it returned for an earlier file (or nil), whose contents the
// search no longer needs; it may return the new file's contents in it,
// grown as needed. The search copies what it keeps (the lines it reports),
// so no result refers to a buffer. Each buffer is used by one call at a
// time; read is called from several goroutines at once.
func GrepWithBuffers(ctx context.Context, fsys FileSystem, req GrepRequest, read func(ctx context.Context, name string, max int64, buf []byte) ([]byte, error)) (GrepResult, error) {
	m, err := NewLineMatcher(req.Pattern, req.Literal, req.IgnoreCase)
	if err != nil {
		return GrepResult{}, err
	}
	maxBytes := req.MaxFileBytes
	if maxBytes <= 0 {
		maxBytes = 1 << 62
	}

	// The walk hands out files as it finds them (walkEach); workers read
	// and match them, and this goroutine takes their results in walk order.
	// So a search that reaches its limit stops the walk there, rather than
	// list the whole tree first. The walk runs at most grepAhead files
	// ahead of the results taken.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fileResult struct {
		name  string
		lines []GrepLine
		done  chan struct{}
	}
	order := make(chan *fileResult, grepAhead)
	jobs := make(chan *fileResult)
	var walkErr error
	walked := make(chan struct{})
	go func() {
		defer close(walked)
		defer close(jobs)
		defer close(order)
		start := cleanDir(req.Dir)
		walkErr = walkEach(ctx, fsys, WalkRequest{Dir: req.Dir, Pattern: "", Exclude: req.Exclude, FilesOnly: true}, func(e WalkEntry) error {
			// A file named as the start is searched alone, whatever Glob
			// says; links and special files are not searched.
			if e.Type != 0 || e.Path != start && req.Glob != "" && !GlobMatch(req.Glob, e.Path) {
				return nil
			}
			r := &fileResult{name: e.Path, done: make(chan struct{})}
			select {
			case order <- r:
			case <-ctx.Done():
				return ctx.Err()
			}
			select {
			case jobs <- r:
			case <-ctx.Done():
				close(r.done) // never read: the search is over
				return ctx.Err()
			}
			return nil
		})
	}()
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) * 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for r := range jobs {
				data, err := read(ctx, r.name, maxBytes, buf)
				if err == nil {
					r.lines = m.grepData(r.name, data, req)
				}
				if err == nil && cap(data) <= keptBuffer {
					buf = data[:0]
				}
				close(r.done)
			}
		}()
	}
	stop := func() {
		cancel()
		<-walked
		wg.Wait()
	}

	var out GrepResult
	for r := range order {
		select {
		case <-r.done:
		case <-ctx.Done():
			stop()
			return GrepResult{}, ctx.Err()
		}
		for _, l := range r.lines {
			if l.Match {
				if req.Limit > 0 && out.Matches >= req.Limit {
					out.Truncated = true // context that led up to this match is trimmed below
					break
				}
				out.Matches++
			}
			out.Lines = append(out.Lines, l)
		}
		if out.Truncated {
			break
		}
	}
	stop()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return GrepResult{}, err
	}
	if !out.Truncated && walkErr != nil {
		return GrepResult{}, walkErr
	}
	return trimTrailingContext(out, req.Context), nil
}

// grepAhead is how many files a search's walk may find before their
// results are taken: enough to keep the workers busy while one file is
// slow, few enough that a search stopped at its limit has read little
// past it (under gVisor a file costs a fifth of a millisecond).
const grepAhead = 32

// isAfterContext reports whether the last line of lines lies within the after
// context of an earlier match.
func isAfterContext(lines []GrepLine, context int) bool {
	last := lines[len(lines)-1]
	for k := len(lines) - 1; k >= 0; k-- {
		if lines[k].Path != last.Path {
			return false
		}
		if lines[k].Match {
			return last.Line-lines[k].Line <= context
		}
	}
	return false
}

// trimTrailingContext removes, after a truncation, context lines that belong
// only to the dropped match.
func trimTrailingContext(out GrepResult, context int) GrepResult {
	if !out.Truncated {
		return out
	}
	for len(out.Lines) > 0 {
		last := out.Lines[len(out.Lines)-1]
		if last.Match || isAfterContext(out.Lines, context) {
			break
		}
		out.Lines = out.Lines[:len(out.Lines)-1]
	}
	return out
}

func cleanDir(d string) string {
	if d == "" {
		return "."
	}
	return d
}

// LineMatcher matches single lines, with a whole-file prefilter.
type LineMatcher struct {
	line *regexp.Regexp // matches one line
	file *regexp.Regexp // the same pattern in multi-line mode, to skip files fast
	// lit is a string every match contains, found by searching the file
	// rather than running the expression on every line; nil when the
	// pattern has none. With fold it is ASCII lower case, and matched
	// ignoring ASCII case.
	lit  []byte
	fold bool
	rare int // the index in lit of its rarest byte, where a search anchors
}

// NewLineMatcher compiles a grep pattern. An invalid expression fails with
// ErrInvalidArgument and says why.
func NewLineMatcher(pattern string, literal, ignoreCase bool) (*LineMatcher, error) {
	if literal {
		pattern = regexp.QuoteMeta(pattern)
	}
	flags := ""
	if ignoreCase {
		flags = "(?i)"
	}
	line, err := regexp.Compile(flags + pattern)
	if err != nil {
		return nil, &PatternError{Pattern: pattern, Err: err}
	}
	file, err := regexp.Compile("(?m)" + flags + pattern)
	if err != nil {
		return nil, &PatternError{Pattern: pattern, Err: err}
	}
	m := &LineMatcher{line: line, file: file}
	if re, err := syntax.Parse(flags+pattern, syntax.Perl); err == nil {
		m.lit, m.fold = requiredLiteral(re.Simplify())
		m.rare = rarestByte(m.lit)
	}
	return m, nil
}

// requiredLiteral returns the longest literal that every match of re
// contains, or nil. A case-folded literal is cut to its longest run of runes
// whose case variants are all ASCII (so "k", whose variants include the
// Kelvin sign, ends a run) and returned in lower case.
func requiredLiteral(re *syntax.Regexp) ([]byte, bool) {
	switch re.Op {
	case syntax.OpLiteral:
		fold := re.Flags&syntax.FoldCase != 0
		if !fold {
			lit := []byte(string(re.Rune))
			// A "\n" is never within one line; U+FFFD also matches bytes
			// that are not UTF-8, which a byte search would not find.
			if bytes.IndexByte(lit, '\n') >= 0 || slices.Contains(re.Rune, utf8.RuneError) {
				return nil, false
			}
			return lit, false
		}
		var best, run []byte
		for _, r := range append(re.Rune, -1) {
			if r >= 0 && r != '\n' && asciiFoldOrbit(r) {
				run = append(run, byte(unicode.ToLower(r)))
				continue
			}
			if len(run) > len(best) {
				best = run
			}
			run = nil
		}
		return best, best != nil
	case syntax.OpCapture, syntax.OpPlus:
		return requiredLiteral(re.Sub[0])
	case syntax.OpRepeat:
		if re.Min >= 1 {
			return requiredLiteral(re.Sub[0])
		}
	case syntax.OpConcat:
		var best []byte
		var bestFold bool
		for _, sub := range re.Sub {
			if lit, fold := requiredLiteral(sub); len(lit) > len(best) {
				best, bestFold = lit, fold
			}
		}
		return best, bestFold
	}
	return nil, false
}

// asciiFoldOrbit reports whether r and every rune that case-folds to it are
// ASCII.
func asciiFoldOrbit(r rune) bool {
	for f := r; ; {
		if f > unicode.MaxASCII {
			return false
		}
		if f = unicode.SimpleFold(f); f == r {
			return true
		}
	}
}

// byteRarity ranks bytes from common (low) to rare (high) in source code and
// prose; a literal search anchors on the rarest byte of its literal.
var byteRarity = func() (rank [256]byte) {
	for i := range rank {
		rank[i] = 30
	}
	for i, c := range []byte(" etaoinsrlcdhum\tpf_.(),gybw=\"/v;:kx-*jqz") {
		rank[c] = byte(i)
	}
	return rank
}()

func rarestByte(lit []byte) int {
	best := 0
	for i, c := range lit {
		if byteRarity[c] > byteRarity[lit[best]] {
			best = i
		}
	}
	return best
}

// PatternError is a regular expression that does not compile. It matches
// ErrInvalidArgument.
type PatternError struct {
	Pattern string
	Err     error
}

func (e *PatternError) Error() string { return "invalid pattern: " + e.Err.Error() }
func (e *PatternError) Unwrap() error { return ErrInvalidArgument }

// MatchLine reports whether one line matches.
func (m *LineMatcher) MatchLine(line []byte) bool { return m.line.Match(line) }

// lineRef is a line of a file: its number and where it lies (end excludes
// the newline).
type lineRef struct{ no, start, end int }

// grepData returns what a search reports of one file's contents: nothing for
// a binary file unless the request asks for binary files too.
func (m *LineMatcher) grepData(name string, data []byte, req GrepRequest) []GrepLine {
	if !req.Binary {
		if bytes.IndexByte(data[:min(len(data), binarySniff)], 0) >= 0 {
			return nil
		}
		return m.grepFile(name, data, req)
	}
	if bytes.IndexByte(data, 0) < 0 {
		return m.grepFile(name, data, req)
	}
	matches := m.matches(data, lineCut{req.MaxLineChars, req.KeepCR})
	if len(matches) == 0 {
		return nil
	}
	return []GrepLine{{Path: name, Line: matches[0].no, Match: true, Binary: true}}
}

// grepFile returns the matching lines of data and their context.
func (m *LineMatcher) grepFile(name string, data []byte, req GrepRequest) []GrepLine {
	cut := lineCut{req.MaxLineChars, req.KeepCR}
	matches := m.matches(data, cut)
	if len(matches) == 0 {
		return nil
	}
	return withContext(name, data, matches, req.Context, cut)
}

// matches returns the matching lines of data.
func (m *LineMatcher) matches(data []byte, cut lineCut) []lineRef {
	if m.lit != nil {
		return m.literalMatches(data, cut)
	}
	return m.scanMatches(data, cut)
}

// lineCut says how a line is matched and shown: cut to max characters (0:
// whole), and without the "\r" of a "\r\n" unless keepCR.
type lineCut struct {
	max    int
	keepCR bool
}

// lineText is a line as it is matched and shown.
func lineText(data []byte, l lineRef, cut lineCut) []byte {
	line := data[l.start:l.end]
	if !cut.keepCR {
		line = bytes.TrimSuffix(line, []byte("\r"))
	}
	return CutLine(line, cut.max)
}

// literalMatches finds the lines holding the required literal and runs the
// expression on those alone: a line without the literal cannot match.
func (m *LineMatcher) literalMatches(data []byte, cut lineCut) []lineRef {
	var out []lineRef
	ls := newLitSearch(data, m.lit, m.rare, m.fold)
	countedTo, countedNo := 0, 1 // line countedNo starts at countedTo
	for from := 0; from < len(data); {
		i := ls.index(from)
		if i < 0 {
			break
		}
		l := lineRef{start: bytes.LastIndexByte(data[:i], '\n') + 1, end: len(data)}
		if j := bytes.IndexByte(data[i:], '\n'); j >= 0 {
			l.end = i + j
		}
		l.no = countedNo + bytes.Count(data[countedTo:l.start], []byte("\n"))
		countedTo, countedNo = l.start, l.no
		if m.line.Match(lineText(data, l, cut)) {
			out = append(out, l)
		}
		from = l.end + 1
	}
	return out
}

// scanMatches runs the expression on every line, after a whole-file check.
func (m *LineMatcher) scanMatches(data []byte, cut lineCut) []lineRef {
	// The prefilter is exact unless a line gets cut (a cut can make "x$"
	// match where the whole line does not) or ends in "\r\n" (lines are
	// matched without the "\r", which multi-line "$" does not skip).
	if !m.file.Match(data) && (cut.max <= 0 || !hasLineLongerThan(data, cut.max)) && bytes.IndexByte(data, '\r') < 0 {
		return nil
	}
	var out []lineRef
	for l := (lineRef{end: -1}); l.end < len(data); {
		l = nextLine(data, l)
		if l.start == len(data) {
			break // a final newline ends the last line; it starts none
		}
		if m.line.Match(lineText(data, l, cut)) {
			out = append(out, l)
		}
	}
	return out
}

// nextLine returns the line after l (whose end must be below len(data)).
func nextLine(data []byte, l lineRef) lineRef {
	n := lineRef{no: l.no + 1, start: l.end + 1, end: len(data)}
	if j := bytes.IndexByte(data[n.start:], '\n'); j >= 0 {
		n.end = n.start + j
	}
	return n
}

// withContext turns matching lines into grep lines with up to c lines of
// context before and after each, every line shown once, in order.
func withContext(name string, data []byte, matches []lineRef, c int, cut lineCut) []GrepLine {
	out := make([]GrepLine, 0, len(matches)*(1+2*c))
	add := func(l lineRef, match bool) {
		out = append(out, GrepLine{Path: name, Line: l.no, Text: string(lineText(data, l, cut)), Match: match})
	}
	last := lineRef{end: -1} // the last line shown
	afterUntil := 0          // the last line of the pending after context
	flushAfter := func(until int) {
		for last.no < min(afterUntil, until) && last.end < len(data) {
			n := nextLine(data, last)
			if n.start == len(data) {
				return
			}
			add(n, false)
			last = n
		}
	}
	var before []lineRef
	for _, m := range matches {
		flushAfter(m.no - 1)
		before = before[:0]
		for l := m; len(before) < c && l.no-1 > last.no; {
			prevEnd := l.start - 1
			l = lineRef{no: l.no - 1, start: bytes.LastIndexByte(data[:prevEnd], '\n') + 1, end: prevEnd}
			before = append(before, l)
		}
		for i := len(before) - 1; i >= 0; i-- {
			add(before[i], false)
		}
		add(m, true)
		last, afterUntil = m, m.no+c
	}
	flushAfter(afterUntil)
	return out
}

// litSearch finds a literal in data, or with fold a lower-case ASCII literal
// ignoring ASCII case. It anchors on the literal's rarest byte, scanning for
// it (for both its cases) with bytes.IndexByte, which is much faster than a
// substring search whose first byte is common, and remembers the next hit
// of each case.
type litSearch struct {
	data      []byte
	lit       []byte
	fold      bool
	at        int     // anchor index in lit
	c         [2]byte // the anchor byte's cases
	next      [2]int  // next hit of each case at or after the last query; -1 unknown
	searched  [2]int  // where each next was searched from
	sameCases bool
}

func newLitSearch(data, lit []byte, at int, fold bool) *litSearch {
	c := lit[at]
	s := &litSearch{data: data, lit: lit, fold: fold, at: at, c: [2]byte{c, c}, next: [2]int{-1, -1}, searched: [2]int{-1, -1}}
	if fold && 'a' <= c && c <= 'z' {
		s.c[1] = c - 'a' + 'A'
	}
	s.sameCases = s.c[0] == s.c[1]
	return s
}

// index returns the offset of the first occurrence at or after from, or -1.
func (s *litSearch) index(from int) int {
	for {
		pos := from + s.at // where the anchor byte must lie at the earliest
		if pos+len(s.lit)-s.at > len(s.data) {
			return -1
		}
		hit := len(s.data)
		for k := range 2 {
			if k == 1 && s.sameCases {
				break
			}
			if s.next[k] < pos && s.next[k] != len(s.data) || s.searched[k] > pos {
				s.next[k] = len(s.data)
				if j := bytes.IndexByte(s.data[pos:], s.c[k]); j >= 0 {
					s.next[k] = pos + j
				}
				s.searched[k] = pos
			}
			hit = min(hit, s.next[k])
		}
		start := hit - s.at
		if hit == len(s.data) || start+len(s.lit) > len(s.data) {
			return -1
		}
		if cand := s.data[start : start+len(s.lit)]; s.fold && equalFoldASCII(cand, s.lit) || !s.fold && bytes.Equal(cand, s.lit) {
			return start
		}
		from = start + 1
	}
}

// equalFoldASCII reports whether b equals the lower-case lit ignoring ASCII
// case.
func equalFoldASCII(b, lit []byte) bool {
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lit[i] {
			return false
		}
	}
	return true
}

func hasLineLongerThan(data []byte, n int) bool {
	for len(data) > n {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return utf8.RuneCount(data) > n
		}
		if i > n && utf8.RuneCount(data[:i]) > n {
			return true
		}
		data = data[i+1:]
	}
	return false
}

// CutLine cuts line to at most n characters (runes; an invalid byte counts as
// one). n <= 0 leaves it whole.
func CutLine(line []byte, n int) []byte {
	if n <= 0 || len(line) <= n {
		return line
	}
	i := 0
	for chars := 0; i < len(line) && chars < n; chars++ {
		_, size := utf8.DecodeRune(line[i:])
		i += size
	}
	return line[:i]
}
