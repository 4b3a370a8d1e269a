package delivery_test

import (
	"bytes"
	"context"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/delivery"
	"github.com/sandboxd/sandboxd/localfs"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/workspace"
)

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

// project lays out a directory, a git repository when repo is set.
func project(t *testing.T, repo bool) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"keep.txt":     "same\n",
		"edit.txt":     "one\ntwo\nthree\n",
		"gone.txt":     "bye\n",
		"noeol.txt":    "no newline",
		"bin/blob.bin": "\x00\x01\x02old",
		"run.sh":       "#!/bin/sh\n",
		"sub/deep.txt": "deep\n",
		".gitignore":   "*.log\n",
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("keep.txt", filepath.Join(dir, "link"))
	if repo {
		run(t, dir, "git", "init", "-q", "-b", "main")
		run(t, dir, "git", "add", "-A")
		run(t, dir, "git", "commit", "-qm", "first")
	}
	return dir
}

// work changes a copy of dir as an agent would, and returns it.
func work(t *testing.T, dir string) workspace.FileSystem {
	t.Helper()
	fsys, err := workOn(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

// workOn is work, for a process that is no test.
func workOn(dir string) (workspace.FileSystem, error) {
	ctx := context.Background()
	fsys, err := memfs.FromDir(ctx, dir, memfs.WithUmask(0))
	if err != nil {
		return nil, err
	}
	for _, err := range []error{
		fsys.WriteFile(ctx, "edit.txt", []byte("one\nTWO\nthree\n"), 0o644),
		fsys.WriteFile(ctx, "noeol.txt", []byte("no newline, still"), 0o644),
		fsys.Remove(ctx, "gone.txt"),
		fsys.Remove(ctx, "sub/deep.txt"),
		fsys.Remove(ctx, "sub"),
		fsys.MkdirAll(ctx, "new/dir", 0o755),
		fsys.WriteFile(ctx, "new/dir/added.txt", []byte("added\n"), 0o644),
		fsys.WriteFile(ctx, "bin/blob.bin", []byte("\x00\x01\x02new and longer than before"), 0o644),
		fsys.Remove(ctx, "run.sh"),
		fsys.WriteFile(ctx, "run.sh", []byte("#!/bin/sh\n"), 0o755), // a mode change
		fsys.WriteFile(ctx, "empty.txt", nil, 0o600),
		fsys.WriteFile(ctx, "debug.log", []byte("ignored\n"), 0o644),
		fsys.Remove(ctx, "link"),
		fsys.Symlink(ctx, "edit.txt", "link"),
		// Bookkeeping never delivered.
		fsys.MkdirAll(ctx, ".sandboxd/journal", 0o755),
		fsys.WriteFile(ctx, ".sandboxd/journal/x", []byte("j"), 0o644),
		fsys.MkdirAll(ctx, "vendored/.git", 0o755),
		fsys.WriteFile(ctx, "vendored/.git/HEAD", []byte("ref"), 0o644),
	} {
		if err != nil {
			return nil, err
		}
	}
	return fsys, nil
}

// tree reads dir's delivered tree: name → mode and content.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(dir, p)
		if err != nil || d.IsDir() {
			if d != nil && d.IsDir() && (d.Name() == ".git" || rel == ".sandboxd") {
				return filepath.SkipDir
			}
			return err
		}
		if d.Name() == ".git" { // a worktree's link to its repository
			return nil
		}
		info, _ := d.Info()
		var data []byte
		if d.Type()&fs.ModeSymlink != 0 {
			l, _ := os.Readlink(p)
			data = []byte("-> " + l)
		} else {
			data, _ = os.ReadFile(p)
		}
		out[rel] = info.Mode().String() + " " + string(data)
		return nil
	})
	return out
}

// final is what the session's tree looks like on disk.
func final(t *testing.T, fsys workspace.FileSystem) map[string]string {
	t.Helper()
	dir := t.TempDir()
	wr, err := localfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	walk, _ := workspace.Walk(t.Context(), fsys, workspace.WalkRequest{FilesOnly: true})
	for _, e := range walk.Entries {
		if delivery.Excluded(e.Path) {
			continue
		}
		p := filepath.Join(dir, e.Path)
		os.MkdirAll(filepath.Dir(p), 0o755)
		info, _ := fsys.Lstat(t.Context(), e.Path)
		if e.Type&fs.ModeSymlink != 0 {
			l, _ := fsys.(workspace.SymlinkFS).Readlink(t.Context(), e.Path)
			os.Symlink(l, p)
			continue
		}
		data, _ := fsys.ReadFile(t.Context(), e.Path, 1<<20)
		os.WriteFile(p, data, 0o600)
		os.Chmod(p, info.Mode().Perm())
	}
	wr.Close()
	return tree(t, dir)
}

func deliver(t *testing.T, dir string, between func(), req delivery.Request) (*delivery.Report, workspace.FileSystem) {
	t.Helper()
	b := begin(t, dir)
	fsys := work(t, dir)
	if between != nil {
		between()
	}
	req.Session = "s-test"
	if req.PatchFile == "" {
		req.PatchFile = filepath.Join(t.TempDir(), "work.patch")
	}
	r, err := b.Deliver(t.Context(), fsys, req)
	if err != nil {
		t.Fatalf("deliver %s: %v", req.Mode, err)
	}
	return r, fsys
}

// TestPatchApplies: the patch applies with git apply to a copy of the
// directory and gives the session's tree.
func TestPatchApplies(t *testing.T) {
	for _, repo := range []bool{false, true} {
		dir := project(t, repo)
		r, fsys := deliver(t, dir, nil, delivery.Request{Mode: delivery.Auto})
		if repo != (r.Mode == delivery.Branch) {
			t.Errorf("auto in a repository %v: delivered as %s", repo, r.Mode)
		}
		if repo {
			continue
		}
		if before := tree(t, dir); before["edit.txt"] != "-rw-r--r-- one\ntwo\nthree\n" {
			t.Errorf("writing a patch changed the directory: %v", before)
		}
		patch, _ := os.ReadFile(r.PatchFile)
		if bytes.Contains(patch, []byte(".sandboxd")) && !bytes.Contains(patch, []byte("sandboxd: the work")) || bytes.Contains(patch, []byte(".git/")) {
			t.Errorf("the patch carries bookkeeping:\n%s", patch)
		}
		run(t, dir, "git", "apply", "--check", r.PatchFile)
		run(t, dir, "git", "apply", r.PatchFile)
		got, want := tree(t, dir), gitModes(final(t, fsys))
		if !maps.Equal(got, want) {
			t.Errorf("after git apply:\n got %q\nwant %q\npatch:\n%s", got, want, patch)
		}
	}
}

// TestBranch: the branch holds HEAD plus the session's changes (not the
// ignored file), and the work tree, index and HEAD are as they were.
func TestBranch(t *testing.T) {
	dir := project(t, true)
	index, _ := os.ReadFile(filepath.Join(dir, ".git/index"))
	head := run(t, dir, "git", "rev-parse", "HEAD")
	before := tree(t, dir)
	r, fsys := deliver(t, dir, nil, delivery.Request{Mode: delivery.Branch})
	if r.Committed == nil || r.Committed.Branch != "refs/heads/sandboxd/s-test" || !slices.Equal(r.Ignored, []string{"debug.log"}) {
		t.Fatalf("committed %+v, ignored %v", r.Committed, r.Ignored)
	}
	if idx, _ := os.ReadFile(filepath.Join(dir, ".git/index")); !bytes.Equal(idx, index) || run(t, dir, "git", "rev-parse", "HEAD") != head || !maps.Equal(tree(t, dir), before) {
		t.Errorf("making the branch touched the index, HEAD or work tree")
	}
	if parent := run(t, dir, "git", "rev-parse", "sandboxd/s-test^"); parent != head {
		t.Errorf("the branch's parent %s, want HEAD %s", parent, head)
	}
	// Check the branch out elsewhere: it is the session's tree, less the
	// ignored file.
	wt := filepath.Join(t.TempDir(), "wt")
	run(t, dir, "git", "worktree", "add", "-q", wt, "sandboxd/s-test")
	want := gitModes(final(t, fsys))
	delete(want, "debug.log")
	if got := tree(t, wt); !maps.Equal(got, want) {
		t.Errorf("the branch:\n got %q\nwant %q", got, want)
	}
}

// TestIgnoredLeftOut: in a git work tree, a patch and apply leave out the
// added files the repository ignores, as the branch does, and say so.
func TestIgnoredLeftOut(t *testing.T) {
	for _, mode := range []delivery.Mode{delivery.Patch, delivery.Apply} {
		dir := project(t, true)
		r, _ := deliver(t, dir, nil, delivery.Request{Mode: mode})
		if !slices.Equal(r.Ignored, []string{"debug.log"}) || !strings.Contains(r.String(), "left out, ignored by the repository: debug.log") {
			t.Errorf("%s: ignored %v\n%s", mode, r.Ignored, r)
		}
		if patch, _ := os.ReadFile(r.PatchFile); bytes.Contains(patch, []byte("debug.log")) {
			t.Errorf("%s: the patch carries the ignored file", mode)
		}
		if _, err := os.Stat(filepath.Join(dir, "debug.log")); mode == delivery.Apply && err == nil {
			t.Errorf("apply wrote the ignored file")
		}
	}
}

// TestSyncBack: the changes land in the directory, with their modes; a file
// changed in the directory meanwhile is a conflict, kept, and the session's
// version is in the patch.
func TestSyncBack(t *testing.T) {
	dir := project(t, false)
	r, fsys := deliver(t, dir, func() {
		os.WriteFile(filepath.Join(dir, "edit.txt"), []byte("the user's\n"), 0o644)
	}, delivery.Request{Mode: delivery.Apply})
	if len(r.Applied.Conflicts) != 1 || r.Applied.Conflicts[0].Path != "edit.txt" {
		t.Fatalf("conflicts %+v, want edit.txt", r.Applied.Conflicts)
	}
	want := final(t, fsys)
	want["edit.txt"] = "-rw-r--r-- the user's\n"
	if got := tree(t, dir); !maps.Equal(got, want) {
		t.Errorf("after sync-back:\n got %q\nwant %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "sub")); err == nil {
		t.Errorf("the directory emptied by the session stayed")
	}
	patch, err := os.ReadFile(r.PatchFile)
	if err != nil || !bytes.Contains(patch, []byte("+TWO")) || bytes.Contains(patch, []byte("added.txt")) {
		t.Errorf("the conflicts' patch: %v\n%s", err, patch)
	}
	if s := r.String(); !strings.Contains(s, "conflict, left alone: edit.txt") || !strings.Contains(s, r.PatchFile) {
		t.Errorf("report:\n%s", s)
	}
}

// gitModes gives a tree's files the modes git keeps: 0644, or 0755 when
// executable.
func gitModes(tree map[string]string) map[string]string {
	for name, v := range tree {
		if strings.HasPrefix(v, "-rw-------") {
			tree[name] = "-rw-r--r--" + strings.TrimPrefix(v, "-rw-------")
		}
	}
	return tree
}

// TestBranchFromSubdirectory: a directory below a repository's top is
// committed at its place in the repository's tree.
func TestBranchFromSubdirectory(t *testing.T) {
	top := project(t, true)
	dir := filepath.Join(top, "sub")
	b := begin(t, dir)
	fsys, err := memfs.FromDir(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	fsys.WriteFile(t.Context(), "deep.txt", []byte("deeper\n"), 0o644)
	r, err := b.Deliver(t.Context(), fsys, delivery.Request{Mode: delivery.Auto, Session: "s-sub"})
	if err != nil || r.Mode != delivery.Branch {
		t.Fatalf("deliver: %v, %+v", err, r)
	}
	if got := run(t, top, "git", "show", "sandboxd/s-sub:sub/deep.txt"); got != "deeper\n" {
		t.Errorf("sub/deep.txt on the branch: %q", got)
	}
	if got := run(t, top, "git", "diff", "--name-only", "HEAD", "sandboxd/s-sub"); got != "sub/deep.txt\n" {
		t.Errorf("the branch changes %q, want only sub/deep.txt", got)
	}
}

// TestBranchHooksAndUnborn: a repository without a commit gets a root
// commit, and its hooks do not run.
func TestBranchHooksAndUnborn(t *testing.T) {
	dir := t.TempDir()
	run(t, dir, "git", "init", "-q")
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("a\n"), 0o644)
	hook := filepath.Join(dir, ".git/hooks/reference-transaction")
	os.WriteFile(hook, []byte("#!/bin/sh\ntouch \"$GIT_DIR/../hook-ran\"\nexit 1\n"), 0o755)
	b := begin(t, dir)
	fsys, _ := memfs.FromDir(t.Context(), dir)
	fsys.WriteFile(t.Context(), "b.txt", []byte("b\n"), 0o644)
	r, err := b.Deliver(t.Context(), fsys, delivery.Request{Mode: delivery.Branch, Session: "s-root"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Committed.Parent != "" {
		t.Errorf("parent %q, want a root commit", r.Committed.Parent)
	}
	if got := run(t, dir, "git", "ls-tree", "--name-only", "sandboxd/s-root"); got != "b.txt\n" {
		t.Errorf("the root commit holds %q, want the session's change alone", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "hook-ran")); err == nil {
		t.Errorf("a hook ran")
	}
}

// TestPermissionsGitDoesNotKeep: a change of permission bits git does not
// keep is applied back, and left out of a patch and a commit.
func TestPermissionsGitDoesNotKeep(t *testing.T) {
	dir := project(t, true)
	b := begin(t, dir)
	fsys, _ := memfs.FromDir(t.Context(), dir, memfs.WithUmask(0))
	fsys.Remove(t.Context(), "keep.txt")
	fsys.WriteFile(t.Context(), "keep.txt", []byte("same\n"), 0o600)
	for _, mode := range []delivery.Mode{delivery.Patch, delivery.Branch, delivery.Apply} {
		patch := filepath.Join(t.TempDir(), "p.patch")
		r, err := b.Deliver(t.Context(), fsys, delivery.Request{Mode: mode, Session: "s-" + string(mode), PatchFile: patch})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		switch mode {
		case delivery.Patch:
			data, _ := os.ReadFile(patch)
			if bytes.Contains(data, []byte("diff --git")) {
				t.Errorf("the patch has a diff git cannot apply:\n%s", data)
			}
		case delivery.Branch:
			if r.Committed.Files != 0 {
				t.Errorf("the commit counts %d files", r.Committed.Files)
			}
		case delivery.Apply:
			if info, _ := os.Stat(filepath.Join(dir, "keep.txt")); info.Mode().Perm() != 0o600 {
				t.Errorf("keep.txt is %v after sync-back, want 0600", info.Mode())
			}
		}
	}
}

// TestBranchOutsideARepositoryKeepsTheWork: asked for a branch where there
// is no repository, the work goes to a patch and the error says where.
func TestBranchOutsideARepositoryKeepsTheWork(t *testing.T) {
	dir := project(t, false)
	b := begin(t, dir)
	fsys := work(t, dir)
	patch := filepath.Join(t.TempDir(), "p.patch")
	r, err := b.Deliver(t.Context(), fsys, delivery.Request{Mode: delivery.Branch, Session: "s-x", PatchFile: patch})
	if err == nil || !strings.Contains(err.Error(), patch) || r.PatchFile != patch {
		t.Fatalf("err %v, report %+v; want an error naming the patch written", err, r)
	}
	run(t, dir, "git", "apply", "--check", patch)
}

// begin reads dir's baseline, released when the test ends.
func begin(t *testing.T, dir string) *delivery.Baseline {
	t.Helper()
	b, err := delivery.Begin(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestPatchQuotesNames: names with a tab, a newline, a quote, a
// backslash, a control character, a space or bytes past ASCII are written
// as git writes them (core.quotePath): git apply takes the patch whole and
// gives the session's tree, and the patch's "diff --git", "---" and "+++"
// lines are the ones git diff writes for the same change.
func TestPatchQuotesNames(t *testing.T) {
	names := []string{"tab\there.txt", "new\nline.txt", `quote".txt`, `back\slash.txt`, "bell\a.txt", "spaced name.txt", "ünï.txt", "dir\twith/file.txt", "plain.txt"}
	dir := t.TempDir()
	for _, name := range append(names, "gone\nname.txt") {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte("old\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, dir, "git", "init", "-q", "-b", "main")
	run(t, dir, "git", "add", "-A")
	run(t, dir, "git", "commit", "-qm", "first")
	b := begin(t, dir)
	ctx := t.Context()
	fsys, err := memfs.FromDir(ctx, dir, memfs.WithUmask(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if err := fsys.WriteFile(ctx, name, []byte("new\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fsys.Remove(ctx, "gone\nname.txt")
	fsys.WriteFile(ctx, "added\tname\x01.bin", []byte("\x00binary"), 0o644)
	r, err := b.Deliver(ctx, fsys, delivery.Request{Mode: delivery.Patch, Session: "s-test", PatchFile: filepath.Join(t.TempDir(), "work.patch")})
	if err != nil {
		t.Fatal(err)
	}
	patch, _ := os.ReadFile(r.PatchFile)
	run(t, dir, "git", "apply", "--check", r.PatchFile)
	run(t, dir, "git", "apply", r.PatchFile)
	if got, want := tree(t, dir), gitModes(final(t, fsys)); !maps.Equal(got, want) {
		t.Errorf("after git apply:\n got %q\nwant %q\npatch:\n%s", got, want, patch)
	}
	run(t, dir, "git", "add", "-A")
	headers := func(p string) []string {
		var out []string
		for line := range strings.Lines(p) {
			if strings.HasPrefix(line, "diff --git ") || strings.HasPrefix(line, "--- ") || strings.HasPrefix(line, "+++ ") {
				out = append(out, line)
			}
		}
		slices.Sort(out)
		return out
	}
	if got, want := headers(string(patch)), headers(run(t, dir, "git", "diff", "--cached", "--binary", "HEAD")); !slices.Equal(got, want) {
		t.Errorf("the patch's names:\n%q\ngit's:\n%q", got, want)
	}
}
