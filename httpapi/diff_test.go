package httpapi_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
)

// diffSource is the tree a diff test's session starts from.
func diffSource(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"keep.txt":   "unchanged\n",
		"mod.txt":    "one\ntwo\nthree\n",
		"del.txt":    "going\n",
		"run.sh":     "echo hi\n",
		"bin.dat":    "a\x00b",
		"sub/in.txt": "deep\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// copyTree copies a directory with cp -a, for git apply to work on.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "tree")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return dst
}

// gitApply runs git apply (with extra flags) on patch in dir.
func gitApply(t *testing.T, dir string, patch []byte, flags ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"apply"}, flags...)...)
	cmd.Dir, cmd.Stdin = dir, bytes.NewReader(patch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git apply %v: %v: %s\npatch:\n%s", flags, err, out, patch)
	}
}

// The diff of a session says what it added, modified, deleted and
// re-moded, applies with git apply to the tree it began from, and leaves
// sandboxd's bookkeeping out; since=COMMIT narrows it to the journal's
// commits after COMMIT.
func TestDiff(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	e := start(t, config{backend: memory.Backend{TempDir: t.TempDir()}})
	src := diffSource(t)
	sess, err := e.m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: writer, Source: src})
	if err != nil {
		t.Fatal(err)
	}
	id := sess.ID()
	diff := func(query string, want int) []byte {
		t.Helper()
		status, body, h := e.do(acmeToken, "GET", "/v1/sessions/"+id+"/diff"+query, nil)
		if status != want {
			t.Fatalf("diff%s: %d, want %d: %s", query, status, want, body)
		}
		if want == http.StatusOK && !strings.HasPrefix(h.Get("Content-Type"), "text/x-diff") {
			t.Fatalf("diff%s: Content-Type %q", query, h.Get("Content-Type"))
		}
		return body
	}
	if body := diff("", http.StatusOK); len(body) != 0 {
		t.Fatalf("diff of an untouched session: %q", body)
	}

	// Commit 1 adds a file, commit 2 edits one; bash (not journaled)
	// deletes, re-modes, rewrites a binary file and writes bookkeeping.
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"write", map[string]any{"path": "new/added.txt", "content": "fresh\n"}},
		{"edit", map[string]any{"path": "mod.txt", "edits": []map[string]any{{"oldText": "two\n", "newText": "TWO\n"}}}},
		{"bash", map[string]any{"command": "rm del.txt && chmod 755 run.sh && printf 'a\\000c' > bin.dat && mkdir -p .sandboxd && echo x > .sandboxd/junk"}},
	} {
		if r := e.call(acmeToken, id, c.tool, c.args); r.IsError {
			t.Fatalf("%s: %+v", c.tool, r)
		}
	}

	patch := diff("", http.StatusOK)
	for _, want := range []string{
		"diff --git a/new/added.txt b/new/added.txt\nnew file mode 100644\n",
		"+fresh\n",
		"diff --git a/del.txt b/del.txt\ndeleted file mode 100644\n",
		"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n",
		"-two\n+TWO\n",
		"diff --git a/bin.dat b/bin.dat\n",
		"GIT binary patch\n",
	} {
		if !bytes.Contains(patch, []byte(want)) {
			t.Errorf("the diff lacks %q:\n%s", want, patch)
		}
	}
	for _, absent := range []string{".sandboxd", "keep.txt", "sub/in.txt"} {
		if bytes.Contains(patch, []byte(absent)) {
			t.Errorf("the diff names %s:\n%s", absent, patch)
		}
	}
	// It applies to the tree the session began from, and gives the
	// session's tree.
	tree := copyTree(t, src)
	gitApply(t, tree, patch, "--check")
	gitApply(t, tree, patch)
	for name, want := range map[string]string{"new/added.txt": "fresh\n", "mod.txt": "one\nTWO\nthree\n", "bin.dat": "a\x00c", "keep.txt": "unchanged\n"} {
		if got, err := os.ReadFile(filepath.Join(tree, name)); err != nil || string(got) != want {
			t.Errorf("%s after git apply: %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(tree, "del.txt")); !os.IsNotExist(err) {
		t.Errorf("del.txt after git apply: %v", err)
	}
	if info, err := os.Stat(filepath.Join(tree, "run.sh")); err != nil || info.Mode().Perm()&0o100 == 0 {
		t.Errorf("run.sh after git apply: %v, %v", info, err)
	}

	// Since commit 1: the edit alone (bash's changes are not journaled).
	since1 := diff("?since=1", http.StatusOK)
	if !bytes.Contains(since1, []byte("diff --git a/mod.txt b/mod.txt\n")) || bytes.Count(since1, []byte("diff --git")) != 1 {
		t.Errorf("diff since commit 1:\n%s", since1)
	}
	// Since the journal's start: both commits' paths.
	since0 := diff("?since=0", http.StatusOK)
	if bytes.Count(since0, []byte("diff --git")) != 2 || !bytes.Contains(since0, []byte("new file mode 100644")) {
		t.Errorf("diff since the journal's start:\n%s", since0)
	}
	// It applies to the tree as it was after commit 1.
	after1 := copyTree(t, src)
	os.MkdirAll(filepath.Join(after1, "new"), 0o755)
	os.WriteFile(filepath.Join(after1, "new", "added.txt"), []byte("fresh\n"), 0o644)
	gitApply(t, after1, since1, "--check")
	since2 := diff("?since=2", http.StatusOK)
	if len(since2) != 0 {
		t.Errorf("diff since the last commit: %q", since2)
	}

	diff("?since=3", http.StatusNotFound)
	diff("?since=-1", http.StatusBadRequest)
	diff("?since=one", http.StatusBadRequest)
	diff("?since=", http.StatusBadRequest)
	if status, _, _ := e.do(boltToken, "GET", "/v1/sessions/"+id+"/diff", nil); status != http.StatusNotFound {
		t.Errorf("another tenant's diff: %d", status)
	}
}

// A download of the root leaves sandboxd's bookkeeping out, as the diff
// does; naming .sandboxd downloads it.
func TestDownloadLeavesBookkeepingOut(t *testing.T) {
	e := start(t, config{})
	s := e.create(acmeToken, writer)
	if r := e.call(acmeToken, s.ID, "bash", map[string]any{"command": "echo a > a.txt && mkdir -p .sandboxd/x && echo j > .sandboxd/x/junk"}); r.IsError {
		t.Fatalf("bash: %+v", r)
	}
	status, body, _ := e.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/files/", nil)
	if got := readTar(t, body); status != http.StatusOK || len(got) != 1 || got[0].name != "a.txt" {
		t.Fatalf("download of the root: %d %v", status, got)
	}
	status, body, _ = e.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/files/.sandboxd", nil)
	if got := readTar(t, body); status != http.StatusOK || len(got) != 2 || got[1].name != "x/junk" {
		t.Fatalf("download of .sandboxd: %d %v", status, got)
	}
}

// A diff draws its files from the memory budget: a file over a tenant's
// share of it over the files read at once is named in the patch's header,
// not shown.
func TestDiffBoundedByTheMemoryBudget(t *testing.T) {
	const budget = 6 << 20 // the least for a 1 MiB body cap
	e := start(t, config{api: []httpapi.Option{httpapi.WithMaxBodyBytes(1 << 20), httpapi.WithMemoryBudget(budget)}})
	s := e.create(acmeToken, writer)
	perFile := budget / 2 / runner.DiffReaders
	if r := e.call(acmeToken, s.ID, "bash", map[string]any{"command": fmt.Sprintf("head -c %d /dev/zero > big.bin && echo small > small.txt", perFile+1)}); r.IsError {
		t.Fatalf("bash: %+v", r)
	}
	status, body, _ := e.do(acmeToken, "GET", "/v1/sessions/"+s.ID+"/diff", nil)
	if status != http.StatusOK || !bytes.Contains(body, []byte(fmt.Sprintf("sandboxd: not in this diff: big.bin (over %d bytes)", perFile))) ||
		!bytes.Contains(body, []byte("diff --git a/small.txt b/small.txt\n")) || bytes.Contains(body, []byte("a/big.bin")) {
		t.Fatalf("diff: %d\n%s", status, body)
	}
	tree := t.TempDir()
	gitApply(t, tree, body)
	if data, err := os.ReadFile(filepath.Join(tree, "small.txt")); err != nil || string(data) != "small\n" {
		t.Fatalf("small.txt after git apply: %q, %v", data, err)
	}
}

// TestBaseline: a session that gets its project by an upload takes a new
// baseline (POST …/baseline, or the upload's ?baseline=true), and its diff
// then shows only what changed after it; another tenant's session, or none,
// is 404, a body or a flag it does not understand is 400.
func TestBaseline(t *testing.T) {
	e := start(t, config{backend: memory.Backend{TempDir: t.TempDir()}})
	id := e.create(acmeToken, writer).ID
	diff := func() string {
		t.Helper()
		status, body, _ := e.do(acmeToken, "GET", "/v1/sessions/"+id+"/diff", nil)
		if status != http.StatusOK {
			t.Fatalf("diff: %d %s", status, body)
		}
		return string(body)
	}
	project := makeTar(t, entry{name: "a.txt", typ: tar.TypeReg, body: "one\n"}, entry{name: "src/b.txt", typ: tar.TypeReg, body: "bee\n"})
	if status, body, _ := e.do(acmeToken, "PUT", "/v1/sessions/"+id+"/files/", bytes.NewReader(project)); status != http.StatusOK {
		t.Fatalf("upload: %d %s", status, body)
	}
	if d := diff(); !strings.Contains(d, "b/src/b.txt") {
		t.Fatalf("the diff after the upload lacks it:\n%s", d)
	}
	var info runner.BaselineInfo
	e.json(acmeToken, "POST", "/v1/sessions/"+id+"/baseline", nil, http.StatusOK, &info)
	if info.Files != 2 || info.Taken.IsZero() {
		t.Fatalf("the new baseline: %+v, want 2 files", info)
	}
	if d := diff(); d != "" {
		t.Fatalf("the diff right after a new baseline:\n%s", d)
	}
	e.call(acmeToken, id, "write", map[string]any{"path": "a.txt", "content": "two\n"})
	if d := diff(); !strings.Contains(d, "-one\n+two\n") || strings.Contains(d, "b.txt") {
		t.Fatalf("the diff of a change after the new baseline:\n%s", d)
	}

	more := makeTar(t, entry{name: "c.txt", typ: tar.TypeReg, body: "see\n"})
	status, body, _ := e.do(acmeToken, "PUT", "/v1/sessions/"+id+"/files/up?baseline=true", bytes.NewReader(more))
	var res httpapi.TransferResult
	if status != http.StatusOK || json.Unmarshal(body, &res) != nil || res.Files != 1 || res.Baseline == nil || res.Baseline.Files != 3 {
		t.Fatalf("upload with a new baseline: %d %s", status, body)
	}
	if d := diff(); d != "" {
		t.Fatalf("the diff right after an upload with a new baseline:\n%s", d)
	}

	for _, c := range []struct {
		token, method, path string
		body                string
		want                int
	}{
		{boltToken, "POST", "/v1/sessions/" + id + "/baseline", "", http.StatusNotFound},
		{acmeToken, "POST", "/v1/sessions/s-none/baseline", "", http.StatusNotFound},
		{acmeToken, "POST", "/v1/sessions/" + id + "/baseline", `{"since":1}`, http.StatusBadRequest},
		{acmeToken, "PUT", "/v1/sessions/" + id + "/files/up?baseline=maybe", string(more), http.StatusBadRequest},
		{boltToken, "PUT", "/v1/sessions/" + id + "/files/up?baseline=true", string(more), http.StatusNotFound},
	} {
		if status, body, _ := e.do(c.token, c.method, c.path, strings.NewReader(c.body)); status != c.want {
			t.Errorf("%s %s (%s): %d %s, want %d", c.method, c.path, c.token, status, body, c.want)
		}
	}
}
