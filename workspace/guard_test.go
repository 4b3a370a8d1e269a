package workspace_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/memfs"
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

// TestGuard: every change the guard's globs name — as written or through a
// link, a tree holding one moved or removed — fails with a
// *ProtectedError before anything changes; the rest passes through.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*memfs.FS, workspace.FileSystem) {
		inner := memfs.New()
		for _, d := range []string{".git/hooks", "d/sub", "free"} {
			if err := workspace.MkdirAll(ctx, inner, d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, f := range []string{".git/config", "d/x", "d/sub/secret", "a"} {
			if err := inner.WriteFile(ctx, f, []byte(f), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := inner.Symlink(ctx, ".git/hooks", "hooks"); err != nil {
			t.Fatal(err)
		}
		g := workspace.Guard(inner, "/workspace", workspace.Protect{".git/**", "**/secret"})
		if _, ok := g.(workspace.SymlinkFS); !ok {
			t.Fatal("the guard over a SymlinkFS is no SymlinkFS")
		}
		return inner, g
	}
	sl := func(g workspace.FileSystem) workspace.SymlinkFS { return g.(workspace.SymlinkFS) }
	refused := []struct {
		name, matched string
		op            func(g workspace.FileSystem) error
	}{
		{"write", ".git/config", func(g workspace.FileSystem) error { return g.WriteFile(ctx, ".git/config", nil, 0o644) }},
		{"write case", ".GIT/x", func(g workspace.FileSystem) error { return g.WriteFile(ctx, ".GIT/x", nil, 0o644) }},
		{"write through a link", ".git/hooks/pre-commit", func(g workspace.FileSystem) error {
			return g.WriteFile(ctx, "hooks/pre-commit", nil, 0o644)
		}},
		{"mkdir", ".git/new", func(g workspace.FileSystem) error { return g.Mkdir(ctx, ".git/new", 0o755) }},
		{"mkdirall", ".git/a/b", func(g workspace.FileSystem) error { return workspace.MkdirAll(ctx, g, ".git/a/b", 0o755) }},
		{"remove", "d/sub/secret", func(g workspace.FileSystem) error { return g.Remove(ctx, "d/sub/secret") }},
		{"removeall of a tree holding one", "d/sub/secret", func(g workspace.FileSystem) error { return workspace.RemoveAll(ctx, g, "d") }},
		{"rename of a tree holding one", "d/sub/secret", func(g workspace.FileSystem) error { return g.Rename(ctx, "d", "e") }},
		{"rename into", ".git/hooks/a", func(g workspace.FileSystem) error { return g.Rename(ctx, "a", ".git/hooks/a") }},
		{"rename a tree onto names protected there", ".git/sub", func(g workspace.FileSystem) error { return g.Rename(ctx, "free", ".git") }},
		{"symlink", ".git/l", func(g workspace.FileSystem) error { return sl(g).Symlink(ctx, "a", ".git/l") }},
		{"check", ".git/hooks/x", func(g workspace.FileSystem) error {
			_, err := workspace.CheckChange(ctx, g, "/workspace", "hooks/x")
			return err
		}},
		{"swap", ".git/config", func(g workspace.FileSystem) error {
			_, err := workspace.Swap(ctx, g, workspace.SwapRequest{Name: ".git/config", Root: "/workspace", Perm: 0o644})
			return err
		}},
		{"swap through a link", ".git/hooks/pre-commit", func(g workspace.FileSystem) error {
			_, err := workspace.Swap(ctx, g, workspace.SwapRequest{Name: "hooks/pre-commit", Root: "/workspace", Perm: 0o644})
			return err
		}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			inner, g := setup(t)
			if tc.name == "rename a tree onto names protected there" {
				inner.WriteFile(ctx, "free/sub", nil, 0o644)
			}
			before, _ := workspace.Walk(ctx, inner, workspace.WalkRequest{})
			err := tc.op(g)
			var pr *workspace.ProtectedError
			var pe *fs.PathError
			if !errors.As(err, &pr) || !errors.As(err, &pe) || !errors.Is(err, workspace.ErrProtected) || pr.Name != tc.matched {
				t.Fatalf("got %v; want a *ProtectedError naming %s in an *fs.PathError", err, tc.matched)
			}
			if after, _ := workspace.Walk(ctx, inner, workspace.WalkRequest{}); !slices.Equal(after.Entries, before.Entries) {
				t.Errorf("the workspace changed: %v, was %v", after.Entries, before.Entries)
			}
		})
	}
	_, g := setup(t)
	for _, op := range []func() error{
		func() error { return g.WriteFile(ctx, "d/y", []byte("y"), 0o644) },
		func() error { return g.Rename(ctx, "d/x", "free/x") },
		func() error { return workspace.RemoveAll(ctx, g, "free") },
		func() error {
			if err := sl(g).Symlink(ctx, "d", "dl"); err != nil {
				return err
			}
			if real, err := workspace.CheckChange(ctx, g, "/workspace", "dl/z"); err != nil || real != "d/z" {
				return fmt.Errorf("CheckChange(dl/z) = %q, %v; want d/z", real, err)
			}
			return nil
		},
		func() error {
			_, err := workspace.Swap(ctx, g, workspace.SwapRequest{Name: "d/x", Data: []byte("x2"), Root: "/workspace", Perm: 0o644, Max: 100})
			return err
		},
	} {
		if err := op(); err != nil {
			t.Errorf("an unprotected change failed: %v", err)
		}
	}
	if data, err := g.ReadFile(ctx, ".git/config", 100); err != nil || string(data) != ".git/config" {
		t.Errorf("reads pass through: %q, %v", data, err)
	}
	// A swap the guard lets through is the inner file system's own, in
	// one call where it has one.
	swapper := &countingSwap{FS: memfs.New()}
	if _, err := workspace.Swap(ctx, workspace.Guard(swapper, "/workspace", workspace.Protect{".git/**"}),
		workspace.SwapRequest{Name: "f", Data: []byte("f"), Root: "/workspace", Perm: 0o644}); err != nil || swapper.swaps != 1 {
		t.Errorf("a guarded swap: %v, %d swaps of the inner file system; want 1", err, swapper.swaps)
	}
	if inner := memfs.New(); workspace.Guard(inner, "/workspace", workspace.Protect{}) != workspace.FileSystem(inner) {
		t.Error("an empty guard is not the file system itself")
	}
}

// countingSwap is a memfs with a SwapFS of its own that counts its swaps.
type countingSwap struct {
	*memfs.FS
	swaps int
}

func (c *countingSwap) Swap(ctx context.Context, req workspace.SwapRequest) (workspace.SwapResult, error) {
	c.swaps++
	return workspace.SwapGeneric(ctx, c.FS, req)
}

// TestGuardCheckedOnce: a name CheckChange let through is not resolved again
// for the change the same call makes next, and only for that one: another
// call, or a second change, resolves it afresh (a link swapped meanwhile to
// lead into .git is then refused).
func TestGuardCheckedOnce(t *testing.T) {
	bg := context.Background()
	inner := memfs.New()
	for _, d := range []string{".git", "d"} {
		if err := inner.Mkdir(bg, d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := inner.Symlink(bg, "d", "l"); err != nil {
		t.Fatal(err)
	}
	g := workspace.Guard(inner, "/workspace", workspace.Protect{".git/**"})
	type callKey struct{}
	call, other := context.WithValue(bg, callKey{}, 1), context.WithValue(bg, callKey{}, 2)
	swap := func() {
		if err := inner.Remove(bg, "l"); err != nil {
			t.Fatal(err)
		}
		if err := inner.Symlink(bg, ".git", "l"); err != nil {
			t.Fatal(err)
		}
	}
	if real, err := workspace.CheckChange(call, g, "/workspace", "l/x"); err != nil || real != "d/x" {
		t.Fatalf("CheckChange = %q, %v", real, err)
	}
	swap()
	if err := g.WriteFile(other, "l/x", nil, 0o644); !errors.Is(err, workspace.ErrProtected) {
		t.Errorf("another call's write through the swapped link: %v, want it refused", err)
	}
	if err := g.WriteFile(call, "l/x", nil, 0o644); !errors.Is(err, workspace.ErrProtected) {
		t.Errorf("a change after another change: %v, want it resolved again and refused", err)
	}
}

// TestGuardSwap: the guard's swap writes only where it checked — the name
// itself at first, then where the swap reports the name leads (one swap
// more) — and leaves a condition of the caller's to the caller.
func TestGuardSwap(t *testing.T) {
	ctx := context.Background()
	inner := &countingSwap{FS: memfs.New()}
	for _, d := range []string{".git", "d"} {
		if err := inner.Mkdir(ctx, d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range [][2]string{{"d", "dl"}, {".git", "gl"}} {
		if err := inner.Symlink(ctx, l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	g := workspace.Guard(inner, "/workspace", workspace.Protect{".git/**"})
	swap := func(req workspace.SwapRequest) (workspace.SwapResult, int, error) {
		inner.swaps = 0
		req.Root, req.Perm = "/workspace", 0o644
		res, err := workspace.Swap(ctx, g, req)
		return res, inner.swaps, err
	}
	if res, n, err := swap(workspace.SwapRequest{Name: "d/f", Data: []byte("1")}); err != nil || res.Real != "d/f" || res.Unmet || n != 1 {
		t.Errorf("swap of a name without links: %+v, %d swaps, %v; want d/f in 1", res, n, err)
	}
	if res, n, err := swap(workspace.SwapRequest{Name: "dl/f", Data: []byte("2")}); err != nil || res.Real != "d/f" || res.Unmet || n != 2 {
		t.Errorf("swap through a link: %+v, %d swaps, %v; want d/f in 2", res, n, err)
	}
	if _, _, err := swap(workspace.SwapRequest{Name: "gl/config", Data: []byte("x")}); !errors.Is(err, workspace.ErrProtected) {
		t.Errorf("swap through a link into .git: %v, want it refused", err)
	}
	if _, n, err := swap(workspace.SwapRequest{Name: "f", Real: ".git/f", Data: []byte("x")}); !errors.Is(err, workspace.ErrProtected) || n != 0 {
		t.Errorf("swap on the caller's condition that it leads into .git: %v after %d swaps, want it refused before any", err, n)
	}
	res, n, err := swap(workspace.SwapRequest{Name: "dl/f", Real: "dl/f", Data: []byte("x")})
	if err != nil || !res.Unmet || res.Real != "d/f" || n != 1 {
		t.Errorf("swap on the caller's condition, unmet: %+v, %d swaps, %v; want it unmet after 1", res, n, err)
	}
	res, _, err = swap(workspace.SwapRequest{Name: "d/f", Data: []byte("x"), Max: 10, OldSum: workspace.Sum([]byte("other"))})
	if err != nil || !res.Unmet {
		t.Errorf("swap on the caller's sum, unmet: %+v, %v; want it unmet", res, err)
	}
	if data, _ := inner.ReadFile(ctx, "d/f", 10); string(data) != "2" {
		t.Errorf("d/f holds %q after unmet swaps, want 2", data)
	}
	if _, err := inner.Lstat(ctx, ".git/config"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf(".git/config: %v, want none written", err)
	}
}

// TestGuardCapabilities: the guard claims links exactly when its inner
// file system has them, and every extension it claims works.
func TestGuardCapabilities(t *testing.T) {
	conformance.TestWrapper(t, conformance.WrapperHarness{
		New: func(t *testing.T) (workspace.FileSystem, string) {
			fsys := memfs.New()
			return fsys, fsys.Root()
		},
		Wrap: func(t *testing.T, inner workspace.FileSystem, root string) workspace.FileSystem {
			return workspace.Guard(inner, root, workspace.Protect{".git/**"})
		},
	})
}
