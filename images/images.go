// Package images builds sandboxd's sandbox images without a registry, through
// the Docker Engine API, from definitions pinned in files under images/defs,
// and gives an image name its one meaning (Canonical, Resolve).
//
// Two images are defined: "minimal" (FROM scratch plus GNU bash from Debian's
// bash-static, as /bin/bash, and a static busybox from busybox-static for the
// other commands) and "dev" (a Debian root filesystem made with debootstrap
// --variant=minbase, with the toolchains projects are built with: git,
// ripgrep, make, gcc, python3, golang-go, nodejs and npm among others). Both
// have a user 1000:1000 and a /workspace directory it owns. No registry is
// used: the root filesystem is made on this machine from Debian packages
// (apt-get and debootstrap against the mirror in /etc/apt) and imported as a
// single-layer image.
//
// An image is tagged sandboxd/NAME:HASH, where HASH is derived from the pinned
// definition, and sandboxd/NAME:latest. Its labels name sandboxd, the
// definition and the hash. Building an image the engine already has from the
// same definition is a no-op that says so. Root filesystem tarballs are cached
// under a cache directory keyed by the same hash, so a rebuild (after `docker
// image rm`, or on another engine) skips debootstrap.
//
//	ref, err := images.Ensure(ctx, cli, "minimal", images.WithProgress(log.Print))
package images

import (
	"cmp"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/workspace"
)

// Labels on every image this package builds.
const (
	LabelSandboxd   = "sandboxd"
	LabelImage      = "sandboxd.image"
	LabelDefinition = "sandboxd.definition"
)

// Default is the image sessions use when they name none.
const Default = "minimal"

// builderRevision changes whenever the way a builder turns a definition into
// a root filesystem changes, so that cached tarballs and images are redone.
var builderRevision = map[string]string{"busybox": "3", "debootstrap": "2"}

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
	for _, f := range d.Files {
		if !strings.HasPrefix(f.Path, "/") || !filepath.IsLocal(f.Path[1:]) {
			return fmt.Errorf("images: definition %s: file %q is not an absolute path inside the image", d.Name, f.Path)
		}
		if _, err := f.perm(); err != nil {
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

// File is a file a definition adds to its image, owned by root.
type File struct {
	Path    string `json:"path"`           // absolute, in the image
	Content string `json:"content"`        // the whole text
	Mode    string `json:"mode,omitempty"` // octal permissions; "0644" when empty
}

func (f File) perm() (int64, error) {
	if f.Mode == "" {
		return 0o644, nil
	}
	n, err := strconv.ParseUint(f.Mode, 8, 12)
	if err != nil {
		return 0, fmt.Errorf("mode %q is not octal permissions such as 0644", f.Mode)
	}
	return int64(n), nil
}

// Client is the part of the Docker Engine API this package uses;
// *client.Client implements it.
type Client interface {
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImageImport(ctx context.Context, src client.ImageImportSource, ref string, opts client.ImageImportOptions) (client.ImageImportResult, error)
	ImageTag(ctx context.Context, opts client.ImageTagOptions) (client.ImageTagResult, error)
	ImageRemove(ctx context.Context, image string, opts client.ImageRemoveOptions) (client.ImageRemoveResult, error)
}

var _ Client = (*client.Client)(nil)

// Option configures Build and Ensure.
type Option func(*options)

type options struct {
	progress func(string)
	cacheDir string
	rebuild  bool
}

// WithProgress receives one line per step of a build (and debootstrap's own
// output), as a person would want to watch it.
func WithProgress(f func(line string)) Option { return func(o *options) { o.progress = f } }

// WithCacheDir sets where root filesystem tarballs are cached; the default is
// sandboxd/images under os.UserCacheDir.
func WithCacheDir(dir string) Option { return func(o *options) { o.cacheDir = dir } }

// WithRebuild makes Build ignore a cached root filesystem and make it anew.
func WithRebuild() Option { return func(o *options) { o.rebuild = true } }

func newOptions(opts []Option) (*options, error) {
	o := &options{progress: func(string) {}}
	for _, opt := range opts {
		opt(o)
	}
	if o.cacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("images: no cache directory: %w", err)
		}
		o.cacheDir = filepath.Join(base, "sandboxd", "images")
	}
	return o, nil
}

// Ensure returns the reference of the named image, building it first when the
// engine does not have it (saying so through the progress function). It is
// what a session calls on first use of an image.
func Ensure(ctx context.Context, cli Client, name string, opts ...Option) (string, error) {
	d, err := Lookup(name)
	if err != nil {
		return "", err
	}
	ok, err := exists(ctx, cli, d.Ref())
	if err != nil || ok {
		return d.Ref(), err
	}
	o, err := newOptions(opts)
	if err != nil {
		return "", err
	}
	o.progress(fmt.Sprintf("image %s is not built yet; building it now (sandboxd image build %s)", d.Ref(), name))
	return build(ctx, cli, d, o)
}

// Build makes the named image and returns its reference. When the engine
// already has the image of this very definition, Build only makes sure the
// latest tag names it and says so: nothing is imported, nothing is left
// dangling (WithRebuild makes it anew all the same). The root filesystem
// comes from the cache when present; building it may install debootstrap
// with apt-get, which it reports through the progress function. Build needs
// root for debootstrap and network access to the Debian mirror only when the
// cache is cold.
func Build(ctx context.Context, cli Client, name string, opts ...Option) (string, error) {
	d, err := Lookup(name)
	if err != nil {
		return "", err
	}
	o, err := newOptions(opts)
	if err != nil {
		return "", err
	}
	if !o.rebuild {
		have, err := cli.ImageInspect(ctx, d.Ref())
		if err == nil && have.Config != nil && have.Config.Labels[LabelDefinition] == d.hash {
			if err := tagLatest(ctx, cli, d, have.ID); err != nil {
				return "", err
			}
			o.progress(fmt.Sprintf("%s is up to date (its definition is unchanged); nothing to do (--rebuild makes it anew)", d.Ref()))
			return d.Ref(), nil
		}
	}
	return build(ctx, cli, d, o)
}

// tagLatest points d's latest tag at the image id, unless it does already.
func tagLatest(ctx context.Context, cli Client, d Definition, id string) error {
	if latest, err := cli.ImageInspect(ctx, d.Latest()); err == nil && latest.ID == id {
		return nil
	}
	if _, err := cli.ImageTag(ctx, client.ImageTagOptions{Source: d.Ref(), Target: d.Latest()}); err != nil {
		return fmt.Errorf("images: tag %s: %w", d.Latest(), err)
	}
	return nil
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

// Resolve returns the canonical reference of image (see Canonical) once it
// has checked that the engine has that image; it builds nothing. A missing
// image is an error of kind workspace.ErrUnavailable that names what to
// run: `sandboxd image build NAME` for an image sandboxd defines, `docker
// pull` or `docker load` for any other.
func Resolve(ctx context.Context, cli Client, image string) (string, error) {
	ref := Canonical(image)
	ok, err := exists(ctx, cli, ref)
	switch {
	case err != nil:
		return "", err
	case ok:
		return ref, nil
	}
	fix := fmt.Sprintf("docker pull %s, or docker load -i FILE for an image saved elsewhere", ref)
	if d, err := Lookup(definitionName(ref)); err == nil && d.Ref() == ref {
		fix = "sandboxd image build " + d.Name
	}
	return "", fmt.Errorf("images: image %s is not on the engine (run %s): %w", ref, fix, workspace.ErrUnavailable)
}

// definitionName is NAME of a reference sandboxd/NAME:TAG, or "".
func definitionName(ref string) string {
	rest, ok := strings.CutPrefix(ref, "sandboxd/")
	name, _, _ := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	return name
}

func exists(ctx context.Context, cli Client, ref string) (bool, error) {
	_, err := cli.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("images: inspect %s: %w", ref, err)
}

func build(ctx context.Context, cli Client, d Definition, o *options) (string, error) {
	tarball, err := rootfs(ctx, d, o)
	if err != nil {
		return "", err
	}
	var previous string // the image a rebuild replaces, removed once untagged
	if old, err := cli.ImageInspect(ctx, d.Ref()); err == nil {
		previous = old.ID
	}
	f, err := os.Open(tarball)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil {
		o.progress(fmt.Sprintf("importing %s (%.1f MB) as %s", filepath.Base(tarball), float64(fi.Size())/1e6, d.Ref()))
	}
	changes := []string{
		"WORKDIR /workspace",
		fmt.Sprintf("USER %d:%d", d.User.UID, d.User.GID),
		fmt.Sprintf("LABEL %s=1 %s=%s %s=%s", LabelSandboxd, LabelImage, d.Name, LabelDefinition, d.hash),
	}
	for _, e := range d.Env {
		changes = append(changes, "ENV "+e)
	}
	res, err := cli.ImageImport(ctx, client.ImageImportSource{Source: f, SourceName: "-"}, d.Ref(),
		client.ImageImportOptions{Message: "sandboxd image " + d.Name, Changes: changes})
	if err != nil {
		return "", fmt.Errorf("images: import %s: %w", d.Ref(), err)
	}
	err = readJSONMessages(res, o.progress)
	res.Close()
	if err != nil {
		return "", fmt.Errorf("images: import %s: %w", d.Ref(), err)
	}
	now, err := cli.ImageInspect(ctx, d.Ref())
	if err != nil {
		return "", fmt.Errorf("images: inspect %s: %w", d.Ref(), err)
	}
	if err := tagLatest(ctx, cli, d, now.ID); err != nil {
		return "", err
	}
	if previous != "" && now.ID != previous {
		// Best effort: the old image may still be used by a container.
		cli.ImageRemove(ctx, previous, client.ImageRemoveOptions{})
	}
	o.progress(fmt.Sprintf("built %s (also tagged %s)", d.Ref(), d.Latest()))
	return d.Ref(), nil
}

// readJSONMessages drains the engine's progress stream, returning the error
// it reports, if any.
func readJSONMessages(r io.Reader, progress func(string)) error {
	dec := json.NewDecoder(r)
	for {
		var m struct {
			Status      string `json:"status"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
			Error string `json:"error"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if m.ErrorDetail != nil {
			return errors.New(m.ErrorDetail.Message)
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
		if m.Status != "" {
			progress("engine: " + m.Status)
		}
	}
}
