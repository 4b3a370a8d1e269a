package tools

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// Config is every option of the workspace tools, under the names of the
// contract's configuration table (they are also the keys of sandboxd's JSON
// configuration file). Start from DefaultConfig: the zero Config is not
// valid, and New refuses it with a message naming the first bad option.
type Config struct {
	// Tools are the tools to register (default: all seven).
	Tools []string `json:"tools"`
	// Always are the skills active from the first step: "read", "edit",
	// "shell" (or their full names, "workspace.edit", …). Default ["read"].
	// New fails when one of them needs a grant the session lacks.
	Always []string `json:"always"`
	// Confine refuses paths outside the workspace. It must be true: the
	// FileSystem port confines every name to the root, so sandboxd has no
	// unconfined mode (Validate says so).
	Confine bool `json:"confine"`
	// Protect are the globs write and edit refuse.
	Protect workspace.Protect `json:"protect"`
	// Exclude are the names (or, with a slash, root-relative paths) find and
	// grep skip.
	Exclude workspace.Exclude `json:"exclude"`
	// MaxLines and MaxBytes bound what read, find and grep show, and the tail
	// of its output bash keeps.
	MaxLines int `json:"maxLines"`
	MaxBytes int `json:"maxBytes"`
	// LsEntries, FindResults and GrepMatches cap ls, find and grep; a call's
	// limit may ask for less, never more.
	LsEntries   int `json:"lsEntries"`
	FindResults int `json:"findResults"`
	GrepMatches int `json:"grepMatches"`
	// GrepLineChars is the width grep cuts lines to before matching them.
	GrepLineChars int `json:"grepLineChars"`
	// MaxFileBytes is the largest file read, edit and grep load, and the most
	// of a command's output bash saves.
	MaxFileBytes int64 `json:"maxFileBytes"`
	// ReadImages makes read return PNG, JPEG, GIF and WebP files as images;
	// when false they are reported as binary files.
	ReadImages bool `json:"readImages"`
	// FuzzyEdit enables edit's normalised fallback match.
	FuzzyEdit bool `json:"fuzzyEdit"`
	// BashTimeoutMs is a command's default timeout; BashMaxTimeoutMs the most
	// a call may ask for.
	BashTimeoutMs    int64 `json:"bashTimeoutMs"`
	BashMaxTimeoutMs int64 `json:"bashMaxTimeoutMs"`
	// BashEnv is added to every command's environment.
	BashEnv map[string]string `json:"bashEnv"`
	// BashInheritEnv and BashEnvAllow say which host variables a local
	// command sees. The tool layer does not read the host environment: the
	// host passes these two to the adapter it builds (localexec).
	BashInheritEnv bool     `json:"bashInheritEnv"`
	BashEnvAllow   []string `json:"bashEnvAllow"`
	// BashSessionEnv adds SANDBOXD_SESSION_ID, SANDBOXD_RUN_ID and
	// SANDBOXD_WORKSPACE to every command's environment.
	BashSessionEnv bool `json:"bashSessionEnv"`
	// BashKeepState carries the working directory and the exported
	// variables of one bash call over to the next, as a terminal would
	// (bash only; other shell state does not carry over). Off by default:
	// each call is a new shell in the workspace root, as the tool's
	// description tells the model.
	BashKeepState bool `json:"bashKeepState"`
	// BashBackground is how many background commands (bash with
	// background: true, read with bash_output, stopped with bash_kill) a
	// session keeps at once, running or ended (an ended one is forgotten to
	// make room for a new one); 0 offers none. Default 4.
	BashBackground int `json:"bashBackground"`
	// BashBackgroundBytes is how much of a background command's output is
	// kept for bash_output: the newest bytes; what is dropped is counted
	// and said. Default 1 MiB.
	BashBackgroundBytes int64 `json:"bashBackgroundBytes"`
	// SpillDir is where bash saves whole outputs (a workspace path), and
	// SpillKeep how many of them stay.
	SpillDir  string `json:"spillDir"`
	SpillKeep int    `json:"spillKeep"`
	// ProgressMs is how long bash output gathers before it is published as a
	// progress event.
	ProgressMs int64 `json:"progressMs"`
	// EnvironmentSection enables the system-prompt section about the
	// workspace; SectionOrder is its place among a prompt's sections.
	EnvironmentSection bool `json:"environmentSection"`
	SectionOrder       int  `json:"sectionOrder"`
	// Grants are the permissions of tool discovery: "fs.write" (write, edit)
	// and "shell.exec" (bash). None by default: the agent can only look.
	Grants []string `json:"grants"`
	// MaxCallsPerRun caps tool calls in one run (0: no cap). Default 64,
	// the contract's, for hosts whose agents have turns; sandboxd mcp has
	// none, and no cap unless its configuration sets one.
	MaxCallsPerRun int `json:"maxCallsPerRun"`
	// Profile selects the tool profiles: "workspace-tools" (the seven
	// tools and load_skill), "workspace-shell" (the workspace-shell
	// capability), or both. In JSON a list or a comma-separated string.
	// Empty: workspace-shell when WorkspaceShell is set, else
	// workspace-tools (see Profiles).
	Profile Profiles `json:"profile,omitempty"`
	// WorkspaceShell are the workspace-shell profile's options: "mode",
	// "commands", "timeout". Its write access is the fs.write grant.
	WorkspaceShell *workspaceshell.Settings `json:"workspaceShell,omitempty"`
	// Driver is the kind of agent driving the session: "model" (default),
	// "provider" or "custom". It decides what the workspace-shell profile
	// gives (a provider gets only workspace_exec, and only with commands).
	Driver workspaceshell.Driver `json:"driver,omitempty"`
	// Sources are the session's declared sources, which materialize_sources
	// copies into .sandboxd/sources/<name>/ (see package sources): each
	// {"name", "kind": "dir"|"tar"|"git", "path", "commit" (git)}.
	Sources sources.Decls `json:"sources,omitempty"`
	// Visible and Commit are the workspace's rules (package scope):
	// doublestar globs of the workspace names every tool shows, and of
	// those it may change, on top of Protect. nil: everything. The rules
	// bind the file tools, not what a process does, so a session with rules
	// is offered no bash, and workspace_exec only under commit rules alone
	// (the journal then puts back what the process changed outside them).
	Visible []string `json:"visible,omitempty"`
	Commit  []string `json:"commit,omitempty"`
}

// Rules are the configuration's visible and commit rules.
func (c Config) Rules() scope.Rules { return scope.Rules{Visible: c.Visible, Commit: c.Commit} }

// The tool profiles.
const (
	ProfileWorkspaceTools = "workspace-tools"
	ProfileWorkspaceShell = "workspace-shell"
)

// Profiles is a list of profile names; JSON takes a list or a string of
// comma-separated names.
type Profiles []string

// UnmarshalJSON reads ["a","b"] or "a,b".
func (p *Profiles) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		*p = ParseProfiles(s)
		return nil
	}
	var l []string
	if err := json.Unmarshal(data, &l); err != nil {
		return &OptionError{Option: "profile", Reason: "want a profile name, a comma-separated string of them, or a list"}
	}
	*p = l
	return nil
}

// ParseProfiles reads "workspace-tools,workspace-shell".
func ParseProfiles(s string) Profiles {
	var p Profiles
	for n := range strings.SplitSeq(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			p = append(p, n)
		}
	}
	return p
}

// Profiles returns the profiles the configuration selects: Profile when
// set; otherwise workspace-shell when its options are given, else
// workspace-tools.
func (c Config) Profiles() []string {
	switch {
	case len(c.Profile) > 0:
		return c.Profile
	case c.WorkspaceShell != nil:
		return []string{ProfileWorkspaceShell}
	}
	return []string{ProfileWorkspaceTools}
}

// ShellSettings returns the workspace-shell profile's settings: its
// options, the driver, and write access from the fs.write grant.
func (c Config) ShellSettings() workspaceshell.Settings {
	var s workspaceshell.Settings
	if c.WorkspaceShell != nil {
		s = *c.WorkspaceShell
	}
	s.Driver = c.Driver
	s.WriteAccess = slices.Contains(c.Grants, GrantFSWrite)
	return s
}

// The grants skills need.
const (
	GrantFSWrite   = "fs.write"
	GrantShellExec = "shell.exec"
)

// Default limits of the contract.
const (
	DefaultMaxLines      = 2000
	DefaultMaxBytes      = 50 * 1024
	DefaultMaxFileBytes  = 32 << 20
	DefaultSpillDir      = ".sandboxd/runtime/tool-output"
	MaxImageBytes        = 3932160 // 3.75 MiB
	MaxImageSide         = 8000
	DefaultSectionOrder  = 800
	DefaultMaxCallsRun   = 64
	DefaultBashTimeoutMs = 120_000
)

// AllTools are the seven workspace tools, in catalogue order (the
// catalogue's tools of the workspace-tools profile's skills).
var AllTools []string

// AllGrants are the grants there are.
var AllGrants = []string{GrantFSWrite, GrantShellExec}

// DefaultConfig returns the contract's defaults.
func DefaultConfig() Config {
	return Config{
		Tools:              slices.Clone(AllTools),
		Always:             []string{"read"},
		Confine:            true,
		Protect:            slices.Clone(workspace.DefaultProtect),
		Exclude:            slices.Clone(workspace.DefaultExclude),
		MaxLines:           DefaultMaxLines,
		MaxBytes:           DefaultMaxBytes,
		LsEntries:          500,
		FindResults:        1000,
		GrepMatches:        100,
		GrepLineChars:      500,
		MaxFileBytes:       DefaultMaxFileBytes,
		ReadImages:         true,
		FuzzyEdit:          true,
		BashTimeoutMs:      DefaultBashTimeoutMs,
		BashMaxTimeoutMs:   600_000,
		BashEnv:            map[string]string{},
		BashEnvAllow:       slices.Clone(workspace.DefaultEnvAllow),
		SpillDir:           DefaultSpillDir,
		SpillKeep:          50,
		ProgressMs:         250,
		EnvironmentSection: true,
		SectionOrder:       DefaultSectionOrder,
		MaxCallsPerRun:     DefaultMaxCallsRun,

		BashBackground:      4,
		BashBackgroundBytes: 1 << 20,
	}
}
