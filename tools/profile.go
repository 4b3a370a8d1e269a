package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// The workspace-shell profile (workspace-shell.md) and the journal tools.
// The profile's tools have the skill SkillWorkspaceShell and the journal's
// SkillJournal: neither is loaded with load_skill — they are active from the
// start when the settings give them.

// Skills of the tools outside the workspace-tools profile.
const (
	SkillWorkspaceShell = "workspaceShell"
	SkillJournal        = "journal"
)

func entryTools(e *workspaceshell.CatalogueEntry) []string {
	if e == nil {
		return nil
	}
	return e.Tools
}

// WorkspaceShell returns the workspace-shell profile's catalogue entry, or
// nil when the profile is off or gives no tool.
func (s *Set) WorkspaceShell() *workspaceshell.CatalogueEntry { return s.wsEntry }

// Catalogue is the whole catalogue of a set, the output of `sandboxd tools
// --json`: the tools, the skills and, with the workspace-shell profile, its
// capability entry, which JSON lists among the tools (as the contract's
// "tools contains a workspaceShell entry") with "kind": "capability".
type Catalogue struct {
	Tools          []Tool
	Skills         []Skill
	WorkspaceShell *workspaceshell.CatalogueEntry
}

// MarshalJSON writes {"tools": [...tools, entry], "skills": [...]}.
func (c Catalogue) MarshalJSON() ([]byte, error) {
	items := make([]any, 0, len(c.Tools)+1)
	for _, t := range c.Tools {
		items = append(items, t)
	}
	if c.WorkspaceShell != nil {
		items = append(items, struct {
			*workspaceshell.CatalogueEntry
			Kind   string `json:"kind"`
			Active bool   `json:"active"`
		}{c.WorkspaceShell, "capability", true})
	}
	skills := c.Skills
	if skills == nil {
		skills = []Skill{}
	}
	return json.Marshal(struct {
		Tools  []any   `json:"tools"`
		Skills []Skill `json:"skills"`
	}{items, skills})
}

// Catalogue returns the set's catalogue.
func (s *Set) Catalogue() Catalogue {
	return Catalogue{Tools: s.List(), Skills: s.Skills(), WorkspaceShell: s.wsEntry}
}

// Journal returns the workspace's journal, opened on first use. Hosts use
// it for provider sessions (Begin … End) and to read the journal.
func (s *Set) Journal(ctx context.Context) (*journal.Journal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.journal != nil {
		return s.journal, nil
	}
	store := journal.WithStore(s.env.JournalStore)
	if s.env.JournalStore == nil {
		store = journal.InMemory()
	}
	opts := []journal.Option{store, journal.WithRoot(s.root), journal.WithMaxBlobBytes(s.cfg.MaxFileBytes)}
	if s.scoped() {
		opts = append(opts, journal.WithCommitScope(func(name string) bool {
			for _, r := range s.rules {
				if !r.IsCommittable(name) {
					return false
				}
			}
			return true
		}))
	}
	if s.env.Bash != nil {
		opts = append(opts, journal.WithChmod(s.chmod))
	}
	j, err := journal.Open(ctx, s.env.FS, opts...)
	if err != nil {
		return nil, err
	}
	s.journal = j
	return j, nil
}

// own tells the journal, when it is open, that sandboxd itself wrote names
// under .sandboxd/ (journal.Journal.Own): a workspace session keeps them,
// where it puts back what a process wrote there.
func (s *Set) own(ctx context.Context, names ...string) {
	s.mu.Lock()
	j := s.journal
	s.mu.Unlock()
	if j != nil {
		j.Own(ctx, names...)
	}
}

// BeginProviderRun opens a provider run: a workspace session of the journal
// that holds every change made until EndProviderRun — by workspace_exec, by
// the structured tools — with no commit of its own. Only one is active at a
// time; a second fails with workspace.ErrForbidden.
func (s *Set) BeginProviderRun(ctx context.Context, message string) error {
	j, err := s.Journal(ctx)
	if err != nil {
		return err
	}
	if message = strings.TrimSpace(message); message == "" {
		message = "provider run"
	}
	sess, err := j.Begin(ctx, message)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.provider = sess
	s.mu.Unlock()
	return nil
}

// EndProviderRun ends the active provider run: with commit, everything it
// changed becomes one commit (outside the session's commit rules, if any, it
// is put back instead); without, the workspace is restored to where the run
// began. No active run fails with workspace.ErrInvalidArgument.
func (s *Set) EndProviderRun(ctx context.Context, commit bool) (journal.Outcome, error) {
	s.mu.Lock()
	sess := s.provider
	s.provider = nil
	s.mu.Unlock()
	if sess == nil {
		return journal.Outcome{}, fmt.Errorf("%w: no provider run is active", workspace.ErrInvalidArgument)
	}
	return sess.End(ctx, commit)
}

// chmod sets permission bits through the Bash port, for restores on
// adapters without a Chmod of their own.
func (s *Set) chmod(ctx context.Context, name string, mode fs.FileMode) error {
	octal := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		octal |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		octal |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		octal |= 0o1000
	}
	res, err := s.env.Bash.Run(ctx, workspace.Command{Argv: []string{"chmod", fmt.Sprintf("%04o", octal), "--", name}})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("chmod %s exited %d", name, res.ExitCode)
	}
	return err
}

// errFailed carries a failed Result through journal.Record, which then
// rolls the call back.
type errFailed struct{ res Result }

func (errFailed) Error() string { return "tool call failed" }

// recorded runs a journaled tool: one call, one commit, or nothing when
// the call fails (what it changed is put back).
func (s *Set) recorded(ctx context.Context, d *toolDef, args json.RawMessage, c *call) Result {
	j, err := s.Journal(ctx)
	if err != nil {
		return errorResult(err)
	}
	var res Result
	commit, err := j.Record(ctx, commitMessage(d.name, args), func(fsys workspace.FileSystem) error {
		view, err := s.through(fsys)
		if err != nil {
			return err
		}
		c.raw, c.fsys = fsys, view
		if res, err = d.run(s, ctx, args, c); err != nil {
			return err
		}
		if res.IsError {
			return errFailed{res}
		}
		return nil
	})
	var failed errFailed
	switch {
	case errors.As(err, &failed):
		return failed.res
	case err != nil:
		return errorResult(err)
	}
	if commit != nil { // for programs; the model's text stays the tool's
		sum := commit.Summary()
		res.Commit = &sum
	}
	return res
}

// commitMessage names the tool and what it was given: "writeFile src/a.go",
// "movePath a -> b", "shell rm -r build".
func commitMessage(tool string, args json.RawMessage) string {
	var a map[string]any
	_ = json.Unmarshal(args, &a)
	str := func(k string) string { v, _ := a[k].(string); return v }
	detail := str("path")
	switch {
	case str("from") != "":
		detail = str("from") + " -> " + str("to")
	case str("command") != "":
		detail = str("command")
	}
	if r := []rune(detail); len(r) > 120 {
		detail = string(r[:120]) + "…"
	}
	return strings.TrimSpace(tool + " " + strings.Join(strings.Fields(detail), " "))
}

func (s *Set) shellEnv(c *call) workspaceshell.Env {
	sess := s.env.Session
	sess.Root, sess.RunID = s.root, c.runID
	// c.fsys is the guarded view: the shell adds no guard of its own.
	env := workspaceshell.Env{FS: c.fsys, Session: sess, Protect: workspace.Protect{}, Exclude: s.cfg.Exclude,
		MaxOutput: s.cfg.MaxBytes, MaxFileBytes: s.cfg.MaxFileBytes}
	if s.cfg.Sources.HTTP() {
		env.Sources = s.env.Sources
	}
	return env
}
