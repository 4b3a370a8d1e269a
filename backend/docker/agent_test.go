package docker_test

import (
	"context"
	"maps"
	"strings"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/images/engine"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
	"github.com/sandboxd/sandboxd/workspace"
)

// TestPruneAgentVolumes: the agent volumes of other builds are removed,
// except one a container uses; the volume of the build kept stays.
func TestPruneAgentVolumes(t *testing.T) {
	cli := dockertest.Client(t)
	ctx := context.Background()
	image := dockertest.Image(t)
	vols := map[string]string{"stale": "", "kept": "", "used": ""}
	for build := range vols {
		labels := maps.Clone(dockertest.Labels())
		labels[docker.LabelAgent] = build
		v, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		vols[build] = v.Volume.Name
		t.Cleanup(func() { cli.VolumeRemove(context.Background(), v.Volume.Name, client.VolumeRemoveOptions{Force: true}) })
	}
	user, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: image, Entrypoint: []string{"/.never-started"}, Labels: dockertest.Labels()},
		HostConfig: &container.HostConfig{NetworkMode: "none", Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: vols["used"], Target: "/agent"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.ContainerRemove(context.Background(), user.ID, client.ContainerRemoveOptions{Force: true})
	})

	docker.PruneAgentVolumes(ctx, cli, "kept", 0, dockertest.Labels())
	for build, name := range vols {
		_, err := cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
		if gone := cerrdefs.IsNotFound(err); gone != (build == "stale") {
			t.Errorf("volume of build %q: gone = %v (%v)", build, gone, err)
		}
	}
}

// TestRemoveVolumeInUse: a session's workspace volume that containers
// the daemon never learned of still mount (a create cut short by a
// cancelled context after the engine made it: the session's container,
// a loader) goes, with them; removing it again is no error.
func TestRemoveVolumeInUse(t *testing.T) {
	cli := dockertest.Client(t)
	ctx := context.Background()
	v, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Labels: dockertest.Labels()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.VolumeRemove(context.Background(), v.Volume.Name, client.VolumeRemoveOptions{Force: true}) })
	var users []string
	for range 2 {
		ct, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
			Config:     &container.Config{Image: dockertest.Image(t), Entrypoint: []string{"/.never-started"}, Labels: dockertest.Labels()},
			HostConfig: &container.HostConfig{NetworkMode: "none", Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: v.Volume.Name, Target: "/workspace"}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, ct.ID)
		t.Cleanup(func() { cli.ContainerRemove(context.Background(), ct.ID, client.ContainerRemoveOptions{Force: true}) })
	}
	if _, err := cli.VolumeRemove(ctx, v.Volume.Name, client.VolumeRemoveOptions{Force: true}); err == nil {
		t.Fatal("the engine removed a volume in use: the case this test stands for does not arise")
	}
	for range 2 {
		if err := docker.RemoveVolume(ctx, cli, v.Volume.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.VolumeInspect(ctx, v.Volume.Name, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("the volume is left: %v", err)
	}
	for _, id := range users {
		if _, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
			t.Errorf("container %s, which mounted the volume, is left: %v", id, err)
		}
	}
}

// TestShell: the container says which shell runs its scripts — GNU bash on
// minimal, busybox's sh on an image without bash (one declared here from
// busybox-static alone), where bash syntax fails.
func TestShell(t *testing.T) {
	ctx := context.Background()
	cli := dockertest.Client(t)
	d, err := images.Declare(images.Definition{Name: "itest-nobash", Builder: "busybox", Packages: []string{"busybox-static"}})
	if err != nil {
		t.Fatal(err)
	}
	nobash, err := engine.Build(ctx, cli, d.Name, engine.WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.ImageRemove(context.Background(), d.Latest(), client.ImageRemoveOptions{})
		cli.ImageRemove(context.Background(), nobash, client.ImageRemoveOptions{})
	})
	for _, tt := range []struct {
		image, shell, out string
	}{
		{dockertest.Image(t), "/bin/bash", "3\n"},
		{nobash, "/bin/sh", ""},
	} {
		c := dockertest.Start(t, docker.Spec{Profile: policy.DefaultProfile(tt.image)})
		if got := workspace.ShellOf(c.Bash()); got != tt.shell {
			t.Errorf("%s: shell %q, want %q", tt.image, got, tt.shell)
		}
		var out strings.Builder
		res, err := c.Bash().Run(ctx, workspace.Command{Script: "a=(x y z); echo ${#a[@]}", Output: func(s workspace.Stream, p []byte) {
			if s == workspace.Stdout {
				out.Write(p)
			}
		}})
		if err != nil || out.String() != tt.out || (res.ExitCode == 0) != (tt.out != "") {
			t.Errorf("%s: bash arrays: %+v, %v, output %q; want %q", tt.image, res, err, out.String(), tt.out)
		}
	}
}
