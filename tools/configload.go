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
