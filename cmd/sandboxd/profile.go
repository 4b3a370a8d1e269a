package main

import (
	"flag"
	"strconv"

	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// shellFlags are the flags of the tool profiles and the workspace-shell
// profile, shared by "sandboxd mcp" and "sandboxd tools". Each replaces the
// configuration file's value; the settings are validated with the rest of
// the configuration, so a bad combination stops the start with the
// contract's diagnostic.
type shellFlags struct {
	profile, mode, commands, driver, timeout string
}

func (f *shellFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.profile, "profile", "", "tool `profiles`, comma separated: workspace-tools (default), workspace-shell")
	fs.StringVar(&f.mode, "mode", "", "workspace-shell `mode`: read (default) or write (needs --grant fs.write)")
	fs.StringVar(&f.commands, "commands", "", "workspace_exec's allowlist: `names` or absolute paths, comma separated, or all (provider driver, write mode)")
	fs.StringVar(&f.driver, "driver", "", "the kind of agent: model (default), provider or custom")
	fs.StringVar(&f.timeout, "exec-timeout", "", "workspace_exec's default timeout in `ms` (default 60000)")
}

// apply puts the flags given into cfg. Any workspace-shell flag creates the
// profile's options, which select the profile when --profile is not given.
func (f *shellFlags) apply(cfg *tools.Config) error {
	if f.profile != "" {
		cfg.Profile = tools.ParseProfiles(f.profile)
	}
	if f.driver != "" {
		cfg.Driver = workspaceshell.Driver(f.driver)
	}
	if f.mode == "" && f.commands == "" && f.timeout == "" {
		return nil
	}
	if cfg.WorkspaceShell == nil {
		cfg.WorkspaceShell = &workspaceshell.Settings{}
	}
	if f.mode != "" {
		cfg.WorkspaceShell.Mode = workspaceshell.Mode(f.mode)
	}
	if f.commands != "" {
		cfg.WorkspaceShell.Commands = workspaceshell.ParseCommands(f.commands)
	}
	if f.timeout != "" {
		ms, err := strconv.ParseInt(f.timeout, 10, 64)
		if err != nil {
			return usagef("--exec-timeout: %q is not a number of milliseconds", f.timeout)
		}
		cfg.WorkspaceShell.Timeout = &ms
	}
	return nil
}
