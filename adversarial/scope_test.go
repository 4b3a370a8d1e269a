package adversarial

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// privateMarker is the contents of the file the session's rules hide.
const privateMarker = "PRIVATE-c47f0e19"

// TestScope: a workspace laid out by a hostile repository — links into a
// directory the session's rules hide, by every spelling the kernel follows —
// and an agent with every file tool tries to read or change what is hidden.
// On local disk and in a container, nothing of it is shown or changed.
func TestScope(t *testing.T) {
	runAttacks(t, []attack{{"HiddenStaysHidden", func(t *testing.T, w *world) {
		w.sh(t, `cd "$WS" && mkdir -p private pub/deep/dir && printf '`+privateMarker+`' > private/key &&
			ln -s ../private/key pub/rel && ln -s "$WS/private/key" pub/abs && ln -s ../private pub/dir &&
			ln -s deep/dir pub/x && ln -s x/../../../private/key pub/dotdot && ln -s "$WS/pub/x/../../../private/key" pub/absdotdot &&
			ln -s .. pub/up && printf 'public\n' > pub/readme`)
		set := w.toolSet(t, func(c *tools.Config) {
			c.Profile = tools.Profiles{tools.ProfileWorkspaceTools, tools.ProfileWorkspaceShell}
			c.WorkspaceShell = &workspaceshell.Settings{Mode: workspaceshell.Write}
			c.Always = []string{"read", "edit"}
			c.Visible = []string{"pub/**"}
			c.Commit = []string{"pub/**"}
		})
		shows := func(tool string, args map[string]any) string {
			t.Helper()
			res := call(t, set, tool, args)
			if strings.Contains(res.Text, privateMarker) {
				t.Errorf("%s %v showed the hidden file: %s", tool, args, res.Text)
			}
			return res.Text
		}
		for _, name := range []string{"private/key", "pub/rel", "pub/abs", "pub/dir/key", "pub/dotdot", "pub/absdotdot", "pub/up/private/key"} {
			shows("read", map[string]any{"path": name})
			shows("shell", map[string]any{"command": "cat " + name + "; head -c 100 " + name + "; wc -c " + name})
			shows("grep", map[string]any{"pattern": "PRIVATE", "path": name})
		}
		shows("grep", map[string]any{"pattern": "PRIVATE"})
		shows("shell", map[string]any{"command": "grep -r PRIVATE . ; rg PRIVATE ; find . -name key ; ls -R"})
		if out := shows("find", map[string]any{"pattern": "**/key"}); strings.Contains(out, "private") {
			t.Errorf("find shows the hidden directory: %s", out)
		}
		if out := shows("ls", map[string]any{"path": "."}); strings.Contains(out, "private") {
			t.Errorf("ls shows the hidden directory: %s", out)
		}
		// Writes through the links are refused; the hidden file is as it was.
		for _, name := range []string{"pub/rel", "pub/abs", "pub/dir/key", "pub/dotdot", "pub/absdotdot"} {
			if res := call(t, set, "write", map[string]any{"path": name, "content": "clobbered"}); !res.IsError {
				t.Errorf("write %s succeeded", name)
			}
			call(t, set, "shell", map[string]any{"command": "cp pub/readme " + name + "; rm " + name + "/../key"})
		}
		if got := w.sh(t, `cat "$WS/private/key"`); got != privateMarker {
			t.Errorf("the hidden file now holds %q", got)
		}
		if res := call(t, set, "read", map[string]any{"path": "pub/readme"}); res.IsError {
			t.Errorf("read of a visible file: %s", res.Text)
		}
	}}})
}
