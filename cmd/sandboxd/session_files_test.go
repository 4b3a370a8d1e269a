package main

import (
	"bytes"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// treeOf describes a host tree: each file's mode and contents, each link's
// target, each directory.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			out[rel] = "link " + target
			return err
		case d.IsDir():
			out[rel] = "dir"
		default:
			data, err := os.ReadFile(p)
			out[rel] = info.Mode().Perm().String() + " " + string(data)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runWithInput runs sandboxd in process with stdin.
func runWithInput(t *testing.T, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), stdio{in: bytes.NewReader(stdin), out: &out, err: &errb}, args)
	return code, out.String(), errb.String()
}

// memoryDaemon starts serve on the memory backend, points the session
// commands at it, and returns a function that runs sandboxd in process and
// gives its standard output, failing t unless it exits 0.
func memoryDaemon(t *testing.T) func(args ...string) string {
	t.Helper()
	url, welcome := startServe(t, "--backend", "memory")
	t.Setenv("SANDBOXD_URL", url)
	t.Setenv("SANDBOXD_TOKEN", regexp.MustCompile(`SANDBOXD_TOKEN=(\S+)`).FindStringSubmatch(welcome)[1])
	return func(args ...string) string {
		t.Helper()
		code, out, errs := runInProcess(t, args...)
		if code != 0 {
			t.Fatalf("sandboxd %s: exit %d: %s", strings.Join(args, " "), code, errs)
		}
		return out
	}
}

// TestSessionGetPutDiff: a tree put into a session comes back the same
// with get (extracted, or as a tar put back in), a single file goes in by
// its name, and diff prints a patch that rebuilds the session's work on
// the tree it began from (here, nothing).
func TestSessionGetPutDiff(t *testing.T) {
	sandboxd := memoryDaemon(t)
	id := strings.TrimSpace(sandboxd("session", "create", "--grant", "fs.write", "--grant", "shell.exec", "--always", "read,edit,shell"))

	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub", "deeper"), 0o755)
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha\n"), 0o644)
	os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "deeper", "b.txt"), []byte("beta"), 0o600)
	os.Symlink("sub/deeper/b.txt", filepath.Join(src, "link"))
	single := filepath.Join(t.TempDir(), "notes.md")
	os.WriteFile(single, []byte("# notes\n"), 0o644)

	sandboxd("session", "put", id, "project", src)
	sandboxd("session", "put", id, "project/docs", single)

	// get -C: the tree as it was put, and the file in its directory.
	back := t.TempDir()
	sandboxd("session", "get", "-C", back, id, "project")
	want := treeOf(t, src)
	want["docs"], want["docs/notes.md"] = "dir", "-rw-r--r-- # notes\n"
	if got := treeOf(t, back); !maps.Equal(got, want) {
		t.Fatalf("get -C gave\n%v\nwant\n%v", got, want)
	}
	// get to standard output and -o: the same tar; put back from standard
	// input, it makes the same tree elsewhere.
	tarball := sandboxd("session", "get", id, "project")
	file := filepath.Join(t.TempDir(), "project.tar")
	sandboxd("session", "get", "-o", file, id, "project")
	if data, err := os.ReadFile(file); err != nil || string(data) != tarball {
		t.Fatalf("get -o: %d bytes, %v; standard output had %d", len(data), err, len(tarball))
	}
	if code, _, errs := runWithInput(t, []byte(tarball), "session", "put", id, "copy", "-"); code != 0 {
		t.Fatalf("put -: exit %d: %s", code, errs)
	}
	again := t.TempDir()
	sandboxd("session", "get", "-C", again, id, "copy")
	if got := treeOf(t, again); !maps.Equal(got, want) {
		t.Fatalf("a tar put back gave\n%v\nwant\n%v", got, want)
	}

	// diff: everything since the session began, which git apply turns
	// into the session's tree from an empty one.
	sandboxd("session", "call", id, "edit", `{"path":"project/a.txt","edits":[{"oldText":"alpha","newText":"ALPHA"}]}`)
	patch := sandboxd("session", "diff", id)
	if !strings.Contains(patch, "diff --git a/project/a.txt b/project/a.txt\nnew file mode 100644\n") || !strings.Contains(patch, "+ALPHA\n") ||
		!strings.Contains(patch, "diff --git a/project/run.sh b/project/run.sh\nnew file mode 100755\n") || strings.Contains(patch, ".sandboxd") {
		t.Fatalf("diff:\n%s", patch)
	}
	empty := t.TempDir()
	apply := exec.Command("git", "apply", "-")
	apply.Dir, apply.Stdin = empty, strings.NewReader(patch)
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v: %s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(empty, "project", "a.txt")); string(got) != "ALPHA\n" {
		t.Fatalf("a.txt after git apply: %q", got)
	}
	// --since 0: the journal's commits alone (the edit), into a file.
	out := filepath.Join(t.TempDir(), "since.patch")
	sandboxd("session", "diff", "--since", "0", "-o", out, id)
	if data, _ := os.ReadFile(out); !strings.HasPrefix(string(data), "diff --git a/project/a.txt b/project/a.txt\n") || strings.Count(string(data), "diff --git") != 1 {
		t.Fatalf("diff --since 0:\n%s", data)
	}
	// Errors name the command and the daemon's kind.
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"session", "diff", "--since", "9", id}, "sandboxd session diff: "},
		{[]string{"session", "get", id, "missing"}, "NotFound"},
		{[]string{"session", "get", "s-nope", "x"}, "404 NotFound"},
		{[]string{"session", "put", id, "x", filepath.Join(src, "nothing")}, "sandboxd session put: "},
	} {
		if code, _, errs := runInProcess(t, tc.args...); code != 1 || !strings.Contains(errs, tc.err) {
			t.Errorf("sandboxd %s: exit %d, %q; want 1 and %q", strings.Join(tc.args, " "), code, errs, tc.err)
		}
	}
	if code, _, _ := runInProcess(t, "session", "get", "-o", "f", "-C", "d", id, "x"); code != 2 {
		t.Errorf("get -o with -C: exit %d, want 2", code)
	}
}

// TestSessionBaseline: the project put into an empty session is in its
// diff until a new baseline (session baseline, or put --baseline), after
// which the diff shows only what changed since.
func TestSessionBaseline(t *testing.T) {
	sandboxd := memoryDaemon(t)
	id := strings.TrimSpace(sandboxd("session", "create", "--grant", "fs.write", "--always", "read,edit"))
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha\n"), 0o644)
	sandboxd("session", "put", id, "project", src)
	if patch := sandboxd("session", "diff", id); !strings.Contains(patch, "b/project/a.txt") {
		t.Fatalf("diff after the upload:\n%s", patch)
	}
	if code, _, errs := runInProcess(t, "session", "baseline", id); code != 0 || !strings.Contains(errs, "new diff baseline: 1 files") {
		t.Fatalf("session baseline: exit %d: %s", code, errs)
	}
	if patch := sandboxd("session", "diff", id); patch != "" {
		t.Fatalf("diff right after a new baseline:\n%s", patch)
	}
	sandboxd("session", "call", id, "edit", `{"path":"project/a.txt","edits":[{"oldText":"alpha","newText":"ALPHA"}]}`)
	if patch := sandboxd("session", "diff", id); !strings.Contains(patch, "-alpha\n+ALPHA\n") || strings.Contains(patch, "new file") {
		t.Fatalf("diff of an edit after the new baseline:\n%s", patch)
	}
	os.WriteFile(filepath.Join(src, "b.txt"), []byte("beta\n"), 0o644)
	if code, _, errs := runInProcess(t, "session", "put", "--baseline", id, "more", src); code != 0 || !strings.Contains(errs, "new diff baseline: 3 files") {
		t.Fatalf("session put --baseline: exit %d: %s", code, errs)
	}
	if patch := sandboxd("session", "diff", id); patch != "" {
		t.Fatalf("diff right after put --baseline:\n%s", patch)
	}
	if code, _, errs := runInProcess(t, "session", "baseline", "s-nope"); code != 1 || !strings.Contains(errs, "404 NotFound") {
		t.Errorf("session baseline of no session: exit %d, %q", code, errs)
	}
}
