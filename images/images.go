// Package images defines sandboxd's sandbox images and gives an image name
// its one meaning; it asks no engine. The definitions are pinned in files
// under images/defs (and an operator's configuration may declare more,
// Declare); Lookup finds one, Canonical turns an image setting into the
// reference it means. Package [github.com/sandboxd/sandboxd/images/engine]
// builds them on a Docker engine, ensures and resolves them.
//
// Two images are defined: "minimal" (FROM scratch plus GNU bash from Debian's
// bash-static, as /bin/bash, and a static busybox from busybox-static for the
// other commands) and "dev" (a Debian root filesystem made with debootstrap
// --variant=minbase, with the toolchains projects are built with: git,
// ripgrep, make, gcc, python3, golang-go, nodejs and npm among others). Both
// have a user 1000:1000 and a /workspace directory it owns.
//
// An image is tagged sandboxd/NAME:HASH, where HASH is derived from the pinned
// definition, and sandboxd/NAME:latest. Its labels name sandboxd, the
// definition and the hash.
//
//	d, err := images.Lookup("minimal")
//	ref := images.Canonical("minimal") // d.Ref(): sandboxd/minimal:HASH12
package images

import (
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Labels on every image package engine builds.
const (
	LabelSandboxd   = "sandboxd"
	LabelImage      = "sandboxd.image"
	LabelDefinition = "sandboxd.definition"
)

// Default is the image sessions use when they name none.
const Default = "minimal"

// builderRevision changes whenever the way a builder turns a definition into
// a root filesystem changes, so that cached tarballs and images are redone.
var builderRevision = map[string]string{"busybox": "3", "debootstrap": "3"}

//go:embed defs/*.json
var defsFS embed.FS

// Definition is one image's pinned recipe, as written in images/defs/NAME.json.
type Definition struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Builder is "busybox" (a static busybox on an empty root) or
	// "debootstrap" (a Debian root filesystem).
	Builder string `json:"builder"`
	// Suite is the Debian release the packages come from.
	Suite string `json:"suite"`
	// Variant is debootstrap's --variant.
	Variant string `json:"variant,omitempty"`
	// Packages are the Debian packages the image is made of.
	Packages []string `json:"packages"`
	// Links are symbolic links the image adds: absolute path → target
	// ("/bin/bash" → "bash-static").
	Links map[string]string `json:"links,omitempty"`
	// Files are files the image adds, after its packages.
	Files []File `json:"files,omitempty"`
	// Go, when set, installs a current Go toolchain at /usr/local/go, as
	// the go command itself fetches one for GOTOOLCHAIN (see GoToolchain).
	Go *GoToolchain `json:"go,omitempty"`
	// User is the unprivileged user that owns /workspace.
	User struct {
		Name string `json:"name"`
		UID  int    `json:"uid"`
		GID  int    `json:"gid"`
	} `json:"user"`
	// Env is the image's default environment.
	Env []string `json:"env"`

	hash string
}

// Hash identifies the definition's content and the builder's revision.
func (d Definition) Hash() string { return d.hash }

// Ref is the image reference the definition builds: sandboxd/NAME:HASH12.
func (d Definition) Ref() string { return "sandboxd/" + d.Name + ":" + d.hash[:12] }

// Latest is the moving tag sandboxd/NAME:latest.
func (d Definition) Latest() string { return "sandboxd/" + d.Name + ":latest" }

// Definitions returns every definition — the pinned ones and those Declare
// added — sorted by name.
func Definitions() ([]Definition, error) {
	var defs []Definition
	for _, name := range names() {
		d, err := Lookup(name)
		if err != nil {
			return nil, err
		}
		defs = append(defs, d)
	}
	return defs, nil
}

// validName is what an image name may be: a Docker repository path element.
var validName = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*$`)

// declared holds the definitions Declare added, by name.
var declared struct {
	sync.RWMutex
	defs map[string]Definition
}

// Declare adds an operator's definition (the daemon configuration's
// "images"), so that its name means its image everywhere, as a pinned one's
// does. What it leaves unset is filled in: the builder debootstrap with the
// minbase variant, the suite bookworm, the user sandbox 1000:1000, and the
// environment of the pinned images. It refuses a definition that is not
// whole or that takes a pinned definition's name; declaring a name again
// replaces its definition. It is meant for a program's start, before images
// are looked up.
func Declare(d Definition) (Definition, error) {
	if !validName.MatchString(d.Name) {
		return d, fmt.Errorf("images: an image definition needs a name of lower-case letters, digits, '.', '_' or '-', not %q", d.Name)
	}
	if _, err := defsFS.ReadFile("defs/" + d.Name + ".json"); err == nil {
		return d, fmt.Errorf("images: image %q is sandboxd's own; give the declared image another name", d.Name)
	}
	d.Builder = cmp.Or(d.Builder, "debootstrap")
	d.Suite = cmp.Or(d.Suite, "bookworm")
	if d.Builder == "debootstrap" {
		d.Variant = cmp.Or(d.Variant, "minbase")
	}
	if d.User.Name == "" {
		d.User.Name, d.User.UID, d.User.GID = "sandbox", 1000, 1000
	}
	if d.Env == nil {
		d.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/workspace", "LANG=C.UTF-8"}
	}
	if err := d.finish(); err != nil {
		return d, err
	}
	declared.Lock()
	defer declared.Unlock()
	if declared.defs == nil {
		declared.defs = map[string]Definition{}
	}
	declared.defs[d.Name] = d
	return d, nil
}

// Lookup returns the definition called name, or an error listing the names
// there are.
func Lookup(name string) (Definition, error) {
	declared.RLock()
	d, ok := declared.defs[name]
	declared.RUnlock()
	if ok {
		return d, nil
	}
	data, err := defsFS.ReadFile("defs/" + name + ".json")
	if err != nil || strings.ContainsAny(name, "/\\") {
		return d, fmt.Errorf("images: no image definition %q (known: %s); the daemon's configuration declares more under \"images\"", name, strings.Join(names(), ", "))
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return d, fmt.Errorf("images: definition %s: %w", name, err)
	}
	if d.Name != name {
		return d, fmt.Errorf("images: definition file %s.json names %q", name, d.Name)
	}
	return d, d.finish()
}

// finish checks d and computes its hash.
func (d *Definition) finish() error {
	rev, ok := builderRevision[d.Builder]
	if !ok {
		return fmt.Errorf("images: definition %s: unknown builder %q (busybox or debootstrap)", d.Name, d.Builder)
	}
	if len(d.Packages) == 0 || d.User.UID <= 0 {
		return fmt.Errorf("images: definition %s: it needs packages and a user other than root", d.Name)
	}
	for link := range d.Links {
		if !strings.HasPrefix(link, "/") || !filepath.IsLocal(link[1:]) {
			return fmt.Errorf("images: definition %s: link %q is not an absolute path inside the image", d.Name, link)
		}
	}
	if g := d.Go; g != nil && (!regexp.MustCompile(`^1\.[0-9]+(\.[0-9]+)?$`).MatchString(g.Version) || len(g.Sums) == 0) {
		return fmt.Errorf("images: definition %s: go wants a release such as 1.27.4 and the h1: sums of its zips by platform", d.Name)
	}
	for _, f := range d.Files {
		if !strings.HasPrefix(f.Path, "/") || !filepath.IsLocal(f.Path[1:]) {
			return fmt.Errorf("images: definition %s: file %q is not an absolute path inside the image", d.Name, f.Path)
		}
		if _, err := f.Perm(); err != nil {
			return fmt.Errorf("images: definition %s: file %s: %w", d.Name, f.Path, err)
		}
	}
	// The hash covers what goes into the image, not the prose about it.
	bare := *d
	bare.Description = ""
	canon, err := json.Marshal(bare)
	if err != nil {
		return fmt.Errorf("images: definition %s: %w", d.Name, err)
	}
	sum := sha256.Sum256(append([]byte("sandboxd images "+d.Builder+" "+rev+"\n"), canon...))
	d.hash = hex.EncodeToString(sum[:])
	return nil
}

// names lists the definitions there are, sorted.
func names() []string {
	entries, _ := defsFS.ReadDir("defs")
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(e.Name(), ".json"))
	}
	declared.RLock()
	out = append(out, slices.Collect(maps.Keys(declared.defs))...)
	declared.RUnlock()
	slices.Sort(out)
	return out
}

// GoToolchain is a Go release as the module golang.org/toolchain holds it
// (v0.0.1-goVERSION.GOOS-GOARCH), fetched through the module proxy
// (GOPROXY, or proxy.golang.org) and checked against its pinned go.sum hash
// before a byte of it is used.
type GoToolchain struct {
	// Version is the release, without "go": "1.27.4".
	Version string `json:"version"`
	// Sums are the h1: hashes of the module's zip by platform
	// ("linux-amd64"), as sum.golang.org has them.
	Sums map[string]string `json:"sums"`
}

// Module is the module path and version of the toolchain for platform
// ("linux-amd64").
func (g GoToolchain) Module(platform string) (path, version string) {
	return "golang.org/toolchain", "v0.0.1-go" + g.Version + "." + platform
}

// File is a file a definition adds to its image, owned by root.
type File struct {
	Path    string `json:"path"`           // absolute, in the image
	Content string `json:"content"`        // the whole text
	Mode    string `json:"mode,omitempty"` // octal permissions; "0644" when empty
}

// Perm is the file's permission bits: Mode in octal, 0644 when Mode is
// empty. Lookup and Declare refuse a definition whose Mode is not octal.
func (f File) Perm() (int64, error) {
	if f.Mode == "" {
		return 0o644, nil
	}
	n, err := strconv.ParseUint(f.Mode, 8, 12)
	if err != nil {
		return 0, fmt.Errorf("mode %q is not octal permissions such as 0644", f.Mode)
	}
	return int64(n), nil
}

// Canonical returns the image reference an image setting means — the one
// meaning of an image name for the top-level image, policy.defaultImage,
// policy.images, pools and a session's image: the name of an image
// definition ("minimal", "dev") is that definition's image, sandboxd/NAME:
// HASH12; anything else (an image reference, a pattern of policy.images) is
// returned as it is. It asks no engine.
func Canonical(image string) string {
	if d, err := Lookup(image); err == nil {
		return d.Ref()
	}
	return image
}
