package adversarial

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/tools"
)

// within runs f and fails the test when it takes longer than d: an attack
// that makes a tool hang is a failed defence.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s still running after %v", what, d)
	}
}

// mustKind calls a tool and fails unless it is refused with kind.
func mustKind(t *testing.T, set *tools.Set, kind, tool string, args map[string]any) tools.Result {
	t.Helper()
	var res tools.Result
	within(t, 20*time.Second, tool, func() { res = call(t, set, tool, args) })
	if k := errKind(res); k != kind {
		t.Errorf("%s %v: got %q, want %s: %.300s", tool, args, k, kind, res.Text)
	}
	return res
}

// gitState describes .git entirely, for "nothing was written there".
const gitState = `cd "$WS" && find .git .GIT 2>/dev/null | sort | while read -r f; do stat -c '%n %F %s %i' "$f"; [ -f "$f" ] && md5sum "$f"; done; true`

// Protect globs (.git/**, .sandboxd/**) refuse write and edit however the
// path is spelt and whatever link leads there; .git is byte-identical after.
func TestProtectEvasion(t *testing.T) {
	runAttacks(t, []attack{
		{"Spellings", func(t *testing.T, w *world) {
			w.sh(t, `mkdir -p .git/hooks sub .sandboxd && printf '[core]\n' > .git/config && printf x > .sandboxd/state`)
			before := w.sh(t, gitState)
			set := w.toolSet(t, nil)
			for _, p := range []string{
				".git/config", ".GIT/config", ".Git/hooks/pre-commit", "./.git//config", ".git/./config",
				"sub/../.git/config", "sub/./../.git/hooks/post-checkout", w.root + "/.git/config",
				w.root + "//.git/../.git/config", ".git/hooks/pre-commit", ".sandboxd/state", ".SANDBOXD/x", ".git",
			} {
				mustKind(t, set, "Protected", "write", map[string]any{"path": p, "content": "[core]\n\thooksPath = /tmp\n"})
				mustKind(t, set, "Protected", "edit", map[string]any{"path": p, "edits": []map[string]string{{"oldText": "[core]", "newText": "[alias]"}}})
			}
			if after := w.sh(t, gitState); after != before {
				t.Errorf(".git changed:\n%s\n---\n%s", before, after)
			}
		}},
		{"LinksIntoGit", func(t *testing.T, w *world) {
			w.sh(t, `mkdir -p .git/hooks sub && printf '[core]\n' > .git/config &&
				ln -s .git g && ln -s .git/config c && ln -s sub/../.git/hooks h && ln -s g chain &&
				ln -s "$WS/.git" abs && ln -s ../.git sub/up && ln -s .git/hooks/new dangling`)
			before := w.sh(t, gitState)
			set := w.toolSet(t, nil)
			for _, p := range []string{"g/config", "c", "h/pre-commit", "chain/config", "abs/config", "sub/up/config", "dangling"} {
				mustKind(t, set, "Protected", "write", map[string]any{"path": p, "content": "[core]\n\tfsmonitor = touch /tmp/pwned\n"})
				mustKind(t, set, "Protected", "edit", map[string]any{"path": p, "edits": []map[string]string{{"oldText": "[core]", "newText": "[x]"}}})
			}
			if after := w.sh(t, gitState); after != before {
				t.Errorf(".git changed:\n%s\n---\n%s", before, after)
			}
		}},
	})
}

// FIFOs, sockets and devices are refused at once (never opened, so never
// blocking); a 100 GB sparse file and a 50 MB single line are answered
// within bounds.
func TestSpecialFiles(t *testing.T) {
	runAttacks(t, []attack{
		{"FIFO", func(t *testing.T, w *world) {
			w.sh(t, `mkfifo p && mkdir d && mkfifo d/q && printf 'text\n' > d/t`)
			set := w.toolSet(t, nil)
			mustKind(t, set, "NotAFile", "read", map[string]any{"path": "p"})
			mustKind(t, set, "NotAFile", "write", map[string]any{"path": "p", "content": "x"})
			mustKind(t, set, "NotAFile", "edit", map[string]any{"path": "p", "edits": []map[string]string{{"oldText": "a", "newText": "b"}}})
			within(t, 20*time.Second, "grep over a FIFO", func() {
				res := call(t, set, "grep", map[string]any{"pattern": "text"})
				if g, ok := res.Structured.(*tools.GrepResult); !ok || len(g.Matches) != 1 {
					t.Errorf("grep beside FIFOs: %s", res.Text)
				}
				call(t, set, "grep", map[string]any{"pattern": "x", "path": "p"})
			})
			within(t, 20*time.Second, "ls and find", func() {
				call(t, set, "ls", map[string]any{"path": "d"})
				call(t, set, "find", map[string]any{"pattern": "**"})
			})
			w.sh(t, `[ -p p ] && [ -p d/q ]`) // still FIFOs: nothing replaced them
		}},
		{"SocketsAndDevices", func(t *testing.T, w *world) {
			if w.loan == nil {
				ln, err := net.Listen("unix", filepath.Join(w.root, "sock"))
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				set := w.toolSet(t, nil)
				mustKind(t, set, "NotAFile", "read", map[string]any{"path": "sock"})
				mustKind(t, set, "NotAFile", "write", map[string]any{"path": "sock", "content": "x"})
			} else {
				// No CAP_MKNOD in a session container: no device nodes at all.
				out, res, _ := w.run(t, context.Background(), "mknod zero c 1 5", 10*time.Second)
				if res.ExitCode == 0 {
					t.Errorf("mknod succeeded in a session container: %s", out)
				}
			}
			w.sh(t, `ln -s /dev/zero z && ln -s /dev/urandom u && ln -s /proc/self/environ e`)
			set := w.toolSet(t, nil)
			for _, p := range []string{"z", "u", "e", "/dev/zero", "/proc/self/environ"} {
				mustKind(t, set, "OutsideWorkspace", "read", map[string]any{"path": p})
			}
		}},
		{"SparseFile100GB", func(t *testing.T, w *world) {
			w.sh(t, `truncate -s 100G big && printf 'needle\n' > small`)
			set := w.toolSet(t, nil)
			mustKind(t, set, "FileTooLarge", "read", map[string]any{"path": "big"})
			mustKind(t, set, "FileTooLarge", "edit", map[string]any{"path": "big", "edits": []map[string]string{{"oldText": "a", "newText": "b"}}})
			within(t, 30*time.Second, "grep beside a 100 GB file", func() {
				res := call(t, set, "grep", map[string]any{"pattern": "needle"})
				if g, ok := res.Structured.(*tools.GrepResult); !ok || len(g.Matches) != 1 {
					t.Errorf("grep: %s", res.Text)
				}
				call(t, set, "grep", map[string]any{"pattern": "needle", "path": "big"})
			})
			w.sh(t, `[ "$(stat -c %s big)" = 107374182400 ]`)
		}},
		{"SingleLine50MB", func(t *testing.T, w *world) {
			w.sh(t, `head -c 50000000 /dev/zero | tr '\0' a > huge && head -c 8000000 /dev/zero | tr '\0' b > line && printf 'X\n' >> line`)
			set := w.toolSet(t, nil)
			mustKind(t, set, "FileTooLarge", "read", map[string]any{"path": "huge"})
			within(t, 30*time.Second, "read and grep of an 8 MB line", func() {
				res := call(t, set, "read", map[string]any{"path": "line"})
				if res.IsError || len(res.Text) > 200_000 {
					t.Errorf("read of an 8 MB line: error %v, %d bytes of text", res.IsError, len(res.Text))
				}
				// grep cuts lines to grepLineChars (500) before matching, as
				// the contract says: the match is shown cut, and text past
				// the cut is not searched (SECURITY.md, what is not promised).
				res = call(t, set, "grep", map[string]any{"pattern": "bbb", "path": "line"})
				g, ok := res.Structured.(*tools.GrepResult)
				if !ok || len(g.Matches) != 1 || len(g.Matches[0].Text) > 1000 || len(res.Text) > 10_000 {
					t.Errorf("grep of an 8 MB line: %.300s", res.Text)
				}
				call(t, set, "grep", map[string]any{"pattern": "a+$"})
			})
		}},
	})
}

// Content that is not plain text is reported, never mangled: binary files,
// invalid UTF-8 (edit refuses, leaving the bytes), a BOM and CRLF endings
// kept byte-exact by edit.
func TestContent(t *testing.T) {
	runAttacks(t, []attack{
		{"Binary", func(t *testing.T, w *world) {
			w.sh(t, `printf '\177ELF\002\001\001\000\000\000\000\000' > bin && head -c 4096 /dev/urandom >> bin`)
			sum := w.sh(t, `md5sum bin`)
			set := w.toolSet(t, nil)
			res := call(t, set, "read", map[string]any{"path": "bin"})
			if _, ok := res.Structured.(*tools.ReadBinaryResult); !ok {
				t.Errorf("read of a binary: %T %.200s", res.Structured, res.Text)
			}
			if !utf8.ValidString(res.Text) {
				t.Error("the result's text is not UTF-8")
			}
			mustKind(t, set, "NotUtf8", "edit", map[string]any{"path": "bin", "edits": []map[string]string{{"oldText": "ELF", "newText": "FLE"}}})
			if w.sh(t, `md5sum bin`) != sum {
				t.Error("the binary changed")
			}
		}},
		{"InvalidUTF8", func(t *testing.T, w *world) {
			w.sh(t, `printf 'caf\351 ok\nline two \377\376\n' > latin1`)
			sum := w.sh(t, `md5sum latin1`)
			set := w.toolSet(t, nil)
			res := call(t, set, "read", map[string]any{"path": "latin1"})
			if res.IsError || !utf8.ValidString(res.Text) || !strings.Contains(res.Text, "\uFFFD") {
				t.Errorf("read of Latin-1: %q", res.Text)
			}
			mustKind(t, set, "NotUtf8", "edit", map[string]any{"path": "latin1", "edits": []map[string]string{{"oldText": "ok", "newText": "OK"}}})
			if w.sh(t, `md5sum latin1`) != sum {
				t.Error("the file changed")
			}
		}},
		{"BOMAndCRLFKept", func(t *testing.T, w *world) {
			w.sh(t, `printf '\357\273\277first\r\nsecond line\r\nthird\r\n' > win.txt`)
			set := w.toolSet(t, nil)
			res := call(t, set, "edit", map[string]any{"path": "win.txt", "edits": []map[string]string{{"oldText": "second line\nthird", "newText": "SECOND\nTHIRD\nfourth"}}})
			if res.IsError {
				t.Fatalf("edit: %s", res.Text)
			}
			got := w.sh(t, `od -An -c win.txt | tr -s ' \n' ' '`)
			want := w.sh(t, `printf '\357\273\277first\r\nSECOND\r\nTHIRD\r\nfourth\r\n' | od -An -c | tr -s ' \n' ' '`)
			if got != want {
				t.Errorf("after edit:\n got %s\nwant %s", got, want)
			}
		}},
	})
}
