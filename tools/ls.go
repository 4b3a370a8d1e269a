package tools

import (
	"context"
	"fmt"
	"io/fs"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// LsResult is the structured content of ls.
type LsResult struct {
	Path      string   `json:"path"`
	Entries   []string `json:"entries"` // directories end in "/", links in "@"
	Truncated bool     `json:"truncated"`
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

func (s *Set) ls(ctx context.Context, p lsArgs, c *call) (Result, error) {
	limit := limitOf(p.Limit, s.cfg.LsEntries)
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
