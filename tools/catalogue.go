package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Descriptions, input schemas and the environment section: everything the
// model is told about the tools, produced from the configuration.

type prop struct {
	name, typ, desc string
	required        bool
	extra           map[string]any
}

func objectSchema(props ...prop) json.RawMessage {
	properties := map[string]any{}
	required := []string{}
	for _, p := range props {
		m := map[string]any{"type": p.typ, "description": p.desc}
		for k, v := range p.extra {
			m[k] = v
		}
		properties[p.name] = m
		if p.required {
			required = append(required, p.name)
		}
	}
	data, err := json.Marshal(map[string]any{
		"type": "object", "properties": properties, "required": required, "additionalProperties": false,
	})
	if err != nil {
		panic(err) // static shapes: cannot fail
	}
	return data
}

func kb(n int64) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%d KB", (n+512)/1024)
	default:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", float64(n)/(1<<20)), "0"), ".") + " MB"
	}
}

func (s *Set) define(name string) *toolDef {
	c := s.cfg
	limits := fmt.Sprintf("%d lines or %s", c.MaxLines, kb(int64(c.MaxBytes)))
	pathProp := func(desc string, required bool) prop {
		return prop{name: "path", typ: "string", desc: desc, required: required}
	}
	limitProp := func(what string, max int) prop {
		return prop{name: "limit", typ: "integer", desc: fmt.Sprintf("the most %s to return (at most %d, the default)", what, max),
			extra: map[string]any{"minimum": 1}}
	}
	d := &toolDef{name: name}
	switch name {
	case "read":
		img := "Images are reported as binary files, not shown."
		if c.ReadImages {
			img = fmt.Sprintf("PNG, JPEG, GIF and WebP files (recognised from their bytes, whatever their name) are returned as images you can see, up to %s and %d pixels a side.",
				kb(min(MaxImageBytes, c.MaxFileBytes)), MaxImageSide)
		}
		d.desc = fmt.Sprintf("Read a file of the workspace. Text is shown %s at a time from offset; the result ends with the offset to continue from. %s Other binary files are reported, not shown. Files over %s are refused.",
			limits, img, kb(c.MaxFileBytes))
		d.schema = objectSchema(pathProp("the file, relative to the workspace root (or absolute inside it)", true),
			prop{name: "offset", typ: "integer", desc: "the first line to show, from 1", extra: map[string]any{"minimum": 1}},
			prop{name: "limit", typ: "integer", desc: fmt.Sprintf("the most lines to show (at most %d)", c.MaxLines), extra: map[string]any{"minimum": 1}})
		d.run = (*Set).read
		d.readOnly = true
	case "ls":
		d.desc = fmt.Sprintf("List a directory of the workspace, sorted by name. Directories end in /, symbolic links in @; a name holding a control character (a newline, an escape) is shown quoted, Go-style (\"a\\nb\"). At most %d entries.", c.LsEntries)
		d.schema = objectSchema(pathProp("the directory (default: the workspace root)", false), limitProp("entries", c.LsEntries))
		d.run = (*Set).ls
		d.readOnly = true
	case "find":
		d.desc = fmt.Sprintf("Find files whose path matches a glob (doublestar: *, **, ?, [abc], {a,b}), written relative to the workspace root; a pattern without / matches the file name at any depth (*.go). Returns paths relative to the root (quoted, Go-style, when one holds a control character), at most %d, shown up to %s. Never enters linked directories or %s.",
			c.FindResults, limits, excludeText(c.Exclude))
		d.schema = objectSchema(prop{name: "pattern", typ: "string", desc: "the glob, e.g. **/*.ts or src/**/test_*.py", required: true},
			pathProp("the directory to search (default: the workspace root)", false), limitProp("paths", c.FindResults))
		d.run = (*Set).find
		d.readOnly = true
	case "grep":
		d.desc = fmt.Sprintf("Search file contents for a regular expression (Go RE2 syntax: no backreferences or lookaround; matching takes linear time, so no pattern can hang the search). Returns path:line:text for each matching line (context lines as path-line-text), at most %d matches, lines cut to %d characters before matching, shown up to %s. Skips binary files, linked directories and %s.",
			c.GrepMatches, c.GrepLineChars, limits, excludeText(c.Exclude))
		d.schema = objectSchema(prop{name: "pattern", typ: "string", desc: "the regular expression (or plain text with literal)", required: true},
			pathProp("a directory or file to search (default: the workspace root)", false),
			prop{name: "glob", typ: "string", desc: "only files whose root-relative path matches this glob (*.go matches at any depth)"},
			prop{name: "ignoreCase", typ: "boolean", desc: "match case-insensitively"},
			prop{name: "literal", typ: "boolean", desc: "treat pattern as plain text"},
			prop{name: "context", typ: "integer", desc: "lines to show before and after each match", extra: map[string]any{"minimum": 0}},
			limitProp("matching lines", c.GrepMatches))
		d.run = (*Set).grep
		d.readOnly = true
	case "write":
		d.desc = fmt.Sprintf("Create or replace a file with content, creating missing parent directories. Readers never see half a file. Refuses to empty a file that has content, and paths matching %s.",
			strings.Join(c.Protect, ", "))
		d.schema = objectSchema(pathProp("the file to write", true), prop{name: "content", typ: "string", desc: "the whole new content", required: true})
		d.run = (*Set).write
		d.journaled = true
	case "edit":
		fuzzy := ""
		if c.FuzzyEdit {
			fuzzy = " When the exact text is not found, it is matched once more with whitespace, quotes and dashes normalised; that match must be unique too."
		}
		d.desc = "Replace text in a file: several blocks at once, each oldText exactly as it appears once in the file (as it was before this call), blocks not overlapping." + fuzzy +
			" Line endings and a byte-order mark are kept. Returns how many blocks were replaced and at which lines. Refuses files that are not UTF-8 and paths matching " + strings.Join(c.Protect, ", ") + "."
		d.schema = objectSchema(pathProp("the file to edit", true), prop{name: "edits", typ: "array", required: true,
			desc: "the replacements, applied together",
			extra: map[string]any{"minItems": 1, "items": map[string]any{
				"type": "object", "additionalProperties": false, "required": []string{"oldText", "newText"},
				"properties": map[string]any{
					"oldText": map[string]any{"type": "string", "description": "text that appears exactly once in the file"},
					"newText": map[string]any{"type": "string", "description": "its replacement"},
				}}}})
		d.run = (*Set).edit
		d.journaled = true
	case "bash":
		runBy := "run by bash"
		d.desc = fmt.Sprintf("Run a shell command in the workspace root. Returns the end of its output (stdout and stderr, last %s) and how it ended; when there was more, the whole output (up to %s) is saved to a file under %s whose path the result gives. Non-zero exit, a signal or a timeout are reported, not failures. Default timeout %ds, at most %ds.",
			limits, kb(c.MaxFileBytes), c.SpillDir, c.BashTimeoutMs/1000, c.BashMaxTimeoutMs/1000)
		if sh := s.notBash(); sh != "" {
			runBy = "run by " + sh + " (this workspace has no bash)"
			d.desc += " " + noBashNote(sh)
		}
		props := []prop{{name: "command", typ: "string", desc: "the command line, " + runBy, required: true},
			{name: "timeout", typ: "number", desc: fmt.Sprintf("seconds before the command and everything it started are killed (default %d, at most %d)", c.BashTimeoutMs/1000, c.BashMaxTimeoutMs/1000), extra: map[string]any{"exclusiveMinimum": 0}},
			{name: "stdin", typ: "string", desc: "the command's standard input"}}
		if c.BashBackground > 0 {
			d.desc += fmt.Sprintf(" With background: true the command starts and the call answers at once with its id: read its output with bash_output, stop it with bash_kill (at most %d kept at once; killed when the session ends).", c.BashBackground)
			props = append(props, prop{name: "background", typ: "boolean", desc: fmt.Sprintf("start the command and answer at once with its id, without waiting for it; its timeout is then %d s unless timeout says less", c.BashMaxTimeoutMs/1000)})
		}
		d.schema = objectSchema(props...)
		d.run = (*Set).bash
	case LoadSkill:
		var lines []string
		for _, sk := range skillDefs {
			need := ""
			if sk.grant != "" {
				need = ", needs the grant " + sk.grant
			}
			lines = append(lines, fmt.Sprintf("%s (%s%s)", sk.name, sk.desc, need))
		}
		d.desc = "Activate a skill, making its tools available: " + strings.Join(lines, "; ") + "."
		d.schema = objectSchema(prop{name: "skill", typ: "string", desc: "the skill to load, e.g. workspace.edit", required: true,
			extra: map[string]any{"enum": []string{"workspace.read", "workspace.edit", "workspace.shell"}}})
		d.run = (*Set).loadSkill
		d.readOnly = true
	}
	return d
}

func excludeText(x []string) string {
	if len(x) == 0 {
		return "nothing else"
	}
	return strings.Join(x, ", ")
}

func (s *Set) loadSkill(_ context.Context, args json.RawMessage, c *call) (Result, error) {
	var p struct {
		Skill string `json:"skill"`
	}
	if err := decodeArgs(args, &p); err != nil {
		return Result{}, err
	}
	sk := skillByName(p.Skill)
	if sk == nil {
		return Result{}, invalid("unknown skill %q: the skills are workspace.read, workspace.edit, workspace.shell", p.Skill)
	}
	if !s.granted(sk) {
		return failure(KindCapabilityForbidden, fmt.Sprintf("%s needs the grant %s, which this session does not have; its tools stay unavailable", sk.name, sk.grant)), nil
	}
	s.mu.Lock()
	changed := !s.active[sk.name]
	s.active[sk.name] = true
	s.mu.Unlock()
	tools := s.registered(sk)
	if changed && c.opts.ToolsChanged != nil {
		c.opts.ToolsChanged()
	}
	text := fmt.Sprintf("Loaded %s: %s now available.", sk.name, strings.Join(tools, ", "))
	if !changed {
		text = fmt.Sprintf("%s is already active: %s.", sk.name, strings.Join(tools, ", "))
	}
	return Result{Text: text, Structured: &LoadSkillResult{Skill: sk.name, Tools: tools}}, nil
}

// SectionOrder is the environment section's place among a system prompt's
// sections (the sectionOrder option).
func (s *Set) SectionOrder() int { return s.cfg.SectionOrder }

// EnvironmentSection returns the system-prompt section about the workspace:
// its root, the tools and skills, the guardrails and the limits, produced
// from the settings. It is empty when the environmentSection option is off.
func (s *Set) EnvironmentSection() string {
	if !s.cfg.EnvironmentSection {
		return ""
	}
	c := s.cfg
	var b strings.Builder
	fmt.Fprintf(&b, "# Workspace\n\nYou work in the workspace at %s. Paths are relative to it; absolute paths inside it work too, and paths that lead outside it (with .., an absolute path or a symbolic link) are refused.\n\n", s.root)
	var active, loadable []string
	for _, sk := range s.Skills() {
		if len(sk.Tools) == 0 {
			continue
		}
		switch {
		case sk.Active:
			active = append(active, sk.Tools...)
		case sk.Granted:
			loadable = append(loadable, fmt.Sprintf("%s (%s)", sk.Name, strings.Join(sk.Tools, ", ")))
		default:
			loadable = append(loadable, fmt.Sprintf("%s (%s; needs the grant %s, not given: loading it fails)", sk.Name, strings.Join(sk.Tools, ", "), sk.Grant))
		}
	}
	for _, t := range s.List() {
		if t.Skill == SkillWorkspaceShell {
			active = append(active, t.Name)
		}
	}
	fmt.Fprintf(&b, "Tools: %s.", strings.Join(active, ", "))
	if len(loadable) > 0 {
		fmt.Fprintf(&b, " Load more with load_skill: %s.", strings.Join(loadable, "; "))
	}
	b.WriteString("\n\nGuardrails:\n")
	if slices.ContainsFunc(c.Tools, func(t string) bool { return t == "write" || t == "edit" }) && len(c.Protect) > 0 {
		fmt.Fprintf(&b, "- write and edit refuse %s.\n", strings.Join(c.Protect, ", "))
	}
	for _, r := range s.rules {
		if r.Visible != nil {
			fmt.Fprintf(&b, "- Only paths matching %s exist for this session; anything else is not found.\n", strings.Join(r.Visible, ", "))
		}
		if r.Commit != nil {
			fmt.Fprintf(&b, "- Changes are allowed only to paths matching %s; others are refused as outside the commit scope.\n", strings.Join(r.Commit, ", "))
		}
	}
	fmt.Fprintf(&b, "- find and grep never enter linked directories or %s.\n", excludeText(c.Exclude))
	fmt.Fprintf(&b, "- read, find and grep show at most %d lines or %s; ls %d entries, find %d paths, grep %d matches.\n",
		c.MaxLines, kb(int64(c.MaxBytes)), c.LsEntries, c.FindResults, c.GrepMatches)
	if slices.Contains(c.Tools, "bash") && s.env.Bash != nil && !s.scoped() {
		fmt.Fprintf(&b, "- bash keeps the last %d lines or %s of output and saves the whole output under %s; commands time out after %ds unless asked (at most %ds).\n",
			c.MaxLines, kb(int64(c.MaxBytes)), c.SpillDir, c.BashTimeoutMs/1000, c.BashMaxTimeoutMs/1000)
		if sh := s.notBash(); sh != "" {
			fmt.Fprintf(&b, "- %s\n", noBashNote(sh))
		}
	}
	if e := s.wsEntry; e != nil && len(e.Commands) > 0 {
		fmt.Fprintf(&b, "- shell (%s mode) runs only %s; anything else is refused.\n", e.Mode, strings.Join(e.Commands, ", "))
	}
	if s.active[SkillJournal] {
		b.WriteString("- Every call that changes files is a journal commit: journal_list, journal_show and journal_revert list, show and undo them.\n")
	}
	if c.MaxCallsPerRun > 0 {
		fmt.Fprintf(&b, "- A turn may make at most %d tool calls.\n", c.MaxCallsPerRun)
	}
	b.WriteString("- A failed call returns { error, message }: read it and correct the call.\n")
	return b.String()
}
