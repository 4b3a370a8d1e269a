package docker

import (
	"archive/tar"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/images/engine"
	"github.com/sandboxd/sandboxd/policy"
)

// Export writes the workspace's tree to w as a tar stream, names relative
// to /workspace, parents before what they hold, as the engine's archive of
// the workspace volume has them (snapshot.Source's form). The container is
// frozen (docker pause: the cgroup freezer stops every process in it, the
// agent too) from before the engine reads the first entry until w has
// taken the last, so the tree is one moment's: a command writing meanwhile
// is caught where it stood — a file it was writing may be cut short, but
// no file is read from before a change and another from after it. Calls
// and commands stall meanwhile (their time runs on), and go on once the
// container thaws. The container thaws even when ctx ends or w fails; one
// that cannot be thawed fails Export, saying so. Exports of one container
// take turns.
func (c *Container) Export(ctx context.Context, w io.Writer) (err error) {
	c.freezing.Lock()
	defer c.freezing.Unlock()
	return export(ctx, c.cli, c.id, c.name, true, w)
}

// ExportWorkspace is Export for a session container this process does not
// hold — one a killed run left, whose work is to be delivered: the
// container named id (a name or an ID) is frozen while its workspace is
// read when it runs, and read as it stands when it has stopped.
func ExportWorkspace(ctx context.Context, cli Engine, id string, w io.Writer) error {
	res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return fmt.Errorf("dockerexec: the container %s: %w", id, err)
	}
	running := res.Container.State != nil && res.Container.State.Running && !res.Container.State.Paused
	return export(ctx, cli, res.Container.ID, id, running, w)
}

func export(ctx context.Context, cli Engine, id, name string, freeze bool, w io.Writer) (err error) {
	if freeze {
		if _, err := cli.ContainerPause(ctx, id, client.ContainerPauseOptions{}); err != nil {
			return fmt.Errorf("dockerexec: freezing the container for the copy: %w", err)
		}
		defer func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if _, uerr := cli.ContainerUnpause(tctx, id, client.ContainerUnpauseOptions{}); uerr != nil {
				err = errors.Join(err, fmt.Errorf("dockerexec: the container %s stays frozen after its copy (docker unpause %s): %w", name, name, uerr))
			}
		}()
	}
	res, err := cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: policy.WorkspaceDir})
	if err != nil {
		return fmt.Errorf("dockerexec: reading the workspace: %w", err)
	}
	defer res.Content.Close()
	return rebase(w, res.Content, strings.TrimPrefix(policy.WorkspaceDir, "/"))
}

// rebase copies the tar stream src to w with the leading directory dir
// taken off every name (its own entry becomes the root's, and is dropped).
func rebase(w io.Writer, src io.Reader, dir string) error {
	tr, tw := tar.NewReader(src), tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("dockerexec: the workspace's archive: %w", err)
		}
		rest, ok := strings.CutPrefix(strings.TrimPrefix(h.Name, "./"), dir)
		rest = strings.TrimPrefix(rest, "/")
		if !ok || rest == "" {
			continue
		}
		h.Name = rest
		if h.Typeflag == tar.TypeLink {
			if l, ok := strings.CutPrefix(strings.TrimPrefix(h.Linkname, "./"), dir+"/"); ok {
				h.Linkname = l
			}
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// Import writes the tar stream r (names relative to the workspace root, as
// Export writes it) into the container's workspace, which should be empty:
// directories, regular files and links, owned by the container's user,
// with their permission bits and times; other entries, and names that
// would leave the workspace, are dropped. It fails, naming the cap, once
// the files pass Spec.MaxWorkspaceBytes (each at its full size). It goes
// through the engine's archive API, into a container that runs only its
// agent (a fresh or a warm one), never one whose session has run commands:
// extraction follows no link of the workspace's out of it, but a
// session's own processes could race it.
func (c *Container) Import(ctx context.Context, r io.Reader) error {
	budget := &copyBudget{limit: c.maxBytes}
	pr, pw := io.Pipe()
	tarred := make(chan error, 1)
	go func() {
		err := ownTar(pw, r, c.owner[0], c.owner[1], budget)
		pw.CloseWithError(err)
		tarred <- err
	}()
	_, err := c.cli.CopyToContainer(ctx, c.id, client.CopyToContainerOptions{DestinationPath: policy.WorkspaceDir, Content: pr})
	pr.CloseWithError(cmp.Or(err, io.ErrClosedPipe))
	// The stream's own failure (the cap, a snapshot refused) says more than
	// the engine's about a body cut short.
	if terr := <-tarred; terr != nil && !errors.Is(terr, io.ErrClosedPipe) {
		return terr
	}
	if err != nil {
		return fmt.Errorf("dockerexec: copying the workspace in: %w", err)
	}
	return nil
}

// ReadImage writes the tree at dir of spec.Profile.Image to w, in
// Export's form, from a container made of the image and never started (no
// code of the image runs), labelled as spec says — so that a crash leaves
// nothing Reap does not remove — and removed at once.
func (d *Backend) ReadImage(ctx context.Context, spec backend.Spec, dir string, w io.Writer) error {
	dir = path.Clean("/" + dir)
	if dir == "/" {
		return errors.New("docker backend: a template is a directory of its image, not the image's root")
	}
	ref, err := engine.Resolve(ctx, d.Client, spec.Profile.Image)
	if err != nil {
		return fmt.Errorf("docker backend: %w", err)
	}
	labels := spec.Profile.Labels()
	maps.Copy(labels, spec.Labels)
	created, err := d.Client.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: containerName("template"),
		Config: &container.Config{
			Image: ref, Entrypoint: []string{"/.sandboxd-never-started"}, Cmd: []string{},
			NetworkDisabled: true, Labels: labels,
		},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return fmt.Errorf("docker backend: a container of %s to read %s from: %w", ref, dir, err)
	}
	defer d.Client.ContainerRemove(context.WithoutCancel(ctx), created.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	res, err := d.Client.CopyFromContainer(ctx, created.ID, client.CopyFromContainerOptions{SourcePath: dir})
	if err != nil {
		return fmt.Errorf("docker backend: reading %s of %s: %w", dir, ref, err)
	}
	defer res.Content.Close()
	return rebase(w, res.Content, path.Base(dir))
}
