package scope

import (
	"fmt"
	"path"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
	"github.com/sandboxd/sandboxd/workspace"
)

// Rules bound what an agent sees and changes in one session, on top of the
// protect globs. Globs are doublestar patterns (github.com/bmatcuk/doublestar/v4)
// over workspace names: "src/**", "docs/*.md", "**/*.go". They are matched
// like workspace.Protect: on the cleaned name, a glob ending in "/**" also
// covers the directory itself, and a name is covered when it or any of its
// ancestors matches. Two differences from Protect, both because these are
// allow lists (a miss refuses): matching is case-sensitive, so on a
// case-insensitive disk a name spelt in another case is refused rather than
// let in; and, as in Protect, a glob without a slash names top-level entries
// only ("*.go" is the root's Go files; "**/*.go" is every Go file).
type Rules struct {
	// Visible lists what the agent may see. Nil: everything is visible.
	Visible []string `json:"visible,omitempty"`
	// Commit lists what the agent may change, within what it sees. Nil:
	// every visible path may be changed.
	Commit []string `json:"commit,omitempty"`
}

// Validate reports the first glob doublestar cannot parse or that can never
// match a workspace name (one starting with "/" or "./" or ending with "/"),
// and a list that is present but empty (which would read as "nothing" in Go
// and as "no rule" once JSON drops it): each error matches
// workspace.ErrInvalidArgument and names the list and the glob.
func (r Rules) Validate() error {
	for _, l := range []struct {
		name  string
		globs []string
	}{{"visible", r.Visible}, {"commit", r.Commit}} {
		if l.globs != nil && len(l.globs) == 0 {
			return fmt.Errorf("scope: %s is an empty list: leave it out for no restriction: %w", l.name, workspace.ErrInvalidArgument)
		}
		for _, g := range l.globs {
			if g == "" || !doublestar.ValidatePattern(g) {
				return fmt.Errorf("scope: %s glob %q is not a doublestar pattern: %w", l.name, g, workspace.ErrInvalidArgument)
			}
			if strings.HasPrefix(g, "/") || strings.HasPrefix(g, "./") || strings.HasSuffix(g, "/") {
				return fmt.Errorf("scope: %s glob %q can never match: workspace names are relative, without a leading \"./\" or \"/\" or a trailing \"/\": %w", l.name, g, workspace.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// IsZero reports whether r restricts nothing.
func (r Rules) IsZero() bool { return r.Visible == nil && r.Commit == nil }

// IsVisible reports whether the agent may see name, a workspace name. The root
// "." is always visible. A directory the agent may not see can still be
// traversed when something visible could lie beneath it (see New).
func (r Rules) IsVisible(name string) bool {
	if r.Visible == nil {
		return true
	}
	name = path.Clean(name)
	return name == "." || covers(r.Visible, name)
}

// IsCommittable reports whether the agent may change name: it is visible and
// Commit is nil or covers it. The root is covered only by the glob "**".
func (r Rules) IsCommittable(name string) bool {
	if !r.IsVisible(name) {
		return false
	}
	if r.Commit == nil {
		return true
	}
	name = path.Clean(name)
	if name == "." {
		for _, g := range r.Commit {
			if g == "**" {
				return true
			}
		}
		return false
	}
	return covers(r.Commit, name)
}

// seen reports whether name is shown to the agent: visible, or a directory
// (dir) under which something visible may lie.
func (r Rules) seen(name string, dir bool) bool {
	return r.IsVisible(name) || dir && mayHold(r.Visible, name)
}

// changeable reports whether the entry at name — a directory when dir — may be
// created, replaced or removed on its own. A directory, which holds nothing of
// its own, needs only that something committable may lie beneath it.
func (r Rules) changeable(name string, dir bool) bool {
	if !dir {
		return r.IsCommittable(name)
	}
	return r.seen(name, true) && (r.Commit == nil || covers(r.Commit, name) || mayHold(r.Commit, name))
}

// covers reports whether name or one of its ancestors (not the root) matches
// one of globs, a glob ending in "/**" matching its directory too.
func covers(globs []string, name string) bool {
	for n := name; n != "." && n != "/" && n != ""; n = path.Dir(n) {
		for _, g := range globs {
			if ok, _ := doublestar.Match(g, n); ok {
				return true
			}
			if dir, ok := strings.CutSuffix(g, "/**"); ok {
				if ok, _ := doublestar.Match(dir, n); ok {
					return true
				}
			}
		}
	}
	return false
}

// mayHold reports whether a name strictly below the directory dir could
// match one of globs. It errs towards true: it compares dir segment by
// segment with each glob's leading segments, and answers true as soon as it
// reaches a "**" segment, the end of dir with glob segments left, or a
// segment it cannot judge alone (one with "{", "[" or "\", whose
// alternatives, classes or escapes may span a slash). So whenever a name below
// dir is covered, dir is covered too or mayHold(dir) holds, and walking only
// into such directories finds every covered name.
func mayHold(globs []string, dir string) bool {
	if dir == "." {
		return len(globs) > 0
	}
	segs := strings.Split(dir, "/")
	for _, g := range globs {
		if globMayHold(strings.Split(g, "/"), segs) {
			return true
		}
	}
	return false
}

func globMayHold(glob, dir []string) bool {
	for i, seg := range dir {
		if i >= len(glob) {
			return false // the glob ends above dir: only dir or its ancestors can match it
		}
		p := glob[i]
		if p == "**" || strings.ContainsAny(p, "{[\\") {
			return true
		}
		if ok, err := doublestar.Match(p, seg); err != nil {
			return true
		} else if !ok {
			return false
		}
	}
	return len(glob) > len(dir) // equal: the glob matches dir itself, which covers all below
}
