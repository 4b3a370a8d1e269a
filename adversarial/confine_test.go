package adversarial

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

// swapScript makes $WS/d flip, as fast as the shell can, between a real
// directory holding f ("inside") and a symbolic link to the outside
// directory, which holds f with the outside secret.
//
// The loop is the attacker's own and runs as the session's user: when a
// tool call makes d between its rm and mv, its mv moves the temporary into
// whatever d is, through its own link too. Those temporaries (swap.*.tmp)
// are therefore left out of the comparison of the outside.
const swapScript = `cd "$WS" || exit 1
while :; do
  rm -rf swap.dir.tmp; mkdir swap.dir.tmp; printf inside > swap.dir.tmp/f; rm -rf d; mv swap.dir.tmp d
  rm -f swap.link.tmp; ln -s "$OUT" swap.link.tmp; rm -rf d; mv swap.link.tmp d
done`

// swapping runs swapScript in the workspace until the returned stop is
// called; stop returns once the loop is dead.
func (w *world) swapping(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(t, ctx, swapScript, time.Minute)
	}()
	// Let the loop start before the attack.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := w.fs.Lstat(context.Background(), "d"); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return func() { cancel(); <-done }
}

// The workspace directory d is swapped with a link to the outside while the
// tools read, list, grep, write and edit through it: every answer is the
// inside or a refusal, the outside is never read or written (the world's
// cleanup compares the outside before and after).
func TestConfinement(t *testing.T) {
	runAttacks(t, []attack{
		{"LinkOut", func(t *testing.T, w *world) {
			w.sh(t, `ln -s "$OUT" out && ln -s "$OUT/secret" s && ln -s ../../.. up && mkdir sub && ln -s "$OUT/d" sub/x`)
			set := w.toolSet(t, nil)
			for _, c := range []struct {
				tool string
				args map[string]any
			}{
				{"read", map[string]any{"path": "s"}},
				{"read", map[string]any{"path": "out/secret"}},
				{"read", map[string]any{"path": "up/etc/passwd"}},
				{"read", map[string]any{"path": "sub/x/f"}},
				{"read", map[string]any{"path": "../outside/secret"}},
				{"read", map[string]any{"path": w.outside + "/secret"}},
				{"ls", map[string]any{"path": "out"}},
				{"grep", map[string]any{"pattern": "SECRET", "path": "out"}},
				{"write", map[string]any{"path": "out/new", "content": "x"}},
				{"write", map[string]any{"path": "s", "content": "x"}},
				{"write", map[string]any{"path": "sub/x/f", "content": "x"}},
				{"edit", map[string]any{"path": "s", "edits": []map[string]string{{"oldText": "OUTSIDE", "newText": "x"}}}},
			} {
				res := call(t, set, c.tool, c.args)
				if k := errKind(res); k != "OutsideWorkspace" {
					t.Errorf("%s %v: %q, want OutsideWorkspace: %s", c.tool, c.args, k, res.Text)
				}
			}
			// grep and find over the root walk past the links, never into them.
			res := call(t, set, "grep", map[string]any{"pattern": "SECRET"})
			if g, ok := res.Structured.(*tools.GrepResult); !ok || len(g.Matches) != 0 {
				t.Errorf("grep over the root: %s", res.Text)
			}
		}},
		{"HardLinkOut", func(t *testing.T, w *world) {
			if w.loan != nil {
				// The workspace is a volume of its own: no hard link can
				// join it to a file elsewhere.
				if out, res, _ := w.run(t, context.Background(), `ln "$OUT/secret" h`, 10*time.Second); res.ExitCode == 0 {
					t.Errorf("hard link from the workspace to %s/secret: %s", w.outside, out)
				}
				return
			}
			w.sh(t, `ln "$OUT/secret" h && ln "$OUT/d/f" g`)
			set := w.toolSet(t, nil)
			// write and edit replace the name; the shared inode outside is
			// untouched (the world's cleanup compares it).
			if res := call(t, set, "write", map[string]any{"path": "h", "content": "pwned"}); res.IsError {
				t.Errorf("write over a hard link: %s", res.Text)
			}
			w.fs.WriteFile(context.Background(), "g", []byte("pwned"), 0o644)
		}},
		{"SymlinkSwapDuringToolWrites", func(t *testing.T, w *world) {
			set := w.toolSet(t, nil)
			stop := w.swapping(t)
			defer stop()
			refused := 0
			for i := range 150 {
				res := call(t, set, "write", map[string]any{"path": "d/f", "content": "pwned"})
				if res.IsError {
					refused++
				}
				if i%3 == 0 {
					res = call(t, set, "edit", map[string]any{"path": "d/f", "edits": []map[string]string{{"oldText": "inside", "newText": "pwned"}}})
				}
				res = call(t, set, "write", map[string]any{"path": "d/new", "content": "pwned"})
			}
			t.Logf("%d of 150 writes refused or failed mid-swap", refused)
		}},
		{"SymlinkSwapDuringToolReads", func(t *testing.T, w *world) {
			set := w.toolSet(t, nil)
			stop := w.swapping(t)
			defer stop()
			got := map[string]int{}
			for range 150 {
				for _, c := range []struct {
					tool string
					args map[string]any
				}{
					{"read", map[string]any{"path": "d/f"}},
					{"grep", map[string]any{"pattern": "SECRET|inside", "path": "d"}},
					{"ls", map[string]any{"path": "d"}},
					{"find", map[string]any{"pattern": "**/secret"}},
				} {
					res := call(t, set, c.tool, c.args) // call fails the test on a leak
					got[c.tool+":"+errKind(res)]++
				}
			}
			t.Logf("outcomes: %v", got)
		}},
		{"SymlinkSwapDuringPortCalls", func(t *testing.T, w *world) {
			// The same race one level down, at the FileSystem port, with the
			// calls that take a second name or act on links.
			stop := w.swapping(t)
			defer stop()
			ctx := context.Background()
			for range 200 {
				if data, err := w.fs.ReadFile(ctx, "d/f", 1<<20); err == nil && string(data) != "inside" {
					t.Fatalf("ReadFile d/f = %q", data)
				}
				w.fs.WriteFile(ctx, "d/g", []byte("pwned"), 0o644)
				w.fs.Mkdir(ctx, "d/m", 0o755)
				w.fs.Rename(ctx, "d/f", "moved")
				w.fs.Remove(ctx, "d/f")
				if s, ok := w.fs.(workspace.SymlinkFS); ok {
					s.Symlink(ctx, "x", "d/l")
				}
				if r, ok := w.fs.(workspace.RemoveAllFS); ok {
					r.RemoveAll(ctx, "d/d")
				}
			}
		}},
	})
}

// tarNames lists a tar stream's names and fails on one that is absolute or
// climbs out.
func tarNames(t *testing.T, data []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatalf("tar: %v", err)
		}
		if strings.HasPrefix(h.Name, "/") || strings.Contains("/"+h.Name+"/", "/../") {
			t.Errorf("tar entry %q leaves its root", h.Name)
		}
		names = append(names, h.Name)
	}
}
