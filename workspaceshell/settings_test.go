package workspaceshell_test

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

func ms(n int64) *int64 { return &n }

// TestValidate has every definition-time diagnostic of the contract.
func TestValidate(t *testing.T) {
	git := workspaceshell.Commands{Names: []string{"git"}}
	cases := []struct {
		name string
		s    workspaceshell.Settings
		want []string // each a "setting: …fragment" that must appear; none: valid
	}{
		{"defaults: read mode needs only read access", workspaceshell.Settings{}, nil},
		{"write mode with write access", workspaceshell.Settings{Mode: workspaceshell.Write, WriteAccess: true}, nil},
		{"provider with commands", workspaceshell.Settings{Mode: "write", Commands: git, Driver: "provider", WriteAccess: true, Timeout: ms(30_000)}, nil},
		{"commands all", workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{All: true}, Driver: "provider", WriteAccess: true}, nil},
		{"absolute path command", workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{Names: []string{"/usr/bin/git"}}, Driver: "provider", WriteAccess: true}, nil},
		{"timeout at the maximum", workspaceshell.Settings{Timeout: ms(2_147_483_647)}, nil},
		{"write mode needs write access", workspaceshell.Settings{Mode: "write"},
			[]string{"workspaceShell.mode: write mode needs write access"}},
		{"commands need write access", workspaceshell.Settings{Mode: "write", Commands: git, Driver: "provider"},
			[]string{"workspaceShell.mode: write mode needs write access", "workspaceShell.commands: commands needs write access"}},
		{"commands need write mode", workspaceshell.Settings{Commands: git, Driver: "provider", WriteAccess: true},
			[]string{`workspaceShell.commands: commands needs mode "write"`}},
		{"commands on a model driver point to bash", workspaceshell.Settings{Mode: "write", Commands: git, WriteAccess: true},
			[]string{"workspaceShell.commands: commands is for provider drivers only", "bash tool", "shell.exec"}},
		{"commands on a custom driver point to bash", workspaceshell.Settings{Mode: "write", Commands: git, Driver: "custom", WriteAccess: true},
			[]string{"custom-driven session runs programs with the bash tool instead (grant shell.exec)"}},
		{"whitespace in a command", provider("git status"), []string{"workspaceShell.commands[0]: \"git status\"", "whitespace"}},
		{"tab in a command", provider("git\t"), []string{"whitespace"}},
		{"control character in a command", provider("gi\x01t"), []string{"workspaceShell.commands[0]", "control character"}},
		{"relative path ./x", provider("./x"), []string{"must be absolute"}},
		{"relative path a/b", provider("a/b"), []string{"must be absolute"}},
		{"dot dot", provider(".."), []string{"relative path segment"}},
		{"dot", provider("."), []string{"relative path segment"}},
		{"absolute path with ..", provider("/usr/../bin/sh"), []string{"must be clean"}},
		{"empty command", provider(""), []string{"empty"}},
		{"second command named", provider("git", "go build"), []string{"workspaceShell.commands[1]"}},
		{"timeout zero", workspaceshell.Settings{Timeout: ms(0)}, []string{"workspaceShell.timeout: 0 ms is out of range", "positive", "2147483647"}},
		{"timeout negative", workspaceshell.Settings{Timeout: ms(-5)}, []string{"workspaceShell.timeout: -5 ms"}},
		{"timeout too large", workspaceshell.Settings{Timeout: ms(2_147_483_648)}, []string{"workspaceShell.timeout: 2147483648 ms"}},
		{"unknown mode", workspaceshell.Settings{Mode: "admin"}, []string{`workspaceShell.mode: "admin" is not a mode`}},
		{"unknown driver", workspaceshell.Settings{Driver: "robot"}, []string{`driver: "robot" is not a driver`}},
	}
	for _, tc := range cases {
		err := tc.s.Validate()
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: valid, want %q", tc.name, tc.want)
			continue
		}
		if !errors.Is(err, workspace.ErrInvalidArgument) {
			t.Errorf("%s: %v is not InvalidArgument", tc.name, err)
		}
		var se *workspaceshell.SettingError
		if !errors.As(err, &se) || !strings.HasPrefix(se.Setting, "workspaceShell.") && se.Setting != "driver" {
			t.Errorf("%s: %v names no setting", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}

func provider(names ...string) workspaceshell.Settings {
	return workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{Names: names}, Driver: "provider", WriteAccess: true}
}

func TestCommandsJSON(t *testing.T) {
	var s workspaceshell.Settings
	if err := json.Unmarshal([]byte(`{"mode":"write","commands":"all","timeout":30000}`), &s); err != nil {
		t.Fatal(err)
	}
	if !s.Commands.All || s.Mode != "write" || *s.Timeout != 30000 || s.TimeoutMS() != 30000 {
		t.Fatalf("decoded %+v", s)
	}
	if err := json.Unmarshal([]byte(`{"commands":["git","go"]}`), &s); err != nil || !reflect.DeepEqual(s.Commands.Names, []string{"git", "go"}) {
		t.Fatalf("decoded %+v, %v", s.Commands, err)
	}
	if err := json.Unmarshal([]byte(`{"commands":"git"}`), &s); err == nil || !strings.Contains(err.Error(), "workspaceShell.commands") {
		t.Fatalf("a string other than all: %v", err)
	}
	out, _ := json.Marshal(workspaceshell.Commands{All: true})
	if string(out) != `"all"` {
		t.Fatalf("marshal all = %s", out)
	}
	if c := workspaceshell.ParseCommands("git, go,,"); !reflect.DeepEqual(c.Names, []string{"git", "go"}) || c.All {
		t.Fatalf("ParseCommands = %+v", c)
	}
	if c := workspaceshell.ParseCommands("all"); !c.All {
		t.Fatalf("ParseCommands(all) = %+v", c)
	}
	if (workspaceshell.Settings{}).TimeoutMS() != 60000 {
		t.Fatal("default timeout is not 60000 ms")
	}
}

// TestCatalogue follows the contract's "Verify" steps.
func TestCatalogue(t *testing.T) {
	read := []string{"pwd", "ls", "find", "rg", "grep", "cat", "head", "tail", "wc"}
	write := append(append([]string{}, read...), "mkdir", "touch", "cp", "mv", "rm")
	cases := []struct {
		name string
		s    workspaceshell.Settings
		want *workspaceshell.CatalogueEntry
	}{
		{"model, read", workspaceshell.Settings{}, &workspaceshell.CatalogueEntry{Name: "workspaceShell", Mode: "read",
			Tools: []string{"shell", "materialize_sources"}, Commands: read}},
		{"custom, write", workspaceshell.Settings{Mode: "write", Driver: "custom", WriteAccess: true}, &workspaceshell.CatalogueEntry{
			Name: "workspaceShell", Mode: "write", Commands: write,
			Tools: []string{"shell", "materialize_sources", "writeFile", "appendFile", "makeDir", "copyPath", "movePath", "deletePath"}}},
		{"provider without commands", workspaceshell.Settings{Driver: "provider"}, nil},
		{"provider with commands", provider("git", "/usr/bin/make"), &workspaceshell.CatalogueEntry{Name: "workspaceShell", Mode: "write",
			Tools: []string{"workspace_exec"}, Exec: []string{"workspace_exec (git)", "workspace_exec (/usr/bin/make)"}}},
		{"provider with all", workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{All: true}, Driver: "provider", WriteAccess: true},
			&workspaceshell.CatalogueEntry{Name: "workspaceShell", Mode: "write", Tools: []string{"workspace_exec"}, Exec: []string{"workspace_exec (all)"}}},
	}
	for _, tc := range cases {
		got, err := tc.s.Catalogue()
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	// Step 4: commands on a model-backed agent fail tool resolution with a
	// diagnostic that points to our counterpart of sandbox().
	_, err := workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{Names: []string{"git"}}, WriteAccess: true}.Catalogue()
	if err == nil || !strings.Contains(err.Error(), "bash tool") || !strings.Contains(err.Error(), "shell.exec") {
		t.Fatalf("model driver with commands: %v", err)
	}
}

func TestExecCommand(t *testing.T) {
	git := provider("git")
	gitEnv := func(add map[string]string) map[string]string {
		env := maps.Clone(workspaceshell.GitEnv)
		maps.Copy(env, add)
		return env
	}
	cases := []struct {
		name string
		s    workspaceshell.Settings
		req  workspaceshell.ExecRequest
		want workspace.Command // when kind is nil
		kind *workspace.Kind
		msg  string
	}{
		{"allowlisted", git, workspaceshell.ExecRequest{Command: "git", Args: []string{"status", "--short"}},
			workspace.Command{Argv: []string{"git", "status", "--short"}, Dir: ".", Env: gitEnv(nil), Timeout: time.Minute}, nil, ""},
		{"cwd and env and timeout", git, workspaceshell.ExecRequest{Command: "git", Cwd: "src", Env: map[string]string{"GIT_AUTHOR_NAME": "a"}, Timeout: ms(1500)},
			workspace.Command{Argv: []string{"git"}, Dir: "src", Env: gitEnv(map[string]string{"GIT_AUTHOR_NAME": "a"}), Timeout: 1500 * time.Millisecond}, nil, ""},
		{"absolute cwd inside", git, workspaceshell.ExecRequest{Command: "git", Cwd: "/workspace/src/../docs"},
			workspace.Command{Argv: []string{"git"}, Dir: "docs", Env: gitEnv(nil), Timeout: time.Minute}, nil, ""},
		{"configured timeout", workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{Names: []string{"git"}}, Driver: "provider", WriteAccess: true, Timeout: ms(30_000)},
			workspaceshell.ExecRequest{Command: "git"}, workspace.Command{Argv: []string{"git"}, Dir: ".", Env: gitEnv(nil), Timeout: 30 * time.Second}, nil, ""},
		{"all allows any executable", workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{All: true}, Driver: "provider", WriteAccess: true},
			workspaceshell.ExecRequest{Command: "/usr/bin/env"}, workspace.Command{Argv: []string{"/usr/bin/env"}, Dir: ".", Timeout: time.Minute}, nil, ""},
		{"all refuses a command line", workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{All: true}, Driver: "provider", WriteAccess: true},
			workspaceshell.ExecRequest{Command: "sh -c x"}, workspace.Command{}, workspace.ErrInvalidArgument, "whitespace"},
		{"not allowlisted", git, workspaceshell.ExecRequest{Command: "sh"}, workspace.Command{}, workspace.ErrForbidden, `command "sh" is not allowlisted: workspace_exec runs only git`},
		{"not configured", workspaceshell.Settings{}, workspaceshell.ExecRequest{Command: "git"}, workspace.Command{}, workspace.ErrForbidden, "not configured"},
		{"cwd leaves the root", git, workspaceshell.ExecRequest{Command: "git", Cwd: "../x"}, workspace.Command{}, workspace.ErrOutsideWorkspace, `cwd "../x"`},
		{"absolute cwd outside", git, workspaceshell.ExecRequest{Command: "git", Cwd: "/etc"}, workspace.Command{}, workspace.ErrOutsideWorkspace, `cwd "/etc"`},
		{"timeout zero", git, workspaceshell.ExecRequest{Command: "git", Timeout: ms(0)}, workspace.Command{}, workspace.ErrInvalidArgument, "timeout 0 ms"},
		{"timeout too large", git, workspaceshell.ExecRequest{Command: "git", Timeout: ms(2_147_483_648)}, workspace.Command{}, workspace.ErrInvalidArgument, "at most 2147483647"},
		{"bad env name", git, workspaceshell.ExecRequest{Command: "git", Env: map[string]string{"A=B": "x"}}, workspace.Command{}, workspace.ErrInvalidArgument, "not a variable name"},
	}
	for _, key := range []string{"PATH", "NODE_OPTIONS", "NODE_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES",
		"BASH_ENV", "ENV", "PROMPT_COMMAND", "PYTHONSTARTUP", "PYTHONPATH", "PERL5OPT", "PERL5LIB", "RUBYOPT", "RUBYLIB",
		"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_SSH_COMMAND", "GIT_EXEC_PATH",
		"GIT_ASKPASS", "SSH_ASKPASS", "EDITOR", "VISUAL", "HOME", "npm_config_script_shell", "BASH_FUNC_x", "path",
		"GIT_DIR", "GIT_WORK_TREE", "GIT_SEQUENCE_EDITOR", "GIT_INDEX_FILE", "git_dir", "GIT_CONFIG_PARAMETERS"} {
		cases = append(cases, struct {
			name string
			s    workspaceshell.Settings
			req  workspaceshell.ExecRequest
			want workspace.Command
			kind *workspace.Kind
			msg  string
		}{"env " + key, git, workspaceshell.ExecRequest{Command: "git", Env: map[string]string{"OK": "1", key: "x"}}, workspace.Command{}, workspace.ErrForbidden, "env key " + key + " is refused"})
	}
	for _, tc := range cases {
		got, err := tc.s.ExecCommand("/workspace", tc.req)
		if tc.kind == nil {
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
			}
			continue
		}
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v; want %s saying %q", tc.name, err, tc.kind.Name(), tc.msg)
		}
	}
}

// TestExecArgumentPolicy: an allowlisted executable whose purpose includes
// starting others (git, find, env, xargs …) does not start one the call
// chose; its ordinary uses pass. Under commands "all" nothing is refused.
func TestExecArgumentPolicy(t *testing.T) {
	s := provider("git", "find", "env", "xargs", "timeout", "/usr/bin/git")
	for _, tc := range []struct {
		argv []string
		why  string // "" when allowed
	}{
		{[]string{"git", "status", "--short"}, ""},
		{[]string{"git", "--no-pager", "log", "-p", "--", "-x"}, ""},
		{[]string{"git", "commit", "-m", "msg", "-c", "HEAD"}, ""},
		{[]string{"git", "rebase", "main"}, ""},
		{[]string{"git"}, ""},
		{[]string{"git", "-c", "alias.x=!sh -c id", "x"}, "option -c"},
		{[]string{"git", "-c", "core.pager=sh -c id", "log"}, "option -c"},
		{[]string{"git", "--config-env=core.pager=X", "log"}, "option --config-env"},
		{[]string{"git", "--exec-path=/tmp", "status"}, "option --exec-path"},
		{[]string{"git", "-C", "/", "status"}, "option -C"},
		{[]string{"git", "--git-dir=/tmp/x", "status"}, "option --git-dir"},
		{[]string{"git", "--work-tree=/", "status"}, "option --work-tree"},
		{[]string{"/usr/bin/git", "-c", "core.hooksPath=x", "commit"}, "option -c"},
		{[]string{"git", "x"}, "git x is not a subcommand"},
		{[]string{"git", "config", "alias.x", "!sh"}, "git config is not a subcommand"},
		{[]string{"git", "submodule", "foreach", "sh"}, "git submodule"},
		{[]string{"git", "difftool"}, "git difftool"},
		{[]string{"git", "mergetool"}, "git mergetool"},
		{[]string{"git", "filter-branch"}, "git filter-branch"},
		{[]string{"git", "clone", "ext::sh -c id", "x"}, "git clone"},
		{[]string{"git", "rebase", "--exec", "sh -c id", "main"}, "git rebase --exec"},
		{[]string{"git", "rebase", "-x", "id", "main"}, "git rebase -x"},
		{[]string{"git", "rebase", "-i", "main"}, "git rebase -i"},
		{[]string{"git", "bisect", "run", "sh"}, "git bisect run"},
		{[]string{"git", "grep", "-Osh", "x"}, "git grep -Osh"},
		{[]string{"git", "diff", "--ext-diff"}, "git diff --ext-diff"},
		{[]string{"git", "init", "--template=evil", "sub"}, "git init --template"},
		{[]string{"git", "--help"}, "option --help"},
		{[]string{"git", "log", "--help"}, "git log --help"},
		{[]string{"git", "log", "-h"}, ""},
		{[]string{"find", ".", "-name", "*.go"}, ""},
		{[]string{"find", ".", "-exec", "sh", "-c", "id", ";"}, "find -exec"},
		{[]string{"find", ".", "-execdir", "id", "+"}, "find -execdir"},
		{[]string{"find", ".", "-ok", "id", ";"}, "find -ok"},
		{[]string{"env"}, ""},
		{[]string{"env", "-u", "X", "A=1"}, ""},
		{[]string{"env", "sh", "-c", "id"}, "env runs the command sh"},
		{[]string{"env", "A=1", "sh"}, "env runs the command sh"},
		{[]string{"env", "-u", "X", "--", "id"}, "env runs the command id"},
		{[]string{"env", "-S", "sh -c id"}, "env -S"},
		{[]string{"xargs"}, ""},
		{[]string{"xargs", "sh", "-c", "id"}, "xargs runs the command"},
		{[]string{"timeout", "5", "sh"}, "timeout runs the command"},
	} {
		_, err := s.ExecCommand("/workspace", workspaceshell.ExecRequest{Command: tc.argv[0], Args: tc.argv[1:]})
		switch {
		case tc.why == "" && err != nil:
			t.Errorf("%q: %v, want it allowed", tc.argv, err)
		case tc.why != "" && (!errors.Is(err, workspace.ErrForbidden) || !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), "allowlist those instead")):
			t.Errorf("%q: %v, want ErrForbidden saying %q", tc.argv, err, tc.why)
		}
		all := workspaceshell.Settings{Mode: "write", Commands: workspaceshell.Commands{All: true}, Driver: "provider", WriteAccess: true}
		if _, err := all.ExecCommand("/workspace", workspaceshell.ExecRequest{Command: tc.argv[0], Args: tc.argv[1:]}); err != nil {
			t.Errorf("commands all, %q: %v", tc.argv, err)
		}
	}
}
