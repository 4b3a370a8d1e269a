package tools

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

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
// already (always, environmentSection, sectionOrder, bashSessionEnv, bashKeepState,
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
	{"bashKeepState", nil},  // what the session's own commands left, kept for the next
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
