// Package engine is the engine half of package images: it builds sandboxd's
// sandbox images without a registry, through the Docker Engine API, from
// their definitions (images.Lookup), and finds them there (Ensure, Resolve).
//
// No registry is used: the root filesystem is made on this machine from
// Debian packages (apt-get and debootstrap against the mirror in /etc/apt)
// and imported as a single-layer image, tagged as images.Definition.Ref and
// Latest say and labelled with the definition. Building an image the engine
// already has from the same definition is a no-op that says so. Root
// filesystem tarballs are cached under a cache directory keyed by the same
// hash, so a rebuild (after `docker image rm`, or on another engine) skips
// debootstrap.
//
//	ref, err := engine.Ensure(ctx, cli, "minimal", engine.WithProgress(log.Print))
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/workspace"
)

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
	d, err := images.Lookup(name)
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
	d, err := images.Lookup(name)
	if err != nil {
		return "", err
	}
	o, err := newOptions(opts)
	if err != nil {
		return "", err
	}
	if !o.rebuild {
		have, err := cli.ImageInspect(ctx, d.Ref())
		if err == nil && have.Config != nil && have.Config.Labels[images.LabelDefinition] == d.Hash() {
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
func tagLatest(ctx context.Context, cli Client, d images.Definition, id string) error {
	if latest, err := cli.ImageInspect(ctx, d.Latest()); err == nil && latest.ID == id {
		return nil
	}
	if _, err := cli.ImageTag(ctx, client.ImageTagOptions{Source: d.Ref(), Target: d.Latest()}); err != nil {
		return fmt.Errorf("images: tag %s: %w", d.Latest(), err)
	}
	return nil
}

// Resolve returns the canonical reference of image (see Canonical) once it
// has checked that the engine has that image; it builds nothing. A missing
// image is an error of kind workspace.ErrUnavailable that names what to
// run: `sandboxd image build NAME` for an image sandboxd defines, `docker
// pull` or `docker load` for any other.
func Resolve(ctx context.Context, cli Client, image string) (string, error) {
	ref := images.Canonical(image)
	ok, err := exists(ctx, cli, ref)
	switch {
	case err != nil:
		return "", err
	case ok:
		return ref, nil
	}
	fix := fmt.Sprintf("docker pull %s, or docker load -i FILE for an image saved elsewhere", ref)
	if d, err := images.Lookup(definitionName(ref)); err == nil && d.Ref() == ref {
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

func build(ctx context.Context, cli Client, d images.Definition, o *options) (string, error) {
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
		fmt.Sprintf("LABEL %s=1 %s=%s %s=%s", images.LabelSandboxd, images.LabelImage, d.Name, images.LabelDefinition, d.Hash()),
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
