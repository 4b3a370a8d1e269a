package scope_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
	"github.com/sandboxd/sandboxd/scope"
	"github.com/sandboxd/sandboxd/workspace"
)

// dump describes a whole workspace, contents and link targets included.
func dump(t testing.TB, fsys *memfs.FS) []string {
	t.Helper()
	ctx := context.Background()
	res, err := workspace.WalkGeneric(ctx, fsys, workspace.WalkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range res.Entries {
		switch {
		case e.Type.IsDir():
			out = append(out, e.Path+"/")
		case e.Type&fs.ModeSymlink != 0:
			dest, _ := fsys.Readlink(ctx, e.Path)
			out = append(out, e.Path+" => "+dest)
		default:
			data, _ := fsys.ReadFile(ctx, e.Path, 1<<20)
			out = append(out, e.Path+": "+string(data))
		}
	}
	return out
}

// tree is the workspace every decision is tested on. Under "secret" lies
// what the rules below hide; the links lead across the boundary every way.
var tree = []string{
	"src/a.go: package a",
	"src/b.txt: b",
	"src/sub/c.go: package sub",
	"src/gen/d.go: package gen",
	"docs/x.md: x",
	"docs/y.txt: y",
	"secret/key: s3cret",
	"secret/dir/k.go: package k",
	"top.go: package top",
	"empty/",
	"src/toKey => ../secret/key",           // visible link to an invisible file
	"src/toA => a.go",                      // visible link to a visible file
	"src/toSecret => ../secret",            // visible link to an invisible directory
	"src/abs => /workspace/secret/key",     // the same, absolute
	"src/up => ..",                         // visible link to the root
	"src/x => ../secret/dir",               // a step for dotdot
	"src/dotdot => x/../key",               // kernel: secret/key; lexically: src/key
	"secret/toA => ../src/a.go",            // invisible link to a visible file
	"src/hop => ../secret/toA",             // visible link through an invisible one
	"docs/toA.md => ../src/a.go",           // visible name, visible target
	"src/sub/lk => ../../secret/key",       // committable link to an invisible file
	"src/sub/toDocs => ../../docs/x.md",    // committable link to an uncommittable file
	"src/sub/lsecret => ../../secret/dir",  // committable link to an invisible directory
	"src/probe => ../secret/../src/a.go",   // through an invisible directory and back
	"src/probe2 => ../nothere/../src/a.go", // through a missing one: the same answer
}

var rules = map[string]scope.Rules{
	// A: a subtree and some docs visible; some of the subtree committable.
	"A": {Visible: []string{"src/**", "docs/*.md"}, Commit: []string{"src/*.go", "src/sub/**"}},
	// B: every Go file, wherever it is; everything visible committable.
	"B": {Visible: []string{"**/*.go"}},
	// C: everything visible, docs committable.
	"C": {Commit: []string{"docs/**"}},
}

// op is one call on the decorated workspace; it returns what it found, for
// the calls that find something.
type op struct {
	desc string
	run  func(ctx context.Context, fsys workspace.FileSystem) (string, error)
}

func typeSuffix(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "/"
	case m&fs.ModeSymlink != 0:
		return "@"
	}
	return ""
}

func stat(name string) op { return info("Stat", name) }

func lstat(name string) op { return info("Lstat", name) }

// info describes the entry Stat or Lstat (method) finds: its name and type.
func info(method, name string) op {
	return op{method + " " + name, func(ctx context.Context, fsys workspace.FileSystem) (string, error) {
		f := fsys.Stat
		if method == "Lstat" {
			f = fsys.Lstat
		}
		info, err := f(ctx, name)
		if err != nil {
			return "", err
		}
		return info.Name() + typeSuffix(info.Mode()), nil
	}}
}

func readDir(name string) op {
	return op{"ReadDir " + name, func(ctx context.Context, fsys workspace.FileSystem) (string, error) {
		entries, err := fsys.ReadDir(ctx, name)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name()+typeSuffix(e.Type()))
		}
		return strings.Join(names, " "), err
	}}
}

func readFile(name string) op {
	return op{"ReadFile " + name, func(ctx context.Context, fsys workspace.FileSystem) (string, error) {
		data, err := fsys.ReadFile(ctx, name, 1<<20)
		return string(data), err
	}}
}

func readlink(name string) op {
	return op{"Readlink " + name, func(ctx context.Context, fsys workspace.FileSystem) (string, error) {
		return fsys.(workspace.SymlinkFS).Readlink(ctx, name)
	}}
}

func lock(name string) op {
	return op{"Lock " + name, func(ctx context.Context, fsys workspace.FileSystem) (string, error) {
		unlock, err := workspace.Lock(ctx, fsys, name)
		if err == nil {
			unlock()
		}
		return "", err
	}}
}

func change(desc string, f func(ctx context.Context, fsys workspace.FileSystem) error) op {
	return op{desc, func(ctx context.Context, fsys workspace.FileSystem) (string, error) { return "", f(ctx, fsys) }}
}

func writeFile(name string) op {
	return change("WriteFile "+name, func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.WriteFile(ctx, name, []byte("new"), 0o644)
	})
}

func mkdir(name string) op {
	return change("Mkdir "+name, func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.Mkdir(ctx, name, 0o755)
	})
}

func mkdirAll(name string) op {
	return change("MkdirAll "+name, func(ctx context.Context, fsys workspace.FileSystem) error {
		return workspace.MkdirAll(ctx, fsys, name, 0o755)
	})
}

func remove(name string) op {
	return change("Remove "+name, func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.Remove(ctx, name)
	})
}

func removeAll(name string) op {
	return change("RemoveAll "+name, func(ctx context.Context, fsys workspace.FileSystem) error {
		return workspace.RemoveAll(ctx, fsys, name)
	})
}

func rename(from, to string) op {
	return change("Rename "+from+" "+to, func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.Rename(ctx, from, to)
	})
}

func symlink(dest, name string) op {
	return change("Symlink "+dest+" "+name, func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.(workspace.SymlinkFS).Symlink(ctx, dest, name)
	})
}

func walk(req workspace.WalkRequest) op {
	return op{fmt.Sprintf("Walk %+v", req), func(ctx context.Context, fsys workspace.FileSystem) (string, error) {
		res, err := workspace.Walk(ctx, fsys, req)
		var names []string
		for _, e := range res.Entries {
			names = append(names, e.Path+typeSuffix(e.Type))
		}
		if res.Truncated {
			names = append(names, "…")
		}
		return strings.Join(names, " "), err
	}}
}

func grep(req workspace.GrepRequest) op {
	return op{fmt.Sprintf("Grep %+v", req), func(ctx context.Context, fsys workspace.FileSystem) (string, error) {
		res, err := workspace.Grep(ctx, fsys, req)
		var lines []string
		for _, l := range res.Lines {
			lines = append(lines, fmt.Sprintf("%s:%d", l.Path, l.Line))
		}
		if res.Truncated {
			lines = append(lines, "…")
		}
		return strings.Join(lines, " "), err
	}}
}

var (
	notFound  = workspace.ErrNotFound
	protected = workspace.ErrProtected
	invalid   = workspace.ErrInvalidArgument
	changed   = "changed" // a change that succeeds: the tree must differ
)

// decisions are the rules' verdict on every operation. A case that fails
// must leave the tree as it was; a change that succeeds must change it.
var decisions = []struct {
	rules string
	op    op
	err   error
	want  string // what a read finds; changed for a change
}{
	// A: Visible src/**, docs/*.md; Commit src/*.go, src/sub/**.
	{"A", stat("."), nil, "./"},
	{"A", stat("src/a.go"), nil, "a.go"},
	{"A", stat("docs"), nil, "docs/"}, // traversable: docs/*.md may lie below
	{"A", stat("secret"), notFound, ""},
	{"A", stat("secret/key"), notFound, ""},
	{"A", stat("secret/nothere"), notFound, ""},
	{"A", stat("docs/y.txt"), notFound, ""},
	{"A", stat("top.go"), notFound, ""},
	{"A", stat("empty"), notFound, ""},
	{"A", stat("src/toKey"), notFound, ""}, // a visible link to an invisible file is dangling
	{"A", lstat("src/toKey"), nil, "toKey@"},
	{"A", readlink("src/toKey"), nil, "../secret/key"},
	{"A", readlink("secret/toA"), notFound, ""},
	{"A", readFile("src/toKey"), notFound, ""},
	{"A", readFile("src/abs"), notFound, ""},
	{"A", readFile("src/toSecret/key"), notFound, ""},
	{"A", readFile("src/dotdot"), notFound, ""}, // ".." goes up from secret/dir, as the kernel does
	{"A", readFile("src/hop"), notFound, ""},    // the link on the way is invisible
	{"A", readFile("src/toA"), nil, "package a"},
	{"A", readFile("docs/toA.md"), nil, "package a"},
	{"A", readFile("secret/toA"), notFound, ""}, // the name is invisible
	{"A", readFile("src/up/src/a.go"), nil, "package a"},
	{"A", readFile("src/up/top.go"), notFound, ""}, // visible name, invisible destination
	{"A", readFile("src/up/secret/key"), notFound, ""},
	{"A", readFile("secret/key/x"), notFound, ""}, // an invisible file on the way is not revealed
	{"A", readFile("src/a.go/x"), notFound, ""},
	{"A", readFile("src/probe"), notFound, ""},
	{"A", readFile("src/probe2"), notFound, ""},
	{"A", readDir("."), nil, "docs/ src/"},
	{"A", readDir("docs"), nil, "toA.md@ x.md"},
	{"A", readDir("src"), nil, "a.go abs@ b.txt dotdot@ gen/ hop@ probe@ probe2@ sub/ toA@ toKey@ toSecret@ up@ x@"},
	{"A", readDir("src/up"), nil, "docs/ src/"},
	{"A", readDir("secret"), notFound, ""},
	{"A", readDir("src/toSecret"), notFound, ""},
	{"A", readDir("src/a.go"), workspace.ErrNotADirectory, ""},
	{"A", lock("src/b.txt"), nil, ""},
	{"A", lock("src/new.go"), nil, ""},
	{"A", lock("secret/key"), notFound, ""},
	{"A", walk(workspace.WalkRequest{}), nil, "docs/ docs/toA.md@ docs/x.md src/ src/a.go src/abs@ src/b.txt src/dotdot@ src/gen/ src/gen/d.go " +
		"src/hop@ src/probe@ src/probe2@ src/sub/ src/sub/c.go src/sub/lk@ src/sub/lsecret@ src/sub/toDocs@ src/toA@ src/toKey@ src/toSecret@ src/up@ src/x@"},
	{"A", walk(workspace.WalkRequest{Dir: "src/up", Pattern: "**/*.go"}), nil, "src/up/src/a.go src/up/src/gen/d.go src/up/src/sub/c.go"},
	{"A", walk(workspace.WalkRequest{Dir: "src/toSecret"}), nil, "src/toSecret@"}, // as a link to nothing
	{"A", walk(workspace.WalkRequest{Dir: "secret"}), notFound, ""},
	{"A", walk(workspace.WalkRequest{FilesOnly: true, Limit: 2}), nil, "docs/toA.md@ docs/x.md …"},
	{"A", grep(workspace.GrepRequest{Pattern: "package|s3cret", Limit: 1}), nil, "src/a.go:1 …"}, // secret/ comes first, unseen
	{"A", grep(workspace.GrepRequest{Pattern: "s3cret"}), nil, ""},
	{"A", grep(workspace.GrepRequest{Pattern: "package", Dir: "src/up"}), nil, "src/up/src/a.go:1 src/up/src/gen/d.go:1 src/up/src/sub/c.go:1"},
	{"A", grep(workspace.GrepRequest{Pattern: "s3cret", Dir: "secret/key"}), notFound, ""},

	{"A", writeFile("src/a.go"), nil, changed},
	{"A", writeFile("src/new.go"), nil, changed},
	{"A", writeFile("src/sub/new.txt"), nil, changed},
	{"A", writeFile("src/b.txt"), protected, ""},
	{"A", writeFile("src/gen/d.go"), protected, ""},
	{"A", writeFile("docs/x.md"), protected, ""},
	{"A", writeFile("docs/new.md"), protected, ""},
	{"A", writeFile("docs/new.txt"), notFound, ""},
	{"A", writeFile("secret/key"), notFound, ""},
	{"A", writeFile("top.go"), notFound, ""},
	{"A", writeFile("src/toKey"), notFound, ""},
	{"A", writeFile("src/sub/lk"), notFound, ""},      // committable name, invisible destination
	{"A", writeFile("src/sub/toDocs"), protected, ""}, // committable name, uncommittable destination
	{"A", writeFile("src/toA"), protected, ""},        // the name is not committable
	{"A", writeFile("src/up/src/a.go"), protected, ""},
	{"A", writeFile("src/sub/lsecret/k.go"), notFound, ""},
	{"A", writeFile("."), workspace.ErrNotAFile, ""},
	{"A", mkdir("src/sub/d"), nil, changed},
	{"A", mkdir("src/newdir"), protected, ""}, // nothing committable can lie below it
	{"A", mkdir("docs/new"), notFound, ""},    // nothing visible can lie below it
	{"A", mkdir("newtop"), notFound, ""},
	{"A", mkdir("secret/d"), notFound, ""},
	{"A", mkdir("secret"), notFound, ""}, // exists, invisibly
	{"A", mkdirAll("src/sub/p/q"), nil, changed},
	{"A", mkdirAll("src/p/q"), protected, ""},
	{"A", mkdirAll("secret/p"), notFound, ""},
	{"A", remove("src/a.go"), nil, changed},
	{"A", remove("src/sub/lk"), nil, changed}, // the link goes, its target stays
	{"A", remove("src/b.txt"), protected, ""},
	{"A", remove("src/toKey"), protected, ""},
	{"A", remove("secret/key"), notFound, ""},
	{"A", remove("empty"), notFound, ""},
	{"A", remove("src/nothere.go"), notFound, ""},
	{"A", remove("."), invalid, ""},
	{"A", removeAll("src/sub"), nil, changed},
	{"A", removeAll("src/sub/lsecret"), nil, changed},
	{"A", removeAll("src/nothere.go"), nil, ""},
	{"A", removeAll("src"), protected, ""},
	{"A", removeAll("src/gen"), protected, ""},
	{"A", removeAll("docs"), protected, ""}, // shown, but not itself visible
	{"A", removeAll("secret"), notFound, ""},
	{"A", removeAll("nothere"), notFound, ""},
	{"A", removeAll("src/up/top.go"), notFound, ""},
	{"A", rename("src/a.go", "src/z.go"), nil, changed},
	{"A", rename("src/a.go", "src/sub/a.go"), nil, changed},
	{"A", rename("src/sub/lk", "src/sub/lk2"), nil, changed},
	{"A", rename("src/a.go", "docs/a.md"), protected, ""},
	{"A", rename("src/a.go", "src/a.txt"), protected, ""},
	{"A", rename("src/a.go", "secret/a.go"), notFound, ""},
	{"A", rename("src/a.go", "top2.go"), notFound, ""},
	{"A", rename("src/a.go", "src/up/top.go"), notFound, ""}, // over an invisible file through a link
	{"A", rename("src/a.go", "src/sub/lsecret/a.go"), notFound, ""},
	{"A", rename("src/b.txt", "src/sub/b.txt"), protected, ""},
	{"A", rename("secret/key", "src/key.go"), notFound, ""},
	{"A", rename("src/up/top.go", "src/top.go"), notFound, ""},
	{"A", rename("src/sub", "src/sub2"), protected, ""},
	{"A", symlink("../secret/key", "src/sub/l2"), nil, changed},
	{"A", symlink("x", "src/l3"), protected, ""},
	{"A", symlink("x", "secret/l"), notFound, ""},

	// B: Visible **/*.go: every directory is traversable.
	{"B", readDir("."), nil, "docs/ empty/ secret/ src/ top.go"},
	{"B", readDir("src"), nil, "a.go gen/ sub/"}, // links are entries, not directories
	{"B", readFile("secret/dir/k.go"), nil, "package k"},
	{"B", readFile("secret/key"), notFound, ""},
	{"B", readFile("src/x/k.go"), nil, "package k"},
	{"B", readFile("src/toA"), notFound, ""},
	{"B", stat("secret"), nil, "secret/"},
	{"B", stat("src/x"), nil, "x/"},
	{"B", lstat("src/x"), notFound, ""},
	{"B", walk(workspace.WalkRequest{}), nil, "docs/ empty/ secret/ secret/dir/ secret/dir/k.go src/ src/a.go src/gen/ src/gen/d.go src/sub/ src/sub/c.go top.go"},
	{"B", walk(workspace.WalkRequest{FilesOnly: true, Limit: 2}), nil, "secret/dir/k.go src/a.go …"},
	{"B", walk(workspace.WalkRequest{Pattern: "s*"}), nil, "secret/ src/ src/sub/"},
	{"B", grep(workspace.GrepRequest{Pattern: "package", Limit: 2}), nil, "secret/dir/k.go:1 src/a.go:1 …"},
	{"B", grep(workspace.GrepRequest{Pattern: "."}), nil, "secret/dir/k.go:1 src/a.go:1 src/gen/d.go:1 src/sub/c.go:1 top.go:1"},
	{"B", writeFile("docs/new.go"), nil, changed},
	{"B", writeFile("docs/new.txt"), notFound, ""},
	{"B", mkdir("newdir"), nil, changed},
	{"B", remove("empty"), nil, changed},
	{"B", remove("docs"), workspace.ErrNotEmpty, ""}, // its entries are invisible, but there
	{"B", rename("src", "src2"), protected, ""},
	{"B", rename("src/a.go", "src/b.go"), nil, changed},
	{"B", rename("src/a.go", "src/a.txt"), notFound, ""},
	{"B", removeAll("secret"), protected, ""},
	{"B", removeAll("secret/dir/k.go"), nil, changed},

	// C: Visible nil: every read as the adapter's; Commit docs/**.
	{"C", readFile("secret/key"), nil, "s3cret"},
	{"C", readFile("src/dotdot"), nil, "s3cret"},
	{"C", readFile("src/probe"), nil, "package a"},
	{"C", readFile("src/probe2"), notFound, ""},
	{"C", readDir("src/sub"), nil, "c.go lk@ lsecret@ toDocs@"},
	{"C", grep(workspace.GrepRequest{Pattern: "s3cret"}), nil, "secret/key:1"},
	{"C", writeFile("docs/new"), nil, changed},
	{"C", writeFile("src/a.go"), protected, ""},
	{"C", writeFile("docs/toA.md"), protected, ""}, // leads out of the scope
	{"C", writeFile("src/sub/toDocs"), protected, ""},
	{"C", mkdir("newdir"), protected, ""},
	{"C", mkdir("docs/d"), nil, changed},
	{"C", rename("docs", "docs2"), protected, ""},
	{"C", rename("docs/x.md", "docs/z.md"), nil, changed},
	{"C", rename("docs/x.md", "x.md"), protected, ""},
	{"C", removeAll("docs"), nil, changed},
	{"C", removeAll("src"), protected, ""},
	{"C", symlink("../secret/key", "docs/l"), nil, changed},
}

func TestDecisions(t *testing.T) {
	bases := []func(*memfs.FS) workspace.FileSystem{
		func(f *memfs.FS) workspace.FileSystem { return f },
		// With a walk of its own the adapter takes the decorator's filtering
		// path; the answers must be the same.
		func(f *memfs.FS) workspace.FileSystem { return walkingFS{f} },
	}
	for _, c := range decisions {
		t.Run(c.rules+"/"+c.op.desc, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			for _, base := range bases {
				inner := memfs.New()
				conformance.Build(t, inner, tree...)
				fsys, err := scope.New(base(inner), inner.Root(), rules[c.rules])
				if err != nil {
					t.Fatal(err)
				}
				before := dump(t, inner)
				got, err := c.op.run(ctx, fsys)
				same := reflect.DeepEqual(before, dump(t, inner))
				switch {
				case c.err != nil:
					var pe *fs.PathError
					if !errors.Is(err, c.err) || !errors.As(err, &pe) {
						t.Fatalf("%s: error %v, want a *fs.PathError matching %v", c.op.desc, err, c.err)
					}
					if !same {
						t.Fatalf("%s failed and changed the tree", c.op.desc)
					}
				case err != nil:
					t.Fatalf("%s: %v", c.op.desc, err)
				case c.want == changed:
					if same {
						t.Fatalf("%s succeeded and changed nothing", c.op.desc)
					}
				case got != c.want:
					t.Fatalf("%s = %q, want %q", c.op.desc, got, c.want)
				case !same:
					t.Fatalf("%s changed the tree", c.op.desc)
				}
			}
		})
	}
}

// TestAbsoluteLinkWalkedAsTheKernelDoes: an absolute link target's ".." is
// walked from where the links before it led, not cleaned away; a lexical
// reading of /workspace/x/../secret.txt would judge secret.txt while the
// adapter reads deep/secret.txt.
func TestAbsoluteLinkWalkedAsTheKernelDoes(t *testing.T) {
	ctx := context.Background()
	inner := memfs.New()
	for _, d := range []string{"a", "deep/dir"} {
		if err := workspace.MkdirAll(ctx, inner, d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	inner.WriteFile(ctx, "secret.txt", []byte("visible"), 0o644)
	inner.WriteFile(ctx, "deep/secret.txt", []byte("hidden"), 0o644)
	inner.Symlink(ctx, "deep/dir", "x")
	inner.Symlink(ctx, "/workspace/x/../secret.txt", "a/abs")
	fsys, err := scope.New(inner, inner.Root(), scope.Rules{Visible: []string{"a/**", "x", "deep/dir/**", "secret.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if data, err := inner.ReadFile(ctx, "a/abs", 1<<10); err != nil || string(data) != "hidden" {
		t.Fatalf("the adapter reads %q, %v through a/abs; the test assumes deep/secret.txt", data, err)
	}
	if data, err := fsys.ReadFile(ctx, "a/abs", 1<<10); !errors.Is(err, workspace.ErrNotFound) {
		t.Fatalf("read a/abs = %q, %v; want NotFound (it leads to the invisible deep/secret.txt)", data, err)
	}
}
