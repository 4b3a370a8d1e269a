package adversarial

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/workspace"
)

// FuzzProtect checks the protect and exclude matching every mutation and
// walk relies on, against an independent statement of the rule: after
// workspace.Resolve, a name is protected by the default globs exactly when
// its first component is .git or .sandboxd in any case, and skipped by the
// default excludes exactly when its last component is one of them; a user's
// glob matches a name however it is cased or spelt (./, //).
func FuzzProtect(f *testing.F) {
	for _, s := range []string{".git/config", "./.git//x", "sub/../.git/x", ".GIT/hooks/pre-commit", ".git", ".gitignore",
		"a/.git/x", "/workspace/.sandboxd/runtime", "..", "node_modules", "a/node_modules", ".git/../.git/x", "x/.Git"} {
		f.Add(s, "src/**")
	}
	f.Add("Build/Out/x", "build/**")
	f.Add("a/b.GO", "**/*.go")
	f.Fuzz(func(t *testing.T, p, glob string) {
		name, err := workspace.Resolve("/workspace", p)
		if err != nil {
			return
		}
		parts := strings.Split(name, "/")
		first := strings.ToLower(parts[0])
		want := first == ".git" || first == ".sandboxd"
		if got := workspace.DefaultProtect.Match(name); got != want {
			t.Fatalf("DefaultProtect.Match(%q) (from %q) = %v, want %v", name, p, got, want)
		}
		last := parts[len(parts)-1]
		wantSkip := name != "." && (last == "node_modules" || last == ".git" || last == ".sandboxd")
		if got := workspace.DefaultExclude.Skip(name); got != wantSkip {
			t.Fatalf("DefaultExclude.Skip(%q) = %v, want %v", name, got, wantSkip)
		}
		prot := workspace.Protect{glob}
		if prot.Validate() != nil {
			return
		}
		m := prot.Match(name)
		for _, variant := range []string{strings.ToUpper(name), strings.ToLower(name), "./" + name, strings.ReplaceAll(name, "/", "//")} {
			if prot.Match(variant) != m {
				t.Fatalf("Protect{%q}.Match(%q) = %v but Match(%q) = %v", glob, name, m, variant, !m)
			}
		}
	})
}

// FuzzUpload sends tar streams built from the fuzzer's entries to the
// daemon's upload route (PUT /v1/sessions/{id}/files/{dir}) on the local
// backend, and checks what the route promises: never a server error;
// nothing outside the workspace written; a refusal writes nothing; no link
// written leads out of the workspace.
//
// An entry is a line "T name|rest": T is a tar type flag (0 file, 5 dir,
// 2 symlink, 1 hard link, 6 FIFO, 3 device), rest is a file's content or a
// link's target.
func FuzzUpload(f *testing.F) {
	for _, s := range []string{
		"0 a.txt|hello\n5 d/|\n0 d/b|x",
		"2 l|../../outside\n0 l/x|pwned",
		"2 l|sub\n5 sub/|\n0 l/f|x",
		"0 ../x|pwned", "0 /etc/x|pwned", "0 a/../../x|y",
		"1 h|/etc/passwd", "6 p|", "3 dev|",
		"2 abs|/etc\n0 abs/x|y",
		"2 a|b\n2 b|a\n0 a/x|y",
		"5 d/|\n2 d/up|..\n2 d/upup|../..",
		"0 .sandboxd/x|y", "0 .git/hooks/pre-commit|#!/bin/sh",
		"0 f|x\n5 f/|\n0 f/g|y",
		"2 x|.\n0 x/x/x/y|z",
	} {
		f.Add(s, "up")
		f.Add(s, "")
	}
	d := newDaemon(f, daemonConfig{backend: "local", maxTransfer: 1 << 20})
	id := d.create(f, acmeToken, map[string]any{"grants": []string{"fs.write"}})
	_, info := d.do(f, acmeToken, "GET", "/v1/sessions/"+id, nil)
	var si struct{ Root string }
	json.Unmarshal(info, &si)
	root := si.Root
	data := filepath.Dir(root)
	outside := filepath.Join(data, "outside")
	os.MkdirAll(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "secret"), []byte(outsideSecret), 0o644)
	before := treeState(f, data, root)

	f.Fuzz(func(t *testing.T, spec, dir string) {
		body, ok := buildTar(spec)
		if !ok {
			return
		}
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
		req, err := http.NewRequest("PUT", d.url+"/v1/sessions/"+id+"/files/"+dir, bytes.NewReader(body))
		if err != nil {
			return // not a URL
		}
		req.Header.Set("Authorization", "Bearer "+acmeToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("upload of %q into %q: %d", spec, dir, resp.StatusCode)
		}
		if after := treeState(t, data, root); after != before {
			t.Fatalf("upload of %q into %q changed the outside:\n%s\n---\n%s", spec, dir, before, after)
		}
		if resp.StatusCode != http.StatusOK {
			if left, _ := os.ReadDir(root); len(left) != 0 && resp.StatusCode != http.StatusNotFound {
				t.Fatalf("refused upload (%d) of %q into %q wrote %v", resp.StatusCode, spec, dir, left)
			}
			return
		}
		filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.Type()&os.ModeSymlink == 0 {
				return nil
			}
			target, _ := os.Readlink(p)
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			if rel, err := filepath.Rel(root, filepath.Clean(target)); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				t.Fatalf("upload of %q into %q made a link out: %s -> %s", spec, dir, p, target)
			}
			return nil
		})
	})
}

// buildTar turns the fuzzer's entry lines into a tar stream.
func buildTar(spec string) ([]byte, bool) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for line := range strings.SplitSeq(spec, "\n") {
		if len(line) < 3 || line[1] != ' ' {
			continue
		}
		name, rest, _ := strings.Cut(line[2:], "|")
		h := &tar.Header{Name: name, Typeflag: line[0], Mode: 0o644}
		switch h.Typeflag {
		case tar.TypeReg:
			h.Size = int64(len(rest))
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = rest
		case tar.TypeDir:
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, false
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(rest))
		}
	}
	return b.Bytes(), tw.Close() == nil
}

// treeState lists everything under dir except the workspace: names, types,
// sizes and contents.
func treeState(t testing.TB, dir, workspaceDir string) string {
	var b strings.Builder
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if p == workspaceDir {
			return filepath.SkipDir
		}
		if err != nil {
			b.WriteString(p + " error\n")
			return nil
		}
		b.WriteString(p + " " + e.Type().String())
		if e.Type().IsRegular() {
			data, _ := os.ReadFile(p)
			b.WriteString(" " + string(data))
		}
		b.WriteString("\n")
		return nil
	})
	return b.String()
}
