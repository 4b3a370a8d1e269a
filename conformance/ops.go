package conformance

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// op is one call on a workspace. run returns the call's error and, when the
// call succeeded with a wrong answer, what is wrong. It runs on its own
// goroutine (see within), so it must not use the test.
type op struct {
	desc  string
	needs []Capability
	run   func(ctx context.Context, x *fixture) (wrong string, err error)
}

func plainOp(desc string, f func(ctx context.Context, fsys workspace.FileSystem) error) op {
	return op{desc: desc, run: func(ctx context.Context, x *fixture) (string, error) { return "", f(ctx, x.FS) }}
}

func linkOp(desc string, f func(ctx context.Context, x *fixture, fsys workspace.SymlinkFS) (string, error)) op {
	return op{desc: desc, needs: []Capability{CapSymlinks}, run: func(ctx context.Context, x *fixture) (string, error) {
		sl, ok := x.FS.(workspace.SymlinkFS)
		if !ok {
			return "the FileSystem is no SymlinkFS", nil
		}
		return f(ctx, x, sl)
	}}
}

func checkInfo(name string, info fs.FileInfo, typ fs.FileMode, size int64) string {
	var wrong []string
	if got := info.Mode().Type(); got != typ {
		wrong = append(wrong, fmt.Sprintf("type %v, want %v", got, typ))
	}
	if info.IsDir() != (typ == fs.ModeDir) {
		wrong = append(wrong, fmt.Sprintf("IsDir() = %v", info.IsDir()))
	}
	if name != "." && info.Name() != path.Base(name) {
		wrong = append(wrong, fmt.Sprintf("Name() = %q, want %q", info.Name(), path.Base(name)))
	}
	if size >= 0 && info.Size() != size {
		wrong = append(wrong, fmt.Sprintf("Size() = %d, want %d", info.Size(), size))
	}
	return strings.Join(wrong, "; ")
}

// stat checks Stat's type and, when size >= 0, size.
func stat(name string, typ fs.FileMode, size int64) op {
	return op{desc: fmt.Sprintf("Stat(%q)", name), run: func(ctx context.Context, x *fixture) (string, error) {
		info, err := x.FS.Stat(ctx, name)
		if err != nil {
			return "", err
		}
		return checkInfo(name, info, typ, size), nil
	}}
}

func lstat(name string, typ fs.FileMode) op {
	return op{desc: fmt.Sprintf("Lstat(%q)", name), run: func(ctx context.Context, x *fixture) (string, error) {
		info, err := x.FS.Lstat(ctx, name)
		if err != nil {
			return "", err
		}
		return checkInfo(name, info, typ, -1), nil
	}}
}

// readDir checks ReadDir's entries, written with ls -F suffixes ("d/",
// "l@", "p|", "s="), in order.
func readDir(name string, want ...string) op {
	return op{desc: fmt.Sprintf("ReadDir(%q)", name), run: func(ctx context.Context, x *fixture) (string, error) {
		entries, err := x.FS.ReadDir(ctx, name)
		if err != nil {
			return "", err
		}
		got := make([]string, len(entries))
		for i, e := range entries {
			got[i] = e.Name() + typeSuffix(e.Type())
			info, err := e.Info()
			if err != nil {
				return fmt.Sprintf("%s: Info(): %v", e.Name(), err), nil
			}
			if info.Name() != e.Name() || info.Mode().Type() != e.Type() || e.IsDir() != e.Type().IsDir() {
				return fmt.Sprintf("%s: entry says type %v, its Info says %s %v", e.Name(), e.Type(), info.Name(), info.Mode().Type()), nil
			}
		}
		if !slices.Equal(got, want) {
			return fmt.Sprintf("entries %q, want %q", got, want), nil
		}
		return "", nil
	}}
}

func readFile(name string, max int64, want string) op {
	return op{desc: fmt.Sprintf("ReadFile(%q, %d)", name, max), run: func(ctx context.Context, x *fixture) (string, error) {
		data, err := x.FS.ReadFile(ctx, name, max)
		if err != nil {
			return "", err
		}
		if string(data) != want {
			return fmt.Sprintf("read %q, want %q", data, want), nil
		}
		return "", nil
	}}
}

func writeFile(name, data string) op {
	return plainOp(fmt.Sprintf("WriteFile(%q, %q)", name, data), func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.WriteFile(ctx, name, []byte(data), 0o644)
	})
}

func mkdir(name string) op {
	return plainOp(fmt.Sprintf("Mkdir(%q)", name), func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.Mkdir(ctx, name, 0o755)
	})
}

func remove(name string) op {
	return plainOp(fmt.Sprintf("Remove(%q)", name), func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.Remove(ctx, name)
	})
}

func rename(from, to string) op {
	return plainOp(fmt.Sprintf("Rename(%q, %q)", from, to), func(ctx context.Context, fsys workspace.FileSystem) error {
		return fsys.Rename(ctx, from, to)
	})
}

// symlink makes a link; $ROOT, $OUTSIDE and $OUT in target are expanded.
func symlink(target, name string) op {
	return linkOp(fmt.Sprintf("Symlink(%q, %q)", target, name), func(ctx context.Context, x *fixture, sl workspace.SymlinkFS) (string, error) {
		return "", sl.Symlink(ctx, x.expand(target), name)
	})
}

// readlink checks a link's target; $ROOT, $OUTSIDE and $OUT in want are expanded.
func readlink(name, want string) op {
	return linkOp(fmt.Sprintf("Readlink(%q)", name), func(ctx context.Context, x *fixture, sl workspace.SymlinkFS) (string, error) {
		got, err := sl.Readlink(ctx, name)
		if want := x.expand(want); err == nil && got != want {
			return fmt.Sprintf("target %q, want %q", got, want), nil
		}
		return "", err
	})
}

func mkdirAll(name string) op {
	return plainOp(fmt.Sprintf("workspace.MkdirAll(%q)", name), func(ctx context.Context, fsys workspace.FileSystem) error {
		return workspace.MkdirAll(ctx, fsys, name, 0o755)
	})
}

func removeAll(name string) op {
	return plainOp(fmt.Sprintf("workspace.RemoveAll(%q)", name), func(ctx context.Context, fsys workspace.FileSystem) error {
		return workspace.RemoveAll(ctx, fsys, name)
	})
}

func realPath(name, want string) op {
	return op{desc: fmt.Sprintf("workspace.RealPath(%q)", name), run: func(ctx context.Context, x *fixture) (string, error) {
		got, err := workspace.RealPath(ctx, x.FS, x.Root, name)
		if err == nil && got != want {
			return fmt.Sprintf("got %q, want %q", got, want), nil
		}
		return "", err
	}}
}
