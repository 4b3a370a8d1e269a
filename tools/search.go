package tools

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/bmatcuk/doublestar/v4"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspace"
)

// LsResult is the structured content of ls.
type LsResult struct {
	Path      string   `json:"path"`
	Entries   []string `json:"entries"` // directories end in "/", links in "@"
	Truncated bool     `json:"truncated"`
}

// FindResult is the structured content of find.
type FindResult struct {
	Paths     []string `json:"paths"` // relative to the workspace root
	Truncated bool     `json:"truncated"`
}

// GrepMatch is one line grep found: a match, or a line of context.
type GrepMatch struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// GrepResult is the structured content of grep. Matches are the matching
// lines; Context the lines around them that the context argument asked for.
type GrepResult struct {
	Matches   []GrepMatch `json:"matches"`
	Context   []GrepMatch `json:"context,omitempty"`
	Truncated bool        `json:"truncated"`
}

type lsArgs struct {
	Path  string `json:"path,omitempty" jsonschema:"the directory (default: the workspace root)"`
	Limit *int   `json:"limit,omitempty" jsonschema:"the most entries to return (at most {{.LsEntries}}, the default)"`
}

var lsTool = newTool(spec[lsArgs, *LsResult]{
	name: "ls", skill: "workspace.read",
	describe: func(s *Set) string {
		return fmt.Sprintf("List a directory of the workspace, sorted by name. Directories end in /, symbolic links in @; a name holding a control character (a newline, an escape) is shown quoted, Go-style (\"a\\nb\"). At most %d entries.", s.cfg.LsEntries)
	},
	constrain: func(props map[string]*jsonschema.Schema) { minimum(props, 1, "limit") },
	handle:    (*Set).ls,
	readOnly:  yes,
})

type findArgs struct {
	Pattern string `json:"pattern" jsonschema:"the glob, e.g. **/*.ts or src/**/test_*.py"`
	Path    string `json:"path,omitempty" jsonschema:"the directory to search (default: the workspace root)"`
	Limit   *int   `json:"limit,omitempty" jsonschema:"the most paths to return (at most {{.FindResults}}, the default)"`
}

var findTool = newTool(spec[findArgs, *FindResult]{
	name: "find", skill: "workspace.read",
	describe: func(s *Set) string {
		return fmt.Sprintf("Find files whose path matches a glob (doublestar: *, **, ?, [abc], {a,b}), written relative to the workspace root; a pattern without / matches the file name at any depth (*.go). Returns paths relative to the root (quoted, Go-style, when one holds a control character), at most %d, shown up to %s. Never enters linked directories or %s.",
			s.cfg.FindResults, s.limits(), excludeText(s.cfg.Exclude))
	},
	constrain: func(props map[string]*jsonschema.Schema) { minimum(props, 1, "limit") },
	handle:    (*Set).find,
	readOnly:  yes,
})

type grepArgs struct {
	Pattern    string `json:"pattern" jsonschema:"the regular expression (or plain text with literal)"`
	Path       string `json:"path,omitempty" jsonschema:"a directory or file to search (default: the workspace root)"`
	Glob       string `json:"glob,omitempty" jsonschema:"only files whose root-relative path matches this glob (*.go matches at any depth)"`
	IgnoreCase bool   `json:"ignoreCase,omitempty" jsonschema:"match case-insensitively"`
	Literal    bool   `json:"literal,omitempty" jsonschema:"treat pattern as plain text"`
	Context    int    `json:"context,omitempty" jsonschema:"lines to show before and after each match"`
	Limit      *int   `json:"limit,omitempty" jsonschema:"the most matching lines to return (at most {{.GrepMatches}}, the default)"`
}

var grepTool = newTool(spec[grepArgs, *GrepResult]{
	name: "grep", skill: "workspace.read",
	describe: func(s *Set) string {
		return fmt.Sprintf("Search file contents for a regular expression (Go RE2 syntax: no backreferences or lookaround; matching takes linear time, so no pattern can hang the search). Returns path:line:text for each matching line (context lines as path-line-text), at most %d matches, lines cut to %d characters before matching, shown up to %s. Skips binary files, linked directories and %s.",
			s.cfg.GrepMatches, s.cfg.GrepLineChars, s.limits(), excludeText(s.cfg.Exclude))
	},
	constrain: func(props map[string]*jsonschema.Schema) {
		minimum(props, 1, "limit")
		minimum(props, 0, "context")
	},
	handle:   (*Set).grep,
	readOnly: yes,
})

// limitOf applies a call's limit under the configured cap.
func limitOf(limit *int, max int) (int, error) {
	if limit == nil {
		return max, nil
	}
	if *limit < 1 {
		return 0, invalid("limit must be at least 1, got %d", *limit)
	}
	return min(*limit, max), nil
}

// capOutput keeps the lines that fit in maxLines and maxBytes.
func (s *Set) capOutput(lines []string) (kept int, cut bool) {
	size := 0
	for i, l := range lines {
		size += len(l) + 1
		if i >= s.cfg.MaxLines || size > s.cfg.MaxBytes {
			return i, true
		}
	}
	return len(lines), false
}

func (s *Set) outputCutNote() string {
	return fmt.Sprintf("[Output cut to %d lines or %s.", s.cfg.MaxLines, kb(int64(s.cfg.MaxBytes)))
}

// shownName is how a text result writes a name: as it is when every
// character is printable, else quoted Go-style (strconv.Quote: "a\nb",
// "\x1b[31m", "\u202e"), so that a name holding a newline, a terminal
// escape sequence or a bidirectional control cannot pass for other lines,
// other names or other colours. A name that begins with '"' is quoted too,
// so a quoted name never reads as another's. Structured results keep the
// names as they are (JSON escapes them).
func shownName(name string) string {
	if name != "" && name[0] != '"' && utf8.ValidString(name) && !strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return name
	}
	return strconv.Quote(name)
}

func (s *Set) ls(ctx context.Context, p lsArgs, c *call) (Result, error) {
	limit, err := limitOf(p.Limit, s.cfg.LsEntries)
	if err != nil {
		return Result{}, err
	}
	name, err := s.resolve(p.Path)
	if err != nil {
		return Result{}, err
	}
	entries, err := c.fsys.ReadDir(ctx, name)
	if err != nil {
		return Result{}, err
	}
	r := &LsResult{Path: name, Entries: []string{}}
	for _, e := range entries[:min(len(entries), limit)] {
		n := e.Name()
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			n += "@"
		case e.IsDir():
			n += "/"
		}
		r.Entries = append(r.Entries, n)
	}
	r.Truncated = len(entries) > limit
	shown := make([]string, len(r.Entries))
	for i, e := range entries[:len(r.Entries)] {
		shown[i] = shownName(e.Name()) + strings.TrimPrefix(r.Entries[i], e.Name())
	}
	text := strings.Join(shown, "\n")
	switch {
	case len(entries) == 0:
		text = "(empty directory)"
	case r.Truncated:
		text += fmt.Sprintf("\n\n[Showing %d of %d entries. Use find with a pattern to narrow the listing.]", limit, len(entries))
	}
	return Result{Text: text, Structured: r}, nil
}

func (s *Set) find(ctx context.Context, p findArgs, c *call) (Result, error) {
	if p.Pattern == "" {
		return Result{}, invalid("pattern is required (e.g. **/*.go)")
	}
	if !doublestar.ValidatePattern(strings.TrimPrefix(p.Pattern, "/")) {
		return Result{}, invalid("pattern %q is not a valid glob", p.Pattern)
	}
	limit, err := limitOf(p.Limit, s.cfg.FindResults)
	if err != nil {
		return Result{}, err
	}
	name, err := s.resolve(p.Path)
	if err != nil {
		return Result{}, err
	}
	// The path is followed as ls, read and grep follow it, so a link that
	// leads out of the workspace is refused here too (a walk alone would
	// list the link under its own name).
	if _, err := c.fsys.Stat(ctx, name); err != nil {
		return Result{}, err
	}
	w, err := workspace.Walk(ctx, c.fsys, workspace.WalkRequest{
		Dir: name, Pattern: p.Pattern, Exclude: s.cfg.Exclude, FilesOnly: true, Limit: limit,
	})
	if err != nil {
		return Result{}, err
	}
	paths := make([]string, len(w.Entries))
	shown := make([]string, len(w.Entries))
	for i, e := range w.Entries {
		paths[i], shown[i] = e.Path, shownName(e.Path)
	}
	kept, cut := s.capOutput(shown)
	r := &FindResult{Paths: paths[:kept], Truncated: w.Truncated || cut}
	if len(paths) == 0 {
		return Result{Text: fmt.Sprintf("No files found matching %s.", p.Pattern), Structured: r}, nil
	}
	text := strings.Join(shown[:kept], "\n")
	switch {
	case cut:
		text += fmt.Sprintf("\n\n%s Showing %d paths; there are more. Narrow the pattern or the path.]", s.outputCutNote(), kept)
	case w.Truncated:
		text += fmt.Sprintf("\n\n[Showing the first %d paths; there are more. Narrow the pattern or the path.]", limit)
	}
	return Result{Text: text, Structured: r}, nil
}

func (s *Set) grep(ctx context.Context, p grepArgs, c *call) (Result, error) {
	if p.Pattern == "" {
		return Result{}, invalid("pattern is required")
	}
	if p.Context < 0 {
		return Result{}, invalid("context must not be negative, got %d", p.Context)
	}
	if p.Glob != "" && !doublestar.ValidatePattern(strings.TrimPrefix(p.Glob, "/")) {
		return Result{}, invalid("glob %q is not a valid glob", p.Glob)
	}
	limit, err := limitOf(p.Limit, s.cfg.GrepMatches)
	if err != nil {
		return Result{}, err
	}
	name, err := s.resolve(p.Path)
	if err != nil {
		return Result{}, err
	}
	info, err := c.fsys.Stat(ctx, name)
	if err != nil {
		return Result{}, err
	}
	dir := name
	if !info.IsDir() {
		if _, err := s.regularFile(ctx, c.fsys, name, "grep"); err != nil {
			return Result{}, err
		}
		// A walk does not search a link to a file: search the file it
		// names, and report it under the name the model gave.
		if dir, err = workspace.RealPath(ctx, c.fsys, s.root, name); err != nil {
			return Result{}, err
		}
	}
	g, err := workspace.Grep(ctx, c.fsys, workspace.GrepRequest{
		Pattern: p.Pattern, Literal: p.Literal, IgnoreCase: p.IgnoreCase, Dir: dir, Glob: p.Glob,
		Exclude: s.cfg.Exclude, Context: p.Context, Limit: limit,
		MaxLineChars: s.cfg.GrepLineChars, MaxFileBytes: s.cfg.MaxFileBytes,
	})
	if err != nil {
		var pe *workspace.PatternError
		if errors.As(err, &pe) {
			return Result{}, invalid("pattern %q is not a valid Go (RE2) regular expression: %v", p.Pattern, pe.Err)
		}
		return Result{}, err
	}
	r := &GrepResult{Matches: []GrepMatch{}}
	lines := make([]string, 0, len(g.Lines))
	longLines := false
	for i := range g.Lines {
		if dir != name { // one file, through a link: under the name given
			g.Lines[i].Path = name
		}
	}
	for i, l := range g.Lines {
		if p.Context > 0 && i > 0 && (l.Path != g.Lines[i-1].Path || l.Line != g.Lines[i-1].Line+1) {
			lines = append(lines, "--")
		}
		sep := "-"
		if l.Match {
			sep = ":"
		}
		lines = append(lines, shownName(l.Path)+sep+strconv.Itoa(l.Line)+sep+l.Text)
		longLines = longLines || utf8.RuneCountInString(l.Text) >= s.cfg.GrepLineChars
	}
	kept, cut := s.capOutput(lines)
	shown := 0 // grep lines behind the kept output lines
	for _, l := range lines[:kept] {
		if l != "--" {
			shown++
		}
	}
	for _, l := range g.Lines[:shown] {
		m := GrepMatch{Path: l.Path, Line: l.Line, Text: l.Text}
		if l.Match {
			r.Matches = append(r.Matches, m)
		} else {
			r.Context = append(r.Context, m)
		}
	}
	r.Truncated = g.Truncated || cut
	if g.Matches == 0 {
		return Result{Text: "No matches found.", Structured: r}, nil
	}
	text := strings.Join(lines[:kept], "\n")
	var notes []string
	if cut {
		notes = append(notes, fmt.Sprintf("%s Showing %d of the matching lines; narrow the pattern, path or glob.]", s.outputCutNote(), len(r.Matches)))
	} else if g.Truncated {
		notes = append(notes, fmt.Sprintf("[Stopped at %d matches; there are more. Narrow the pattern, path or glob.]", limit))
	}
	if longLines {
		notes = append(notes, fmt.Sprintf("[Lines are cut to %d characters; read the file for whole lines.]", s.cfg.GrepLineChars))
	}
	if len(notes) > 0 {
		text += "\n\n" + strings.Join(notes, "\n")
	}
	return Result{Text: text, Structured: r}, nil
}
