package workspaceshell

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
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
//   - git: GIT_CONFIG, GIT_CONFIG_* (injected configuration, e.g.
//     core.pager), GIT_SSH, GIT_SSH_COMMAND, GIT_EXEC_PATH, GIT_ASKPASS,
//     GIT_EDITOR, GIT_PAGER, GIT_PROXY_COMMAND, GIT_EXTERNAL_DIFF,
//     GIT_TEMPLATE_DIR (hooks);
//   - programs other tools start: SSH_ASKPASS, EDITOR, VISUAL, PAGER,
//     BROWSER, LESSOPEN, LESSCLOSE;
//   - configuration roots: HOME and XDG_CONFIG_HOME (pointing them into the
//     workspace makes ~/.gitconfig, ~/.npmrc … whatever the caller wrote),
//     NPM_CONFIG_* (npm's script-shell and friends).
//
// This is defence in depth, not a sandbox: an allowlisted executable's own
// arguments can make it run code (git -c, node -e), which is why the
// allowlist is the boundary.
var (
	deniedEnvNames = []string{
		"PATH", "NODE_OPTIONS", "NODE_PATH",
		"BASH_ENV", "ENV", "PROMPT_COMMAND", "PS4", "SHELLOPTS", "BASHOPTS", "IFS",
		"PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE",
		"PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB",
		"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
		"GIT_CONFIG", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH", "GIT_ASKPASS", "GIT_EDITOR",
		"GIT_PAGER", "GIT_PROXY_COMMAND", "GIT_EXTERNAL_DIFF", "GIT_TEMPLATE_DIR",
		"SSH_ASKPASS", "EDITOR", "VISUAL", "PAGER", "BROWSER", "LESSOPEN", "LESSCLOSE",
		"HOME", "XDG_CONFIG_HOME",
	}
	deniedEnvPrefixes = []string{"LD_", "DYLD_", "GIT_CONFIG_", "NPM_CONFIG_", "BASH_FUNC_"}
)

// DeniedEnv reports why workspace_exec refuses to set the variable key, or
// returns "" when it may be set.
func DeniedEnv(key string) string {
	up := strings.ToUpper(key)
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
		return workspace.Command{}, errorf(workspace.ErrForbidden, "workspace_exec is not configured: the profile has no commands")
	}
	if req.Command == "" {
		return workspace.Command{}, errorf(workspace.ErrInvalidArgument, "command is required")
	}
	if !s.Commands.Allows(req.Command) {
		if s.Commands.All {
			return workspace.Command{}, errorf(workspace.ErrInvalidArgument, "command %q is not an executable name or absolute path: %s", req.Command, checkExecutable(req.Command))
		}
		return workspace.Command{}, errorf(workspace.ErrForbidden, "command %q is not allowlisted: workspace_exec runs only %s", req.Command, strings.Join(s.Commands.Names, ", "))
	}
	for i, a := range req.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return workspace.Command{}, errorf(workspace.ErrInvalidArgument, "args[%d] contains a NUL byte", i)
		}
	}
	if root == "" {
		root = DefaultRoot
	}
	dir, err := workspace.Resolve(root, req.Cwd)
	if err != nil {
		kind := workspace.KindOf(err)
		if kind == nil {
			kind = workspace.ErrInvalidArgument
		}
		return workspace.Command{}, errorf(kind, "cwd %q: %s; it must stay inside the workspace (%s)", req.Cwd, errText(err), root)
	}
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !validEnvName(k) {
			return workspace.Command{}, errorf(workspace.ErrInvalidArgument, "env key %q is not a variable name", k)
		}
		if why := DeniedEnv(k); why != "" {
			return workspace.Command{}, errorf(workspace.ErrForbidden, "env key %s is refused: %s", k, why)
		}
		if strings.IndexByte(req.Env[k], 0) >= 0 {
			return workspace.Command{}, errorf(workspace.ErrInvalidArgument, "env %s contains a NUL byte", k)
		}
	}
	ms := s.TimeoutMS()
	if req.Timeout != nil {
		ms = *req.Timeout
		if ms <= 0 || ms > MaxTimeoutMS {
			return workspace.Command{}, errorf(workspace.ErrInvalidArgument, "timeout %d ms is out of range: it must be positive and at most %d", ms, MaxTimeoutMS)
		}
	}
	cmd := workspace.Command{
		Argv:    append([]string{req.Command}, req.Args...),
		Dir:     dir,
		Timeout: time.Duration(ms) * time.Millisecond,
	}
	if len(req.Env) > 0 {
		cmd.Env = make(map[string]string, len(req.Env))
		for k, v := range req.Env {
			cmd.Env[k] = v
		}
	}
	return cmd, nil
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

// Exec runs one workspace_exec call through bash (the session's Bash port):
// it validates the call with ExecCommand, then runs the executable without a
// shell. A session whose host permits no processes (bash nil) fails with
// workspace.ErrForbidden. As with the bash tool, a command that exits
// non-zero, is killed or times out is a Result, not an error. output, when
// not nil, receives the output as it arrives.
//
// Exec does not commit or roll back: the caller runs it inside a workspace
// session when the contract asks for one.
func Exec(ctx context.Context, bash workspace.Bash, s Settings, root string, req ExecRequest,
	output func(workspace.Stream, []byte)) (workspace.Result, error) {
	cmd, err := s.ExecCommand(root, req)
	if err != nil {
		return workspace.Result{}, err
	}
	if bash == nil {
		return workspace.Result{}, errorf(workspace.ErrForbidden, "workspace_exec cannot run %s: this session's host permits no processes", req.Command)
	}
	cmd.Output = output
	res, err := bash.Run(ctx, cmd)
	if err != nil {
		return res, fmt.Errorf("workspace_exec %s: %w", req.Command, err)
	}
	return res, nil
}
