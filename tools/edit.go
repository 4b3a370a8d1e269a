package tools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/pmezard/go-difflib/difflib"
	"github.com/sandboxd/sandboxd/textedit"
	"github.com/sandboxd/sandboxd/workspace"
)

// EditResult is the structured content of edit.
type EditResult struct {
	Path     string `json:"path"`
	Replaced int    `json:"replaced"`
	Diff     string `json:"diff"`  // unified diff of the whole change
	Lines    []int  `json:"lines"` // where each block landed: its first line in the new file, in argument order
}

// Replacement is one block of an edit.
type Replacement = textedit.Replacement

type editArgs struct {
	Path  string        `json:"path" jsonschema:"the file to edit"`
	Edits []Replacement `json:"edits" jsonschema:"the replacements, applied together"`
}

var editTool = newTool(spec[editArgs, *EditResult]{
	name: "edit", skill: "workspace.edit",
	describe: func(s *Set) string {
		fuzzy := ""
		if s.cfg.FuzzyEdit {
			fuzzy = " When the exact text is not found, it is matched once more with whitespace, quotes and dashes normalised; that match must be unique too."
		}
		return "Replace text in a file: several blocks at once, each oldText exactly as it appears once in the file (as it was before this call), blocks not overlapping." + fuzzy +
			" Line endings and a byte-order mark are kept. Returns how many blocks were replaced and at which lines. Refuses files that are not UTF-8 and paths matching " + strings.Join(s.cfg.Protect, ", ") + "."
	},
	constrain: func(props map[string]*jsonschema.Schema) { props["edits"].MinItems = jsonschema.Ptr(1) },
	handle:    (*Set).edit,
	journaled: yes,
})

// edit applies the edits with one swap under the file's lock
// (workspace.SwapRequest.Edit): the file is read, edited and written in one
// step where it is, one round trip to an agent. Under a scope's rules it
// holds the lock from before the read to the write instead.
func (s *Set) edit(ctx context.Context, p editArgs, c *call) (Result, error) {
	if p.Path == "" || len(p.Edits) == 0 {
		return Result{}, invalid("path and at least one edit are required")
	}
	if !s.swapped() {
		return s.editLocked(ctx, p, c)
	}
	name, err := s.changeName(p.Path)
	if err != nil {
		return Result{}, err
	}
	res, err := workspace.Swap(ctx, c.fsys, workspace.SwapRequest{Name: name, Perm: 0o644, Root: s.root, Max: s.cfg.MaxFileBytes, Lock: true,
		Edit: textedit.Edit{Replacements: p.Edits, Fuzzy: s.cfg.FuzzyEdit}})
	if err != nil {
		// A refusal of the change comes first, as when it is asked
		// before the read: a link into .git is Protected, whatever is
		// (not) there.
		if _, cerr := workspace.CheckChange(ctx, c.fsys, s.root, name); cerr != nil {
			return Result{}, cerr
		}
		return Result{}, s.editFailed(ctx, c, name, err)
	}
	if res.Unmet { // no condition of ours; a view's own is its to meet
		return Result{}, newError(workspace.ErrUnavailable, "%s: the edit was not applied; retry", name)
	}
	// Where the blocks landed: the edit again, on what the swap read.
	updated, lines, err := textedit.Apply(res.OldData, p.Edits, s.cfg.FuzzyEdit)
	if err != nil || !bytes.Equal(updated, res.Data) {
		return Result{}, newError(workspace.ErrUnavailable, "%s: the workspace reported an edit that differs from its own; read the file again", name)
	}
	return editResult(name, res.OldData, updated, lines), nil
}

// applyEdits reads name and applies the edits to it.
func (s *Set) applyEdits(ctx context.Context, c *call, name string, edits []Replacement) (old, updated []byte, lines []int, err error) {
	if old, err = s.load(ctx, c.fsys, name, "edit"); err != nil {
		return nil, nil, nil, err
	}
	if updated, lines, err = textedit.Apply(old, edits, s.cfg.FuzzyEdit); err != nil {
		return nil, nil, nil, editError(name, err)
	}
	return old, updated, lines, nil
}

// editFailed is the error of an edit's swap as the tool reports it: what
// is there when it is not a file within the limit (as load says it), the
// name and the matching's own message when the edits did not apply.
func (s *Set) editFailed(ctx context.Context, c *call, name string, err error) error {
	var pe *fs.PathError
	switch {
	case errors.Is(err, workspace.ErrNotAFile) || errors.Is(err, workspace.ErrFileTooLarge):
		return s.explain(ctx, c.fsys, name, "edit", err)
	case errors.As(err, &pe) && pe.Op == "edit":
		return editError(name, pe.Err)
	}
	return err
}

// editError is an error of the edit (textedit.Apply's, or the swap's when
// there was no file to edit) with the file's name before its message.
func editError(name string, err error) error {
	if kind := workspace.KindOf(err); kind != nil {
		return newError(kind, "%s: %s", name, err.Error())
	}
	return err
}

// editLocked is edit under the file's lock from before the read to the
// write.
func (s *Set) editLocked(ctx context.Context, p editArgs, c *call) (Result, error) {
	name, unlock, err := s.lockForChange(ctx, c, p.Path)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	old, updated, lines, err := s.applyEdits(ctx, c, name, p.Edits)
	if err != nil {
		return Result{}, err
	}
	if err := c.fsys.WriteFile(ctx, name, updated, 0o644); err != nil {
		return Result{}, err
	}
	return editResult(name, old, updated, lines), nil
}

func editResult(name string, old, updated []byte, lines []int) Result {
	diff, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: diffLines(string(old)), B: diffLines(string(updated)),
		FromFile: "a/" + name, ToFile: "b/" + name, Context: 3,
	})
	where := make([]string, len(lines))
	for i, l := range lines {
		where[i] = strconv.Itoa(l)
	}
	blocks := "block"
	if len(lines) > 1 {
		blocks = "blocks"
	}
	return Result{
		Text:       fmt.Sprintf("Replaced %d %s in %s, at line %s.", len(lines), blocks, name, strings.Join(where, ", ")),
		Structured: &EditResult{Path: name, Replaced: len(lines), Diff: diff, Lines: lines},
	}
}

// diffLines splits s into lines for difflib, marking a last line without
// its newline the way diff does.
func diffLines(s string) []string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		return lines[:len(lines)-1]
	}
	lines[len(lines)-1] += "\n\\ No newline at end of file\n"
	return lines
}
