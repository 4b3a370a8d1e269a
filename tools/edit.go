package tools

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/pmezard/go-difflib/difflib"
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
type Replacement struct {
	OldText string `json:"oldText" jsonschema:"text that appears exactly once in the file"`
	NewText string `json:"newText" jsonschema:"its replacement"`
}

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

// editTries bounds how often edit reads a file again that changed between
// its reading and its swap.
const editTries = 4

// edit reads the file, applies the edits, and swaps the result in on the
// condition that the file still holds what was read (SwapRequest.OldSum),
// under its lock: two round trips to an agent. When the file changed in
// between, it starts over, at most editTries times. Under a scope's rules
// it holds the lock from before the read to the write instead.
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
	for range editTries {
		old, updated, lines, err := s.applyEdits(ctx, c, name, p.Edits)
		if err != nil {
			// A refusal of the change comes first, as when it is asked
			// before the read: a link into .git is Protected, whatever
			// is (not) there.
			if _, cerr := workspace.CheckChange(ctx, c.fsys, s.root, name); cerr != nil {
				return Result{}, cerr
			}
			return Result{}, err
		}
		res, err := workspace.Swap(ctx, c.fsys, workspace.SwapRequest{Name: name, Data: updated, Perm: 0o644, Root: s.root,
			Max: int64(len(old)), OldSum: workspace.Sum(old), Lock: true})
		if err != nil {
			return Result{}, err
		}
		if !res.Unmet {
			return editResult(name, old, updated, lines), nil
		}
	}
	return Result{}, newError(workspace.ErrUnavailable, "%s changed while it was being edited, %d times; read it again and retry", name, editTries)
}

// applyEdits reads name and applies the edits to it.
func (s *Set) applyEdits(ctx context.Context, c *call, name string, edits []Replacement) (old, updated []byte, lines []int, err error) {
	if old, err = s.load(ctx, c.fsys, name, "edit"); err != nil {
		return nil, nil, nil, err
	}
	updated, lines, err = ApplyEdits(old, edits, s.cfg.FuzzyEdit)
	if err != nil {
		var te *toolError
		if errors.As(err, &te) {
			te.err.Msg = name + ": " + te.err.Msg
		}
		return nil, nil, nil, err
	}
	return old, updated, lines, nil
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

// ApplyEdits applies replacements to a file's content, the way the edit tool
// does, and returns the new content and, for each replacement in argument
// order, the line of the new content where it starts.
//
// Every OldText must occur exactly once in content as it was before the call
// (ErrNoMatch, ErrAmbiguous), and the replaced spans must not overlap
// (ErrInvalidArgument). OldText and NewText may be written with "\n" or
// "\r\n": a file whose lines end in "\r\n" is matched without its "\r"s, and
// new text is written with the file's line ending. When fuzzy is set and an
// OldText is not found exactly, it is matched once more with whitespace,
// quotes and dashes normalised, and that match must be unique too. A
// byte-order mark and every byte outside the replaced spans are kept as they
// were. Content that is not valid UTF-8 is refused (ErrNotUTF8), and so is
// such a replacement (ErrInvalidArgument).
func ApplyEdits(content []byte, edits []Replacement, fuzzy bool) ([]byte, []int, error) {
	if !utf8.Valid(content) {
		return nil, nil, newError(workspace.ErrNotUTF8, "the file is not valid UTF-8 (Latin-1, say); edit would replace the bytes it cannot decode, so it refuses. Rewrite it with write or bash")
	}
	const bom = "\ufeff"
	text := string(content)
	prefix := ""
	if strings.HasPrefix(text, bom) {
		prefix, text = bom, text[len(bom):]
	}
	norm, crs := stripCR(text)
	crlf := len(crs) > 0 && len(crs) >= strings.Count(norm, "\n")-len(crs)
	toOrig := func(o int) int { return o + sort.SearchInts(crs, o) }

	type span struct{ start, end, edit int }
	spans := make([]span, 0, len(edits))
	var fz *folded
	for i, e := range edits {
		if !utf8.ValidString(e.OldText) || !utf8.ValidString(e.NewText) {
			return nil, nil, invalid("edits[%d] is not valid UTF-8", i)
		}
		old, _ := stripCR(e.OldText)
		if old == "" {
			return nil, nil, invalid("edits[%d].oldText is empty", i)
		}
		at := occurrences(norm, old)
		how := ""
		if len(at) == 0 && fuzzy {
			if fz == nil {
				fz = fold(norm)
			}
			fold := fold(old).text
			if fold != "" {
				for _, o := range occurrences(fz.text, fold) {
					at = append(at, [2]int{fz.orig[o[0]], fz.orig[o[1]]})
				}
			}
			how = " (after normalising whitespace, quotes and dashes)"
		}
		switch {
		case len(at) == 0:
			return nil, nil, newError(workspace.ErrNoMatch, "edits[%d].oldText was not found. It must match the file exactly; read the file again and copy the text", i)
		case len(at) > 1:
			return nil, nil, newError(workspace.ErrAmbiguous, "edits[%d].oldText occurs %d times%s, at lines %s; add surrounding lines to make it unique",
				i, len(at), how, lineList(norm, at))
		}
		spans = append(spans, span{toOrig(at[0][0]), toOrig(at[0][1]), i})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	for i := 1; i < len(spans); i++ {
		if spans[i].start < spans[i-1].end {
			return nil, nil, invalid("edits[%d] and edits[%d] overlap; merge them into one block", spans[i-1].edit, spans[i].edit)
		}
	}
	var b strings.Builder
	b.Grow(len(content) + 64)
	b.WriteString(prefix)
	lines := make([]int, len(edits))
	line, last := 1, 0
	for _, sp := range spans {
		line += strings.Count(text[last:sp.start], "\n")
		b.WriteString(text[last:sp.start])
		lines[sp.edit] = line
		repl, _ := stripCR(edits[sp.edit].NewText)
		if crlf {
			repl = strings.ReplaceAll(repl, "\n", "\r\n")
		}
		line += strings.Count(repl, "\n")
		b.WriteString(repl)
		last = sp.end
	}
	b.WriteString(text[last:])
	out := b.String()
	if out == string(content) {
		return nil, nil, invalid("the edits change nothing: each newText equals the text it replaces")
	}
	return []byte(out), lines, nil
}

// stripCR removes the "\r" of every "\r\n" and returns, in ascending order,
// the offsets in the result of the "\n"s that lost one.
func stripCR(s string) (string, []int) {
	if !strings.Contains(s, "\r\n") {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	var at []int
	for {
		i := strings.Index(s, "\r\n")
		if i < 0 {
			b.WriteString(s)
			return b.String(), at
		}
		b.WriteString(s[:i])
		at = append(at, b.Len())
		s = s[i+1:]
	}
}

// occurrences returns the spans of every occurrence of sub in s, overlapping
// ones included (so "aa" occurs twice in "aaa"). It stops counting at three:
// callers only tell one from many.
func occurrences(s, sub string) [][2]int {
	var out [][2]int
	for off := 0; len(out) < 3; {
		i := strings.Index(s[off:], sub)
		if i < 0 {
			break
		}
		out = append(out, [2]int{off + i, off + i + len(sub)})
		_, size := utf8.DecodeRuneInString(s[off+i:])
		off += i + size
	}
	return out
}

func lineList(s string, at [][2]int) string {
	var l []string
	for _, a := range at {
		l = append(l, strconv.Itoa(1+strings.Count(s[:a[0]], "\n")))
	}
	if len(at) >= 3 {
		l = append(l, "…")
	}
	return strings.Join(l, ", ")
}

// folded is text with whitespace, quotes and dashes normalised, and the
// offset in the original of every byte (and of the end).
type folded struct {
	text string
	orig []int
}

// fold normalises s for edit's fuzzy match: a run of horizontal whitespace
// becomes one space, and disappears at the end of a line or of the text;
// typographic quotes become ' and ", and dashes and minus signs become -.
func fold(s string) *folded {
	var b []byte
	orig := make([]int, 0, len(s)+1)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if isHSpace(r) {
			j := i + size
			for j < len(s) {
				r2, size2 := utf8.DecodeRuneInString(s[j:])
				if !isHSpace(r2) {
					break
				}
				j += size2
			}
			if j < len(s) && s[j] != '\n' {
				b = append(b, ' ')
				orig = append(orig, i)
			}
			i = j
			continue
		}
		if c := foldRune(r); c != 0 {
			b = append(b, c)
			orig = append(orig, i)
		} else {
			for k := range size {
				b = append(b, s[i+k])
				orig = append(orig, i+k)
			}
		}
		i += size
	}
	orig = append(orig, len(s))
	return &folded{text: string(b), orig: orig}
}

func isHSpace(r rune) bool {
	switch r {
	case ' ', '\t', '\v', '\f', '\u00a0', '\u1680', '\u202f', '\u205f', '\u3000', '\ufeff':
		return true
	}
	return r >= '\u2000' && r <= '\u200a'
}

func foldRune(r rune) byte {
	switch r {
	case '\u2018', '\u2019', '\u201a', '\u201b', '\u2032':
		return '\''
	case '\u201c', '\u201d', '\u201e', '\u201f', '\u2033', '\u00ab', '\u00bb':
		return '"'
	case '\u2010', '\u2011', '\u2012', '\u2013', '\u2014', '\u2015', '\u2212':
		return '-'
	}
	return 0
}
