package tools

import (
	"fmt"
	"slices"
	"strings"
)

// Descriptions, input schemas and the environment section: everything the
// model is told about the tools, produced from the configuration.

// catalogue is every tool, in catalogue order: the workspace-tools
// profile's seven, the workspace-shell profile's, the journal's, and
// load_skill. A new tool is a file declaring its value with newTool, and its
// line here. It is set in init, as the tools' descriptions (load_skill's)
// read it.
var catalogue []*tool

func init() {
	catalogue = []*tool{
		readTool, lsTool, findTool, grepTool, writeTool, editTool, bashTool, bashOutputTool, bashKillTool,
		shellTool, materializeSourcesTool,
		writeFileTool, appendFileTool, makeDirTool, copyPathTool, movePathTool, deletePathTool,
		execTool,
		journalListTool, journalShowTool, journalRevertTool,
		loadSkillTool,
	}
	for _, sk := range skillDefs {
		for _, name := range toolsOf(sk.name) {
			if t := lookupTool(name); t.companion != "" {
				BackgroundTools = append(BackgroundTools, name)
			} else {
				AllTools = append(AllTools, name)
			}
		}
	}
	JournalTools = toolsOf(SkillJournal)
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

func excludeText(x []string) string {
	if len(x) == 0 {
		return "nothing else"
	}
	return strings.Join(x, ", ")
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
