package workspace

import (
	"path"
	"slices"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
)

// Resolve turns a path an agent wrote into a workspace name (see the package
// documentation). root is the workspace root as an absolute slash path; p may
// be relative to it, or absolute and inside it. Resolve is lexical: it cleans
// p ("a/./b//c", "sub/../x") and refuses, with ErrOutsideWorkspace, a path
// that leaves the root by ".." or names a place outside it. An empty path is
// the root. A path containing a NUL byte fails with ErrInvalidArgument.
//
// What Resolve does not do is follow links: confinement against symbolic
// links is the FileSystem's, done at the moment of use.
func Resolve(root, p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", PathError("resolve", p, ErrInvalidArgument)
	}
	if p == "" {
		return ".", nil
	}
	if path.IsAbs(p) {
		root = path.Clean("/" + root)
		clean := path.Clean(p)
		if clean == root {
			return ".", nil
		}
		prefix := root + "/"
		if root == "/" {
			prefix = "/"
		}
		rel, ok := strings.CutPrefix(clean, prefix)
		if !ok {
			return "", PathError("resolve", p, ErrOutsideWorkspace)
		}
		return rel, nil
	}
	clean := path.Clean(p)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", PathError("resolve", p, ErrOutsideWorkspace)
	}
	return clean, nil
}

// DefaultProtect are the globs write and edit refuse unless configured.
var DefaultProtect = Protect{".git/**", ".sandboxd/**"}

// Protect is a list of doublestar globs (github.com/bmatcuk/doublestar/v4)
// naming paths every mutation refuses. A glob ending in "/**" also covers the
// directory itself. Matching is on the cleaned name and ignores case, so
// ".GIT/config" is protected by ".git/**" — on a case-insensitive disk it is
// the same file, and on others refusing it costs nothing.
type Protect []string

// Match reports whether name (a workspace name) is protected.
func (p Protect) Match(name string) bool {
	name = strings.ToLower(path.Clean(name))
	for _, glob := range p {
		glob = strings.ToLower(glob)
		if ok, _ := doublestar.Match(glob, name); ok {
			return true
		}
		if dir, ok := strings.CutSuffix(glob, "/**"); ok {
			if ok, _ := doublestar.Match(dir, name); ok {
				return true
			}
		}
	}
	return false
}

// Validate reports the first glob that doublestar cannot parse.
func (p Protect) Validate() error {
	for _, g := range p {
		if !doublestar.ValidatePattern(g) {
			return PathError("protect", g, ErrInvalidArgument)
		}
	}
	return nil
}

// DefaultExclude are the names walks skip unless configured.
var DefaultExclude = Exclude{"node_modules", ".git", ".sandboxd"}

// Exclude lists what walks (find, grep) never enter. An entry without a slash
// is a name, matched against every path component's base name (a doublestar
// glob, so "*.egg-info" works); an entry with a slash is a path from the
// workspace root ("build/out" skips that directory wherever a walk starts).
type Exclude []string

// Skip reports whether the workspace name is excluded.
func (e Exclude) Skip(name string) bool {
	if name == "." || name == "" {
		return false
	}
	base := path.Base(name)
	for _, x := range e {
		if strings.Contains(x, "/") {
			x = strings.Trim(path.Clean(x), "/")
			if ok, _ := doublestar.Match(x, name); ok {
				return true
			}
			continue
		}
		if ok, _ := doublestar.Match(x, base); ok {
			return true
		}
	}
	return false
}

// DefaultEnvAllow is the part of the host environment a local command sees
// unless configured otherwise. An entry ending in "*" is a prefix.
var DefaultEnvAllow = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_*", "TERM", "SHELL", "TMPDIR", "TZ"}

// CommandEnv builds a command's environment: the host variables that allow
// names (or every host variable when inherit is set), then vars, which win.
// The result is sorted by name so it is the same for the same inputs. Nothing
// of the host outside allow reaches a command unless inherit is set.
func CommandEnv(host []string, allow []string, inherit bool, vars map[string]string) []string {
	m := make(map[string]string, len(vars)+len(allow))
	for _, kv := range host {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if inherit || EnvAllowed(allow, k) {
			m[k] = v
		}
	}
	for k, v := range vars {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// EnvAllowed reports whether allow (entries as in DefaultEnvAllow) lets a
// host variable named key through.
func EnvAllowed(allow []string, key string) bool {
	for _, a := range allow {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(key, p) {
				return true
			}
		} else if a == key {
			return true
		}
	}
	return false
}
