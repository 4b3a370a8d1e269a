package workspace_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/workspace"
)

func TestResolve(t *testing.T) {
	tests := []struct {
		root, in, want string
		err            error
	}{
		{"/workspace", "", ".", nil},
		{"/workspace", ".", ".", nil},
		{"/workspace", "a/b", "a/b", nil},
		{"/workspace", "./a//b/", "a/b", nil},
		{"/workspace", "sub/../.git/x", ".git/x", nil},
		{"/workspace", "/workspace", ".", nil},
		{"/workspace", "/workspace/a/../b", "b", nil},
		{"/workspace", "/workspace2/a", "", workspace.ErrOutsideWorkspace},
		{"/workspace", "/etc/passwd", "", workspace.ErrOutsideWorkspace},
		{"/workspace", "..", "", workspace.ErrOutsideWorkspace},
		{"/workspace", "../x", "", workspace.ErrOutsideWorkspace},
		{"/workspace", "a/../../x", "", workspace.ErrOutsideWorkspace},
		{"/workspace", "/workspace/../etc", "", workspace.ErrOutsideWorkspace},
		{"/workspace", "a\x00b", "", workspace.ErrInvalidArgument},
		{"/", "/etc/x", "etc/x", nil},
		{"/workspace", "..foo", "..foo", nil},
	}
	for _, tt := range tests {
		got, err := workspace.Resolve(tt.root, tt.in)
		if !errors.Is(err, tt.err) || got != tt.want {
			t.Errorf("Resolve(%q, %q) = %q, %v; want %q, %v", tt.root, tt.in, got, err, tt.want, tt.err)
		}
	}
}

func FuzzResolve(f *testing.F) {
	for _, s := range []string{"", ".", "a/b", "../x", "/workspace/a", "/workspace/../x", "a/../../b", "./.git//x", "a\x00", "//workspace//a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		name, err := workspace.Resolve("/workspace", p)
		if err != nil {
			if !errors.Is(err, workspace.ErrOutsideWorkspace) && !errors.Is(err, workspace.ErrInvalidArgument) {
				t.Fatalf("Resolve(%q): unexpected error kind %v", p, err)
			}
			return
		}
		if !fsValid(name) {
			t.Fatalf("Resolve(%q) = %q, not a valid name", p, name)
		}
	})
}

func fsValid(name string) bool {
	if name == "." {
		return true
	}
	for _, elem := range splitSlash(name) {
		if elem == "" || elem == "." || elem == ".." {
			return false
		}
	}
	return name[0] != '/'
}

func splitSlash(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func TestProtect(t *testing.T) {
	p := workspace.DefaultProtect
	for name, want := range map[string]bool{
		".git": true, ".git/config": true, ".git/a/b": true, ".GIT/config": true,
		".sandboxd/runtime/x": true, ".gitignore": false, "a/.git/config": false,
		"src/main.go": false, ".sandboxd": true,
	} {
		if got := p.Match(name); got != want {
			t.Errorf("Protect.Match(%q) = %v, want %v", name, got, want)
		}
	}
	if err := (workspace.Protect{"[a"}).Validate(); !errors.Is(err, workspace.ErrInvalidArgument) {
		t.Errorf("Validate of a bad glob = %v", err)
	}
}

func TestExclude(t *testing.T) {
	x := workspace.Exclude{"node_modules", ".git", "build/out", "*.egg-info"}
	for name, want := range map[string]bool{
		"node_modules": true, "a/node_modules": true, "a/node_modules/b": false, // walks never get below a skipped dir
		".git": true, "build/out": true, "x/build/out": false, "build": false,
		"pkg.egg-info": true, "src/x.go": false, ".": false,
	} {
		if got := x.Skip(name); got != want {
			t.Errorf("Exclude.Skip(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestCommandEnv(t *testing.T) {
	host := []string{"PATH=/bin", "HOME=/root", "AWS_SECRET_ACCESS_KEY=x", "LC_ALL=C", "GITHUB_TOKEN=y", "bad"}
	got := workspace.CommandEnv(host, workspace.DefaultEnvAllow, false, map[string]string{"FOO": "1", "PATH": "/usr/bin"})
	want := []string{"FOO=1", "HOME=/root", "LC_ALL=C", "PATH=/usr/bin"}
	if !slices.Equal(got, want) {
		t.Errorf("CommandEnv = %q, want %q", got, want)
	}
	if got := workspace.CommandEnv(host, nil, true, nil); len(got) != 5 {
		t.Errorf("inherit: %q", got)
	}
}

func TestKinds(t *testing.T) {
	for _, k := range workspace.Kinds {
		if workspace.KindByName(k.Name()) != k {
			t.Errorf("KindByName(%q) lost the kind", k.Name())
		}
		err := workspace.PathError("op", "p", k)
		if workspace.KindOf(err) != k || !errors.Is(err, k) {
			t.Errorf("kind %s does not survive wrapping", k.Name())
		}
	}
	if workspace.KindOf(workspace.PathError("op", "p", workspace.ErrNotFound)) != workspace.ErrNotFound {
		t.Error("KindOf")
	}
}
