package conformance

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/workspace"
)

// appendCase is one workspace.AppendFile on a tree. Each runs twice,
// through workspace.AppendFile (the adapter's own when it is a
// workspace.AppendFS) and through workspace.AppendFileGeneric, so that the
// two are held to the same tree.
type appendCase struct {
	name   string
	layout []string
	file   string
	data   string
	err    errs
	after  []string
}

var appendCases = []appendCase{
	{name: "Create", file: "f", data: "new", after: l("f: new")},
	{name: "Append", layout: l("f: old"), file: "f", data: " new", after: l("f: old new")},
	{name: "AppendToEmpty", layout: l("f"), file: "f", data: "x", after: l("f: x")},
	{name: "Nothing", layout: l("f: old"), file: "f", data: "", after: l("f: old")},
	{name: "Binary", layout: l("f: x"), file: "f", data: binary, after: l("f: " + quote("x"+binary))},
	{name: "Nested", layout: l("a/b/f: old"), file: "a/b/f", data: "+", after: l("a/b/f: old+")},
	{name: "ThroughLinkKeepsLink", layout: l("f: old", "l => f"), file: "l", data: "+", after: l("f: old+", "l => f")},
	{name: "ThroughLinkedDir", layout: l("d/f: old", "ld => d"), file: "ld/f", data: "+", after: l("d/f: old+", "ld => d")},
	{name: "ParentMissing", file: "no/f", data: "x", err: notFound},
	{name: "UnderFile", layout: l("f: x"), file: "f/g", data: "x", err: underFile},
	{name: "Directory", layout: l("d/x"), file: "d", data: "x", err: notAFile},
	{name: "Root", file: ".", data: "x", err: notAFile},
	{name: "FIFO", layout: l("p|"), file: "p", data: "x", err: notAFile},
	{name: "Invalid", file: "../f", data: "x", err: is(workspace.ErrInvalidArgument, workspace.ErrOutsideWorkspace)},
	{name: "LinkOut", layout: l("l => $OUTSIDE/secret"), file: "l", data: "pwned", err: outside},
	{name: "UnderLinkedDirOut", layout: l("ld => $OUTSIDE/sd"), file: "ld/new", data: "pwned", err: outside},
}

// appendFSCases are the append cases as fsCases: each through AppendFile
// and through AppendFileGeneric.
func appendFSCases() []fsCase {
	var out []fsCase
	for _, c := range appendCases {
		for _, generic := range []bool{false, true} {
			name, desc, appendFile := "AppendFile/"+c.name, "workspace.AppendFile", workspace.AppendFile
			if generic {
				name, desc, appendFile = "AppendFileGeneric/"+c.name, "workspace.AppendFileGeneric", workspace.AppendFileGeneric
			}
			out = append(out, fsCase{name: name, layout: c.layout, err: c.err, after: c.after,
				op: plainOp(fmt.Sprintf("%s(%q, %q)", desc, c.file, c.data), func(ctx context.Context, fsys workspace.FileSystem) error {
					return appendFile(ctx, fsys, c.file, []byte(c.data), 0o644)
				})})
		}
	}
	return out
}
