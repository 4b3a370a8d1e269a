package journal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"

	"github.com/sandboxd/sandboxd/workspace"
)

// apply makes every path of want have its state, and returns the paths it
// could not give their exact state (contents not kept, a special file, a
// mode the adapter would not take). A file whose kept copy was altered is
// left as it is, named in the list, and makes apply fail with
// workspace.ErrUnavailable once everything else is done. Removals go first, shallowest first;
// then creations and updates, shallowest first, so directories exist before
// their entries; directory modes last, deepest first, so a read-only
// directory is filled before it is closed.
func (j *Journal) apply(ctx context.Context, want map[string]Entry) ([]string, error) {
	paths := make([]string, 0, len(want))
	for p := range want {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, byDepth)
	var unrestored, removed, altered []string
	for _, p := range paths {
		if want[p].Exists() || under(p, removed) {
			continue
		}
		if err := workspace.RemoveAll(ctx, j.fs, p); err != nil {
			return unrestored, err
		}
		removed = append(removed, p)
	}
	var dirs []string
	for _, p := range paths {
		w := want[p]
		if !w.Exists() {
			continue
		}
		cur, err := j.fs.Lstat(ctx, p)
		if err != nil && !errors.Is(err, workspace.ErrNotFound) {
			return unrestored, err
		}
		if err == nil && typeOf(cur.Mode()) != w.Type || w.Type == "symlink" && err == nil {
			if err := workspace.RemoveAll(ctx, j.fs, p); err != nil {
				return unrestored, err
			}
			cur, err = nil, workspace.ErrNotFound
		}
		if err := workspace.MkdirAll(ctx, j.fs, path.Dir(p), 0o755); err != nil {
			return unrestored, err
		}
		switch w.Type {
		case "dir":
			dirs = append(dirs, p)
			if cur == nil {
				if err := j.fs.Mkdir(ctx, p, w.Mode.Perm()|0o700); err != nil {
					return unrestored, err
				}
			}
		case "file":
			if !w.restorable() {
				unrestored = append(unrestored, p+" (contents over the journal's size limit were not kept)")
				continue
			}
			ok, err := j.restoreFile(ctx, p, w)
			if errors.Is(err, errAltered) {
				unrestored = append(unrestored, p+" (the journal's copy was altered: not restored)")
				altered = append(altered, p)
				continue
			}
			if err != nil {
				return unrestored, err
			}
			if !ok {
				unrestored = append(unrestored, fmt.Sprintf("%s (mode %04o not restored)", p, w.Mode))
			}
		case "symlink":
			sl, ok := j.fs.(workspace.SymlinkFS)
			if !ok {
				unrestored = append(unrestored, p+" (this workspace cannot make links)")
				continue
			}
			if err := sl.Symlink(ctx, w.Target, p); err != nil {
				return unrestored, err
			}
		default:
			unrestored = append(unrestored, p+" (special files are not restored)")
		}
	}
	for _, p := range slices.Backward(dirs) {
		ok, err := j.setMode(ctx, p, want[p].Mode, nil)
		if err != nil {
			return unrestored, err
		}
		if !ok {
			unrestored = append(unrestored, fmt.Sprintf("%s (mode %04o not restored)", p, want[p].Mode))
		}
	}
	if len(altered) > 0 {
		return unrestored, alteredError(altered)
	}
	return unrestored, nil
}

// alteredError says which paths' kept copies were altered.
func alteredError(paths []string) error {
	return workspace.Errorf(workspace.ErrUnavailable, "journal: the kept copies of %s were altered in the journal's store, so they were not restored; "+
		"the store was written by something other than sandboxd (keep it out of the session's reach: see SECURITY.md, the journal)", strings.Join(paths, ", "))
}

// restoreFile writes the kept contents of w to p and gives it w's mode; it
// reports false when the mode could not be set.
func (j *Journal) restoreFile(ctx context.Context, p string, w Entry) (bool, error) {
	data := []byte{}
	if w.Hash != "" {
		var err error
		if data, err = j.readBlob(ctx, w.Hash); err != nil {
			return false, fmt.Errorf("journal: contents of %s: %w", p, err)
		}
	}
	// Only checked bytes reach the workspace (readBlob); from here on the
	// store is not read again.
	if err := j.fs.WriteFile(ctx, p, data, w.Mode); err != nil {
		return false, err
	}
	return j.setMode(ctx, p, w.Mode, data)
}

// setMode gives p the mode bits mode: with the adapter's or the host's chmod
// when there is one, else, for a file (data not nil), by recreating it.
func (j *Journal) setMode(ctx context.Context, p string, mode fs.FileMode, data []byte) (bool, error) {
	info, err := j.fs.Lstat(ctx, p)
	if err != nil {
		return false, err
	}
	if info.Mode()&modeBits == mode {
		return true, nil
	}
	switch {
	case j.chmod != nil:
		if err := j.chmod(ctx, p, mode); err != nil {
			return false, err
		}
	case data != nil:
		if err := j.fs.Remove(ctx, p); err != nil {
			return false, err
		}
		if err := j.fs.WriteFile(ctx, p, data, mode); err != nil {
			return false, err
		}
	default:
		return false, nil
	}
	info, err = j.fs.Lstat(ctx, p)
	return err == nil && info.Mode()&modeBits == mode, err
}

// byDepth orders paths parents first: by depth, then by name.
func byDepth(a, b string) int {
	if d := strings.Count(a, "/") - strings.Count(b, "/"); d != 0 {
		return d
	}
	return strings.Compare(a, b)
}

// under reports whether p is one of dirs or below one.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// RevertRequest asks to bring the workspace back to a commit.
type RevertRequest struct {
	// To is the commit whose state to return to; 0 is the state before the
	// oldest commit kept.
	To int `json:"to"`
	// Force overwrites paths changed since (by bash or another program),
	// which are otherwise a conflict that stops the revert.
	Force bool `json:"force,omitempty"`
}

// RevertResult says what Revert did.
type RevertResult struct {
	// Commit is the revert's own commit (nil when nothing had to change).
	Commit *Commit `json:"commit,omitempty"`
	// Unrestored are paths that could not be given their exact state.
	Unrestored []string `json:"unrestored,omitempty"`
}

// Revert undoes every commit after req.To, newest first, as one new commit
// (message "revert to N"), which can itself be reverted. Before changing
// anything it checks that each path those commits touched is still as the
// journal left it; a path changed since by something else is a conflict,
// and the revert fails with workspace.ErrInvalidArgument naming the paths,
// unless Force. A path whose earlier contents were over the size limit
// fails it the same way (and is skipped with Force).
func (j *Journal) Revert(ctx context.Context, req RevertRequest) (RevertResult, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.active != nil {
		return RevertResult{}, workspace.Errorf(workspace.ErrForbidden, "a provider session is active: end it before reverting")
	}
	if req.To < 0 {
		return RevertResult{}, workspace.Errorf(workspace.ErrInvalidArgument, "commit %d does not exist", req.To)
	}
	if req.To > 0 {
		if _, err := j.get(req.To); err != nil {
			return RevertResult{}, workspace.Errorf(workspace.ErrNotFound, "commit %d is not in the journal (it keeps the last %d)", req.To, j.maxCommits)
		}
	} else if len(j.commits) > 0 && j.commits[0].ID != 1 {
		return RevertResult{}, workspace.Errorf(workspace.ErrNotFound, "the commits before %d are no longer kept: revert to a kept commit", j.commits[0].ID)
	}
	target, expect := map[string]Entry{}, map[string]Entry{}
	for _, c := range j.commits {
		if c.ID <= req.To {
			continue
		}
		for _, ch := range c.Changes {
			if _, ok := target[ch.Path]; !ok {
				target[ch.Path] = ch.Before
			}
			expect[ch.Path] = ch.After
		}
	}
	var changes []Change
	var problems []string
	for _, p := range slices.Sorted(maps.Keys(expect)) {
		cur, err := j.state(ctx, p)
		if err != nil {
			return RevertResult{}, err
		}
		if !cur.same(expect[p]) {
			problems = append(problems, p+" changed since")
		}
		if !target[p].restorable() {
			problems = append(problems, p+" was over the size limit, its contents were not kept")
			delete(target, p)
			continue
		}
		changes = append(changes, Change{Path: p, Before: cur})
	}
	var altered []string
	for _, p := range slices.Sorted(maps.Keys(target)) {
		if w := target[p]; w.Type == "file" && w.Hash != "" {
			if _, err := j.readBlob(ctx, w.Hash); errors.Is(err, errAltered) {
				altered = append(altered, p)
			} else if err != nil {
				return RevertResult{}, fmt.Errorf("journal: contents of %s: %w", p, err)
			}
		}
	}
	if len(altered) > 0 { // not even with Force: the content to restore is not known
		return RevertResult{}, alteredError(altered)
	}
	if len(problems) > 0 && !req.Force {
		return RevertResult{}, workspace.Errorf(workspace.ErrInvalidArgument, "cannot revert to %s: %s; nothing was changed (force overwrites)", commitLabel(req.To), strings.Join(problems, "; "))
	}
	unrestored, err := j.apply(ctx, target)
	if err != nil {
		return RevertResult{Unrestored: unrestored}, err
	}
	for i := range changes {
		if changes[i].After, err = j.state(ctx, changes[i].Path); err != nil {
			return RevertResult{Unrestored: unrestored}, err
		}
	}
	c, err := j.commit(ctx, "revert to "+commitLabel(req.To), changes)
	return RevertResult{Commit: c, Unrestored: unrestored}, err
}

func commitLabel(id int) string {
	if id == 0 {
		return "the start"
	}
	return fmt.Sprintf("commit %d", id)
}

// Show returns commit id as a unified diff, git style: a header per path,
// mode lines, and the text changes with three lines of context; binary
// files and contents the journal did not keep are named, not shown.
func (j *Journal) Show(ctx context.Context, id int) (string, error) {
	c, err := j.Get(id)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, ch := range c.Changes {
		if err := j.diff(ctx, &b, ch); err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

func (j *Journal) diff(ctx context.Context, b *strings.Builder, ch Change) error {
	p, bf, af := ch.Path, ch.Before, ch.After
	fmt.Fprintf(b, "diff --git a/%s b/%s\n", p, p)
	switch {
	case !bf.Exists():
		fmt.Fprintf(b, "new %s mode %06o\n", kindWord(af), gitMode(af))
	case !af.Exists():
		fmt.Fprintf(b, "deleted %s mode %06o\n", kindWord(bf), gitMode(bf))
	case gitMode(bf) != gitMode(af):
		fmt.Fprintf(b, "old mode %06o\nnew mode %06o\n", gitMode(bf), gitMode(af))
	}
	from, to := "a/"+p, "b/"+p
	if !bf.Exists() {
		from = "/dev/null"
	}
	if !af.Exists() {
		to = "/dev/null"
	}
	before, bok, err := j.text(ctx, bf)
	if err != nil {
		return err
	}
	after, aok, err := j.text(ctx, af)
	if err != nil {
		return err
	}
	if !bok || !aok {
		if !bf.same(af) && (bf.Type == "file" || af.Type == "file") {
			fmt.Fprintf(b, "Binary files %s and %s differ\n", from, to)
		}
		return nil
	}
	if before == after {
		return nil
	}
	d, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: diffLines(before), B: diffLines(after),
		FromFile: from, ToFile: to, Context: 3,
	})
	if err != nil {
		return err
	}
	b.WriteString(d)
	if !strings.HasSuffix(d, "\n") {
		b.WriteString("\n")
	}
	return nil
}

// diffLines splits s into lines that keep their "\n"; a last line without
// one is marked as git marks it.
func diffLines(s string) []string {
	var out []string
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s+"\n\\ No newline at end of file\n")
			break
		}
		out, s = append(out, s[:i+1]), s[i+1:]
	}
	return out
}

// text returns what the diff shows of a state: a file's text, a link's
// target; ok is false for binary or unkept contents.
func (j *Journal) text(ctx context.Context, e Entry) (string, bool, error) {
	switch e.Type {
	case "", "dir":
		return "", true, nil
	case "symlink":
		return e.Target, true, nil
	case "file":
		if e.Hash == "" {
			return "", e.Size == 0, nil
		}
		data, err := j.readBlob(ctx, e.Hash)
		if err != nil {
			return "", false, fmt.Errorf("journal: contents %s: %w", e.Hash[:12], err)
		}
		if !isText(data) {
			return "", false, nil
		}
		return string(data), true, nil
	}
	return "", false, nil
}

func isText(data []byte) bool {
	return !slices.Contains(data, 0) && utf8.Valid(data)
}

func kindWord(e Entry) string {
	if e.Type == "dir" {
		return "directory"
	}
	return "file"
}

func gitMode(e Entry) uint32 {
	perm := uint32(e.Mode.Perm())
	switch e.Type {
	case "dir":
		return 0o040000 | perm
	case "symlink":
		return 0o120000
	}
	return 0o100000 | perm
}
