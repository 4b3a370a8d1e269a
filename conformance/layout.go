package conformance

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/workspace"
)

// An entry is one line of a layout: a tree described one entry a line, in the
// manner of os.Root's tests and ls -F:
//
//	"d/"          a directory
//	"f"           an empty regular file
//	"f: text"     a regular file holding text ("f: \"a\\nb\"" for a Go-quoted string)
//	"x*", "x*: t" an executable file (mode 0o755; files are otherwise 0o644)
//	"l => target" a symbolic link; $ROOT, $OUTSIDE and $OUT in target become the
//	              workspace root, the outside root and the relative path from
//	              the first to the second
//	"p|"          a named pipe
//	"s="          a Unix socket
//
// Parents are created as needed, so "a/b/c: x" implies "a/" and "a/b/".
type entry struct {
	name string
	typ  fs.FileMode // 0, fs.ModeDir, fs.ModeSymlink, fs.ModeNamedPipe or fs.ModeSocket
	data string      // a file's contents or a link's target
	exec bool        // a regular file made executable ("x*")
}

func parseLayout(lines []string, vars map[string]string) ([]entry, error) {
	var repl *strings.Replacer
	if len(vars) > 0 {
		// Longer names first, so "$OUTSIDE" is not read as "$OUT" + "SIDE".
		keys := make([]string, 0, len(vars))
		for k := range vars {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int { return len(b) - len(a) })
		var pairs []string
		for _, k := range keys {
			pairs = append(pairs, k, vars[k])
		}
		repl = strings.NewReplacer(pairs...)
	}
	out := make([]entry, 0, len(lines))
	for _, line := range lines {
		e, err := parseLine(line)
		if err != nil {
			return nil, err
		}
		if e.typ == fs.ModeSymlink && repl != nil {
			e.data = repl.Replace(e.data)
		}
		out = append(out, e)
	}
	return out, nil
}

func parseLine(line string) (entry, error) {
	bad := func() (entry, error) { return entry{}, fmt.Errorf("conformance: bad layout line %q", line) }
	if name, target, ok := strings.Cut(line, " => "); ok {
		if !fs.ValidPath(name) || name == "." || target == "" {
			return bad()
		}
		return entry{name: name, typ: fs.ModeSymlink, data: target}, nil
	}
	if name, data, ok := strings.Cut(line, ": "); ok {
		if strings.HasPrefix(data, `"`) {
			s, err := strconv.Unquote(data)
			if err != nil {
				return bad()
			}
			data = s
		}
		name, exec := strings.CutSuffix(name, "*")
		if !fs.ValidPath(name) || name == "." {
			return bad()
		}
		return entry{name: name, data: data, exec: exec}, nil
	}
	e := entry{name: line}
	for _, k := range []entry{{name: "/", typ: fs.ModeDir}, {name: "|", typ: fs.ModeNamedPipe}, {name: "=", typ: fs.ModeSocket}, {name: ":"}} {
		if n, ok := strings.CutSuffix(line, k.name); ok {
			e = entry{name: n, typ: k.typ}
			break
		}
	}
	if e.typ == 0 {
		e.name, e.exec = strings.CutSuffix(e.name, "*")
	}
	if !fs.ValidPath(e.name) || e.name == "." {
		return bad()
	}
	return e, nil
}

// String formats the entry as a canonical layout line.
func (e entry) String() string {
	switch e.typ {
	case fs.ModeDir:
		return e.name + "/"
	case fs.ModeSymlink:
		return e.name + " => " + e.data
	case fs.ModeNamedPipe:
		return e.name + "|"
	case fs.ModeSocket:
		return e.name + "="
	case 0:
		name := e.name
		if e.exec {
			name += "*"
		}
		if e.data == "" {
			return name
		}
		if plain(e.data) {
			return name + ": " + e.data
		}
		return name + ": " + strconv.Quote(e.data)
	}
	return fmt.Sprintf("%s ?%v", e.name, e.typ)
}

// perm is the permission bits a regular file is made with.
func (e entry) perm() fs.FileMode {
	if e.exec {
		return 0o755
	}
	return 0o644
}

// plain reports whether s reads back unchanged after "name: ".
func plain(s string) bool {
	if !utf8.ValidString(s) || strings.HasPrefix(s, `"`) || strings.TrimSpace(s) != s {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// canonical returns a layout as Dump would print the tree it builds: every
// implied parent directory listed, in walk order.
func canonical(entries []entry) []string {
	seen := map[string]bool{}
	var all []entry
	for _, e := range entries {
		for dir := path.Dir(e.name); dir != "."; dir = path.Dir(dir) {
			if !seen[dir+"/"] {
				seen[dir+"/"] = true
				all = append(all, entry{name: dir, typ: fs.ModeDir})
			}
		}
		key := e.name
		if e.typ == fs.ModeDir {
			key += "/"
		}
		if !seen[key] {
			seen[key] = true
			all = append(all, e)
		}
	}
	slices.SortFunc(all, func(a, b entry) int { return walkOrder(a.name, b.name) })
	lines := make([]string, len(all))
	for i, e := range all {
		lines[i] = e.String()
	}
	return lines
}

// walkOrder compares workspace names in the order of fs.WalkDir: depth
// first, each directory's entries sorted by name.
func walkOrder(a, b string) int {
	return slices.Compare(strings.Split(a, "/"), strings.Split(b, "/"))
}

// treeReader is what dumpTree needs of a file system.
type treeReader interface {
	ReadDir(name string) ([]fs.DirEntry, error)
	ReadFile(name string) ([]byte, error)
	ReadLink(name string) (string, error)
}

// dumpTree describes a tree as canonical layout lines, never following links
// and never opening anything but regular files. It reads no permission bits,
// so it never reports a file as executable ("x*").
func dumpTree(r treeReader) ([]string, error) {
	var lines []string
	var walk func(dir string) error
	walk = func(dir string) error {
		entries, err := r.ReadDir(dir)
		if err != nil {
			return err
		}
		slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, de := range entries {
			name := path.Join(dir, de.Name())
			e := entry{name: name, typ: de.Type()}
			switch de.Type() {
			case 0:
				data, err := r.ReadFile(name)
				if err != nil {
					return err
				}
				e.data = string(data)
			case fs.ModeSymlink:
				if e.data, err = r.ReadLink(name); err != nil {
					return err
				}
			}
			lines = append(lines, e.String())
			if de.IsDir() {
				if err := walk(name); err != nil {
					return err
				}
			}
		}
		return nil
	}
	err := walk(".")
	return lines, err
}

// hostTree reads a host directory.
type hostTree struct{ fsys fs.ReadLinkFS }

func (h hostTree) ReadDir(name string) ([]fs.DirEntry, error) { return fs.ReadDir(h.fsys, name) }
func (h hostTree) ReadFile(name string) ([]byte, error)       { return fs.ReadFile(h.fsys, name) }
func (h hostTree) ReadLink(name string) (string, error)       { return h.fsys.ReadLink(name) }

// wsTree reads a workspace through the port.
type wsTree struct {
	ctx  context.Context
	fsys workspace.FileSystem
}

// dumpMax bounds the files a dump reads.
const dumpMax = 64 << 20

func (w wsTree) ReadDir(name string) ([]fs.DirEntry, error) { return w.fsys.ReadDir(w.ctx, name) }
func (w wsTree) ReadFile(name string) ([]byte, error)       { return w.fsys.ReadFile(w.ctx, name, dumpMax) }
func (w wsTree) ReadLink(name string) (string, error) {
	sl, ok := w.fsys.(workspace.SymlinkFS)
	if !ok {
		return "", fmt.Errorf("conformance: %s is a link but the FileSystem is no SymlinkFS", name)
	}
	return sl.Readlink(w.ctx, name)
}

// buildTree creates a layout's entries in a workspace through the port.
func buildTree(ctx context.Context, fsys workspace.FileSystem, special func(string, fs.FileMode) error, entries []entry) error {
	for _, e := range entries {
		if dir := path.Dir(e.name); dir != "." {
			if err := workspace.MkdirAll(ctx, fsys, dir, 0o755); err != nil {
				return err
			}
		}
		var err error
		switch e.typ {
		case fs.ModeDir:
			err = workspace.MkdirAll(ctx, fsys, e.name, 0o755)
		case 0:
			err = fsys.WriteFile(ctx, e.name, []byte(e.data), e.perm())
		case fs.ModeSymlink:
			sl, ok := fsys.(workspace.SymlinkFS)
			if !ok {
				return fmt.Errorf("conformance: layout has link %s but the FileSystem is no SymlinkFS", e.name)
			}
			err = sl.Symlink(ctx, e.data, e.name)
		default:
			if special == nil {
				return fmt.Errorf("conformance: layout has special file %s but the harness has no MakeSpecial", e.name)
			}
			err = special(e.name, e.typ)
		}
		if err != nil {
			return fmt.Errorf("conformance: building %q: %w", e.String(), err)
		}
	}
	return nil
}
