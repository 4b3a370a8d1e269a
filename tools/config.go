package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/policy"
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
	cfg, err := DefaultConfig().With(data)
	if err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

// With returns c with the options of data, one JSON object, decoded over
// it; c itself is not changed. Options data leaves out keep c's values; a
// list given replaces c's, bashEnv adds to c's variables, and
// workspaceShell's keys go over c's. bashTimeoutMs, a default, is lowered
// to a bashMaxTimeoutMs that data sets below it, unless data sets it too.
// An unknown key or a value of the wrong type fails, naming the option;
// With does not validate the result (Validate does).
func (c Config) With(data []byte) (Config, error) {
	// A deep copy through JSON: decoding over c must not write into the
	// slices and maps c shares with its callers.
	raw, err := json.Marshal(c)
	if err != nil {
		return Config{}, err
	}
	var cfg Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return Config{}, err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return Config{}, fmt.Errorf("configuration: want one JSON object of options: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Config{}, &OptionError{Option: te.Field, Reason: fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)}
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return Config{}, fmt.Errorf("unknown option %s", f)
		}
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	_, setsDefault := keys["bashTimeoutMs"]
	if _, setsMax := keys["bashMaxTimeoutMs"]; setsMax && !setsDefault && cfg.BashMaxTimeoutMs > 0 {
		cfg.BashTimeoutMs = min(cfg.BashTimeoutMs, cfg.BashMaxTimeoutMs)
	}
	return cfg, nil
}

// OptionError is a bad configuration value; Option is its JSON name.
type OptionError struct {
	Option string
	Reason string
}

func (e *OptionError) Error() string { return "option " + e.Option + ": " + e.Reason }

// Caps is what a session's host gives its tool set, besides the
// configuration: what Check needs to know of it.
type Caps struct {
	// Bash says the workspace runs commands (Env.Bash is set). A host that
	// checks a configuration before its workspace is started, and knows
	// only then, says true.
	Bash bool
	// Scope is the actor's scope (Env.Scope), applied on top of the
	// configuration's visible and commit rules.
	Scope scope.Rules
}

// Check reports whether a tool set can be built with c over a host that
// gives caps: c is valid (Validate: an *OptionError), the actor's scope is
// valid, and every always-on skill can be active — its grant is given, and
// its tools can be offered (workspace.shell needs a Bash and a session
// without visible or commit rules). It is a pure function of its inputs,
// and what New checks; a host calls it before it starts a workspace.
func (c Config) Check(caps Caps) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if err := caps.Scope.Validate(); err != nil {
		return err
	}
	scoped := !c.Rules().IsZero() || !caps.Scope.IsZero()
	for _, a := range c.Always {
		sk := skillByName(a)
		switch {
		case sk.grant != "" && !slices.Contains(c.Grants, sk.grant):
			return fmt.Errorf("always-on skill %s needs the grant %s, which is not given", sk.name, sk.grant)
		case sk.name == "workspace.shell" && !caps.Bash:
			return errors.New("always-on skill workspace.shell needs a Bash (Env.Bash is nil)")
		case sk.name == "workspace.shell" && scoped:
			return errors.New("always-on skill workspace.shell: this session has visible/commit rules, which bind the file tools but not a command, so bash is not offered")
		}
	}
	return nil
}

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
		{"progressMs", c.ProgressMs}, {"bashBackgroundBytes", c.BashBackgroundBytes},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return bad(p.name, "must be positive, got %d", p.v)
		}
	}
	if c.BashBackground < 0 {
		return bad("bashBackground", "must be 0 (no background commands) or more, got %d", c.BashBackground)
	}
	if c.BashTimeoutMs > c.BashMaxTimeoutMs {
		return bad("bashTimeoutMs", "%d is above bashMaxTimeoutMs (%d): lower it, or leave it out to take the maximum", c.BashTimeoutMs, c.BashMaxTimeoutMs)
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
		if !slices.Contains(AllGrants, g) {
			return bad("grants", "unknown grant %q (grants are %s)", g, strings.Join(AllGrants, ", "))
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

// Within reports whether c, a session's configuration, stays within op, its
// operator's: a session may narrow every option and widen none. It returns
// nil, or a *policy.DeniedError for the first option (in Config's order) c
// widens, whose Setting is "options." and the option's name and whose Limit
// names the operator's value. The operator's Grants are those a session may
// hold: the ones it is given and the ones it may ask for.
//
// Each option has one rule (see ceilings): what is offered (tools, grants,
// bashEnvAllow, profile, sources) may only lose entries, and what is
// refused or hidden (protect, exclude) only gain them; limits, timeouts and
// counts may only fall; a switch that loosens (readImages, fuzzyEdit,
// bashInheritEnv) may only be turned off, and confine only kept on; bashEnv
// may add variables but not change the operator's; where spills go and the
// workspace's rules (spillDir, visible, commit) may not change. Running a
// program of any kind takes shell.exec: workspace_exec commands beyond the
// operator's need the session to hold it, as write mode needs fs.write.
// What only shapes how the tools are presented, or is bounded by the grants
// already (always, environmentSection, sectionOrder, bashSessionEnv,
// driver), is the session's to choose.
//
// Within judges the options as they are; it does not validate them
// (Validate does).
func (c Config) Within(op Config) error {
	for _, r := range ceilings {
		if r.check == nil {
			continue
		}
		if asked, limit := r.check(op, c); limit != "" {
			return &policy.DeniedError{Setting: "options." + r.option, Value: jsonText(asked), Limit: limit}
		}
	}
	return nil
}

// A ceiling says whether the session's s stays within the operator's op:
// it returns limit "" when it does, else what the session asked for and
// what the operator allows.
type ceiling func(op, s Config) (asked any, limit string)

// ceilings are Within's rules, one for every option of Config, in its
// order; a nil check is an option the session may set freely.
var ceilings = []struct {
	option string
	check  ceiling
}{
	{"tools", subset(func(c Config) []string { return c.Tools })},
	{"always", nil}, // activates only skills whose grants the session holds
	{"confine", onlyOn(func(c Config) bool { return c.Confine })},
	{"protect", superset(func(c Config) []string { return c.Protect })},
	{"exclude", superset(func(c Config) []string { return c.Exclude })},
	{"maxLines", atMost(func(c Config) int64 { return int64(c.MaxLines) })},
	{"maxBytes", atMost(func(c Config) int64 { return int64(c.MaxBytes) })},
	{"lsEntries", atMost(func(c Config) int64 { return int64(c.LsEntries) })},
	{"findResults", atMost(func(c Config) int64 { return int64(c.FindResults) })},
	{"grepMatches", atMost(func(c Config) int64 { return int64(c.GrepMatches) })},
	{"grepLineChars", atMost(func(c Config) int64 { return int64(c.GrepLineChars) })},
	{"maxFileBytes", atMost(func(c Config) int64 { return c.MaxFileBytes })},
	{"readImages", onlyOff(func(c Config) bool { return c.ReadImages })},
	{"fuzzyEdit", onlyOff(func(c Config) bool { return c.FuzzyEdit })},
	{"bashTimeoutMs", func(op, s Config) (any, string) { // a default, bounded by the operator's maximum
		if s.BashTimeoutMs <= op.BashMaxTimeoutMs {
			return nil, ""
		}
		return s.BashTimeoutMs, fmt.Sprintf("it may be at most the operator's bashMaxTimeoutMs %d", op.BashMaxTimeoutMs)
	}},
	{"bashMaxTimeoutMs", atMost(func(c Config) int64 { return c.BashMaxTimeoutMs })},
	{"bashEnv", func(op, s Config) (any, string) {
		for k, v := range op.BashEnv {
			if w, ok := s.BashEnv[k]; !ok || w != v {
				return s.BashEnv, fmt.Sprintf("it may add variables to the operator's %s, not change or remove them", jsonText(op.BashEnv))
			}
		}
		added := maps.Clone(s.BashEnv)
		maps.DeleteFunc(added, func(k, _ string) bool { _, ok := op.BashEnv[k]; return ok })
		if k, why := ExecEnv(added, s.Grants); why != "" {
			return map[string]string{k: added[k]}, why
		}
		return nil, ""
	}},
	{"bashInheritEnv", onlyOff(func(c Config) bool { return c.BashInheritEnv })},
	{"bashEnvAllow", subset(func(c Config) []string {
		if c.BashEnvAllow == nil {
			return workspace.DefaultEnvAllow
		}
		return c.BashEnvAllow
	})},
	{"bashSessionEnv", nil}, // tells commands the session's own ID and root
	{"bashBackground", atMost(func(c Config) int64 { return int64(c.BashBackground) })},
	{"bashBackgroundBytes", atMost(func(c Config) int64 { return c.BashBackgroundBytes })},
	{"spillDir", same(func(c Config) any { return c.SpillDir })},
	{"spillKeep", atMost(func(c Config) int64 { return int64(c.SpillKeep) })},
	{"progressMs", atMost(func(c Config) int64 { return c.ProgressMs })},
	{"environmentSection", nil}, // what the system prompt says
	{"sectionOrder", nil},
	{"grants", subset(func(c Config) []string { return c.Grants })},
	{"maxCallsPerRun", func(op, s Config) (any, string) { // 0 is no cap
		if op.MaxCallsPerRun == 0 || (s.MaxCallsPerRun > 0 && s.MaxCallsPerRun <= op.MaxCallsPerRun) {
			return nil, ""
		}
		return s.MaxCallsPerRun, fmt.Sprintf("it may be from 1 to the operator's %d (0 is no cap)", op.MaxCallsPerRun)
	}},
	{"profile", subset(func(c Config) []string { return c.Profiles() })},
	{"workspaceShell", workspaceShellWithin},
	{"driver", nil}, // what the workspace-shell profile offers; its commands are judged under workspaceShell
	{"sources", func(op, s Config) (any, string) {
		for _, d := range s.Sources {
			i := slices.IndexFunc(op.Sources, func(o sources.Decl) bool { return o.Name == d.Name })
			if i < 0 || jsonText(op.Sources[i]) != jsonText(d) {
				return d.Name, fmt.Sprintf("it may only pick among the operator's sources %q, unchanged", op.Sources.Names())
			}
		}
		return nil, ""
	}},
	{"visible", same(func(c Config) any { return c.Visible })},
	{"commit", same(func(c Config) any { return c.Commit })},
}

// workspaceShellWithin is the ceiling of the workspace-shell options.
// Commands run programs: a session may keep to the operator's, or set its
// own when it holds shell.exec, the grant that running a program takes.
// Write mode needs fs.write; the default timeout may only fall.
func workspaceShellWithin(op, s Config) (any, string) {
	o, w := op.ShellSettings(), s.ShellSettings()
	execGrant := slices.Contains(s.Grants, GrantShellExec)
	switch {
	case w.Commands.Set() && !execGrant && !commandsWithin(w.Commands, o.Commands):
		return w.Commands, fmt.Sprintf("workspace_exec runs programs, which takes the shell.exec grant; without it a session may only keep to the operator's commands %s", jsonText(o.Commands))
	case w.Mode == workspaceshell.Write && o.Mode != workspaceshell.Write && !w.WriteAccess:
		return w.Mode, "write mode takes the fs.write grant"
	case w.TimeoutMS() > o.TimeoutMS():
		return w.TimeoutMS(), fmt.Sprintf("its timeout may be at most the operator's %d ms", o.TimeoutMS())
	}
	return nil, ""
}

// ExecEnv returns the first variable of env (by name) that only a session
// holding shell.exec may set, and why: one that changes which programs or
// code a command runs (workspaceshell.DeniedEnv), which would let an
// allowlisted workspace_exec command run any program. It returns "", ""
// when grants hold shell.exec or env has none.
func ExecEnv(env map[string]string, grants []string) (key, why string) {
	if slices.Contains(grants, GrantShellExec) {
		return "", ""
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if why := workspaceshell.DeniedEnv(k); why != "" {
			return k, why + ", so a session sets it only with the shell.exec grant, which the operator's grants did not give it"
		}
	}
	return "", ""
}

// commandsWithin says whether the commands s allow are among those of op.
func commandsWithin(s, op workspaceshell.Commands) bool {
	if op.All {
		return true
	}
	return !s.All && !slices.ContainsFunc(s.Names, func(n string) bool { return !slices.Contains(op.Names, n) })
}

func atMost(get func(Config) int64) ceiling {
	return func(op, s Config) (any, string) {
		if get(s) <= get(op) {
			return nil, ""
		}
		return get(s), fmt.Sprintf("it may be at most the operator's %d", get(op))
	}
}

func subset(get func(Config) []string) ceiling {
	return func(op, s Config) (any, string) {
		if i := slices.IndexFunc(get(s), func(e string) bool { return !slices.Contains(get(op), e) }); i >= 0 {
			return get(s), fmt.Sprintf("it may only leave out entries of the operator's %s, not add %q", jsonText(get(op)), get(s)[i])
		}
		return nil, ""
	}
}

func superset(get func(Config) []string) ceiling {
	return func(op, s Config) (any, string) {
		if i := slices.IndexFunc(get(op), func(e string) bool { return !slices.Contains(get(s), e) }); i >= 0 {
			return get(s), fmt.Sprintf("it may only add to the operator's %s, not leave out %q", jsonText(get(op)), get(op)[i])
		}
		return nil, ""
	}
}

func same(get func(Config) any) ceiling {
	return func(op, s Config) (any, string) {
		if jsonText(get(s)) == jsonText(get(op)) {
			return nil, ""
		}
		return get(s), fmt.Sprintf("it is the operator's %s, which a session may not change", jsonText(get(op)))
	}
}

// onlyOff is a switch that loosens when on: a session may turn it off.
func onlyOff(get func(Config) bool) ceiling {
	return func(op, s Config) (any, string) {
		if !get(s) || get(op) {
			return nil, ""
		}
		return true, "the operator's is false, which a session may not turn on"
	}
}

// onlyOn is a switch that tightens when on: a session may turn it on.
func onlyOn(get func(Config) bool) ceiling {
	return func(op, s Config) (any, string) {
		if get(s) || !get(op) {
			return nil, ""
		}
		return false, "the operator's is true, which a session may not turn off"
	}
}

// jsonText is v as JSON, for messages and comparisons.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
