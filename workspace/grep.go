package workspace

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"runtime"
	"sync"
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
}

// GrepLine is one line of a grep result: a match, or context around one.
type GrepLine struct {
	Path  string
	Line  int // 1-based
	Text  string
	Match bool
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
	m, err := NewLineMatcher(req.Pattern, req.Literal, req.IgnoreCase)
	if err != nil {
		return GrepResult{}, err
	}
	walk, err := Walk(ctx, fsys, WalkRequest{Dir: req.Dir, Pattern: "", Exclude: req.Exclude, FilesOnly: true})
	if err != nil {
		return GrepResult{}, err
	}
	single := len(walk.Entries) == 1 && walk.Entries[0].Path == cleanDir(req.Dir)
	var files []string
	for _, e := range walk.Entries {
		if e.Type != 0 { // links and special files are not searched
			continue
		}
		if !single && req.Glob != "" && !GlobMatch(req.Glob, e.Path) {
			continue
		}
		files = append(files, e.Path)
	}
	maxBytes := req.MaxFileBytes
	if maxBytes <= 0 {
		maxBytes = 1 << 62
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fileResult struct {
		lines []GrepLine
		done  chan struct{}
	}
	results := make([]fileResult, len(files))
	for i := range results {
		results[i].done = make(chan struct{})
	}
	jobs := make(chan int)
	workers := min(runtime.GOMAXPROCS(0)*2, len(files))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				data, err := fsys.ReadFile(ctx, files[i], maxBytes)
				if err == nil && bytes.IndexByte(data[:min(len(data), binarySniff)], 0) < 0 {
					results[i].lines = m.grepFile(files[i], data, req)
				}
				close(results[i].done)
			}
		}()
	}
	go func() {
		defer close(jobs)
		for i := range files {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()

	var out GrepResult
	for i := range files {
		select {
		case <-results[i].done:
		case <-ctx.Done():
			wg.Wait()
			return GrepResult{}, ctx.Err()
		}
		for _, l := range results[i].lines {
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
	cancel()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return GrepResult{}, err
	}
	return trimTrailingContext(out, req.Context), nil
}

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
	return &LineMatcher{line: line, file: file}, nil
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

// grepFile returns the matching lines of data and their context.
func (m *LineMatcher) grepFile(name string, data []byte, req GrepRequest) []GrepLine {
	maxChars := req.MaxLineChars
	// The prefilter is exact unless a line gets cut (a cut can make "x$"
	// match where the whole line does not) or ends in "\r\n" (lines are
	// matched without the "\r", which multi-line "$" does not skip).
	if !m.file.Match(data) && (maxChars <= 0 || !hasLineLongerThan(data, maxChars)) && bytes.IndexByte(data, '\r') < 0 {
		return nil
	}
	var out []GrepLine
	var before []GrepLine // ring of context lines not yet shown
	after := 0            // context lines still owed after the last match
	lineNo := 0
	for len(data) > 0 {
		lineNo++
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		line = CutLine(line, maxChars)
		if m.line.Match(line) {
			out = append(out, before...)
			before = before[:0]
			out = append(out, GrepLine{Path: name, Line: lineNo, Text: string(line), Match: true})
			after = req.Context
			continue
		}
		if after > 0 {
			out = append(out, GrepLine{Path: name, Line: lineNo, Text: string(line)})
			after--
			continue
		}
		if req.Context > 0 {
			if len(before) == req.Context {
				before = append(before[:0], before[1:]...)
			}
			before = append(before, GrepLine{Path: name, Line: lineNo, Text: string(line)})
		}
	}
	return out
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
