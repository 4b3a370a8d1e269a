package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
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

// AllTools are the seven workspace tools, in catalogue order.
var AllTools = []string{"read", "ls", "find", "grep", "write", "edit", "bash"}

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
	}
}

// LoadConfig reads a JSON configuration file over DefaultConfig: options the
// file leaves out keep their defaults. An unknown key, a value of the wrong
// type or a bad value fails, naming the option.
func LoadConfig(file string) (Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Config{}, err
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", file, err)
	}
	return cfg, nil
}

// ParseConfig is LoadConfig for JSON already in memory. Keys other than
// the options (another component's section of a shared file, say) are an
// error; a caller that shares a file decodes its own keys first and passes
// the rest.
func ParseConfig(data []byte) (Config, error) {
	cfg := DefaultConfig()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Config{}, fmt.Errorf("option %s: want %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return Config{}, fmt.Errorf("unknown option %s", f)
		}
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	if dec.More() {
		return Config{}, errors.New("configuration: more than one JSON value")
	}
	return cfg, cfg.Validate()
}

// OptionError is a bad configuration value; Option is its JSON name.
type OptionError struct {
	Option string
	Reason string
}

func (e *OptionError) Error() string { return "option " + e.Option + ": " + e.Reason }

// Validate reports the first bad option, as an *OptionError.
func (c Config) Validate() error {
	bad := func(opt, format string, args ...any) error {
		return &OptionError{Option: opt, Reason: fmt.Sprintf(format, args...)}
	}
	for _, t := range c.Tools {
		if !slices.Contains(AllTools, t) {
			return bad("tools", "unknown tool %q (tools are %s)", t, strings.Join(AllTools, ", "))
		}
	}
	for _, a := range c.Always {
		if skillByName(a) == nil {
			return bad("always", "unknown skill %q (skills are read, edit, shell)", a)
		}
	}
	if !c.Confine {
		return bad("confine", "must be true: every FileSystem adapter confines paths to the workspace root, and sandboxd has no unconfined mode")
	}
	if err := c.Protect.Validate(); err != nil {
		return bad("protect", "%v", err)
	}
	for _, x := range c.Exclude {
		if x == "" || !validGlob(x) {
			return bad("exclude", "invalid entry %q", x)
		}
	}
	positive := []struct {
		name string
		v    int64
	}{
		{"maxLines", int64(c.MaxLines)}, {"maxBytes", int64(c.MaxBytes)},
		{"lsEntries", int64(c.LsEntries)}, {"findResults", int64(c.FindResults)},
		{"grepMatches", int64(c.GrepMatches)}, {"grepLineChars", int64(c.GrepLineChars)},
		{"maxFileBytes", c.MaxFileBytes}, {"bashTimeoutMs", c.BashTimeoutMs},
		{"bashMaxTimeoutMs", c.BashMaxTimeoutMs}, {"spillKeep", int64(c.SpillKeep)},
		{"progressMs", c.ProgressMs},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return bad(p.name, "must be positive, got %d", p.v)
		}
	}
	if c.BashTimeoutMs > c.BashMaxTimeoutMs {
		return bad("bashTimeoutMs", "%d is above bashMaxTimeoutMs (%d)", c.BashTimeoutMs, c.BashMaxTimeoutMs)
	}
	for k := range c.BashEnv {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return bad("bashEnv", "invalid variable name %q", k)
		}
	}
	for _, a := range c.BashEnvAllow {
		if a == "" || strings.ContainsAny(a, "=\x00") {
			return bad("bashEnvAllow", "invalid entry %q", a)
		}
	}
	spill := path.Clean(c.SpillDir)
	if c.SpillDir == "" || path.IsAbs(spill) || spill == "." || spill == ".." || strings.HasPrefix(spill, "../") {
		return bad("spillDir", "%q must be a directory path relative to the workspace root", c.SpillDir)
	}
	for _, g := range c.Grants {
		if g != GrantFSWrite && g != GrantShellExec {
			return bad("grants", "unknown grant %q (grants are %s, %s)", g, GrantFSWrite, GrantShellExec)
		}
	}
	if c.MaxCallsPerRun < 0 {
		return bad("maxCallsPerRun", "must not be negative, got %d", c.MaxCallsPerRun)
	}
	if err := c.Rules().Validate(); err != nil {
		option := "visible"
		if (scope.Rules{Visible: c.Visible}).Validate() == nil {
			option = "commit"
		}
		return bad(option, "%v", err)
	}
	var de *sources.DeclError
	if err := c.Sources.Validate(); errors.As(err, &de) {
		return bad(de.Field, "%s", de.Reason)
	}
	for _, d := range c.Sources {
		cred := d.Credential
		if cred == nil || cred.Env == "" {
			continue
		}
		if c.BashInheritEnv {
			return bad("bashInheritEnv", "commands would inherit %s, the credential of source %s; list the variables they need in bashEnvAllow instead", cred.Env, d.Name)
		}
		allow := c.BashEnvAllow
		if allow == nil {
			allow = workspace.DefaultEnvAllow
		}
		if workspace.EnvAllowed(allow, cred.Env) {
			return bad("bashEnvAllow", "it lets commands see %s, the credential of source %s", cred.Env, d.Name)
		}
	}
	return c.validateProfiles()
}

// validateProfiles checks the profiles and, with workspace-shell, every
// definition-time diagnostic of the capability (all of them, in one
// *OptionError named after the first bad setting).
func (c Config) validateProfiles() error {
	profiles := c.Profiles()
	for _, p := range profiles {
		if p != ProfileWorkspaceTools && p != ProfileWorkspaceShell {
			return &OptionError{Option: "profile", Reason: fmt.Sprintf("unknown profile %q (profiles are %s, %s)", p, ProfileWorkspaceTools, ProfileWorkspaceShell)}
		}
	}
	if !slices.Contains(profiles, ProfileWorkspaceShell) {
		if c.WorkspaceShell != nil {
			return &OptionError{Option: "workspaceShell", Reason: "the workspace-shell options are set but the profile does not include workspace-shell (add it: profile workspace-tools,workspace-shell)"}
		}
		return nil
	}
	err := c.ShellSettings().Validate()
	if err == nil {
		return nil
	}
	var msgs []string
	var first string
	for _, e := range unjoin(err) {
		var se *workspaceshell.SettingError
		if errors.As(e, &se) && first == "" {
			first = se.Setting
		}
		msgs = append(msgs, e.Error())
	}
	if first == "" {
		first = "workspaceShell"
	}
	return &OptionError{Option: first, Reason: strings.TrimPrefix(strings.Join(msgs, "; "), first+": ")}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func validGlob(g string) bool {
	return workspace.Protect{g}.Validate() == nil
}
