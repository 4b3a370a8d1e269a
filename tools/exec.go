package tools

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// ExecMessage is the message of a workspace_exec commit, as the contract
// words it.
const ExecMessage = "workspace shell command"

// ExecResult is the structured content of workspace_exec: bash's, plus
// how the call's workspace session ended.
type ExecResult struct {
	BashResult
	// Committed says the command exited 0 and its changes were kept.
	Committed bool `json:"committed"`
	// Commit is the journal commit the changes made (0: nothing changed,
	// or the call ran in a provider session).
	Commit int `json:"commit,omitempty"`
	// Restored says the command failed and the workspace was put back.
	Restored bool `json:"restored,omitempty"`
	// Unrestored are paths that could not be put back exactly.
	Unrestored []string `json:"unrestored,omitempty"`
	// InSession says the call ran in the active provider session, whose end
	// commits or rolls back.
	InSession bool `json:"inSession,omitempty"`
	// OutOfScope are paths the command changed outside the session's commit
	// rules; they were put back and not committed.
	OutOfScope []string `json:"outOfScope,omitempty"`
	// Protected are paths the command changed under .sandboxd/, which only
	// sandboxd writes: put back, whether it succeeded or not.
	Protected []string `json:"protected,omitempty"`
}

type execArgs struct {
	Command string            `json:"command" jsonschema:"the executable: {{.Executables}}"`
	Args    []string          `json:"args,omitempty" jsonschema:"its arguments, passed as they are (no shell)"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory relative to {{.Root}} (default: the root)"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"variables to add (PATH, LD_*, DYLD_*, NODE_OPTIONS, BASH_ENV, GIT_CONFIG_* and others that make programs run code are refused)"`
	Timeout *int64            `json:"timeout,omitempty" jsonschema:"milliseconds (default {{.ExecTimeoutMS}}, at most {{.MaxExecTimeoutMS}})"`
}

var execTool = newTool(spec[execArgs, *ExecResult]{
	name: workspaceshell.ToolExec, skill: SkillWorkspaceShell,
	describe: func(s *Set) string {
		return fmt.Sprintf("Run one allowlisted executable (%s) without a shell, in the workspace or a directory of it. Runs in a workspace session: exit code 0 commits its changes to the journal (%q); anything else restores the workspace exactly and commits nothing. Default timeout %d ms. Returns the end of its output and how it ended.",
			s.argText().Executables, ExecMessage, s.shell.TimeoutMS())
	},
	constrain: func(props map[string]*jsonschema.Schema) {
		minimum(props, 1, "timeout")
		props["timeout"].Maximum = jsonschema.Ptr(float64(workspaceshell.MaxTimeoutMS))
	},
	handle: (*Set).workspaceExec,
})

func (s *Set) workspaceExec(ctx context.Context, p execArgs, c *call) (Result, error) {
	req := workspaceshell.ExecRequest(p)
	cmd, err := s.shell.ExecCommand(s.root, req)
	if err != nil {
		return Result{}, err
	}
	if s.env.Bash == nil {
		return Result{}, newError(workspace.ErrForbidden, "workspace_exec cannot run %s: this session's host permits no processes", req.Command)
	}
	if s.hidesPaths() {
		return Result{}, newError(workspace.ErrForbidden, "workspace_exec cannot run %s: this session has visible rules, which bind the file tools but not what a process reads", req.Command)
	}
	tr := s.egressTrace(c)
	if tr != nil {
		defer tr.Close()
	}
	env := s.commandEnv(c, tr)
	maps.Copy(env, cmd.Env)
	cmd.Env = env
	j, err := s.Journal(ctx)
	if err != nil {
		return Result{}, err
	}
	var res Result
	var br *BashResult
	out, err := j.Exec(ctx, ExecMessage, func(ctx context.Context) (bool, error) {
		var err error
		res, br, err = s.runCommand(ctx, c, tr, cmd.Timeout, func(ctx context.Context, output func(workspace.Stream, []byte)) (workspace.Result, error) {
			cmd.Output = output
			return s.env.Bash.Run(ctx, cmd)
		})
		return err == nil && br.ExitCode == 0 && !br.TimedOut && br.Signal == "", err
	})
	if br == nil || (err != nil && !out.Restored) {
		return Result{}, err
	}
	r := &ExecResult{BashResult: *br, Committed: out.Committed, Restored: out.Restored, Unrestored: out.Unrestored, InSession: out.InSession, OutOfScope: out.OutOfScope, Protected: out.Protected}
	if len(out.Protected) > 0 {
		res.Text += fmt.Sprintf("\n[Written in .sandboxd/, which only sandboxd writes: put back: %s.]", strings.Join(out.Protected, ", "))
	}
	if len(out.OutOfScope) > 0 {
		res.Text += fmt.Sprintf("\n[Outside this session's commit rules, put back and not committed: %s.]", strings.Join(out.OutOfScope, ", "))
	}
	if len(out.Unrestored) > 0 && !out.Restored {
		res.Text += "\n[Not put back exactly: " + strings.Join(out.Unrestored, "; ") + ".]"
	}
	switch {
	case out.InSession:
		res.Text += "\n[Ran in the active provider session: its changes are part of the session's result.]"
	case out.Commit != nil:
		r.Commit = out.Commit.ID
		sum := out.Commit.Summary()
		res.Commit = &sum
		res.Text += fmt.Sprintf("\n[Committed as journal commit %d (%d added, %d modified, %d deleted).]", sum.ID, sum.Added, sum.Modified, sum.Deleted)
	case out.Committed:
		res.Text += "\n[Committed: nothing changed.]"
	case out.Restored:
		res.Text += "\n[The command did not succeed: the workspace was restored as it was, and nothing was committed.]"
		if len(out.Unrestored) > 0 {
			res.Text += "\n[Not restored exactly: " + strings.Join(out.Unrestored, "; ") + ".]"
		}
	}
	res.Structured = r
	return res, nil
}
