package runner

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"
)

// Settings are what a session asks for when it is created. Zero fields
// take the operator's defaults; the operator's word is a ceiling: anything
// beyond it is refused, naming the setting and the operator's value.
type Settings struct {
	// Image is the container image; "" is the policy's default.
	Image string `json:"image,omitempty"`
	// Runtime is the OCI runtime; "" is the policy's default.
	Runtime string `json:"runtime,omitempty"`
	// Network is the network mode; "" is none.
	Network string `json:"network,omitempty"`
	// Privileged, CapAdd, HostMounts, WritableRootfs and RootUser relax the
	// hardened profile, as far as the policy allows.
	Privileged     bool     `json:"privileged,omitempty"`
	CapAdd         []string `json:"capAdd,omitempty"`
	HostMounts     []Mount  `json:"hostMounts,omitempty"`
	WritableRootfs bool     `json:"writableRootfs,omitempty"`
	RootUser       bool     `json:"rootUser,omitempty"`
	// Limits are the container's resource limits.
	Limits Limits `json:"limits,omitzero"`
	// Grants are the permissions of tool discovery: "fs.write", "shell.exec".
	Grants []string `json:"grants,omitempty"`
	// Always are the skills active from the first step; nil keeps the
	// operator's.
	Always []string `json:"always,omitempty"`
	// Options are tool options (maxLines, bashTimeoutMs, …) over the
	// operator's, each of which they may narrow and none widen
	// (tools.Config.Within: a limit at most the operator's, protect only
	// added to, …). The host-facing ones (bashInheritEnv, bashEnvAllow),
	// the operator's rules and sources, and those with settings of their
	// own (grants, always) are refused here.
	Options json.RawMessage `json:"options,omitempty"`
	// Sources names the operator's declared sources this session gets
	// (materialize_sources, the shell's curl); nil: all of them, an empty
	// list: none. A session cannot declare a source of its own: a source
	// reads host files or holds a credential.
	Sources []string `json:"sources,omitempty"`
	// Scope is the actor's scope: globs of what this session's agent may
	// see and change, narrowing the operator's visible and commit rules
	// (package scope). A scoped session is offered no bash; workspace_exec
	// runs only when it is scoped by commit rules alone.
	Scope scope.Rules `json:"scope,omitzero"`
	// Vars are added to every command's environment. One that changes
	// which programs or code a command runs (LD_PRELOAD, PATH, GIT_SSH, …)
	// needs the shell.exec grant: without it, commands are only
	// workspace_exec's allowlisted ones.
	Vars map[string]string `json:"vars,omitempty"`
	// Lifetime ends the session that long after it was created, and
	// IdleTimeout when no call was made for that long; zero is the
	// operator's default, more than the operator's maximum is refused.
	Lifetime    Duration `json:"lifetime,omitzero"`
	IdleTimeout Duration `json:"idleTimeout,omitzero"`
	// Egress is what this session's commands may reach through its egress
	// proxy: "HOST:PORT" rules and preset names (package egress), each
	// within the operator's (egress.allow) and the tenant's; nil keeps
	// theirs, an empty list is no egress.
	Egress []string `json:"egress,omitzero"`
	// Secrets names the operator's secrets (WithSecrets) this session's
	// commands get placeholders for, among those its tenant may have; nil:
	// all of those, an empty list: none.
	Secrets []string `json:"secrets,omitzero"`
	// SecretValues are the tenant's own secrets for this session (see
	// TenantSecret), as many as the operator allows the tenant
	// (CreateRequest.MaxSecrets; none by default). Their values are never
	// marshalled: not in the session's record, not in what the API shows.
	SecretValues []TenantSecret `json:"secretValues,omitzero"`
	// Snapshot is a snapshot of the tenant's (Session.Snapshot) whose tree
	// the workspace starts with, checked against its manifest before the
	// session is handed out; Template names an operator's template
	// (WithTemplates) instead. At most one of them.
	Snapshot string `json:"snapshot,omitempty"`
	Template string `json:"template,omitempty"`
}

// Limits are a session container's resource limits; zero is the policy's
// default.
type Limits struct {
	Pids        int64 `json:"pids,omitempty"`
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	NanoCPUs    int64 `json:"nanoCpus,omitempty"`
}

// Mount is a host path asked for in the container.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("90s", "1h30m"); a JSON number is read as seconds.
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var secs float64
	if err := json.Unmarshal(b, &secs); err == nil {
		*d = Duration(secs * float64(time.Second))
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"90s\" or a number of seconds, got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// SettingError is a setting that cannot be used as written (an unknown tool
// option, a lifetime over the operator's maximum). Operator-policy refusals
// are *policy.DeniedError instead.
type SettingError struct {
	Setting string
	Reason  string
}

func (e *SettingError) Error() string { return "setting " + e.Setting + ": " + e.Reason }

// request is the policy request the settings make.
func (s Settings) request(session, tenant string) policy.Request {
	req := policy.Request{
		Session: session, Tenant: tenant,
		Image: images.Canonical(s.Image), Runtime: s.Runtime, Network: s.Network,
		Privileged: s.Privileged, CapAdd: s.CapAdd,
		WritableRootfs: s.WritableRootfs, RootUser: s.RootUser,
		PidsLimit: s.Limits.Pids, MemoryBytes: s.Limits.MemoryBytes, NanoCPUs: s.Limits.NanoCPUs,
	}
	for _, m := range s.HostMounts {
		req.HostMounts = append(req.HostMounts, policy.HostMount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return req
}

// sessionOnlyOptions are tool options a session may not set in Options.
var sessionOnlyOptions = map[string]string{
	"bashInheritEnv": "the operator's configuration sets it",
	"bashEnvAllow":   "the operator's configuration sets it",
	"grants":         "use the grants setting",
	"always":         "use the always setting",
	"sources":        "the operator's configuration declares them (a source reads host files or holds a credential); pick among them with the sources setting",
	"visible":        "the operator's rule; narrow it with the scope setting",
	"commit":         "the operator's rule; narrow it with the scope setting",
}

// toolsConfig is the tool configuration a session gets: base, the
// operator's, with the session's options, grants, always-on skills and
// sources. The result is judged against base field by field
// (tools.Config.Within): a session may narrow every option and widen none,
// and holds only the grants of base and those allowedGrants lets it ask for
// (nil: any).
func toolsConfig(base tools.Config, s Settings, allowedGrants []string) (tools.Config, error) {
	opts := bytes.TrimSpace(s.Options)
	if len(opts) == 0 || string(opts) == "null" {
		opts = []byte("{}")
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(opts, &keys); err != nil {
		return tools.Config{}, &SettingError{"options", "want a JSON object of tool options"}
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if why, ok := sessionOnlyOptions[k]; ok {
			return tools.Config{}, &SettingError{"options." + k, "a session may not set it: " + why}
		}
	}
	cfg, err := base.With(opts) // a copy: base's slices and maps are every session's
	if err != nil {
		return tools.Config{}, &SettingError{"options", err.Error()}
	}
	for _, g := range s.Grants {
		if allowedGrants != nil && !slices.Contains(allowedGrants, g) {
			return tools.Config{}, &policy.DeniedError{Setting: "grant", Value: g,
				Limit: fmt.Sprintf("the operator lets sessions ask for %s (grants in the daemon's configuration)", cmp.Or(strings.Join(allowedGrants, ", "), "no grant"))}
		}
		if !slices.Contains(cfg.Grants, g) {
			cfg.Grants = append(cfg.Grants, g)
		}
	}
	if s.Always != nil {
		cfg.Always = slices.Clone(s.Always)
	}
	if s.Sources != nil {
		picked := sources.Decls{}
		if len(s.Sources) > 0 {
			var err error
			if picked, err = cfg.Sources.Select(sources.Request{Names: s.Sources}); err != nil {
				var pe *fs.PathError // Select names the first undeclared source
				if !errors.As(err, &pe) {
					return tools.Config{}, &SettingError{"sources", err.Error()}
				}
				return tools.Config{}, &SettingError{"sources", fmt.Sprintf("no source named %q (the operator declares %s)",
					pe.Path, cmp.Or(strings.Join(cfg.Sources.Names(), ", "), "none"))}
			}
		}
		cfg.Sources = picked
	}
	if err := cfg.Validate(); err != nil {
		var oe *tools.OptionError
		if errors.As(err, &oe) {
			return tools.Config{}, &SettingError{oe.Option, oe.Reason}
		}
		return tools.Config{}, &SettingError{"options", err.Error()}
	}
	ceiling := base
	if allowedGrants == nil {
		allowedGrants = tools.AllGrants
	}
	ceiling.Grants = slices.Concat(base.Grants, allowedGrants)
	if err := cfg.Within(ceiling); err != nil {
		return tools.Config{}, err
	}
	if k, why := tools.ExecEnv(s.Vars, cfg.Grants); why != "" {
		return tools.Config{}, &policy.DeniedError{Setting: "vars", Value: k, Limit: why}
	}
	return cfg, nil
}

// bounded returns asked, or def when asked is zero; asked over max (when
// max is positive) is refused naming setting. A positive max bounds the
// default too: a def of zero (none) or above max is max.
func bounded(setting string, asked, def, max Duration) (time.Duration, error) {
	if max > 0 && (def == 0 || def > max) {
		def = max
	}
	switch {
	case asked < 0:
		return 0, &SettingError{setting, "must not be negative"}
	case asked == 0:
		return time.Duration(def), nil
	case max > 0 && asked > max:
		return 0, &SettingError{setting, fmt.Sprintf("%v is over the operator's maximum of %v (ask for less, or for none to get %v)", time.Duration(asked), time.Duration(max), time.Duration(def))}
	}
	return time.Duration(asked), nil
}
