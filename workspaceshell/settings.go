package workspaceshell

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode"

	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// Mode selects the tools of the profile: inspection only, or inspection plus
// the structured mutations. It is the shell's mode ([interp.Mode]).
type Mode = interp.Mode

// The modes.
const (
	Read  = interp.Read
	Write = interp.Write
)

// Driver is the kind of agent driving the session, as the contract names them.
type Driver string

const (
	// DriverModel is a model-backed agent: it gets shell, materialize_sources
	// and, in write mode, the mutation tools. The default.
	DriverModel Driver = "model"
	// DriverProvider is a coding agent that brings its own file tools: it gets
	// workspace_exec when commands are configured, and nothing else.
	DriverProvider Driver = "provider"
	// DriverCustom is a custom-run agent: it gets what a model-backed one gets.
	DriverCustom Driver = "custom"
)

// DefaultTimeoutMS is workspace_exec's timeout when neither the call nor the
// settings give one.
const DefaultTimeoutMS = 60_000

// MaxTimeoutMS is the largest timeout a setting or a call may give: the
// largest 32-bit signed integer, as the contract says.
const MaxTimeoutMS = 2_147_483_647

// Commands is workspace_exec's executable allowlist: a list of executable
// names or absolute paths, or every executable (All). The zero value
// configures none, and then there is no workspace_exec.
//
// In JSON it is an array of strings or the string "all".
type Commands struct {
	All   bool
	Names []string
}

// ParseCommands reads the command-line form: "all", or names separated by
// commas ("git,go"). Empty names are dropped; the names are not validated
// here (Settings.Validate does that).
func ParseCommands(s string) Commands {
	if strings.TrimSpace(s) == "all" {
		return Commands{All: true}
	}
	var c Commands
	for n := range strings.SplitSeq(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.Names = append(c.Names, n)
		}
	}
	return c
}

// Set reports whether any command is configured.
func (c Commands) Set() bool { return c.All || len(c.Names) > 0 }

// Allows reports whether workspace_exec may run command: a listed name or
// path, or, with All, any valid executable name or absolute path.
func (c Commands) Allows(command string) bool {
	if c.All {
		return checkExecutable(command) == ""
	}
	return slices.Contains(c.Names, command)
}

// MarshalJSON writes "all" or the list.
func (c Commands) MarshalJSON() ([]byte, error) {
	if c.All {
		return json.Marshal("all")
	}
	if c.Names == nil {
		return []byte("[]"), nil
	}
	return json.Marshal(c.Names)
}

// UnmarshalJSON reads "all" or a list of strings; any other string fails.
func (c *Commands) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		if s != "all" {
			return fmt.Errorf(`workspaceShell.commands: %q is neither a list of executables nor "all"`, s)
		}
		*c = Commands{All: true}
		return nil
	}
	var names []string
	if err := json.Unmarshal(data, &names); err != nil {
		return fmt.Errorf(`workspaceShell.commands: want a list of executables or "all": %w`, err)
	}
	*c = Commands{Names: names}
	return nil
}

// Settings are the workspace-shell profile's options, under the names of the
// contract ("mode", "commands", "timeout") and of the session it belongs to
// (the driver, and whether the session may write to the workspace).
type Settings struct {
	// Mode is "read" (the default when empty) or "write".
	Mode Mode `json:"mode,omitempty"`
	// Commands is workspace_exec's allowlist; provider drivers only.
	Commands Commands `json:"commands"`
	// Timeout is workspace_exec's default timeout in milliseconds; nil means
	// DefaultTimeoutMS. A set value must be positive and at most MaxTimeoutMS.
	Timeout *int64 `json:"timeout,omitempty"`
	// Driver is the kind of agent: "model" (the default when empty),
	// "provider" or "custom". It is the session's, not an option of the
	// profile (a configuration file names it beside "workspaceShell").
	Driver Driver `json:"-"`
	// WriteAccess says the session may change the workspace (its fs.write
	// grant). Write mode and commands need it.
	WriteAccess bool `json:"-"`
}

// SettingError is one definition-time diagnostic: the setting it is about
// and what is wrong. It matches workspace.ErrInvalidArgument.
type SettingError struct {
	Setting string // "workspaceShell.mode", "workspaceShell.commands[2]", …
	Message string
}

func (e *SettingError) Error() string { return e.Setting + ": " + e.Message }
func (e *SettingError) Unwrap() error { return workspace.ErrInvalidArgument }

// Validate checks the settings the way the contract checks an agent
// definition, before any tool is resolved, and returns every diagnostic
// (errors.Join of *SettingError, each naming its setting), or nil:
//
//   - mode is "read" or "write"; driver is "model", "provider" or "custom";
//   - write mode needs write access, and so does any commands value;
//   - commands needs the provider driver: other drivers are pointed to the
//     bash tool and its shell.exec grant, sandboxd's way to run programs;
//   - each command is an executable name or an absolute path: no
//     whitespace, no control characters, no relative path segments;
//   - timeout is positive and at most 2,147,483,647 ms.
func (s Settings) Validate() error {
	var errs []error
	bad := func(setting, format string, args ...any) {
		errs = append(errs, &SettingError{Setting: "workspaceShell." + setting, Message: fmt.Sprintf(format, args...)})
	}
	mode := s.Mode.OrRead()
	switch mode {
	case Read, Write:
	default:
		bad("mode", `%q is not a mode: use "read" or "write"`, string(s.Mode))
	}
	driver := s.driver()
	switch driver {
	case DriverModel, DriverProvider, DriverCustom:
	default:
		errs = append(errs, &SettingError{Setting: "driver", Message: fmt.Sprintf(`%q is not a driver: use "model", "provider" or "custom"`, string(s.Driver))})
	}
	if mode == Write && !s.WriteAccess {
		bad("mode", `write mode needs write access to the workspace (the session's fs.write grant); without it use mode "read"`)
	}
	if s.Commands.Set() {
		if !s.WriteAccess {
			bad("commands", "commands needs write access to the workspace (the session's fs.write grant)")
		}
		if mode != Write {
			bad("commands", `commands needs mode "write"`)
		}
		if driver == DriverModel || driver == DriverCustom {
			bad("commands", "commands is for provider drivers only; a %s-driven session runs programs with the bash tool instead (grant shell.exec)", driver)
		}
		for i, name := range s.Commands.Names {
			if why := checkExecutable(name); why != "" {
				bad(fmt.Sprintf("commands[%d]", i), "%q is not an executable name or absolute path: %s", name, why)
			}
		}
	}
	if s.Timeout != nil {
		if t := *s.Timeout; t <= 0 || t > MaxTimeoutMS {
			bad("timeout", "%d ms is out of range: the timeout must be a positive number of milliseconds no greater than %d", t, MaxTimeoutMS)
		}
	}
	return errors.Join(errs...)
}

func (s Settings) driver() Driver {
	if s.Driver == "" {
		return DriverModel
	}
	return s.Driver
}

// TimeoutMS is the configured default timeout of workspace_exec.
func (s Settings) TimeoutMS() int64 {
	if s.Timeout != nil {
		return *s.Timeout
	}
	return DefaultTimeoutMS
}

// checkExecutable says why name is not an executable name ("git") or an
// absolute path ("/usr/bin/git"), or returns "".
func checkExecutable(name string) string {
	if name == "" {
		return "it is empty"
	}
	for _, r := range name {
		switch {
		case unicode.IsSpace(r):
			return "it contains whitespace (commands are executables, never command lines)"
		case unicode.IsControl(r) || r == unicode.ReplacementChar:
			return "it contains a control character"
		}
	}
	if !strings.Contains(name, "/") {
		if name == "." || name == ".." {
			return "it is a relative path segment"
		}
		return ""
	}
	if !path.IsAbs(name) {
		return "a path must be absolute (relative paths depend on the working directory)"
	}
	for seg := range strings.SplitSeq(name[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "an absolute path must be clean: no empty, . or .. segments"
		}
	}
	return ""
}

// Tool names of the profile.
const (
	ToolShell              = "shell"
	ToolMaterializeSources = "materialize_sources"
	ToolWriteFile          = "writeFile"
	ToolAppendFile         = "appendFile"
	ToolMakeDir            = "makeDir"
	ToolCopyPath           = "copyPath"
	ToolMovePath           = "movePath"
	ToolDeletePath         = "deletePath"
	ToolExec               = "workspace_exec"
)

// CatalogueEntry is the profile's entry in the tool catalogue (sandboxd tools
// --json), the counterpart of the contract's "workspaceShell" entry.
type CatalogueEntry struct {
	Name string `json:"name"` // always "workspaceShell"
	Mode Mode   `json:"mode"`
	// Tools are the tools the agent receives, in order.
	Tools []string `json:"tools"`
	// Commands are the shell tool's commands (absent for a provider driver,
	// which gets no shell).
	Commands []string `json:"commands,omitempty"`
	// Exec has one "workspace_exec (<command>)" item per allowlisted
	// executable; "workspace_exec (all)" when every executable is allowed.
	Exec []string `json:"exec,omitempty"`
}

// Catalogue validates the settings and returns the catalogue entry they give,
// or nil when they give no tool (a provider driver without commands, which
// works in the workspace with its own tools).
func (s Settings) Catalogue() (*CatalogueEntry, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	mode := s.Mode.OrRead()
	e := &CatalogueEntry{Name: "workspaceShell", Mode: mode}
	if s.driver() == DriverProvider {
		if !s.Commands.Set() {
			return nil, nil
		}
		e.Tools = []string{ToolExec}
		if s.Commands.All {
			e.Exec = []string{ToolExec + " (all)"}
		}
		for _, n := range s.Commands.Names {
			e.Exec = append(e.Exec, ToolExec+" ("+n+")")
		}
		return e, nil
	}
	e.Tools = []string{ToolShell, ToolMaterializeSources}
	if mode == Write {
		e.Tools = append(e.Tools, ToolWriteFile, ToolAppendFile, ToolMakeDir, ToolCopyPath, ToolMovePath, ToolDeletePath)
	}
	e.Commands = interp.ShellCommands(mode)
	return e, nil
}
