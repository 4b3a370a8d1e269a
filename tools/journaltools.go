package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/journal"
	"github.com/sandboxd/sandboxd/workspace"
)

// JournalTools are the journal's tools, given to every session with the
// fs.write grant (the catalogue's tools of SkillJournal).
var JournalTools []string

// JournalListResult is the structured content of journal_list.
type JournalListResult struct {
	Commits []journal.Summary `json:"commits"`
}

// JournalShowResult is the structured content of journal_show.
type JournalShowResult struct {
	journal.Summary
	Diff string `json:"diff"`
}

type journalListArgs struct {
	Limit int `json:"limit,omitempty" jsonschema:"the most commits to list (default 50)"`
}

var journalListTool = newTool(spec[journalListArgs, *JournalListResult]{
	name: "journal_list", skill: SkillJournal,
	describe: func(*Set) string {
		return "List the workspace journal's commits, newest first: each tool call that changed files (write, edit, writeFile, …, workspace_exec) is one commit."
	},
	constrain: func(props map[string]*jsonschema.Schema) { minimum(props, 1, "limit") },
	tolerate:  []string{"limit"}, // 0 or less is the default, 50
	handle:    (*Set).journalList,
	readOnly:  yes,
})

func (s *Set) journalList(ctx context.Context, p journalListArgs, _ *call) (Result, error) {
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

type journalShowArgs struct {
	ID int `json:"id" jsonschema:"the commit"`
}

var journalShowTool = newTool(spec[journalShowArgs, *JournalShowResult]{
	name: "journal_show", skill: SkillJournal,
	describe:  func(*Set) string { return "Show one journal commit as a unified diff." },
	constrain: func(props map[string]*jsonschema.Schema) { minimum(props, 1, "id") },
	handle:    (*Set).journalShow,
	readOnly:  yes,
})

func (s *Set) journalShow(ctx context.Context, p journalShowArgs, _ *call) (Result, error) {
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

type journalRevertArgs struct {
	To    *int `json:"to" jsonschema:"the commit to return to"`
	Force bool `json:"force,omitempty" jsonschema:"overwrite paths changed since"`
}

var journalRevertTool = newTool(spec[journalRevertArgs, *journal.RevertResult]{
	name: "journal_revert", skill: SkillJournal,
	describe: func(*Set) string {
		return "Bring the workspace back to the state right after a commit (0: before the first), undoing the later commits as one new commit, which can be reverted too. Refuses when a path was changed since by something else, unless force."
	},
	constrain: func(props map[string]*jsonschema.Schema) { minimum(props, 0, "to") },
	handle:    (*Set).journalRevert,
})

func (s *Set) journalRevert(ctx context.Context, p journalRevertArgs, _ *call) (Result, error) {
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
