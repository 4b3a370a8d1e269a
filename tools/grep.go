package tools

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bmatcuk/doublestar/v4"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspace"
)

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

func (s *Set) grep(ctx context.Context, p grepArgs, c *call) (Result, error) {
	if p.Pattern == "" {
		return Result{}, invalid("pattern is required")
	}
	if p.Glob != "" && !doublestar.ValidatePattern(strings.TrimPrefix(p.Glob, "/")) {
		return Result{}, invalid("glob %q is not a valid glob", p.Glob)
	}
	limit := limitOf(p.Limit, s.cfg.GrepMatches)
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
