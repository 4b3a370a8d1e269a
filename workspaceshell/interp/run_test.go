package interp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspaceshell/internal/shelltest"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// readCases are lines of read mode with their output; "$ROOT" stands for the
// workspace root.
var readCases = []struct {
	line, stdout, stderr string
	exit                 int
}{
	{"pwd", "$ROOT\n", "", 0},
	{"ls", "a.txt\ndata.bin\ndir with space\ndocs\nempty\nlink.txt\nnode_modules\nsrc\n", "", 0},
	{"ls -A", ".git\n.hidden\na.txt\ndata.bin\ndir with space\ndocs\nempty\nlink.txt\nnode_modules\nsrc\n", "", 0},
	{"ls -a src", ".\n..\nmain.go\nutil.go\n", "", 0},
	{"ls -1 src docs", "docs:\nreadme.md\n\nsrc:\nmain.go\nutil.go\n", "", 0},
	{"ls -F", "a.txt\ndata.bin\ndir with space/\ndocs/\nempty/\nlink.txt@\nnode_modules/\nsrc/\n", "", 0},
	{"ls -d src a.txt", "a.txt\nsrc\n", "", 0},
	{"ls -R docs empty", "docs:\nreadme.md\n\nempty:\n", "", 0},
	{"ls -R src", "src:\nmain.go\nutil.go\n", "", 0},
	{"ls -r src", "util.go\nmain.go\n", "", 0},
	{"ls missing", "", "ls: cannot access 'missing': No such file or directory\n", 2},
	{"ls -z", "", "ls: invalid option -- 'z'\n", 2},
	{"ls src/*.go", "src/main.go\nsrc/util.go\n", "", 0},
	{"ls {src,docs}/*", "docs/readme.md\nsrc/main.go\nsrc/util.go\n", "", 0},
	{"ls src | grep util", "util.go\n", "", 0},
	{"find . -name '*.go'", "./src/main.go\n./src/util.go\n", "", 0},
	{"find src", "src\nsrc/main.go\nsrc/util.go\n", "", 0},
	{"find . -maxdepth 1 -type d", ".\n./dir with space\n./docs\n./empty\n./src\n", "", 0},
	{"find . -type l", "./link.txt\n", "", 0},
	{"find . -empty", "./empty\n", "", 0},
	{"find src -name 'm*' -o -name 'u*'", "src/main.go\nsrc/util.go\n", "", 0},
	{"find . -path './src/*' -print", "./src/main.go\n./src/util.go\n", "", 0},
	{"find . -iname 'README*'", "./docs/readme.md\n", "", 0},
	{"find . -name '*.go' -not -name 'm*'", "./src/util.go\n", "", 0},
	{"find . \\( -name '*.md' -o -name '*.bin' \\) -type f", "./data.bin\n./docs/readme.md\n", "", 0},
	{"find src -type f | head -1", "src/main.go\n", "", 0},
	{"find src -mindepth 1 | wc -l", "2\n", "", 0},
	{"find nothere", "", "find: 'nothere': No such file or directory\n", 1},
	{"find . -bogus", "", "find: unknown predicate '-bogus'\n", 2},
	{"cat a.txt", "hello\nworld\n", "", 0},
	{"cat -n a.txt src/util.go", "     1\thello\n     2\tworld\n     3\tpackage main\n     4\t// TODO fix\n", "", 0},
	{"cat link.txt", "hello\nworld\n", "", 0},
	{"cat 'dir with space/file name'", "spaced\n", "", 0},
	{"cat \"$HOME/a.txt\"", "hello\nworld\n", "", 0},
	{"cat missing a.txt", "hello\nworld\n", "cat: missing: No such file or directory\n", 1},
	{"cat /etc/passwd", "", "cat: /etc/passwd: Path leads outside the workspace\n", 1},
	{"cat ../x", "", "cat: ../x: Path leads outside the workspace\n", 1},
	{"cat src", "", "cat: src: Not a regular file\n", 1},
	{"cat < a.txt", "hello\nworld\n", "", 0},
	{"cat <<EOF\nx $HOME\nEOF", "x $ROOT\n", "", 0},
	{"cat <<'EOF'\nx $HOME\nEOF", "x $HOME\n", "", 0},
	{"cat <<-EOF\n\tindented\n\tEOF", "indented\n", "", 0},
	{"cat $(find src -name 'u*')", "package main\n// TODO fix\n", "", 0},
	{"cat a.txt >/dev/null", "", "", 0},
	{"head -n 1 a.txt", "hello\n", "", 0},
	{"head -1 a.txt", "hello\n", "", 0},
	{"head -c 3 a.txt", "hel", "", 0},
	{"head -n -1 a.txt", "hello\n", "", 0},
	{"head -n 1 src/*.go", "==> src/main.go <==\npackage main\n\n==> src/util.go <==\npackage main\n", "", 0},
	{"head -n 2 src/main.go | tail -n 1", "\n", "", 0},
	{"head -n x a.txt", "", "head: invalid number of lines: 'x'\n", 2},
	{"tail -n 1 a.txt", "world\n", "", 0},
	{"tail -n +2 src/main.go", "\nfunc main() {}\n", "", 0},
	{"tail -c 3 a.txt", "ld\n", "", 0},
	{"tail -n 1 a.txt src/util.go", "==> a.txt <==\nworld\n\n==> src/util.go <==\n// TODO fix\n", "", 0},
	{"wc -l a.txt", "2 a.txt\n", "", 0},
	{"wc a.txt", " 2  2 12 a.txt\n", "", 0},
	{"wc -l src/main.go src/util.go", " 3 src/main.go\n 2 src/util.go\n 5 total\n", "", 0},
	{"cat a.txt | wc -l", "2\n", "", 0},
	{"cat a.txt | wc", "      2       2      12\n", "", 0},
	{"wc -c < a.txt", "12\n", "", 0},
	{"grep -rn TODO .", "./.hidden:1:secret TODO\n./docs/readme.md:2:TODO: write\n./src/util.go:2:// TODO fix\n", "grep: ./data.bin: binary file matches\n", 0},
	{"grep -r TODO src docs", "src/util.go:// TODO fix\ndocs/readme.md:TODO: write\n", "", 0},
	{"grep -rl TODO", ".hidden\ndata.bin\ndocs/readme.md\nsrc/util.go\n", "", 0},
	{"grep -c o a.txt", "2\n", "", 0},
	{"grep -c TODO data.bin", "1\n", "", 0},
	{"grep -v hello a.txt", "world\n", "", 0},
	{"grep -w wor a.txt", "", "", 1},
	{"grep -w world a.txt", "world\n", "", 0},
	{`grep 'hel\|wor' a.txt`, "hello\nworld\n", "", 0},
	{"grep -E 'h(e|a)llo' a.txt", "hello\n", "", 0},
	{"grep '(' src/main.go", "func main() {}\n", "", 0},
	{"grep -i HELLO a.txt", "hello\n", "", 0},
	{"grep -o 'o.' a.txt", "or\n", "", 0},
	{"grep -n -A1 package src/main.go", "1:package main\n2-\n", "", 0},
	{"grep -B1 -n world a.txt", "1-hello\n2:world\n", "", 0},
	{"grep -h TODO src/util.go docs/readme.md", "// TODO fix\nTODO: write\n", "", 0},
	{"grep --include='*.go' -r TODO .", "./src/util.go:// TODO fix\n", "", 0},
	{"grep -F '()' src/main.go", "func main() {}\n", "", 0},
	{"grep -x world a.txt", "world\n", "", 0},
	{"grep -e hello -e world a.txt", "hello\nworld\n", "", 0},
	{"grep -q TODO src/util.go && pwd", "$ROOT\n", "", 0},
	{"grep TODO missing", "", "grep: missing: No such file or directory\n", 2},
	{"grep TODO src", "", "grep: src: Is a directory\n", 2},
	{"grep --bogus x", "", "grep: unrecognized option '--bogus'\n", 2},
	{`grep '\(a\)\1' a.txt`, "", "grep: back-references (\\1) are not supported: patterns are RE2\n", 2},
	{"grep hello <<< 'hello there'", "hello there\n", "", 0},
	{"rg TODO", "docs/readme.md:TODO: write\nsrc/util.go:// TODO fix\n", "", 0},
	{"rg -n TODO src", "src/util.go:2:// TODO fix\n", "", 0},
	{"rg TODO src/util.go", "// TODO fix\n", "", 0},
	{"rg -l TODO .", "./docs/readme.md\n./src/util.go\n", "", 0},
	{"rg --hidden -l TODO", ".hidden\ndocs/readme.md\nsrc/util.go\n", "", 0},
	{"rg -t go -c package", "src/main.go:1\nsrc/util.go:1\n", "", 0},
	{"rg -g '*.md' TODO", "docs/readme.md:TODO: write\n", "", 0},
	{"rg -g '!*.md' TODO", "src/util.go:// TODO fix\n", "", 0},
	{"rg --files src", "src/main.go\nsrc/util.go\n", "", 0},
	{"cat a.txt | rg -i WOR", "world\n", "", 0},
	{"rg -w TODO -o docs", "docs/readme.md:TODO\n", "", 0},
	{"rg -S todo src", "src/util.go:// TODO fix\n", "", 0},
	{"rg nothing", "", "", 1},
	{"for f in src/*.go; do wc -l $f; done", "3 src/main.go\n2 src/util.go\n", "", 0},
	{"if grep -q nothing a.txt; then pwd; else ls src; fi", "main.go\nutil.go\n", "", 0},
	{"! grep -q nothing a.txt && pwd", "$ROOT\n", "", 0},
	{"ls missing 2>&1 | wc -l", "1\n", "", 0},
	{"ls missing 2>/dev/null || pwd", "$ROOT\n", "", 0},
	{"(ls src; ls docs) | wc -l", "3\n", "", 0},
	{"{ cat a.txt; cat src/util.go; } | grep -c package", "1\n", "", 0},
	{"ls src; ls nothere; ls docs", "main.go\nutil.go\nreadme.md\n", "ls: cannot access 'nothere': No such file or directory\n", 0},
	{"ls nothere && pwd", "", "ls: cannot access 'nothere': No such file or directory\n", 2},
	{"grep -c x a.txt; ls $?", "0\n", "ls: cannot access '1': No such file or directory\n", 2},
	{"while grep -q nothing a.txt; do pwd; done; ls docs", "readme.md\n", "", 0},
	{"cat a.txt | head -n 1 | wc -c", "6\n", "", 0},
}

// TestReadLines runs every read case on every backend: the same tree gives
// the same output.
func TestReadLines(t *testing.T) {
	for _, b := range shelltest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			env := shelltest.Setup(t, b, shelltest.Sample)
			before := shelltest.Snapshot(t, env)
			root := env.Session.Root
			for _, tc := range readCases {
				res, err := run(t, env, tc.line, interp.Read)
				if err != nil {
					t.Errorf("%q: %v", tc.line, err)
					continue
				}
				want := strings.ReplaceAll(tc.stdout, "$ROOT", root)
				if res.Stdout != want || res.Stderr != tc.stderr || res.ExitCode != tc.exit {
					t.Errorf("%q:\n got stdout %q stderr %q exit %d\nwant stdout %q stderr %q exit %d",
						tc.line, res.Stdout, res.Stderr, res.ExitCode, want, tc.stderr, tc.exit)
				}
			}
			shelltest.SameTree(t, shelltest.Snapshot(t, env), before)
		})
	}
}

// TestLimits: a line that runs away is stopped by the output limit, the
// timeout or its context, and a brace expansion cannot fill the memory.
func TestLimits(t *testing.T) {
	b := shelltest.Backends[0]
	env := shelltest.Setup(t, b, shelltest.Sample)
	env.MaxOutput = 1000
	res, err := run(t, env, "while cat a.txt; do cat a.txt; done", interp.Read)
	if err != nil || !res.Truncated || len(res.Stdout) != 1000 || !strings.Contains(res.Stderr, "output stopped after 1000 bytes") {
		t.Errorf("output limit: %d bytes, %+v, %v", len(res.Stdout), res.Truncated, err)
	}

	env = shelltest.Setup(t, b, shelltest.Sample)
	env.Timeout = 50 * time.Millisecond
	res, err = run(t, env, "while ls >/dev/null; do cat a.txt > /dev/null; done", interp.Read)
	if err != nil || !res.TimedOut || res.ExitCode != 124 { // the loop has no end of its own
		t.Errorf("timeout: %+v, %v", res, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err = interp.Run(ctx, shelltest.Setup(t, b, shelltest.Sample), "while ls >/dev/null; do ls | cat | cat >/dev/null; done", interp.Read)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}

	res, err = run(t, shelltest.Setup(t, b, shelltest.Sample), "ls {1..3000000000}", interp.Read)
	if err != nil || res.ExitCode != 1 || !strings.Contains(res.Stderr, "brace expansion would exceed") {
		t.Errorf("brace bomb: %+v, %v", res, err)
	}
}
