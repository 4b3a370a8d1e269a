package delivery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Committed is what Commit made.
type Committed struct {
	// Branch is the branch's full ref ("refs/heads/sandboxd/ID"); Commit
	// its commit; Parent the commit it is on ("" for none).
	Branch, Commit, Parent string
	// Files counts the paths the commit changes.
	Files int
	// Ignored names added files the repository ignores (its .gitignore),
	// left out of the commit as git add would leave them.
	Ignored []string
}

// RepoPrefix reports whether dir is in a git work tree, and where in it:
// "" at its top, "sub/dir/" below. ok is false when dir is in none (or git
// cannot be run).
func RepoPrefix(ctx context.Context, dir string) (prefix string, ok bool) {
	out, err := git(ctx, dir, nil, nil, "rev-parse", "--is-inside-work-tree", "--show-prefix")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if err != nil || len(lines) != 2 || lines[0] != "true" {
		return "", false
	}
	return lines[1], true
}

// Commit records changes as one commit on top of the HEAD of the git
// repository whose work tree holds dir, on a new branch (which must not
// exist), with git's plumbing and a temporary index: dir's work tree, its
// index and its HEAD are never touched, no hook runs, and only objects and
// the new ref are added to the repository. The commit's tree is HEAD's
// with the changed paths (below dir) replaced or removed: what the session
// changed, not the state of dir's work tree. Added files the repository
// ignores are left out. The commit is not signed. Without user.name and user.email configured the
// commit is made as "sandboxd <sandboxd@localhost>".
func Commit(ctx context.Context, dir, branch, message string, changes []Change, st *Store) (*Committed, error) {
	prefix, ok := RepoPrefix(ctx, dir)
	if !ok {
		return nil, fmt.Errorf("delivery: %s is not in a git work tree", dir)
	}
	// The temporary index lives with the store, and goes with it.
	tmp, err := os.MkdirTemp(st.dir, "index-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(tmp, "index")}
	if _, err := git(ctx, dir, nil, nil, "var", "GIT_COMMITTER_IDENT"); err != nil {
		env = append(env, "GIT_AUTHOR_NAME=sandboxd", "GIT_AUTHOR_EMAIL=sandboxd@localhost",
			"GIT_COMMITTER_NAME=sandboxd", "GIT_COMMITTER_EMAIL=sandboxd@localhost")
	}
	res := &Committed{Branch: "refs/heads/" + branch}
	if out, err := git(ctx, dir, env, nil, "rev-parse", "--verify", "-q", "HEAD^{commit}"); err == nil {
		res.Parent = strings.TrimSpace(out)
	}
	readTree := []string{"read-tree", "--empty"}
	if res.Parent != "" {
		readTree = []string{"read-tree", res.Parent}
	}
	if _, err := git(ctx, dir, env, nil, readTree...); err != nil {
		return nil, err
	}
	ignored, err := ignoredAdds(ctx, dir, env, changes)
	if err != nil {
		return nil, err
	}
	var paths, info bytes.Buffer
	for _, c := range changes {
		if c.gitInvisible() {
			continue
		}
		if ignored[c.Path] {
			res.Ignored = append(res.Ignored, c.Path)
			continue
		}
		res.Files++
		if c.New == nil {
			fmt.Fprintf(&info, "0 %s\t%s%s\x00", zeroOID, prefix, c.Path)
			continue
		}
		paths.WriteString(st.path(c.New.OID) + "\n")
		fmt.Fprintf(&info, "%s %s\t%s%s\x00", c.New.gitMode(), c.New.OID, prefix, c.Path)
	}
	if paths.Len() > 0 {
		if _, err := git(ctx, dir, env, &paths, "hash-object", "-w", "--no-filters", "--stdin-paths"); err != nil {
			return nil, err
		}
	}
	if _, err := git(ctx, dir, env, &info, "update-index", "-z", "--index-info"); err != nil {
		return nil, err
	}
	tree, err := git(ctx, dir, env, nil, "write-tree")
	if err != nil {
		return nil, err
	}
	// Unsigned: signing may ask for a passphrase, and nobody is there.
	args := []string{"commit-tree", "--no-gpg-sign", strings.TrimSpace(tree), "-F", "-"}
	if res.Parent != "" {
		args = append(args, "-p", res.Parent)
	}
	commit, err := git(ctx, dir, env, strings.NewReader(message), args...)
	if err != nil {
		return nil, err
	}
	res.Commit = strings.TrimSpace(commit)
	if _, err := git(ctx, dir, env, nil, "update-ref", "-m", "sandboxd: a session's work", res.Branch, res.Commit, zeroOID); err != nil {
		// A branch made by a run killed before it could say so has this
		// commit's tree and parent: that commit is this delivery.
		if have, ok := sameCommit(ctx, dir, res.Branch, strings.TrimSpace(tree), res.Parent); ok {
			res.Commit = have
			return res, nil
		}
		return nil, err
	}
	return res, nil
}

// sameCommit returns the commit branch names when it has tree and parent.
func sameCommit(ctx context.Context, dir, branch, tree, parent string) (string, bool) {
	out, err := git(ctx, dir, nil, nil, "log", "-1", "--format=%H %T %P", branch, "--")
	f := strings.Fields(out)
	if err != nil || len(f) < 2 || f[1] != tree || strings.Join(f[2:], " ") != parent {
		return "", false
	}
	return f[0], true
}

// ignoredAdds returns which added paths the repository ignores; opts are
// more options of git check-ignore.
func ignoredAdds(ctx context.Context, dir string, env []string, changes []Change, opts ...string) (map[string]bool, error) {
	var in bytes.Buffer
	for _, c := range changes {
		if c.Old == nil {
			in.WriteString(c.Path + "\x00")
		}
	}
	out := map[string]bool{}
	if in.Len() == 0 {
		return out, nil
	}
	list, err := git(ctx, dir, env, &in, append([]string{"check-ignore", "-z", "--stdin"}, opts...)...)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return out, nil // none is ignored
	}
	if err != nil {
		return nil, err
	}
	for p := range strings.SplitSeq(strings.TrimSuffix(list, "\x00"), "\x00") {
		out[p] = true
	}
	return out, nil
}

// IgnoredAdds returns which of changes' added files the .gitignore files of
// tree (a session's final tree, its contents in st) ignore, as git would
// judge them in a work tree of that tree: the files are laid out in a
// scratch repository of .gitignore files alone and asked of git
// check-ignore --no-index. The session's own .git (and so its
// info/exclude) is not part of a tree; the user's and system's git
// configuration are not read. It is how a diff taken inside the daemon,
// with no repository of the user's at hand, leaves out what the project
// ignores (build output, caches), as a delivery does.
func IgnoredAdds(ctx context.Context, tree *Tree, st *Store, changes []Change) (map[string]bool, error) {
	out := map[string]bool{}
	var ignores []string
	for name := range tree.Files {
		if path.Base(name) == ".gitignore" && tree.Files[name].Mode.IsRegular() {
			ignores = append(ignores, name)
		}
	}
	if len(ignores) == 0 {
		return out, nil
	}
	dir, err := os.MkdirTemp("", "sandboxd-ignores-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	for _, name := range ignores {
		data, err := st.Get(tree.Files[name].OID)
		if err != nil {
			return nil, err
		}
		if err := root.MkdirAll(path.Dir(name), 0o700); err != nil {
			return nil, err
		}
		if err := root.WriteFile(name, data, 0o600); err != nil {
			return nil, err
		}
	}
	env := []string{"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_DIR=" + filepath.Join(dir, ".git"), "GIT_WORK_TREE=" + dir}
	if _, err := git(ctx, dir, env, nil, "init", "-q"); err != nil {
		return nil, err
	}
	return ignoredAdds(ctx, dir, env, changes, "--no-index")
}

// git runs git in dir with env added and stdin (nil: none), and returns
// its output. Its error names the command and carries git's standard error.
func git(ctx context.Context, dir string, env []string, stdin io.Reader, args ...string) (string, error) {
	// No hook runs (update-ref would run reference-transaction).
	cmd := exec.CommandContext(ctx, "git", append([]string{"-c", "core.hooksPath=/dev/null"}, args...)...)
	cmd.Dir, cmd.Stdin = dir, stdin
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", args[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}
