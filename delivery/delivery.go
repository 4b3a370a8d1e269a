package delivery

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/workspace"
)

// Mode says how a session's work is delivered.
type Mode string

const (
	// Auto commits onto a branch when the directory is in a git work tree,
	// and otherwise writes a patch.
	Auto Mode = "auto"
	// Apply writes the changes into the directory, leaving conflicts alone
	// (and writing them as a patch, so nothing is lost).
	Apply Mode = "apply"
	// Patch writes a git-format patch.
	Patch Mode = "patch"
	// Branch commits onto the branch sandboxd/SESSION of the directory's
	// repository.
	Branch Mode = "branch"
	// None discards the work.
	None Mode = "none"
)

// Modes are the modes, in the order help lists them.
var Modes = []Mode{Auto, Apply, Patch, Branch, None}

// ParseMode returns the mode s names.
func ParseMode(s string) (Mode, error) {
	if m := Mode(s); slices.Contains(Modes, m) {
		return m, nil
	}
	return "", fmt.Errorf("unknown delivery %q (one of auto, apply, patch, branch, none)", s)
}

// gitLog is where git keeps HEAD's reflog in a repository.
const gitLog = ".git/logs/HEAD"

// Baseline is a directory as it was when copied into a session: read by
// Begin before the copy, so a file changed in the directory while the copy
// is made looks changed by the user, never by the session.
type Baseline struct {
	dir   string
	tree  *Tree
	store *Store
	log   []byte // the directory's .git/logs/HEAD
}

// Begin reads dir's tree (its contents into a private store). Close
// releases the store.
func Begin(ctx context.Context, dir string) (*Baseline, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fsys, err := localfs.New(abs)
	if err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	defer fsys.Close()
	st, err := NewStore()
	if err != nil {
		return nil, err
	}
	t, err := Snapshot(ctx, fsys, st)
	if err != nil {
		st.Close()
		return nil, err
	}
	log, _ := fsys.ReadFile(ctx, gitLog, MaxFileBytes)
	return &Baseline{dir: abs, tree: t, store: st, log: log}, nil
}

// Close removes the baseline's store.
func (b *Baseline) Close() error { return b.store.Close() }

// Request says how to deliver a session's work.
type Request struct {
	Mode Mode
	// Session names the session: the branch is sandboxd/Session, the
	// default patch file Session.patch.
	Session string
	// PatchFile is where a patch goes; "" is DefaultPatchFile's.
	PatchFile string
}

// Report is what Deliver did.
type Report struct {
	Mode    Mode // as done (Auto resolved)
	Dir     string
	Changes []Change
	// Skipped names what the session's tree held that was not delivered.
	Skipped map[string]string
	// Commits are the subjects of the commits the agent made in the
	// session, from its reflog; they are carried as one commit's message.
	Commits   []string
	Committed *Committed
	Applied   *Applied
	// PatchFile is the patch written, if any; for Apply, the conflicts'.
	PatchFile string
	// Fallback says why a patch was written instead of the mode asked for.
	Fallback string
}

// Deliver reads the session's final tree from fsys and delivers what
// changed since the baseline as req says. It never overwrites a change made
// in the directory since the copy, and short of an error it never loses the
// session's work: a branch that cannot be made, or a directory that cannot
// be written, gives a patch instead (an error unless under Auto), and
// Apply's conflicts are written as a patch.
func (b *Baseline) Deliver(ctx context.Context, fsys workspace.FileSystem, req Request) (*Report, error) {
	final, err := Snapshot(ctx, fsys, b.store)
	if err != nil {
		return nil, err
	}
	r := &Report{Mode: req.Mode, Dir: b.dir, Changes: Changes(b.tree, final), Skipped: final.Skipped,
		Commits: agentCommits(ctx, fsys, b.log)}
	if len(r.Changes) == 0 || req.Mode == None {
		return r, nil
	}
	if req.PatchFile == "" {
		if req.PatchFile, err = DefaultPatchFile(req.Session); err != nil {
			return r, err
		}
	}
	message := b.message(req.Session, r.Commits)
	if r.Mode == Auto {
		r.Mode = Patch
		if _, ok := RepoPrefix(ctx, b.dir); ok {
			r.Mode = Branch
		}
	}
	switch r.Mode {
	case Branch:
		if r.Committed, err = Commit(ctx, b.dir, "sandboxd/"+req.Session, message, r.Changes, b.store); err != nil {
			return r, b.fallback(req, message, r, err)
		}
		return r, nil
	case Apply:
		if r.Applied, err = SyncBack(b.dir, r.Changes, final, b.store); err != nil {
			return r, b.fallback(req, message, r, err)
		}
		var kept []Change
		for _, c := range r.Changes {
			if slices.ContainsFunc(r.Applied.Conflicts, func(k Conflict) bool { return k.Path == c.Path }) {
				kept = append(kept, c)
			}
		}
		if len(kept) == 0 {
			return r, nil
		}
		return r, b.writePatch(req.PatchFile, message, kept, r)
	default:
		return r, b.writePatch(req.PatchFile, message, r.Changes, r)
	}
}

// fallback writes the whole work as a patch when the mode asked for failed
// with err, so the work is not lost. Under Auto that is the delivery; a
// mode named explicitly still fails, saying where the work went.
func (b *Baseline) fallback(req Request, message string, r *Report, err error) error {
	r.Mode, r.Fallback, r.Committed, r.Applied = Patch, err.Error(), nil, nil
	if perr := b.writePatch(req.PatchFile, message, r.Changes, r); perr != nil {
		return errors.Join(err, perr)
	}
	if req.Mode == Auto {
		return nil
	}
	return fmt.Errorf("%w (the work is in the patch %s)", err, r.PatchFile)
}

// writePatch writes changes to a new file name (never replacing one).
func (b *Baseline) writePatch(name, header string, changes []Change, r *Report) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("delivery: %w (name another file with --patch FILE)", err)
	}
	err = WritePatch(f, header, changes, b.store)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("delivery: writing the patch: %w", err)
	}
	r.PatchFile = name
	return nil
}

// DefaultPatchFile is where a session's patch goes unless named:
// $XDG_STATE_HOME/sandboxd/deliveries/SESSION.patch (by default under
// ~/.local/state), outside the directory, so its work tree stays as it is.
func DefaultPatchFile(session string) (string, error) {
	dir := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(dir) {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("delivery: no place for the patch: %w (name one with --patch FILE)", err)
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "sandboxd", "deliveries", session+".patch"), nil
}

// message is the commit message of a delivery, and a patch's header.
func (b *Baseline) message(session string, commits []string) string {
	var m strings.Builder
	fmt.Fprintf(&m, "sandboxd: the work of session %s\n\nWhat the session changed in %s, as one change.\n", session, b.dir)
	if len(commits) > 0 {
		m.WriteString("\nCommits made in the session (their changes are in this one):\n")
		for _, c := range commits {
			fmt.Fprintf(&m, "- %s\n", c)
		}
	}
	return m.String()
}

// agentCommits lists the commits made in the session, from the lines its
// reflog gained since the baseline's.
func agentCommits(ctx context.Context, fsys workspace.FileSystem, base []byte) []string {
	log, err := fsys.ReadFile(ctx, gitLog, MaxFileBytes)
	if err != nil {
		return nil
	}
	if rest, ok := bytes.CutPrefix(log, base); ok {
		log = rest
	}
	var out []string
	for line := range strings.Lines(string(log)) {
		_, msg, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
		if kind, subject, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(kind, "commit") {
			if kind != "commit" {
				subject = strings.TrimPrefix(kind, "commit ") + " " + subject
			}
			out = append(out, subject)
		}
	}
	return out
}

// String says what was delivered where, one line each, for standard error.
func (r *Report) String() string {
	var b strings.Builder
	say := func(format string, a ...any) { fmt.Fprintf(&b, "sandboxd: "+format+"\n", a...) }
	var added, modified, deleted int
	for _, c := range r.Changes {
		switch {
		case c.Old == nil:
			added++
		case c.New == nil:
			deleted++
		default:
			modified++
		}
	}
	for _, p := range slices.Sorted(maps.Keys(r.Skipped)) {
		say("not delivered: %s (%s)", p, r.Skipped[p])
	}
	if len(r.Changes) == 0 {
		say("the session changed nothing in %s; nothing to deliver", r.Dir)
		return b.String()
	}
	say("the session changed %d paths of %s: %d added, %d modified, %d deleted", len(r.Changes), r.Dir, added, modified, deleted)
	if len(r.Commits) > 0 {
		say("commits made in the session: %d; their work is delivered as one change, their subjects in its message", len(r.Commits))
	}
	switch {
	case r.Mode == None:
		say("--deliver none: the work is discarded")
	case r.Committed != nil:
		branch := strings.TrimPrefix(r.Committed.Branch, "refs/heads/")
		say("committed onto branch %s (%s, on %s) in %s; the work tree and index are untouched", branch, short(r.Committed.Commit), cmp.Or(short(r.Committed.Parent), "no commit"), r.Dir)
		say("see it: git -C %s show %s; take it: git -C %s merge %s", r.Dir, branch, r.Dir, branch)
		if n := len(r.Committed.Ignored); n > 0 {
			shown := r.Committed.Ignored[:min(n, 10)]
			more := ""
			if n > len(shown) {
				more = fmt.Sprintf(" and %d more", n-len(shown))
			}
			say("left out of the commit, ignored by the repository: %s%s", strings.Join(shown, ", "), more)
		}
	case r.Applied != nil:
		say("applied to %s: %d written, %d removed, %d already so", r.Dir, len(r.Applied.Written), len(r.Applied.Removed), len(r.Applied.Same))
		for _, c := range r.Applied.Conflicts {
			say("conflict, left alone: %s: %s", c.Path, c.Why)
		}
	}
	if r.Fallback != "" {
		say("could not deliver as asked (%s): a patch instead", r.Fallback)
	}
	switch {
	case r.PatchFile != "" && r.Applied != nil:
		say("the session's side of the conflicts is kept as a patch against the copy in %s; merge it by hand, or in a git repository: git -C %s apply --3way %s", r.PatchFile, r.Dir, r.PatchFile)
	case r.PatchFile != "":
		say("wrote the patch to %s; apply it: git -C %s apply %s", r.PatchFile, r.Dir, r.PatchFile)
	}
	return b.String()
}

func short(oid string) string { return oid[:min(len(oid), 12)] }
