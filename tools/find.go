package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspace"
)

// FindResult is the structured content of find.
type FindResult struct {
	Paths     []string `json:"paths"` // relative to the workspace root
	Truncated bool     `json:"truncated"`
}

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

func (s *Set) find(ctx context.Context, p findArgs, c *call) (Result, error) {
	if p.Pattern == "" {
		return Result{}, invalid("pattern is required (e.g. **/*.go)")
	}
	if !doublestar.ValidatePattern(strings.TrimPrefix(p.Pattern, "/")) {
		return Result{}, invalid("pattern %q is not a valid glob", p.Pattern)
	}
	limit := limitOf(p.Limit, s.cfg.FindResults)
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
