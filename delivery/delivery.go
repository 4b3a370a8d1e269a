package delivery

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	log   []byte   // the directory's .git/logs/HEAD
	keep  string   // where a durable baseline is kept (Keep), or ""
	lock  *os.File // a kept baseline's lock, held while it is open
}

// Begin reads dir's tree (its contents into a private store). Close
// releases the store. With Keep the baseline is durable: see Open.
func Begin(ctx context.Context, dir string, opts ...BeginOption) (*Baseline, error) {
	var o beginOptions
	for _, opt := range opts {
		opt(&o)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fsys, err := localfs.New(abs)
	if err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	defer fsys.Close()
	var st *Store
	var lock *os.File
	if o.keep != "" {
		if err := os.MkdirAll(o.keep, 0o700); err != nil {
			return nil, fmt.Errorf("delivery: %w", err)
		}
		if lock, err = lockKept(o.keep); err != nil {
			return nil, err
		}
		st, err = openStore(filepath.Join(o.keep, objectsDir))
	} else {
		st, err = NewStore()
	}
	b := &Baseline{dir: abs, store: st, keep: o.keep, lock: lock}
	if err == nil {
		b.tree, err = Snapshot(ctx, fsys, st)
	}
	if err == nil && o.keep != "" {
		b.log, _ = fsys.ReadFile(ctx, gitLog, MaxFileBytes)
		err = b.save()
	} else if err == nil {
		b.log, _ = fsys.ReadFile(ctx, gitLog, MaxFileBytes)
	}
	if err != nil {
		if st != nil {
			st.Close()
		}
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	return b, nil
}

// Close releases the baseline: a temporary store is removed; a kept one
// (Keep) stays until Discard, and its lock is let go.
func (b *Baseline) Close() error {
	err := b.store.Close()
	if b.lock != nil {
		b.lock.Close()
	}
	return err
}

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
	// Ignored names the files the session added that the repository
	// ignores (its .gitignore files, .git/info/exclude, core.excludesFile),
	// left out whatever the mode, as git add would leave them out: build
	// output, caches. Only a directory in a git work tree ignores any.
	Ignored []string
	// Commits are the subjects of the commits the agent made in the
	// session, from its reflog; they are carried as one commit's message.
	Commits   []string
	Committed *Committed
	Applied   *Applied
	// PatchFile is the patch written, if any; for Apply, the conflicts'.
	PatchFile string
	// Fallback says why a patch was written instead of the mode asked for.
	Fallback string
	// Resumed: this finished a delivery that an earlier run began and did
	// not finish (Baseline.Interrupted).
	Resumed bool
}

// Deliver reads the session's final tree from fsys and delivers what
// changed since the baseline as req says. It never overwrites a change made
// in the directory since the copy, and short of an error it never loses the
// session's work: a branch that cannot be made, or a directory that cannot
// be written, gives a patch instead (an error unless under Auto), and
// Apply's conflicts are written as a patch.
//
// A durable baseline (Keep) journals the delivery before it changes
// anything: when a delivery of it began and did not finish (a process
// killed halfway; Interrupted), Deliver finishes that one — the same
// changes, to the same places, from the contents kept — without reading
// fsys, which may be nil then. Every step is one a second run may repeat:
// a branch or a patch already made as it would be counts as made, a path of
// Apply already holding the session's version as written, and the
// temporary files a killed Apply left in the directory are removed.
func (b *Baseline) Deliver(ctx context.Context, fsys workspace.FileSystem, req Request) (*Report, error) {
	return b.deliver(ctx, req, func() (*Tree, []byte, error) {
		if fsys == nil {
			return nil, nil, errors.New("delivery: no workspace to read the work from")
		}
		final, err := Snapshot(ctx, fsys, b.store)
		if err != nil {
			return nil, nil, err
		}
		log, _ := fsys.ReadFile(ctx, gitLog, MaxFileBytes)
		return final, log, nil
	})
}

// DeliverArchive is Deliver of the session's tree as the tar stream r has
// it (names relative to the workspace root: the form of a Docker
// container's export), for a workspace whose agent is not there to read
// it through: one a killed run left. Entries other than regular files,
// links and directories, and what Excluded names, are left out.
func (b *Baseline) DeliverArchive(ctx context.Context, r io.Reader, req Request) (*Report, error) {
	return b.deliver(ctx, req, func() (*Tree, []byte, error) { return snapshotArchive(r, b.store) })
}

func (b *Baseline) deliver(ctx context.Context, req Request, read func() (*Tree, []byte, error)) (*Report, error) {
	j, err := b.readJournal()
	if err != nil {
		return nil, err
	}
	if j != nil {
		j.Report.Resumed = true
		return j.Report, b.carryOut(ctx, j)
	}
	r, j, err := b.plan(ctx, req, read)
	if err != nil || j == nil {
		return r, err
	}
	return r, b.carryOut(ctx, j)
}

// plan measures the work and journals the delivery it takes; the journal
// is nil when there is nothing to deliver.
func (b *Baseline) plan(ctx context.Context, req Request, read func() (*Tree, []byte, error)) (*Report, *journal, error) {
	final, log, err := read()
	if err != nil {
		return nil, nil, err
	}
	r := &Report{Mode: req.Mode, Dir: b.dir, Changes: Changes(b.tree, final), Skipped: final.Skipped,
		Commits: agentCommits(log, b.log)}
	if len(r.Changes) == 0 || req.Mode == None {
		return r, nil, nil
	}
	if req.PatchFile == "" {
		if req.PatchFile, err = DefaultPatchFile(req.Session); err != nil {
			return r, nil, err
		}
	}
	inRepo := false
	if b.dir != "" { // not Nothing's
		_, inRepo = RepoPrefix(ctx, b.dir)
	}
	if r.Mode == Auto {
		r.Mode = Patch
		if inRepo {
			r.Mode = Branch
		}
	}
	if inRepo {
		r.leaveOutIgnored(ctx, b.dir)
		if len(r.Changes) == 0 {
			return r, nil, nil
		}
	}
	j := &journal{Report: r}
	j.Request, j.Message, j.Tag = req, b.message(req.Session, r.Commits), strings.ToLower(rand.Text()[:10])
	if r.Mode == Apply {
		for p := range final.Files {
			j.Keep = append(j.Keep, parents(p)...)
		}
		slices.Sort(j.Keep)
		j.Keep = slices.Compact(j.Keep)
		// The whole work first, as a patch beside the baseline: what a
		// run that cannot finish the apply hands over.
		if b.keep != "" {
			var buf bytes.Buffer
			if err := WritePatch(&buf, j.Message, r.Changes, b.store); err != nil {
				return r, nil, fmt.Errorf("delivery: %w", err)
			}
			if err := writeFileAtomic(filepath.Join(b.keep, workPatch), buf.Bytes()); err != nil {
				return r, nil, err
			}
		}
	}
	if err := b.writeJournal(j); err != nil {
		return r, nil, err
	}
	return r, j, nil
}

// carryOut delivers what j says. It may run again over what a killed run
// of it did.
func (b *Baseline) carryOut(ctx context.Context, j *journal) error {
	r, req := j.Report, j.Request
	var err error
	switch r.Mode {
	case Branch:
		if r.Committed, err = Commit(ctx, b.dir, "sandboxd/"+req.Session, j.Message, r.Changes, b.store); err != nil {
			return b.fallback(req, j.Message, r, err)
		}
		return nil
	case Apply:
		keep := map[string]bool{}
		for _, d := range j.Keep {
			keep[d] = true
		}
		if r.Applied, err = syncBack(b.dir, r.Changes, keep, b.store, j.Tag); err != nil {
			err = b.fallback(req, j.Message, r, err)
			if b.keep != "" {
				err = fmt.Errorf("%w (the whole work is also in %s)", err, filepath.Join(b.keep, workPatch))
			}
			return err
		}
		var kept []Change
		for _, c := range r.Changes {
			if slices.ContainsFunc(r.Applied.Conflicts, func(k Conflict) bool { return k.Path == c.Path }) {
				kept = append(kept, c)
			}
		}
		if len(kept) == 0 {
			return nil
		}
		return b.writePatch(req.PatchFile, j.Message, kept, r)
	default:
		return b.writePatch(req.PatchFile, j.Message, r.Changes, r)
	}
}

// leaveOutIgnored moves the added files the repository of dir ignores from
// r.Changes to r.Ignored. When git cannot say, everything is delivered.
func (r *Report) leaveOutIgnored(ctx context.Context, dir string) {
	ignored, err := ignoredAdds(ctx, dir, nil, r.Changes)
	if err != nil || len(ignored) == 0 {
		return
	}
	r.Changes, r.Ignored = LeaveOut(r.Changes, ignored)
}

// LeaveOut splits changes into those whose path is not in out, kept in
// order, and the paths of those that are.
func LeaveOut(changes []Change, out map[string]bool) (kept []Change, left []string) {
	for _, c := range changes {
		if out[c.Path] {
			left = append(left, c.Path)
		} else {
			kept = append(kept, c)
		}
	}
	return kept, left
}

// Some names the first ten of names, and how many more there are: "a, b
// and 12 more".
func Some(names []string) string {
	shown := names[:min(len(names), 10)]
	more := ""
	if n := len(names) - len(shown); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	return strings.Join(shown, ", ") + more
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

// writePatch writes changes to a new file name (never replacing one),
// wholly or not at all; a file there already that holds exactly this
// patch (written by a run killed before it could say so) counts as
// written.
func (b *Baseline) writePatch(name, header string, changes []Change, r *Report) error {
	var buf bytes.Buffer
	if err := WritePatch(&buf, header, changes, b.store); err != nil {
		return fmt.Errorf("delivery: writing the patch: %w", err)
	}
	if err := placeNew(name, buf.Bytes()); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("delivery: %w (name another file with --patch FILE)", err)
		}
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
// reflog (log) gained since the baseline's.
func agentCommits(log, base []byte) []string {
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
	if r.Resumed {
		say("finishing the delivery to %s that a killed run began (%s)", r.Dir, r.Mode)
	}
	for _, p := range slices.Sorted(maps.Keys(r.Skipped)) {
		say("not delivered: %s (%s)", p, r.Skipped[p])
	}
	if len(r.Ignored) > 0 {
		say("left out, ignored by the repository: %s", Some(r.Ignored))
	}
	if len(r.Changes) == 0 {
		say("the session changed nothing in %s that the repository keeps; nothing to deliver", r.Dir)
		return b.String()
	}
	if r.Dir == "" { // against Nothing
		say("the session's tree holds %d paths (what it started from is not known: all of it is delivered as added)", len(r.Changes))
	} else {
		say("the session changed %d paths of %s: %d added, %d modified, %d deleted", len(r.Changes), r.Dir, added, modified, deleted)
	}
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
	case r.PatchFile != "" && r.Dir == "":
		say("wrote the patch to %s; apply it in a directory: git apply %s", r.PatchFile, r.PatchFile)
	case r.PatchFile != "":
		say("wrote the patch to %s; apply it: git -C %s apply %s", r.PatchFile, r.Dir, r.PatchFile)
	}
	return b.String()
}

func short(oid string) string { return oid[:min(len(oid), 12)] }
