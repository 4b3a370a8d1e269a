package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/sources"
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

// JournalTools are the journal's tools, given to every session with the
// fs.write grant.
var JournalTools = []string{"journal_list", "journal_show", "journal_revert"}

// ExecMessage is the message of a workspace_exec commit, as the contract
// words it.
const ExecMessage = "workspace shell command"

func entryTools(e *workspaceshell.CatalogueEntry) []string {
	if e == nil {
		return nil
	}
	return e.Tools
}

// ShellResult is the structured content of shell.
type ShellResult struct {
	ExitCode  int    `json:"exitCode"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
	TimedOut  bool   `json:"timedOut"`
}

// SourcesResult is the structured content of materialize_sources: one
// entry per source materialized (none when the workspace declares none).
type SourcesResult struct {
	Sources []sources.Snapshot `json:"sources"`
	Message string             `json:"message,omitempty"`
}

// ExecResult is the structured content of workspace_exec: bash's, plus
// how the call's workspace session ended.
type ExecResult struct {
	BashResult
	// Committed says the command exited 0 and its changes were kept.
	Committed bool `json:"committed"`
	// Commit is the journal commit the changes made (0: nothing changed,
	// or the call ran in a provider session).
	Commit int `json:"commit,omitempty"`
	// Restored says the command failed and the workspace was put back.
	Restored bool `json:"restored,omitempty"`
	// Unrestored are paths that could not be put back exactly.
	Unrestored []string `json:"unrestored,omitempty"`
	// InSession says the call ran in the active provider session, whose end
	// commits or rolls back.
	InSession bool `json:"inSession,omitempty"`
	// OutOfScope are paths the command changed outside the session's commit
	// rules; they were put back and not committed.
	OutOfScope []string `json:"outOfScope,omitempty"`
}

// JournalListResult is the structured content of journal_list.
type JournalListResult struct {
	Commits []journal.Summary `json:"commits"`
}

// JournalShowResult is the structured content of journal_show.
type JournalShowResult struct {
	journal.Summary
	Diff string `json:"diff"`
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
	store := s.env.JournalStore
	if store == nil {
		store = memfs.New()
	}
	opts := []journal.Option{journal.WithStore(store), journal.WithRoot(s.root), journal.WithMaxBlobBytes(s.cfg.MaxFileBytes)}
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

// defineShell describes a tool of the workspace-shell profile or of the
// journal.
func (s *Set) defineShell(name string) *toolDef {
	c := s.cfg
	mode := s.shell.Mode
	if mode == "" {
		mode = workspaceshell.Read
	}
	pathProp := func(desc string) prop { return prop{name: "path", typ: "string", desc: desc, required: true} }
	content := prop{name: "content", typ: "string", desc: "the text", required: true}
	overwrite := prop{name: "overwrite", typ: "boolean", desc: "replace a file at to (a directory is never replaced)"}
	fromTo := []prop{{name: "from", typ: "string", desc: "the path to copy or move", required: true},
		{name: "to", typ: "string", desc: "the exact new path (not a directory to put it in)", required: true}, overwrite}
	guard := fmt.Sprintf(" Paths are relative to %s; paths matching %s are refused.", s.root, strings.Join(c.Protect, ", "))
	d := &toolDef{name: name}
	switch name {
	case workspaceshell.ToolShell:
		cmds := strings.Join(workspaceshell.ShellCommands(mode), ", ")
		if c.Sources.HTTP() {
			cmds += ", and curl for the API-backed sources: only the requests their descriptors in " + path.Join(s.root, sources.SnapshotDir) +
				"/<source>/" + sources.DescriptorFile + " declare (materialize_sources writes them); sandboxd sends them and adds the credential"
		}
		what := "It changes no file, redirects included."
		if mode == workspaceshell.Write {
			what = "mkdir, touch, cp, mv, rm and output redirects change files" + guard[:len(guard)-1] + "; each call is one journal commit."
		}
		d.desc = fmt.Sprintf("Run a Bash-compatible command line for inspection in %s. Commands: %s. Pipes, redirects, && || ;, subshells, loops, globs and $(…) work; any other command is refused before anything runs. %s Output over %s stops the line.",
			s.root, cmds, what, kb(int64(c.MaxBytes)))
		d.schema = objectSchema(prop{name: "command", typ: "string", desc: "the command line, e.g. rg -n TODO src | head -20", required: true})
		d.run = (*Set).shellTool
		d.readOnly = mode != workspaceshell.Write
		d.journaled = mode == workspaceshell.Write
	case workspaceshell.ToolMaterializeSources:
		d.desc = "Materialize complete snapshots of the workspace's sources before inspecting them with shell. Optional path prefix and sources list."
		d.schema = objectSchema(prop{name: "path", typ: "string", desc: "only sources under this path prefix"},
			prop{name: "sources", typ: "array", desc: "the sources to materialize (default: all)", extra: map[string]any{"items": map[string]any{"type": "string"}}})
		d.run = (*Set).materializeSources
		d.readOnly = len(c.Sources) == 0 // else it writes .sandboxd/sources/
	case workspaceshell.ToolWriteFile:
		d.desc = "Create or replace a file, creating missing parent directories; readers never see half a file." + guard
		d.schema = objectSchema(pathProp("the file"), content)
	case workspaceshell.ToolAppendFile:
		d.desc = "Add text to the end of a file, creating it (and its parents) when missing." + guard
		d.schema = objectSchema(pathProp("the file"), content)
	case workspaceshell.ToolMakeDir:
		d.desc = "Create a directory and any missing parents; an existing directory is fine." + guard
		d.schema = objectSchema(pathProp("the directory"))
	case workspaceshell.ToolCopyPath:
		d.desc = "Copy a file or a directory tree to a new path (links inside are copied as links)." + guard
		d.schema = objectSchema(fromTo...)
	case workspaceshell.ToolMovePath:
		d.desc = "Move (rename) a file or a directory." + guard
		d.schema = objectSchema(fromTo...)
	case workspaceshell.ToolDeletePath:
		d.desc = "Delete a file, a link (never its target) or a directory (with recursive, one that has entries)." + guard
		d.schema = objectSchema(pathProp("what to delete"), prop{name: "recursive", typ: "boolean", desc: "delete a directory with everything in it"})
	case workspaceshell.ToolExec:
		allowed := "any executable"
		if !s.shell.Commands.All {
			allowed = strings.Join(s.shell.Commands.Names, ", ")
		}
		d.desc = fmt.Sprintf("Run one allowlisted executable (%s) without a shell, in the workspace or a directory of it. Runs in a workspace session: exit code 0 commits its changes to the journal (%q); anything else restores the workspace exactly and commits nothing. Default timeout %d ms. Returns the end of its output and how it ended.",
			allowed, ExecMessage, s.shell.TimeoutMS())
		d.schema = objectSchema(prop{name: "command", typ: "string", desc: "the executable: " + allowed, required: true},
			prop{name: "args", typ: "array", desc: "its arguments, passed as they are (no shell)", extra: map[string]any{"items": map[string]any{"type": "string"}}},
			prop{name: "cwd", typ: "string", desc: "working directory relative to " + s.root + " (default: the root)"},
			prop{name: "env", typ: "object", desc: "variables to add (PATH, LD_*, DYLD_*, NODE_OPTIONS, BASH_ENV, GIT_CONFIG_* and others that make programs run code are refused)", extra: map[string]any{"additionalProperties": map[string]any{"type": "string"}}},
			prop{name: "timeout", typ: "integer", desc: fmt.Sprintf("milliseconds (default %d, at most %d)", s.shell.TimeoutMS(), workspaceshell.MaxTimeoutMS), extra: map[string]any{"minimum": 1, "maximum": workspaceshell.MaxTimeoutMS}})
		d.run = (*Set).workspaceExec
	case "journal_list":
		d.desc = "List the workspace journal's commits, newest first: each tool call that changed files (write, edit, writeFile, …, workspace_exec) is one commit."
		d.schema = objectSchema(prop{name: "limit", typ: "integer", desc: "the most commits to list (default 50)", extra: map[string]any{"minimum": 1}})
		d.run = (*Set).journalList
		d.readOnly = true
	case "journal_show":
		d.desc = "Show one journal commit as a unified diff."
		d.schema = objectSchema(prop{name: "id", typ: "integer", desc: "the commit", required: true, extra: map[string]any{"minimum": 1}})
		d.run = (*Set).journalShow
		d.readOnly = true
	case "journal_revert":
		d.desc = "Bring the workspace back to the state right after a commit (0: before the first), undoing the later commits as one new commit, which can be reverted too. Refuses when a path was changed since by something else, unless force."
		d.schema = objectSchema(prop{name: "to", typ: "integer", desc: "the commit to return to", required: true, extra: map[string]any{"minimum": 0}},
			prop{name: "force", typ: "boolean", desc: "overwrite paths changed since"})
		d.run = (*Set).journalRevert
	}
	if d.run == nil { // the structured mutations
		d.run = (*Set).mutation
		d.journaled = true
	}
	return d
}

func (s *Set) shellTool(ctx context.Context, args json.RawMessage, c *call) (Result, error) {
	var p struct {
		Command string `json:"command"`
	}
	if err := decodeArgs(args, &p); err != nil {
		return Result{}, err
	}
	if strings.TrimSpace(p.Command) == "" {
		return Result{}, invalid("command is required")
	}
	res, err := workspaceshell.Run(ctx, s.shellEnv(c), p.Command, s.shell.Mode)
	if err != nil {
		return Result{}, err
	}
	text := res.Stdout + res.Stderr
	if text == "" {
		text = "(no output)\n"
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return Result{Text: text + fmt.Sprintf("\n[Exit code %d.]", res.ExitCode), Structured: &ShellResult{
		ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated, TimedOut: res.TimedOut,
	}}, nil
}

func (s *Set) materializeSources(ctx context.Context, args json.RawMessage, c *call) (Result, error) {
	var p struct {
		Path    string   `json:"path"`
		Sources []string `json:"sources"`
	}
	if err := decodeArgs(args, &p); err != nil {
		return Result{}, err
	}
	decls := s.cfg.Sources
	if len(decls) == 0 {
		if len(p.Sources) > 0 {
			return Result{}, newError(workspace.ErrNotFound, "no source named %s: this workspace declares no sources", strings.Join(p.Sources, ", "))
		}
		msg := "This workspace declares no sources: there is nothing to materialize. Its files are already in " + s.root + "; inspect them with shell."
		return Result{Text: msg, Structured: &SourcesResult{Sources: []sources.Snapshot{}, Message: msg}}, nil
	}
	name, err := workspace.Resolve(s.root, p.Path)
	if err != nil {
		return Result{}, err
	}
	res, err := sources.Materialize(ctx, c.raw, decls, sources.Request{Path: name, Names: p.Sources,
		Limits: sources.Limits{MaxFileBytes: s.cfg.MaxFileBytes}})
	if err != nil {
		var k *workspace.Kind // an undeclared name or a path no snapshot is at, not a host file
		if errors.As(err, &k) && k == workspace.ErrNotFound {
			return Result{}, newError(workspace.ErrNotFound, "%v (declared sources: %s, materialized under %s/)", err, strings.Join(decls.Names(), ", "), path.Join(s.root, sources.SnapshotDir))
		}
		return Result{}, err
	}
	var b strings.Builder
	for _, src := range res.Sources {
		state := "unchanged"
		if src.Changed {
			state = "updated"
		}
		fmt.Fprintf(&b, "%s (%s): %s, %d files, %d bytes, %s, %s\n", src.Name, src.Kind, path.Join(s.root, src.Path), src.Files, src.Bytes, src.Digest, state)
		if src.Kind == sources.KindHTTP {
			fmt.Fprintf(&b, "  an API: its declared requests are in %s; send them with shell's curl\n", path.Join(s.root, src.Path, sources.DescriptorFile))
		}
	}
	b.WriteString("Snapshots are read-only; inspect them with shell (name the path: searches from the root skip .sandboxd).")
	return Result{Text: b.String(), Structured: &SourcesResult{Sources: res.Sources}}, nil
}

// mutation runs one of the structured mutations of write mode.
func (s *Set) mutation(ctx context.Context, args json.RawMessage, c *call) (Result, error) {
	env := s.shellEnv(c)
	pathOnly, pathContent, fromTo := []string{"path"}, []string{"path", "content"}, []string{"from", "to"}
	switch c.tool {
	case workspaceshell.ToolWriteFile:
		var req workspaceshell.WriteFileRequest
		return mutate(args, &req, pathContent, func() (*workspaceshell.WriteFileResult, string, error) {
			r, err := workspaceshell.WriteFile(ctx, env, req)
			return &r, fmt.Sprintf("Wrote %s (%d bytes%s).", r.Path, r.Bytes, createdWord(r.Created)), err
		})
	case workspaceshell.ToolAppendFile:
		var req workspaceshell.AppendFileRequest
		return mutate(args, &req, pathContent, func() (*workspaceshell.AppendFileResult, string, error) {
			r, err := workspaceshell.AppendFile(ctx, env, req)
			return &r, fmt.Sprintf("Appended %d bytes to %s (now %d bytes%s).", r.Bytes, r.Path, r.Size, createdWord(r.Created)), err
		})
	case workspaceshell.ToolMakeDir:
		var req workspaceshell.MakeDirRequest
		return mutate(args, &req, pathOnly, func() (*workspaceshell.MakeDirResult, string, error) {
			r, err := workspaceshell.MakeDir(ctx, env, req)
			verb := "Created"
			if !r.Created {
				verb = "Already there:"
			}
			return &r, fmt.Sprintf("%s %s/", verb, r.Path), err
		})
	case workspaceshell.ToolCopyPath:
		var req workspaceshell.CopyPathRequest
		return mutate(args, &req, fromTo, func() (*workspaceshell.CopyPathResult, string, error) {
			r, err := workspaceshell.CopyPath(ctx, env, req)
			return &r, fmt.Sprintf("Copied %s to %s (%d entries).", r.From, r.To, r.Entries), err
		})
	case workspaceshell.ToolMovePath:
		var req workspaceshell.MovePathRequest
		return mutate(args, &req, fromTo, func() (*workspaceshell.MovePathResult, string, error) {
			r, err := workspaceshell.MovePath(ctx, env, req)
			return &r, fmt.Sprintf("Moved %s to %s.", r.From, r.To), err
		})
	case workspaceshell.ToolDeletePath:
		var req workspaceshell.DeletePathRequest
		return mutate(args, &req, pathOnly, func() (*workspaceshell.DeletePathResult, string, error) {
			r, err := workspaceshell.DeletePath(ctx, env, req)
			return &r, fmt.Sprintf("Deleted %s (%d entries).", r.Path, r.Removed), err
		})
	}
	return Result{}, invalid("no mutation named %q", c.tool)
}

// mutate decodes args into req, checks that the required arguments came
// (not empty), and runs op.
func mutate[R any](args json.RawMessage, req any, required []string, op func() (*R, string, error)) (Result, error) {
	if err := decodeArgs(args, req); err != nil {
		return Result{}, err
	}
	var present map[string]json.RawMessage
	_ = json.Unmarshal(args, &present)
	for _, k := range required {
		v, ok := present[k]
		if !ok || string(v) == "null" || k != "content" && string(v) == `""` {
			return Result{}, invalid("%s is required", k)
		}
	}
	r, text, err := op()
	if err != nil {
		return Result{}, err
	}
	return Result{Text: text, Structured: r}, nil
}

func createdWord(created bool) string {
	if created {
		return ", created"
	}
	return ""
}

func (s *Set) workspaceExec(ctx context.Context, args json.RawMessage, c *call) (Result, error) {
	var req workspaceshell.ExecRequest
	if err := decodeArgs(args, &req); err != nil {
		return Result{}, err
	}
	cmd, err := s.shell.ExecCommand(s.root, req)
	if err != nil {
		return Result{}, err
	}
	if s.env.Bash == nil {
		return Result{}, newError(workspace.ErrForbidden, "workspace_exec cannot run %s: this session's host permits no processes", req.Command)
	}
	if s.hidesPaths() {
		return Result{}, newError(workspace.ErrForbidden, "workspace_exec cannot run %s: this session has visible rules, which bind the file tools but not what a process reads", req.Command)
	}
	env := s.commandEnv(c)
	maps.Copy(env, cmd.Env)
	cmd.Env = env
	j, err := s.Journal(ctx)
	if err != nil {
		return Result{}, err
	}
	var res Result
	var br *BashResult
	out, err := j.Exec(ctx, ExecMessage, func(ctx context.Context) (bool, error) {
		var err error
		res, br, err = s.runCommand(ctx, c, cmd.Timeout, func(ctx context.Context, output func(workspace.Stream, []byte)) (workspace.Result, error) {
			cmd.Output = output
			return s.env.Bash.Run(ctx, cmd)
		})
		return err == nil && br.ExitCode == 0 && !br.TimedOut && br.Signal == "", err
	})
	if br == nil || (err != nil && !out.Restored) {
		return Result{}, err
	}
	r := &ExecResult{BashResult: *br, Committed: out.Committed, Restored: out.Restored, Unrestored: out.Unrestored, InSession: out.InSession, OutOfScope: out.OutOfScope}
	if len(out.OutOfScope) > 0 {
		res.Text += fmt.Sprintf("\n[Outside this session's commit rules, put back and not committed: %s.]", strings.Join(out.OutOfScope, ", "))
		if len(out.Unrestored) > 0 && !out.Restored {
			res.Text += "\n[Not put back exactly: " + strings.Join(out.Unrestored, "; ") + ".]"
		}
	}
	switch {
	case out.InSession:
		res.Text += "\n[Ran in the active provider session: its changes are part of the session's result.]"
	case out.Commit != nil:
		r.Commit = out.Commit.ID
		sum := out.Commit.Summary()
		res.Commit = &sum
		res.Text += fmt.Sprintf("\n[Committed as journal commit %d (%d added, %d modified, %d deleted).]", sum.ID, sum.Added, sum.Modified, sum.Deleted)
	case out.Committed:
		res.Text += "\n[Committed: nothing changed.]"
	case out.Restored:
		res.Text += "\n[The command did not succeed: the workspace was restored as it was, and nothing was committed.]"
		if len(out.Unrestored) > 0 {
			res.Text += "\n[Not restored exactly: " + strings.Join(out.Unrestored, "; ") + ".]"
		}
	}
	res.Structured = r
	return res, nil
}

func (s *Set) journalList(ctx context.Context, args json.RawMessage, _ *call) (Result, error) {
	var p struct {
		Limit int `json:"limit"`
	}
	if err := decodeArgs(args, &p); err != nil {
		return Result{}, err
	}
	if p.Limit <= 0 {
		p.Limit = 50
	}
	j, err := s.Journal(ctx)
	if err != nil {
		return Result{}, err
	}
	list := j.List()
	list = list[:min(len(list), p.Limit)]
	var b strings.Builder
	for _, c := range list {
		fmt.Fprintf(&b, "%d  %s  %s  (+%d ~%d -%d)\n", c.ID, c.Time.Format("2006-01-02 15:04:05Z"), c.Message, c.Added, c.Modified, c.Deleted)
	}
	if len(list) == 0 {
		b.WriteString("The journal has no commits yet.\n")
	}
	return Result{Text: b.String(), Structured: &JournalListResult{Commits: list}}, nil
}

func (s *Set) journalShow(ctx context.Context, args json.RawMessage, _ *call) (Result, error) {
	var p struct {
		ID int `json:"id"`
	}
	if err := decodeArgs(args, &p); err != nil {
		return Result{}, err
	}
	j, err := s.Journal(ctx)
	if err != nil {
		return Result{}, err
	}
	c, err := j.Get(p.ID)
	if err != nil {
		return Result{}, newError(workspace.ErrNotFound, "no commit %d in the journal: journal_list shows them", p.ID)
	}
	diff, err := j.Show(ctx, p.ID)
	if err != nil {
		return Result{}, err
	}
	sum := c.Summary()
	text := fmt.Sprintf("commit %d  %s\n%s\n\n%s", c.ID, c.Time.Format("2006-01-02 15:04:05Z"), c.Message, diff)
	return Result{Text: text, Structured: &JournalShowResult{Summary: sum, Diff: diff}}, nil
}

func (s *Set) journalRevert(ctx context.Context, args json.RawMessage, _ *call) (Result, error) {
	var p struct {
		To    *int `json:"to"`
		Force bool `json:"force"`
	}
	if err := decodeArgs(args, &p); err != nil {
		return Result{}, err
	}
	if p.To == nil {
		return Result{}, invalid("to is required: the commit to return to (0: before the first)")
	}
	j, err := s.Journal(ctx)
	if err != nil {
		return Result{}, err
	}
	r, err := j.Revert(ctx, journal.RevertRequest{To: *p.To, Force: p.Force})
	if err != nil {
		return Result{}, err
	}
	text := "Nothing to revert: the workspace is already there."
	var res Result
	if r.Commit != nil {
		sum := r.Commit.Summary()
		res.Commit = &sum
		text = fmt.Sprintf("Reverted as journal commit %d (%s): %d paths.", r.Commit.ID, r.Commit.Message, len(r.Commit.Changes))
	}
	if len(r.Unrestored) > 0 {
		text += " Not restored exactly: " + strings.Join(r.Unrestored, "; ") + "."
	}
	res.Text, res.Structured = text, &r
	return res, nil
}
