package conformance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"github.com/sandboxd/sandboxd/textedit"
	"github.com/sandboxd/sandboxd/workspace"
)

// swapCase is one workspace.Swap on a tree: what it must report (as
// describeSwap writes it), the error it must give and the tree it must
// leave. Each runs twice, through workspace.Swap (the adapter's own when it
// is a workspace.SwapFS) and through workspace.SwapGeneric, so that the two
// are held to the same answer.
type swapCase struct {
	name   string
	layout []string
	req    workspace.SwapRequest // Root is the fixture's; Max 1 MiB when 0
	want   string
	err    errs
	// msg, for an edit's failure, is the matching's message (textedit's),
	// which its *fs.PathError with Op "edit" must carry unchanged.
	msg   string
	after []string
}

var swapCases = []swapCase{
	{name: "Create", req: swapReq("f", "new"), want: "f: was none, now file 3", after: l("f: new")},
	{name: "Replace", layout: l("f: old contents"), req: swapReq("f", "new"),
		want: `f: was file 12 "old contents", now file 3`, after: l("f: new")},
	{name: "ReplaceEmpty", layout: l("f"), req: swapReq("f", "new"), want: `f: was file 0 "", now file 3`, after: l("f: new")},
	{name: "Truncate", layout: l("f: old"), req: swapReq("f", ""), want: `f: was file 3 "old", now file 0`, after: l("f")},
	{name: "ExactlyMax", layout: l("f: 12345"), req: workspace.SwapRequest{Name: "f", Data: []byte("x"), Max: 5},
		want: `f: was file 5 "12345", now file 1`, after: l("f: x")},
	{name: "OverMax", layout: l("f: 123456"), req: workspace.SwapRequest{Name: "f", Data: []byte("x"), Max: 5},
		want: "f: was file 6, now file 1", after: l("f: x")},
	{name: "Nested", layout: l("a/b/f: old"), req: swapReq("a/b/f", "new"), want: `a/b/f: was file 3 "old", now file 3`, after: l("a/b/f: new")},
	{name: "ThroughLink", layout: l("f: old", "l => f"), req: swapReq("l", "new"),
		want: `f: was file 3 "old", now file 3`, after: l("f: new", "l => f")},
	{name: "ThroughAbsoluteLink", layout: l("d/f: old", "l => $ROOT/d/f"), req: swapReq("l", "new"),
		want: `d/f: was file 3 "old", now file 3`, after: l("d/f: new", "l => $ROOT/d/f")},
	{name: "ThroughLinkedDir", layout: l("d/", "ld => d"), req: swapReq("ld/f", "new"),
		want: "d/f: was none, now file 3", after: l("d/f: new", "ld => d")},
	{name: "ParentMissing", req: swapReq("no/f", "x"), err: notFound},
	{name: "UnderFile", layout: l("f: x"), req: swapReq("f/g", "x"), err: underFile},
	{name: "Directory", layout: l("d/x"), req: swapReq("d", "x"), err: notAFile},
	{name: "Root", req: swapReq(".", "x"), err: notAFile},
	{name: "Invalid", req: swapReq("../f", "x"), err: is(workspace.ErrInvalidArgument, workspace.ErrOutsideWorkspace)},
	{name: "FIFO", layout: l("p|"), req: swapReq("p", "x"), err: notAFile},
	{name: "LinkOut", layout: l("l => $OUTSIDE/secret"), req: swapReq("l", "pwned"), err: outside},
	{name: "UnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), req: swapReq("ld/new", "pwned"), err: outside},
	// The conditions: an unmet one writes nothing, with no error.
	{name: "RealMet", layout: l("f: old"), req: swapIf(swapReq("f", "new"), "f", nil),
		want: `f: was file 3 "old", now file 3`, after: l("f: new")},
	{name: "RealMetThroughLink", layout: l("f: old", "l => f"), req: swapIf(swapReq("l", "new"), "f", nil),
		want: `f: was file 3 "old", now file 3`, after: l("f: new", "l => f")},
	{name: "RealUnmetThroughLink", layout: l("f: old", "l => f"), req: swapIf(swapReq("l", "new"), "l", nil),
		want: `f: was file 3 "old", now none (unmet)`, after: l("f: old", "l => f")},
	{name: "RealUnmetNew", layout: l("d/", "ld => d"), req: swapIf(swapReq("ld/f", "new"), "ld/f", nil),
		want: "d/f: was none, now none (unmet)", after: l("d/", "ld => d")},
	{name: "SumMet", layout: l("f: old"), req: swapIf(swapReq("f", "new"), "", []byte("old")),
		want: `f: was file 3 "old", now file 3`, after: l("f: new")},
	{name: "SumMetEmpty", layout: l("f"), req: swapIf(swapReq("f", "new"), "f", []byte{}),
		want: `f: was file 0 "", now file 3`, after: l("f: new")},
	{name: "SumUnmet", layout: l("f: other"), req: swapIf(swapReq("f", "new"), "", []byte("old")),
		want: `f: was file 5 "other", now none (unmet)`, after: l("f: other")},
	{name: "SumUnmetMissing", req: swapIf(swapReq("f", "new"), "", []byte("old")),
		want: "f: was none, now none (unmet)"},
	{name: "SumUnmetOverMax", layout: l("f: old"), req: workspace.SwapRequest{Name: "f", Data: []byte("x"), Max: 2, OldSum: workspace.Sum([]byte("old"))},
		want: "f: was file 3, now none (unmet)", after: l("f: old")},
	{name: "SumUnmetDirectory", layout: l("d/x"), req: swapIf(swapReq("d", "new"), "", []byte("old")),
		want: "d: was type d---------, now none (unmet)", after: l("d/x")},
	{name: "Locked", layout: l("f: old"), req: workspace.SwapRequest{Name: "f", Data: []byte("new"), Perm: 0o644, Lock: true},
		want: `f: was file 3 "old", now file 3`, after: l("f: new")},
	{name: "LockedCreate", layout: l("d/"), req: workspace.SwapRequest{Name: "d/f", Data: []byte("new"), Perm: 0o644, Lock: true, Real: "d/f"},
		want: "d/f: was none, now file 3", after: l("d/", "d/f: new")},
	// An edit (SwapRequest.Edit): the new contents are the old ones with the
	// edit applied, in the step that reads them; a failure writes nothing.
	{name: "Edit", layout: l(`f: "a\nb\nc\n"`), req: swapEdit("f", false, "b", "B"),
		want: `f: was file 6 "a\nb\nc\n", now file 6, wrote "a\nB\nc\n"`, after: l(`f: "a\nB\nc\n"`)},
	{name: "EditBlocks", layout: l(`f: "a\r\nb\r\nc\r\n"`), req: swapEdit("f", false, "c\n", "C\nD\n", "a\n", ""),
		want: `f: was file 9 "a\r\nb\r\nc\r\n", now file 9, wrote "b\r\nC\r\nD\r\n"`, after: l(`f: "b\r\nC\r\nD\r\n"`)},
	{name: "EditFuzzy", layout: l("f: say(“hi”)"), req: swapEdit("f", true, `say("hi")`, "bye"),
		want: `f: was file 13 "say(“hi”)", now file 3, wrote "bye"`, after: l("f: bye")},
	{name: "EditLocked", layout: l("f: old"), req: lockedEdit(swapEdit("f", false, "old", "new")),
		want: `f: was file 3 "old", now file 3, wrote "new"`, after: l("f: new")},
	{name: "EditExactlyMax", layout: l("f: 12345"), req: maxEdit(swapEdit("f", false, "3", "x"), 5),
		want: `f: was file 5 "12345", now file 5, wrote "12x45"`, after: l("f: 12x45")},
	{name: "EditThroughLink", layout: l("f: old", "l => f"), req: swapEdit("l", false, "old", "new"),
		want: `f: was file 3 "old", now file 3, wrote "new"`, after: l("f: new", "l => f")},
	{name: "EditNoMatch", layout: l("f: abc"), req: swapEdit("f", false, "abd", "x"), err: is(workspace.ErrNoMatch),
		msg: "edits[0].oldText was not found. It must match the file exactly; read the file again and copy the text"},
	{name: "EditNoMatchFuzzyOff", layout: l("f: say(“hi”)"), req: swapEdit("f", false, `say("hi")`, "bye"), err: is(workspace.ErrNoMatch),
		msg: "edits[0].oldText was not found. It must match the file exactly; read the file again and copy the text"},
	{name: "EditEmptyFile", layout: l("f"), req: swapEdit("f", false, "x", "y"), err: is(workspace.ErrNoMatch),
		msg: "edits[0].oldText was not found. It must match the file exactly; read the file again and copy the text"},
	{name: "EditAmbiguous", layout: l(`f: "ab\nab\n"`), req: swapEdit("f", false, "ab", "x"), err: is(workspace.ErrAmbiguous),
		msg: "edits[0].oldText occurs 2 times, at lines 1, 2; add surrounding lines to make it unique"},
	{name: "EditNotUTF8", layout: l(`f: "caf\xe9"`), req: swapEdit("f", false, "caf", "x"), err: is(workspace.ErrNotUTF8),
		msg: "the file is not valid UTF-8 (Latin-1, say); edit would replace the bytes it cannot decode, so it refuses. Rewrite it with write or bash"},
	{name: "EditTextNotUTF8", layout: l("f: abc"), req: swapEdit("f", false, "b\xff", "x"), err: invalid,
		msg: "edits[0] is not valid UTF-8"},
	{name: "EditOverlap", layout: l("f: abcd"), req: swapEdit("f", false, "abc", "x", "cd", "y"), err: invalid,
		msg: "edits[0] and edits[1] overlap; merge them into one block"},
	{name: "EditNoChange", layout: l("f: abc"), req: swapEdit("f", false, "b", "b"), err: invalid,
		msg: "the edits change nothing: each newText equals the text it replaces"},
	{name: "EditMissing", req: swapEdit("f", false, "a", "b"), err: notFound},
	{name: "EditParentMissing", req: swapEdit("no/f", false, "a", "b"), err: notFound},
	{name: "EditDirectory", layout: l("d/x"), req: swapEdit("d", false, "a", "b"), err: notAFile},
	{name: "EditFIFO", layout: l("p|"), req: swapEdit("p", false, "a", "b"), err: notAFile},
	{name: "EditOverMax", layout: l("f: 123456"), req: maxEdit(swapEdit("f", false, "1", "x"), 5), err: tooLarge},
	{name: "EditLinkOut", layout: l("l => $OUTSIDE/secret"), req: swapEdit("l", false, "a", "b"), err: outside},
	{name: "EditDanglingLink", layout: l("l => f"), req: swapEdit("l", false, "a", "b"), err: notFound},
	// Unmet conditions come first, whatever the edit would say.
	{name: "EditRealUnmetThroughLink", layout: l("f: old", "l => f"), req: swapIf(swapEdit("l", false, "nowhere", "x"), "l", nil),
		want: `f: was file 3 "old", now none (unmet)`, after: l("f: old", "l => f")},
	{name: "EditSumUnmet", layout: l("f: other"), req: swapIf(swapEdit("f", false, "other", "x"), "", []byte("old")),
		want: `f: was file 5 "other", now none (unmet)`, after: l("f: other")},
	{name: "EditSumMet", layout: l("f: old"), req: swapIf(swapEdit("f", false, "old", "new"), "f", []byte("old")),
		want: `f: was file 3 "old", now file 3, wrote "new"`, after: l("f: new")},
}

// swapEdit is an edit of name: pairs of old and new text, as textedit takes
// them.
func swapEdit(name string, fuzzy bool, pairs ...string) workspace.SwapRequest {
	e := textedit.Edit{Fuzzy: fuzzy}
	for i := 0; i+1 < len(pairs); i += 2 {
		e.Replacements = append(e.Replacements, textedit.Replacement{OldText: pairs[i], NewText: pairs[i+1]})
	}
	return workspace.SwapRequest{Name: name, Perm: 0o644, Edit: e}
}

func lockedEdit(req workspace.SwapRequest) workspace.SwapRequest { req.Lock = true; return req }

func maxEdit(req workspace.SwapRequest, max int64) workspace.SwapRequest { req.Max = max; return req }

// swapIf is req on condition that its name leads to real (when not "") and
// that the file holds old (when not nil).
func swapIf(req workspace.SwapRequest, real string, old []byte) workspace.SwapRequest {
	req.Real = real
	if old != nil {
		req.OldSum = workspace.Sum(old)
	}
	return req
}

func swapReq(name, data string) workspace.SwapRequest {
	return workspace.SwapRequest{Name: name, Data: []byte(data), Perm: 0o644}
}

// swapFSCases are the swap cases as fsCases: each through Swap and through
// SwapGeneric.
func swapFSCases() []fsCase {
	var out []fsCase
	for _, c := range swapCases {
		for _, generic := range []bool{false, true} {
			name := "Swap/" + c.name
			if generic {
				name = "SwapGeneric/" + c.name
			}
			out = append(out, fsCase{name: name, layout: c.layout, op: swapOp(c, generic), err: c.err, after: c.after})
		}
	}
	return out
}

func swapOp(c swapCase, generic bool) op {
	desc := fmt.Sprintf("workspace.Swap(%q, %q)", c.req.Name, c.req.Data)
	if c.req.Edit != nil {
		desc = fmt.Sprintf("workspace.Swap(%q, edit %+v)", c.req.Name, c.req.Edit)
	}
	swap := workspace.Swap
	if generic {
		desc, swap = "workspace.SwapGeneric"+desc[len("workspace.Swap"):], workspace.SwapGeneric
	}
	return op{desc: desc, run: func(ctx context.Context, x *fixture) (string, error) {
		req := c.req
		req.Root = x.Root
		if req.Max == 0 {
			req.Max = 1 << 20
		}
		res, err := swap(ctx, x.FS, req)
		var pe *fs.PathError
		if c.msg != "" && err != nil && (!errors.As(err, &pe) || pe.Op != "edit" || pe.Err.Error() != c.msg) {
			return "", fmt.Errorf("%v: want an *fs.PathError with Op %q and the message %q", err, "edit", c.msg) // of no kind
		}
		if err != nil {
			return "", err
		}
		if got := describeSwap(res); got != c.want {
			return fmt.Sprintf("reported %s, want %s", got, c.want), nil
		}
		for _, fi := range []fs.FileInfo{res.Old, res.New} {
			if fi != nil && fi.Name() != path.Base(res.Real) {
				return fmt.Sprintf("information named %q for %q", fi.Name(), res.Real), nil
			}
		}
		if res.Old != nil && res.New != nil && res.Old.Mode().Perm() != res.New.Mode().Perm() {
			return fmt.Sprintf("permission bits %v before, %v after: a replaced file keeps its bits", res.Old.Mode(), res.New.Mode()), nil
		}
		return "", nil
	}}
}

// describeSwap writes a result as "real: was …, now …", each side "none" or
// the type, a file's size and, when returned, its contents, and what an
// edit wrote.
func describeSwap(res workspace.SwapResult) string {
	side := func(fi fs.FileInfo, data []byte) string {
		switch {
		case fi == nil:
			return "none"
		case !fi.Mode().IsRegular():
			return "type " + fi.Mode().Type().String()
		case data != nil:
			return fmt.Sprintf("file %d %q", fi.Size(), data)
		}
		return fmt.Sprintf("file %d", fi.Size())
	}
	s := fmt.Sprintf("%s: was %s, now %s", res.Real, side(res.Old, res.OldData), side(res.New, nil))
	if res.Data != nil {
		s += fmt.Sprintf(", wrote %q", res.Data)
	}
	if res.Unmet {
		s += " (unmet)"
	}
	if res.OldData != nil && (res.Old == nil || int64(len(res.OldData)) != res.Old.Size()) {
		s += fmt.Sprintf(" (old contents of %d bytes)", len(res.OldData))
	}
	return s
}
