package scope

import (
	"context"
	"io/fs"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// Walk answers as workspace.WalkGeneric over the decorator does. With Visible
// nil it is the inner workspace's walk. Otherwise, when the inner workspace
// is a WalkFS and the start is a directory that is shown, its walk is asked
// and the entries the rules do not show are left out — each entry is judged
// by its name and by its real name (the start's real name joined with the
// rest, since a walk follows no link below its start). A directory that is
// shown has a parent that is shown, so nothing the generic walk would reach
// is lost. With a Limit, the inner walk is asked for more entries until enough
// are shown. Anything else is WalkGeneric over the decorator.
func (s *scopedFS) Walk(ctx context.Context, req workspace.WalkRequest) (workspace.WalkResult, error) {
	if s.readsAll() {
		return workspace.Walk(ctx, s.inner, req)
	}
	w, ok := s.inner.(workspace.WalkFS)
	if !ok {
		return workspace.WalkGeneric(ctx, s.outer(), req)
	}
	start := req.Dir
	if start == "" {
		start = "."
	}
	t, ok := s.walkStart(ctx, start)
	if !ok {
		return workspace.WalkGeneric(ctx, s.outer(), req)
	}
	prefix := start + "/"
	if start == "." {
		prefix = ""
	}
	ask := req
	for {
		res, err := w.Walk(ctx, ask)
		if err != nil {
			return workspace.WalkResult{}, err
		}
		var out workspace.WalkResult
		found := 0 // error entries left out, as Limit counts
		for _, e := range res.Entries {
			rel, ok := strings.CutPrefix(e.Path, prefix)
			if !ok || !s.shown(e.Path, path.Join(t.real, rel), e.Type.IsDir()) {
				continue
			}
			if e.Err == nil {
				if req.Limit > 0 && found == req.Limit {
					out.Truncated = true
					return out, nil
				}
				found++
			}
			out.Entries = append(out.Entries, e)
		}
		if !res.Truncated {
			return out, nil
		}
		if ask.Limit > 1<<24 {
			ask.Limit = 0
		} else {
			ask.Limit *= 4
		}
	}
}

// walkStart says whether a walk from start enters a directory that is shown,
// as WalkGeneric over the decorator would (a link named as the start is
// followed once), and where that directory really is.
func (s *scopedFS) walkStart(ctx context.Context, start string) (target, bool) {
	info, err := s.Lstat(ctx, start)
	if err != nil {
		return target{}, false
	}
	if info.Mode()&fs.ModeSymlink != 0 {
		if info, err = s.Stat(ctx, start); err != nil {
			return target{}, false
		}
	}
	if !info.IsDir() {
		return target{}, false
	}
	t, err := s.lookup(ctx, "walk", start, true)
	return t, err == nil && t.info.IsDir()
}

// Grep answers as workspace.GrepGeneric over the decorator does. With Visible
// nil it is the inner workspace's search. Otherwise, when the inner workspace
// is a GrepFS (the agent's, one round trip) and the start is a directory that
// is shown, its search is asked and the lines of files the rules do not show
// are left out, each file judged by its name and real name as Walk judges
// entries. That answer is exact unless the search stopped at its Limit after
// dropping a match — the matches it did not reach might be shown — and then,
// as for every other start, the files come from Walk (so only files that are
// shown) and each is read with the inner ReadFile.
func (s *scopedFS) Grep(ctx context.Context, req workspace.GrepRequest) (workspace.GrepResult, error) {
	if s.readsAll() {
		return workspace.Grep(ctx, s.inner, req)
	}
	if g, ok := s.inner.(workspace.GrepFS); ok {
		if res, ok, err := s.grepFiltered(ctx, g, req); ok || err != nil {
			return res, err
		}
	}
	return workspace.GrepWithReader(ctx, s, req, s.inner.ReadFile)
}

// grepFiltered is the inner search with what is not shown left out; ok is
// false when that cannot answer exactly.
func (s *scopedFS) grepFiltered(ctx context.Context, g workspace.GrepFS, req workspace.GrepRequest) (workspace.GrepResult, bool, error) {
	start := req.Dir
	if start == "" {
		start = "."
	}
	t, ok := s.walkStart(ctx, start)
	if !ok {
		return workspace.GrepResult{}, false, nil
	}
	prefix := start + "/"
	if start == "." {
		prefix = ""
	}
	res, err := g.Grep(ctx, req)
	if err != nil {
		return workspace.GrepResult{}, false, err
	}
	out := workspace.GrepResult{Truncated: res.Truncated}
	dropped, verdict := false, map[string]bool{}
	for _, l := range res.Lines {
		shown, seen := verdict[l.Path]
		if !seen {
			rel, ok := strings.CutPrefix(l.Path, prefix)
			shown = ok && s.shown(l.Path, path.Join(t.real, rel), false)
			verdict[l.Path] = shown
		}
		switch {
		case shown:
			out.Lines = append(out.Lines, l)
			if l.Match {
				out.Matches++
			}
		case l.Match:
			dropped = true
		}
	}
	if dropped && res.Truncated {
		return workspace.GrepResult{}, false, nil
	}
	return out, true, nil
}
