package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// runscFixed is how to get a runsc the agent serves under: gVisor's
// releases to date follow links on open(2) with O_NOFOLLOW|O_DIRECTORY
// (localfs.ErrKernelFollowsLinks).
const runscFixed = "build runsc with the fix (bash .ci/gvisor.sh runsc in sandboxd's source prints its path), " +
	"register it as runsc in /etc/docker/daemon.json (\"runtimes\", with \"runtimeArgs\": [\"--network=none\", \"--oci-seccomp\"]), then restart the engine"

// checkGVisor starts a session under each runsc runtime the engine has
// (runsc, and any other whose name starts so) in the policy's default
// image, and reports whether its agent serves there: gVisor is what
// sessions get when the policy asks for it, and a runsc whose kernel
// follows links it is told not to makes the agent refuse the workspace.
// A runtime the policy uses fails when it does not work; another warns.
// Without any, it says sessions share the host's kernel.
func checkGVisor(ctx context.Context, cli *client.Client, info system.Info, cfg serveConfig) []check {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(info.Runtimes)) {
		if strings.HasPrefix(name, policy.RuntimeRunsc) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return []check{{name: "gvisor", status: statusSkip,
			detail: "the engine has no runsc runtime: sessions run on the host's kernel (runc); see the README's security section"}}
	}
	image := images.Canonical(cmp.Or(cfg.Policy.DefaultImage, cfg.Image, images.Default))
	used := map[string]bool{cmp.Or(cfg.Policy.DefaultRuntime, policy.RuntimeRunc): true}
	for _, r := range cfg.Policy.Runtimes {
		used[r] = true
	}
	var out []check
	for _, name := range names {
		c := probeRuntime(ctx, cli, image, name)
		if c.status == statusFail && !used[name] {
			c.status = statusWarn
		}
		out = append(out, c)
	}
	return out
}

// followsLinks is in the agent's log when it refuses the workspace for
// localfs.ErrKernelFollowsLinks.
const followsLinks = "follows symbolic links"

// probeRuntime starts a session container of image under runtime, runs
// uname in it and removes it.
func probeRuntime(ctx context.Context, cli docker.Engine, image, runtime string) check {
	c := check{name: "gvisor " + runtime}
	agentPath, err := docker.FindAgent()
	if err != nil {
		c.status, c.detail = statusSkip, "needs the agent"
		return c
	}
	prof := policy.DefaultProfile(image)
	prof.Runtime, prof.Session = runtime, "doctor"
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	ctr, err := docker.Start(ctx, cli, docker.Spec{Profile: prof, Agent: agentPath, Labels: map[string]string{"sandboxd.doctor": "1"}})
	if err != nil {
		c.status, c.detail = statusFail, "a session does not start under "+runtime+": "+strings.TrimPrefix(err.Error(), "dockerexec: ")
		c.fix = "check the engine's log and " + runtime + "'s (runsc --debug-log)"
		if strings.Contains(err.Error(), followsLinks) {
			c.detail = runtime + " follows symbolic links on open(2) with O_NOFOLLOW|O_DIRECTORY (gVisor's releases to date do): " +
				"the agent refuses to serve the workspace there, since links would lead outside it"
			c.fix = runscFixed
		}
		return c
	}
	defer ctr.Close(context.WithoutCancel(ctx))
	took := time.Since(start)
	var buf bytes.Buffer
	res, err := ctr.Bash().Run(ctx, workspace.Command{Argv: []string{"uname", "-sr"},
		Output: func(_ workspace.Stream, p []byte) { buf.Write(p) }})
	if err != nil || res.ExitCode != 0 {
		c.status, c.detail = statusFail, fmt.Sprintf("a command in a session under %s failed: exit %d, %v", runtime, res.ExitCode, err)
		return c
	}
	c.status = statusOK
	c.detail = fmt.Sprintf("a session started under %s in %.1fs; its kernel says %s", runtime, took.Seconds(), strings.TrimSpace(buf.String()))
	return c
}
