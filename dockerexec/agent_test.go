package dockerexec_test

import (
	"context"
	"maps"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/dockerexec"
	"github.com/sandboxd/sandboxd/internal/dockertest"
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
		labels[dockerexec.LabelAgent] = build
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

	dockerexec.PruneAgentVolumes(ctx, cli, "kept", 0, dockertest.Labels())
	for build, name := range vols {
		_, err := cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
		if gone := cerrdefs.IsNotFound(err); gone != (build == "stale") {
			t.Errorf("volume of build %q: gone = %v (%v)", build, gone, err)
		}
	}
}
