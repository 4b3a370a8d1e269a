package tools

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspaceshell"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// ShellResult is the structured content of shell.
type ShellResult struct {
	ExitCode  int    `json:"exitCode"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
	TimedOut  bool   `json:"timedOut"`
}

type shellArgs struct {
	Command string `json:"command" jsonschema:"the command line, e.g. rg -n TODO src | head -20"`
}

var shellTool = newTool(spec[shellArgs, *ShellResult]{
	name: workspaceshell.ToolShell, skill: SkillWorkspaceShell,
	describe: func(s *Set) string {
		c := s.cfg
		mode := s.shellMode()
		cmds := strings.Join(interp.ShellCommands(mode), ", ")
		if c.Sources.HTTP() {
			cmds += ", and curl for the API-backed sources: only the requests their descriptors in " + path.Join(s.root, sources.SnapshotDir) +
				"/<source>/" + sources.DescriptorFile + " declare (materialize_sources writes them); sandboxd sends them and adds the credential"
		}
		what := "It changes no file, redirects included."
		if mode == workspaceshell.Write {
			what = fmt.Sprintf("mkdir, touch, cp, mv, rm and output redirects change files. Paths are relative to %s; paths matching %s are refused; each call is one journal commit.",
				s.root, strings.Join(c.Protect, ", "))
		}
		return fmt.Sprintf("Run a Bash-compatible command line for inspection in %s. Commands: %s. Pipes, redirects, && || ;, subshells, loops, globs and $(…) work; any other command is refused before anything runs. %s Output over %s stops the line.",
			s.root, cmds, what, kb(int64(c.MaxBytes)))
	},
	handle:    (*Set).runShell,
	readOnly:  func(s *Set) bool { return s.shellMode() != workspaceshell.Write },
	journaled: func(s *Set) bool { return s.shellMode() == workspaceshell.Write },
})

// shellMode is the workspace-shell profile's mode (read when unset).
func (s *Set) shellMode() workspaceshell.Mode {
	if s.shell.Mode == "" {
		return workspaceshell.Read
	}
	return s.shell.Mode
}

func (s *Set) runShell(ctx context.Context, p shellArgs, c *call) (Result, error) {
	if strings.TrimSpace(p.Command) == "" {
		return Result{}, invalid("command is required")
	}
	res, err := interp.Run(ctx, s.shellEnv(c), p.Command, s.shell.Mode)
	if err != nil {
		return Result{}, err
	}
	text := res.Stdout + res.Stderr
	if text == "" {
		text = "(no output)\n"
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return Result{Text: text + fmt.Sprintf("\n[Exit code %d.]", res.ExitCode), Structured: &ShellResult{
		ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated, TimedOut: res.TimedOut,
	}}, nil
}
