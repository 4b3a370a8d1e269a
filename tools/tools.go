// Package tools is the workspace tool layer: read, ls, find, grep, write,
// edit and bash over any workspace.FileSystem and workspace.Bash, with the
// skills, grants, guardrails and limits of the contract.
//
// It is a Go library first. A host builds a Set over its adapters and calls
// tools by name with JSON arguments; MCP serving (sandboxd mcp) is one such
// host:
//
//	set, err := tools.New(tools.Env{FS: fsys, Bash: sh, Session: sess}, tools.DefaultConfig())
//	res := set.Call(ctx, "grep", json.RawMessage(`{"pattern":"TODO"}`), tools.CallOptions{})
//	fmt.Println(res.Text) // for the model; res.Structured is for programs
//
// A failure is a Result too (IsError, with Structured an *ErrorResult naming
// the kind), so a model can read it and correct itself. A Set is safe for
// concurrent use.
//
// Each tool is a value declared in one file (newTool: its name, skill,
// description, argument and result types, handler), listed once in
// catalogue.go. [Tool.InputSchema] is derived from the argument type and
// [Tool.OutputSchema] from the result type and [ErrorResult], so a client
// can validate a call's arguments and its structured content. A host checks
// a configuration with [Config.Check] before it has a workspace; [New]
// checks it the same way.
package tools

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
	"github.com/sandboxd/sandboxd/workspaceshell/interp"
)

// Env is what a tool set works on.
type Env struct {
	// FS is the workspace's files. Required.
	FS workspace.FileSystem
	// Bash runs commands in the workspace. When nil, the bash tool is left
	// out of the catalogue (and "shell" in Config.Always is an error).
	Bash workspace.Bash
	// Session names the session; Session.Root is the workspace root as an
	// absolute path ("/workspace" when empty), against which paths the model
	// writes are resolved.
	Session workspace.Session
	// Sources sends the requests of the configuration's http sources for
	// the shell tool's curl. When nil and the configuration declares http
	// sources, New builds a sources.Gateway (auditing to slog's default
	// logger); the daemon passes its own, auditing to its log.
	Sources interp.SourceClient
	// Scope is the actor's scope: rules of what this agent may see and
	// commit, applied on top of Config's visible and commit rules (it can
	// only narrow them). Zero: Config's rules alone.
	Scope scope.Rules
	// JournalStore is where the session's journal keeps its commits and the
	// contents it may restore: a file system the workspace's commands
	// cannot write, so that they cannot choose what a failed workspace_exec
	// "restores". It comes from whoever wires the session: the daemon
	// gives each session a private directory of its own. Nil: the journal
	// is kept in memory (journal.InMemory), held by the Set and lost with
	// it. The journal checks every kept content against its hash either
	// way.
	JournalStore workspace.FileSystem
	// Egress, when set, traces the connections of the commands the tools
	// run through the session's egress (EgressTracer): their results list
	// what was decided. Nil: commands' results carry no egress.
	Egress EgressTracer
	// Gate, when set, is called before each tool call, which waits for it
	// and calls done once it has run: the daemon holds a call that may
	// change the workspace (readOnly false) until the session's first tree
	// is read (its diff's baseline), and lets that read give way to a call
	// that only reads. An error fails the call, which then changes nothing.
	Gate func(ctx context.Context, readOnly bool) (done func(), err error)
	// SkillsChanged, when set, is called once load_skill made a skill
	// active, before the call answers: the daemon keeps the session's
	// active skills (ActiveSkills) with its record, for the run that
	// resumes it. An error fails the call, and the skill is made inactive
	// again.
	SkillsChanged func(ctx context.Context) error
	// PastBackground, when set, are the background commands of the
	// session's earlier workspace, which ended with it (a pause):
	// bash_output and bash_kill answer them as they ended, saying why, and
	// the workspace's own are numbered after them.
	PastBackground *PastBackground
}

// Tool describes one tool of the catalogue; it marshals to the shape of
// `sandboxd tools --json`.
type Tool struct {
	Name        string          `json:"name"`
	Skill       string          `json:"skill"`
	Active      bool            `json:"active"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	// OutputSchema is the JSON Schema of the call's structured content
	// (MCP's outputSchema): one of the tool's result shapes, or, for a
	// failed call, an ErrorResult.
	OutputSchema json.RawMessage `json:"outputSchema"`
	// ReadOnly says the tool changes nothing in the workspace.
	ReadOnly bool `json:"readOnly"`
}

// Skill describes one skill of the catalogue.
type Skill struct {
	Name        string   `json:"name"`            // "workspace.edit"
	Grant       string   `json:"grant,omitempty"` // the grant it needs, if any
	Granted     bool     `json:"granted"`
	Active      bool     `json:"active"`
	Tools       []string `json:"tools"`
	Description string   `json:"description"`
}

// CallOptions are the per-call hooks of Call.
type CallOptions struct {
	// RunID names the run (an agent's turn) the call belongs to: calls are
	// counted per run against maxCallsPerRun, and bash sees it as
	// SANDBOXD_RUN_ID. Empty means Env.Session.RunID.
	RunID string
	// Progress, when set, receives bash output while the command runs: one
	// event per stream every progressMs that the stream wrote something.
	// Calls are serial, never concurrent, and end before Call returns.
	Progress func(Progress)
	// ToolsChanged, when set, is called after load_skill changed which tools
	// are active (an MCP server sends tools/list_changed).
	ToolsChanged func()
	// CallID names the call in what it leaves behind: the egress proxy's
	// records of its commands' connections (Env.Egress). Empty: the Set
	// makes one.
	CallID string
}

// Progress is a run of output from one stream of a running command.
type Progress struct {
	Tool   string `json:"tool"`
	Stream string `json:"stream"` // "stdout" or "stderr"
	Text   string `json:"text"`
}

// Result is what a call gives back: Text for the model, Structured for
// programs (one of the *Result types of this package, or *ErrorResult when
// IsError), and Image for read of an image.
type Result struct {
	Text       string
	Structured any
	Image      *Image
	IsError    bool
	// Commit is the journal commit the call made, when it changed files.
	Commit *journal.Summary
}

// Image is an image for the model.
type Image struct {
	MIMEType string
	Data     []byte
}

// Error kinds of the tool layer itself, besides the workspace kinds
// (workspace.Kind names: NotFound, OutsideWorkspace, Protected, …).
const (
	// KindCapabilityForbidden: load_skill for a skill whose grant is missing.
	KindCapabilityForbidden = "capability.forbidden"
	// KindToolUnavailable: the tool is not registered, or its skill is not
	// active yet (load it with load_skill).
	KindToolUnavailable = "ToolUnavailable"
	// KindCallLimit: the run made maxCallsPerRun calls already.
	KindCallLimit = "CallLimit"
	// KindInternal: a failure of no known kind.
	KindInternal = "Internal"
)

// ErrorResult is the structured content of a failed call.
type ErrorResult struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	// For ImageRejected and FileTooLarge: what was refused.
	Path     string `json:"path,omitempty"`
	MIMEType string `json:"mimeType,omitempty"`
	Bytes    int64  `json:"bytes,omitempty"`
}

type skillDef struct {
	name, short, grant string
	what               string // what its tools do
}

// skillDefs are the workspace-tools profile's skills; their tools are the
// catalogue's of that skill.
var skillDefs = []skillDef{
	{"workspace.read", "read", "", "look around the workspace"},
	{"workspace.edit", "edit", GrantFSWrite, "change files"},
	{"workspace.shell", "shell", GrantShellExec, "run commands"},
}

// desc describes the skill: what its tools do, and which they are.
func (sk *skillDef) desc() string {
	return sk.what + ": " + strings.Join(toolsOf(sk.name), ", ")
}

// skillByName finds a skill by its full or short name.
func skillByName(name string) *skillDef {
	for i := range skillDefs {
		if skillDefs[i].name == name || skillDefs[i].short == name {
			return &skillDefs[i]
		}
	}
	return nil
}

// call is one call in progress.
type call struct {
	tool   string
	runID  string
	callID string
	opts   CallOptions
	// fsys is the workspace as the call sees and changes it: the journal's
	// recorder for a journaled tool, else Env.FS, seen through the rules.
	fsys workspace.FileSystem
	// raw is fsys without the rules, for what the daemon itself writes
	// (snapshots of sources).
	raw workspace.FileSystem
}

type toolFunc func(s *Set, ctx context.Context, args json.RawMessage, c *call) (Result, error)

// toolDef is a tool as a set offers it, under its settings.
type toolDef struct {
	*tool
	desc     string
	schema   json.RawMessage
	readOnly bool
	// journaled tools change the workspace in this process: each call is
	// recorded as one commit of the journal (or rolled back when it fails).
	journaled bool
}

// offer adds t to the set's tools.
func (s *Set) offer(t *tool) {
	d := &toolDef{tool: t, desc: t.describe(s), schema: t.args(s)}
	if t.readOnlyIf != nil {
		d.readOnly = t.readOnlyIf(s)
	}
	if t.journaledIf != nil {
		d.journaled = t.journaledIf(s)
	}
	s.defs = append(s.defs, d)
}

// Set is a session's workspace tools.
type Set struct {
	env   Env
	cfg   Config
	root  string
	defs  []*toolDef // catalogue order; load_skill last
	spill sync.Mutex // serialises pruning of the spill directory

	shell   workspaceshell.Settings        // the workspace-shell profile's settings
	wsEntry *workspaceshell.CatalogueEntry // its catalogue entry; nil without the profile

	// rules are the operator's rules (Config.Visible, Config.Commit) and
	// the actor's scope (Env.Scope), each set applied in turn; none when
	// the session is unscoped. view is Env.FS seen through them, made once.
	rules []scope.Rules
	view  workspace.FileSystem

	mu      sync.Mutex
	active  map[string]bool // skill name → active
	runs    map[string]int  // run ID → calls made
	journal *journal.Journal
	// provider is the active provider run (BeginProviderRun), or nil.
	provider *journal.Session

	bg *backgrounds // bash's background commands
}

// New builds a tool set. It checks cfg as Config.Check does, with what env
// gives, and fails with Check's message (after "tools: ").
func New(env Env, cfg Config) (*Set, error) {
	if env.FS == nil {
		return nil, errors.New("tools: Env.FS is required")
	}
	if err := cfg.Check(Caps{Bash: env.Bash != nil, Scope: env.Scope}); err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	root := env.Session.Root
	if root == "" {
		root = "/workspace"
	}
	if !path.IsAbs(root) {
		return nil, fmt.Errorf("tools: Session.Root %q is not an absolute path", root)
	}
	if env.Sources == nil && cfg.Sources.HTTP() {
		g, err := sources.NewGateway(cfg.Sources)
		if err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
		env.Sources = g
	}
	s := &Set{env: env, cfg: cfg, root: path.Clean(root), active: map[string]bool{"workspace.read": true}, runs: map[string]int{}}
	s.bg = &backgrounds{}
	if env.Bash != nil {
		s.bg.BackgroundBash, s.bg.durable = workspace.Background(env.Bash)
		if p := env.PastBackground; p != nil && len(p.Commands) > 0 {
			s.bg.BackgroundBash, s.bg.cause = pastBackground(s.bg.BackgroundBash, p), p.Cause
		}
	}
	for _, r := range []scope.Rules{cfg.Rules(), env.Scope} {
		if !r.IsZero() {
			s.rules = append(s.rules, r)
		}
	}
	var err error
	if s.view, err = s.through(env.FS); err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	for _, a := range cfg.Always {
		s.active[skillByName(a).name] = true
	}
	profiles := cfg.Profiles()
	if slices.Contains(profiles, ProfileWorkspaceTools) {
		for _, name := range slices.Concat(AllTools, BackgroundTools) {
			t := lookupTool(name)
			if slices.Contains(cfg.Tools, cmp.Or(t.companion, name)) && (t.offered == nil || t.offered(s)) {
				s.offer(t)
			}
		}
	}
	if slices.Contains(profiles, ProfileWorkspaceShell) {
		s.shell = cfg.ShellSettings()
		entry, err := s.shell.Catalogue()
		if err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
		if cfg.Sources.HTTP() && entry.Commands != nil { // the controlled curl of API-backed sources
			entry.Commands = append(entry.Commands, "curl")
		}
		s.wsEntry = entry
		s.active[SkillWorkspaceShell] = true
		for _, name := range entryTools(entry) {
			t := lookupTool(name)
			if t == nil {
				return nil, fmt.Errorf("tools: the workspace-shell profile gives a tool %q that the catalogue does not declare", name)
			}
			s.offer(t)
		}
	}
	if slices.Contains(cfg.Grants, GrantFSWrite) {
		s.active[SkillJournal] = true
		for _, name := range JournalTools {
			s.offer(lookupTool(name))
		}
	}
	if slices.Contains(profiles, ProfileWorkspaceTools) {
		s.offer(loadSkillTool)
	}
	return s, nil
}

// scoped says the session has rules: its tools see the workspace through
// them, and it is offered no bash, whose commands the rules could not bind.
// workspace_exec runs under commit rules alone: the journal puts back what
// its process changed outside them.
func (s *Set) scoped() bool { return len(s.rules) > 0 }

// hidesPaths says some rule limits what is visible, which no process can
// be held to: workspace_exec is refused then.
func (s *Set) hidesPaths() bool {
	for _, r := range s.rules {
		if r.Visible != nil {
			return true
		}
	}
	return false
}

// through returns the session's one view of fsys: behind the guard of the
// protect globs (workspace.Guard), then seen through the operator's rules
// and the actor's scope. Every tool of both profiles reads and changes the
// workspace through it; journaled calls get it over the journal's recorder.
func (s *Set) through(fsys workspace.FileSystem) (workspace.FileSystem, error) {
	fsys = workspace.Guard(fsys, s.root, s.cfg.Protect)
	for _, r := range s.rules {
		var err error
		if fsys, err = scope.New(fsys, s.root, r); err != nil {
			return nil, err
		}
	}
	return fsys, nil
}

// Config returns the set's configuration.
func (s *Set) Config() Config { return s.cfg }

// Root returns the workspace root paths are resolved against.
func (s *Set) Root() string { return s.root }

// List returns the catalogue: every registered tool, whether active or not,
// and load_skill (skill "", always active).
func (s *Set) List() []Tool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Tool, 0, len(s.defs))
	for _, d := range s.defs {
		out = append(out, Tool{Name: d.name, Skill: d.skill, Active: s.isActive(d), Description: d.desc,
			InputSchema: d.schema, OutputSchema: d.out, ReadOnly: d.readOnly})
	}
	return out
}

// Active returns the tools a model may call now.
func (s *Set) Active() []Tool {
	var out []Tool
	for _, t := range s.List() {
		if t.Active {
			out = append(out, t)
		}
	}
	return out
}

// Skills returns the skill catalogue.
func (s *Set) Skills() []Skill {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Skill, 0, len(skillDefs))
	if !slices.Contains(s.cfg.Profiles(), ProfileWorkspaceTools) {
		return out // the skills are workspace-tools'
	}
	for _, sk := range skillDefs {
		out = append(out, Skill{
			Name: sk.name, Grant: sk.grant, Granted: s.granted(&sk), Active: s.active[sk.name],
			Tools: s.registered(&sk), Description: sk.desc(),
		})
	}
	return out
}

// ActiveSkills returns the names of the catalogue's skills (those
// load_skill activates) active now, in its order.
func (s *Set) ActiveSkills() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sk := range skillDefs {
		if s.active[sk.name] {
			out = append(out, sk.name)
		}
	}
	return out
}

// Activate makes skill active as load_skill does, without a call and
// without Env.SkillsChanged: a host gives a session back the skills it had
// (ActiveSkills). It fails, activating nothing, for a skill that is
// unknown or whose grant the set does not have.
func (s *Set) Activate(skill string) error {
	sk := skillByName(skill)
	if sk == nil {
		return fmt.Errorf("tools: unknown skill %q", skill)
	}
	if !s.granted(sk) {
		return fmt.Errorf("tools: the skill %s needs the grant %s, which this session does not have", sk.name, sk.grant)
	}
	s.mu.Lock()
	s.active[sk.name] = true
	s.mu.Unlock()
	return nil
}

func (s *Set) granted(sk *skillDef) bool {
	return sk.grant == "" || slices.Contains(s.cfg.Grants, sk.grant)
}

// registered lists the skill's tools that this set has.
func (s *Set) registered(sk *skillDef) []string {
	out := []string{}
	for _, d := range s.defs {
		if d.skill == sk.name {
			out = append(out, d.name)
		}
	}
	return out
}

func (s *Set) isActive(d *toolDef) bool { return d.skill == "" || s.active[d.skill] }

func (s *Set) lookup(name string) *toolDef {
	for _, d := range s.defs {
		if d.name == name {
			return d
		}
	}
	return nil
}

// EndRun forgets a run's call count.
func (s *Set) EndRun(runID string) {
	s.mu.Lock()
	delete(s.runs, runID)
	s.mu.Unlock()
}

// Call runs one tool with JSON arguments (nil or "null" is {}). Unknown
// argument names are refused (InvalidArgument), as are tools that are not
// active and calls past maxCallsPerRun. Call never panics on bad input and
// never returns a Go error: every failure is a Result with IsError set.
func (s *Set) Call(ctx context.Context, name string, args json.RawMessage, opts CallOptions) Result {
	c := &call{tool: name, runID: opts.RunID, callID: opts.CallID, opts: opts, fsys: s.view, raw: s.env.FS}
	if c.runID == "" {
		c.runID = s.env.Session.RunID
	}
	if c.callID == "" {
		c.callID = "call-" + strings.ToLower(rand.Text()[:16])
	}
	d := s.lookup(name)
	if d == nil {
		return failure(KindToolUnavailable, fmt.Sprintf("no tool named %q", name))
	}
	s.mu.Lock()
	active := s.isActive(d)
	over := s.cfg.MaxCallsPerRun > 0 && s.runs[c.runID] >= s.cfg.MaxCallsPerRun
	if !over {
		s.runs[c.runID]++
	}
	s.mu.Unlock()
	if over {
		return failure(KindCallLimit, fmt.Sprintf("this run made its %d tool calls, the cap maxCallsPerRun sets: finish the turn, or start a new run (a new run ID), or have the operator raise maxCallsPerRun in the tools configuration (0 for no cap; sandboxd mcp --config FILE)", s.cfg.MaxCallsPerRun))
	}
	if !active {
		if sk := skillByName(d.skill); sk != nil && !s.granted(sk) {
			// Said at once: load_skill would only fail naming the grant.
			return failure(KindToolUnavailable, fmt.Sprintf("tool %s needs the skill %s, whose grant %s this session was not given: load_skill cannot help; the grant is given when a session starts", name, d.skill, sk.grant))
		}
		return failure(KindToolUnavailable, fmt.Sprintf("tool %s is not active: call load_skill with skill %q first", name, d.skill))
	}
	if s.env.Gate != nil {
		done, err := s.env.Gate(ctx, d.readOnly)
		if err != nil {
			return errorResult(err)
		}
		defer done()
	}
	if d.journaled {
		return s.recorded(ctx, d, args, c)
	}
	res, err := d.run(s, ctx, args, c)
	if err != nil {
		return errorResult(err)
	}
	return res
}

// decodeArgs decodes a call's arguments strictly into p. Text that is not
// UTF-8 is refused (see badText), not replaced with U+FFFD as encoding/json
// would, so no content or path changes without the caller being told.
//
// valid lists the arguments the tool takes, for the message that refuses an
// unknown one (called only then).
func decodeArgs(args json.RawMessage, p any, valid func() []string) error {
	args = bytes.TrimSpace(args)
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	if at, what := badText(args); at >= 0 {
		where := "arguments"
		var fields map[string]json.RawMessage
		_ = json.Unmarshal(args, &fields)
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			if at, what = badText(fields[name]); at >= 0 {
				where = "argument " + name
				break
			}
		}
		return invalid("%s: not UTF-8 text (%s at byte %d of its JSON), and text is not changed silently; send it as UTF-8 (binary content: base64 it and decode it with bash)", where, what, at)
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(p); err != nil {
		msg := err.Error()
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field != "":
			msg = fmt.Sprintf("argument %s: want %s, got JSON %s", te.Field, te.Type, te.Value)
		case strings.HasPrefix(msg, "json: unknown field "):
			msg = "unknown argument " + strings.TrimPrefix(msg, "json: unknown field ")
			if names := valid(); len(names) > 0 {
				msg += " (the arguments are " + strings.Join(names, ", ") + ")"
			} else {
				msg += " (the tool takes no arguments)"
			}
		default:
			msg = "arguments: " + strings.TrimPrefix(msg, "json: ")
		}
		return invalid("%s", msg)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("arguments: more than one JSON value")
	}
	return nil
}

// badText finds, in JSON text, what encoding/json would silently replace
// with U+FFFD: a byte sequence that is not UTF-8, or a \u escape of half a
// UTF-16 surrogate pair. It returns the offset and what is there, or -1.
func badText(data []byte) (int, string) {
	if !utf8.Valid(data) {
		for i := 0; i < len(data); {
			r, n := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && n == 1 {
				return i, fmt.Sprintf("byte 0x%02x", data[i])
			}
			i += n
		}
	}
	// Backslashes appear only in strings, each starting an escape.
	for i := bytes.IndexByte(data, '\\'); i >= 0 && i+1 < len(data); {
		next := i + 2
		if data[i+1] == 'u' {
			next = i + 6
			r := hex4(data[i+2:])
			switch {
			case utf16.IsSurrogate(r) && r < 0xdc00 && bytes.HasPrefix(data[min(next, len(data)):], []byte(`\u`)) &&
				utf16.DecodeRune(r, hex4(data[next+2:])) != utf8.RuneError:
				next += 6 // a whole pair
			case utf16.IsSurrogate(r):
				return i, fmt.Sprintf(`the lone surrogate escape %s`, data[i:min(i+6, len(data))])
			}
		}
		j := bytes.IndexByte(data[min(next, len(data)):], '\\')
		if j < 0 {
			break
		}
		i = next + j
	}
	return -1, ""
}

// hex4 is the value of the four hex digits b starts with, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	v, err := strconv.ParseUint(string(b[:4]), 16, 16)
	if err != nil {
		return -1
	}
	return rune(v)
}

// toolError is a failure with a kind and a message written for the model
// (a *workspace.Error), and what its result names besides: the file refused,
// its type and size.
type toolError struct {
	err *workspace.Error
	res ErrorResult // Path, MIMEType, Bytes
}

func (e *toolError) Error() string { return e.err.Kind.Name() + ": " + e.err.Msg }
func (e *toolError) Unwrap() error { return e.err }

func newError(kind *workspace.Kind, format string, args ...any) *toolError {
	return &toolError{err: &workspace.Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}}
}

func invalid(format string, args ...any) *toolError {
	return newError(workspace.ErrInvalidArgument, format, args...)
}

func failure(kind, msg string) Result {
	return Result{Text: kind + ": " + msg, Structured: &ErrorResult{Error: kind, Message: msg}, IsError: true}
}

// errorResult turns an error into a failure the model can act on.
func errorResult(err error) Result {
	var te *toolError
	if errors.As(err, &te) {
		r := te.res
		r.Error, r.Message = te.err.Kind.Name(), te.err.Msg
		return Result{Text: r.Error + ": " + r.Message, Structured: &r, IsError: true}
	}
	var pr *workspace.ProtectedError
	if errors.As(err, &pr) { // the guard's message names the path
		return failure(workspace.ErrProtected.Name(), pr.Error())
	}
	kind := KindInternal
	if k := workspace.KindOf(err); k != nil {
		kind = k.Name()
	} else if errors.Is(err, context.Canceled) {
		kind = "Canceled"
	}
	msg := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		msg = displayName(pe.Path) + ": " + pe.Err.Error()
	}
	if hint := kindHints[kind]; hint != "" {
		msg += " (" + hint + ")"
	}
	return failure(kind, msg)
}

var kindHints = map[string]string{
	"OutsideWorkspace": "paths must stay inside the workspace; use a path relative to its root",
	"Protected":        "write and edit refuse this path",
	"NotAFile":         "only regular files can be read or changed; use ls for a directory",
	"NotADirectory":    "use read for a file",
	"NotUtf8":          "edit changes UTF-8 text only; rewrite the file with write or bash",
	"NoSpace":          "the workspace's disk is full: remove files you no longer need, build outputs and caches too, to free space; its size is the operator's limits.workspaceBytes",
}

func displayName(name string) string {
	if name == "" {
		return "."
	}
	return name
}
