package workspaceshell

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// ExecRequest is one workspace_exec call.
type ExecRequest struct {
	// Command is the executable: a name on the allowlist (looked up in the
	// session's PATH) or, with commands "all", any executable name or
	// absolute path.
	Command string `json:"command"`
	// Args are its arguments, passed as they are: no shell reads them.
	Args []string `json:"args,omitempty"`
	// Cwd is the working directory, relative to the workspace root (or
	// absolute inside it); "" is the root.
	Cwd string `json:"cwd,omitempty"`
	// Env adds variables to the command's environment; see DeniedEnv.
	Env map[string]string `json:"env,omitempty"`
	// Timeout in milliseconds; nil means the configured timeout.
	Timeout *int64 `json:"timeout,omitempty"`
}

// deniedEnvNames and deniedEnvPrefixes are the environment variables a
// workspace_exec call may not set, compared without regard to case. The
// contract names PATH, NODE_OPTIONS, NODE_PATH, LD_* and DYLD_*; sandboxd adds
// every variable that makes a shell, an interpreter, git or a tool it starts
// run code, load code or read a configuration chosen by the caller:
//
//   - shells: BASH_ENV, ENV (files run at start), PROMPT_COMMAND, PS4,
//     SHELLOPTS, BASHOPTS, IFS, BASH_FUNC_* (exported functions that stand in
//     for commands);
//   - interpreters: PYTHONSTARTUP, PYTHONPATH, PYTHONHOME, PYTHONUSERBASE,
//     PERL5OPT, PERL5LIB, PERLLIB, PERL5DB, RUBYOPT, RUBYLIB,
//     JAVA_TOOL_OPTIONS, _JAVA_OPTIONS, JDK_JAVA_OPTIONS;
//   - git: every GIT_* variable (GIT_DIR, GIT_WORK_TREE, GIT_CONFIG_*,
//     GIT_SEQUENCE_EDITOR, GIT_SSH_COMMAND, GIT_EXEC_PATH, …: git reads
//     dozens, many of which choose a program or a repository), but for the
//     author's and committer's names, e-mails and dates (allowedGitEnv);
//   - programs other tools start: SSH_ASKPASS, EDITOR, VISUAL, PAGER,
//     BROWSER, LESSOPEN, LESSCLOSE;
//   - configuration roots: HOME and XDG_CONFIG_HOME (pointing them into the
//     workspace makes ~/.gitconfig, ~/.npmrc … whatever the caller wrote),
//     NPM_CONFIG_* (npm's script-shell and friends).
//
// This is defence in depth, not a sandbox: an allowlisted executable's own
// arguments can make it run code (node -e, make), which is why the
// allowlist is the boundary; for the executables whose purpose includes
// running others, see argPolicies.
var (
	deniedEnvNames = []string{
		"PATH", "NODE_OPTIONS", "NODE_PATH",
		"BASH_ENV", "ENV", "PROMPT_COMMAND", "PS4", "SHELLOPTS", "BASHOPTS", "IFS",
		"PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE",
		"PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB",
		"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
		"SSH_ASKPASS", "EDITOR", "VISUAL", "PAGER", "BROWSER", "LESSOPEN", "LESSCLOSE",
		"HOME", "XDG_CONFIG_HOME",
	}
	deniedEnvPrefixes = []string{"LD_", "DYLD_", "GIT_", "NPM_CONFIG_", "BASH_FUNC_"}
	allowedGitEnv     = []string{"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
		"GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE"}
)

// DeniedEnv reports why workspace_exec refuses to set the variable key, or
// returns "" when it may be set.
func DeniedEnv(key string) string {
	up := strings.ToUpper(key)
	if slices.Contains(allowedGitEnv, up) {
		return ""
	}
	if slices.Contains(deniedEnvNames, up) {
		return key + " changes which programs or code a command runs"
	}
	for _, p := range deniedEnvPrefixes {
		if strings.HasPrefix(up, p) {
			return key + " (any " + p + "* variable) changes which programs or code a command runs"
		}
	}
	return ""
}

// ExecCommand validates a workspace_exec call against the settings and
// returns the command to give the Bash port: Argv (no shell), the working
// directory as a workspace name, the added environment and the timeout (the
// call's, else the configured one, else 60,000 ms). Failures carry
// workspace.ErrForbidden (workspace_exec not configured, command not
// allowlisted, a denied variable), workspace.ErrOutsideWorkspace (cwd leaves
// the root) or workspace.ErrInvalidArgument.
func (s Settings) ExecCommand(root string, req ExecRequest) (workspace.Command, error) {
	if !s.Commands.Set() {
		return workspace.Command{}, workspace.Errorf(workspace.ErrForbidden, "workspace_exec is not configured: the profile has no commands")
	}
	if req.Command == "" {
		return workspace.Command{}, workspace.Errorf(workspace.ErrInvalidArgument, "command is required")
	}
	if !s.Commands.Allows(req.Command) {
		if s.Commands.All {
			return workspace.Command{}, workspace.Errorf(workspace.ErrInvalidArgument, "command %q is not an executable name or absolute path: %s", req.Command, checkExecutable(req.Command))
		}
		return workspace.Command{}, workspace.Errorf(workspace.ErrForbidden, "command %q is not allowlisted: workspace_exec runs only %s", req.Command, strings.Join(s.Commands.Names, ", "))
	}
	for i, a := range req.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return workspace.Command{}, workspace.Errorf(workspace.ErrInvalidArgument, "args[%d] contains a NUL byte", i)
		}
	}
	name := path.Base(req.Command)
	if !s.Commands.All {
		if policy := argPolicies[name]; policy != nil {
			if why := policy(req.Args); why != "" {
				return workspace.Command{}, workspace.Errorf(workspace.ErrForbidden, "%s %s is refused: %s; the allowlist lets %s run, not the programs it would start (allowlist those instead)",
					req.Command, strings.Join(req.Args, " "), why, req.Command)
			}
		}
	}
	if root == "" {
		root = interp.DefaultRoot
	}
	dir, err := workspace.Resolve(root, req.Cwd)
	if err != nil {
		kind := workspace.KindOf(err)
		if kind == nil {
			kind = workspace.ErrInvalidArgument
		}
		return workspace.Command{}, workspace.Errorf(kind, "cwd %q: %s; it must stay inside the workspace (%s)", req.Cwd, interp.ErrorText(err), root)
	}
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !validEnvName(k) {
			return workspace.Command{}, workspace.Errorf(workspace.ErrInvalidArgument, "env key %q is not a variable name", k)
		}
		if why := DeniedEnv(k); why != "" {
			return workspace.Command{}, workspace.Errorf(workspace.ErrForbidden, "env key %s is refused: %s", k, why)
		}
		if strings.IndexByte(req.Env[k], 0) >= 0 {
			return workspace.Command{}, workspace.Errorf(workspace.ErrInvalidArgument, "env %s contains a NUL byte", k)
		}
	}
	ms := s.TimeoutMS()
	if req.Timeout != nil {
		ms = *req.Timeout
		if ms <= 0 || ms > MaxTimeoutMS {
			return workspace.Command{}, workspace.Errorf(workspace.ErrInvalidArgument, "timeout %d ms is out of range: it must be positive and at most %d", ms, MaxTimeoutMS)
		}
	}
	cmd := workspace.Command{
		Argv:    append([]string{req.Command}, req.Args...),
		Dir:     dir,
		Timeout: time.Duration(ms) * time.Millisecond,
	}
	if len(req.Env) > 0 {
		cmd.Env = maps.Clone(req.Env)
	}
	if name == "git" && !s.Commands.All {
		if cmd.Env == nil {
			cmd.Env = map[string]string{}
		}
		maps.Copy(cmd.Env, gitEnv)
	}
	return cmd, nil
}

// argPolicies are the argument checks of the executables whose purpose
// includes starting other programs, by base name; each returns why args are
// refused, or "". They apply when the allowlist names its commands
// (commands "all" allows every program already): without them, allowing
// git would allow `git -c alias.x='!sh …' x`, and allowing find, xargs or
// env any program at all. What they promise is narrow: the named
// executable does not start a program the call chose. Other executables on
// an allowlist are allowed with all their arguments — an interpreter (node,
// python, make) runs whatever it is given, and allowlisting one allows that.
var argPolicies = map[string]func(args []string) string{
	"git":  gitArgs,
	"find": findArgs,
	"env":  envArgs,
}

func init() {
	// Programs whose operands are a command to run: with arguments, they
	// are refused outright.
	for _, name := range []string{"xargs", "nice", "nohup", "timeout", "stdbuf", "setsid", "flock", "watch", "time",
		"sudo", "doas", "su", "runuser", "busybox", "ionice", "taskset", "chrt", "strace", "ltrace", "unshare",
		"nsenter", "chroot", "script", "parallel", "setpriv", "prlimit", "capsh"} {
		argPolicies[name] = func(args []string) string {
			if len(args) == 0 {
				return ""
			}
			return name + " runs the command its arguments name"
		}
	}
}

// findArgs refuses the actions that run a program.
func findArgs(args []string) string {
	for _, a := range args {
		switch a {
		case "-exec", "-execdir", "-ok", "-okdir":
			return "find " + a + " runs a program"
		}
	}
	return ""
}

// envArgs allows env to print the environment (with options and
// assignments), not to run a command.
func envArgs(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-S" || strings.HasPrefix(a, "--split-string") || strings.HasPrefix(a, "-S"):
			return "env -S runs a command"
		case a == "-u" || a == "--unset" || a == "-C" || a == "--chdir":
			i++ // takes the next argument
		case a == "--":
			if i+1 < len(args) && !strings.Contains(args[i+1], "=") {
				return "env runs the command " + args[i+1]
			}
		case strings.HasPrefix(a, "-"):
		case !strings.Contains(a, "="):
			return "env runs the command " + a
		}
	}
	return ""
}

// gitEnv is the environment every git that workspace_exec runs gets (when
// the allowlist names its commands): no system or user configuration, and
// the settings that name a program to run overridden above the
// repository's own configuration — hooks, fsmonitor, pager, editors, ssh,
// credential helpers, signing programs, external diff, the interactive
// diff filter — and no transport.
var gitEnv = func() map[string]string {
	env := map[string]string{
		"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
		"GIT_NO_REPLACE_OBJECTS": "1",
	}
	overrides := [][2]string{
		{"core.hooksPath", "/dev/null"}, {"core.fsmonitor", "false"}, {"core.pager", "cat"},
		{"core.editor", "false"}, {"sequence.editor", "false"}, {"core.sshCommand", "false"},
		{"core.askPass", "false"}, {"core.gitProxy", "false"}, {"credential.helper", ""},
		{"diff.external", ""}, {"interactive.diffFilter", "cat"}, {"gpg.program", "false"},
		{"gpg.ssh.program", "false"}, {"gpg.x509.program", "false"}, {"protocol.allow", "never"},
		{"core.alternateRefsCommand", ""}, {"uploadpack.packObjectsHook", ""},
	}
	env["GIT_CONFIG_COUNT"] = strconv.Itoa(len(overrides))
	for i, kv := range overrides {
		env["GIT_CONFIG_KEY_"+strconv.Itoa(i)], env["GIT_CONFIG_VALUE_"+strconv.Itoa(i)] = kv[0], kv[1]
	}
	return env
}()

// gitGlobalOptions are the options git may be given before its subcommand:
// none names a program, a configuration, a repository or a directory.
var gitGlobalOptions = []string{"--no-pager", "-P", "--no-replace-objects", "--literal-pathspecs", "--glob-pathspecs",
	"--noglob-pathspecs", "--icase-pathspecs", "--no-optional-locks", "--version", "-v", "-h"}

// gitSubcommands are the subcommands workspace_exec runs: git's own, which
// start no program the call chooses (with gitEnv). An alias is none of
// them, so no alias runs. Left out: those that run programs by design
// (submodule foreach, difftool, mergetool, filter-branch, help -w,
// instaweb), write git's configuration (config, remote, submodule, clone,
// worktree) or reach the network (fetch, pull, push, clone, ls-remote,
// archive --remote, send-email).
var gitSubcommands = []string{"add", "am", "apply", "bisect", "blame", "branch", "cat-file", "check-attr", "check-ignore",
	"checkout", "cherry", "cherry-pick", "clean", "commit", "count-objects", "describe", "diff", "diff-files", "diff-index",
	"diff-tree", "format-patch", "fsck", "gc", "grep", "hash-object", "init", "log", "ls-files", "ls-tree", "merge",
	"merge-base", "mv", "name-rev", "notes", "range-diff", "read-tree", "rebase", "reflog", "reset", "restore",
	"rev-list", "rev-parse", "revert", "rm", "shortlog", "show", "show-branch", "show-ref", "stash", "status",
	"switch", "symbolic-ref", "tag", "update-index", "update-ref", "var", "version", "whatchanged", "write-tree"}

// gitArgs allows git's global options that choose nothing, then a
// subcommand of gitSubcommands without the switches that run a program.
func gitArgs(args []string) string {
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		if !slices.Contains(gitGlobalOptions, args[i]) {
			return fmt.Sprintf("git's option %s (before the subcommand) is refused: it can set configuration, another repository or program; git may be given only %s there",
				args[i], strings.Join(gitGlobalOptions, " "))
		}
	}
	if i == len(args) {
		return ""
	}
	sub, rest := args[i], args[i+1:]
	if !slices.Contains(gitSubcommands, sub) {
		return fmt.Sprintf("git %s is not a subcommand workspace_exec runs (aliases, and subcommands that run programs, write git's configuration or reach the network, are refused)", sub)
	}
	for _, a := range rest {
		if a == "--" {
			break
		}
		opt, _, _ := strings.Cut(a, "=")
		switch {
		case sub == "rebase" && (opt == "--exec" || strings.HasPrefix(a, "-x") || a == "-i" || opt == "--interactive"),
			sub == "bisect" && a == "run",
			sub == "grep" && (opt == "--open-files-in-pager" || strings.HasPrefix(a, "-O")),
			sub == "init" && (opt == "--template" || opt == "--separate-git-dir"),
			opt == "--ext-diff" || opt == "--upload-pack" || opt == "--receive-pack" || opt == "--exec",
			opt == "--help": // starts the man viewer or a browser the configuration names

			return fmt.Sprintf("git %s %s runs a program", sub, opt)
		}
	}
	return ""
}

func validEnvName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
