// Package textedit applies the edit tool's replacements to a text file's
// contents: exact blocks of old text, each found once, replaced together,
// with the file's line endings and byte-order mark kept.
//
// It is the one implementation of that matching. The tools package calls it
// for the edit tool, and a workspace.Swap with an Edit runs it where the file
// is (an agent in a container applies it under the file's lock, in the call
// that writes), so it depends on nothing but the workspace's error kinds.
package textedit

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/workspace"
)

// Replacement is one block of an edit.
type Replacement struct {
	OldText string `json:"oldText" jsonschema:"text that appears exactly once in the file"`
	NewText string `json:"newText" jsonschema:"its replacement"`
}

// Edit is replacements applied together, as one change of a file. It is a
// workspace.Editor: a swap with it as its Edit (workspace.SwapRequest)
// writes the file's contents with the replacements applied, computed in
// the step that reads them.
type Edit struct {
	Replacements []Replacement `json:"replacements"`
	// Fuzzy matches a block that is not found exactly once more with
	// whitespace, quotes and dashes normalised (see Apply).
	Fuzzy bool `json:"fuzzy,omitempty"`
}

var _ workspace.Editor = Edit{}

// Apply returns content with e's replacements applied, as the function Apply
// does.
func (e Edit) Apply(content []byte) ([]byte, error) {
	out, _, err := Apply(content, e.Replacements, e.Fuzzy)
	return out, err
}

// Apply applies replacements to a file's content, the way the edit tool
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
// such a replacement (ErrInvalidArgument). Its errors are *workspace.Error
// values of those kinds, with a message written for whoever sent the edits
// (edits[i] names a replacement by its index).
func Apply(content []byte, edits []Replacement, fuzzy bool) ([]byte, []int, error) {
	if !utf8.Valid(content) {
		return nil, nil, workspace.Errorf(workspace.ErrNotUTF8, "the file is not valid UTF-8 (Latin-1, say); edit would replace the bytes it cannot decode, so it refuses. Rewrite it with write or bash")
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
			return nil, nil, workspace.Errorf(workspace.ErrInvalidArgument, "edits[%d] is not valid UTF-8", i)
		}
		old, _ := stripCR(e.OldText)
		if old == "" {
			return nil, nil, workspace.Errorf(workspace.ErrInvalidArgument, "edits[%d].oldText is empty", i)
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
			return nil, nil, workspace.Errorf(workspace.ErrNoMatch, "edits[%d].oldText was not found. It must match the file exactly; read the file again and copy the text", i)
		case len(at) > 1:
			return nil, nil, workspace.Errorf(workspace.ErrAmbiguous, "edits[%d].oldText occurs %d times%s, at lines %s; add surrounding lines to make it unique",
				i, len(at), how, lineList(norm, at))
		}
		spans = append(spans, span{toOrig(at[0][0]), toOrig(at[0][1]), i})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	for i := 1; i < len(spans); i++ {
		if spans[i].start < spans[i-1].end {
			return nil, nil, workspace.Errorf(workspace.ErrInvalidArgument, "edits[%d] and edits[%d] overlap; merge them into one block", spans[i-1].edit, spans[i].edit)
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
		return nil, nil, workspace.Errorf(workspace.ErrInvalidArgument, "the edits change nothing: each newText equals the text it replaces")
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
