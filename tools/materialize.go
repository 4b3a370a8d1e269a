package tools

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// SourcesResult is the structured content of materialize_sources: one
// entry per source materialized (none when the workspace declares none).
type SourcesResult struct {
	Sources []sources.Snapshot `json:"sources"`
	Message string             `json:"message,omitempty"`
}

type materializeArgs struct {
	Path    string   `json:"path,omitempty" jsonschema:"only sources under this path prefix"`
	Sources []string `json:"sources,omitempty" jsonschema:"the sources to materialize (default: all)"`
}

var materializeSourcesTool = newTool(spec[materializeArgs, *SourcesResult]{
	name: workspaceshell.ToolMaterializeSources, skill: SkillWorkspaceShell,
	describe: func(*Set) string {
		return "Materialize complete snapshots of the workspace's sources before inspecting them with shell. Optional path prefix and sources list."
	},
	handle:   (*Set).materializeSources,
	readOnly: func(s *Set) bool { return len(s.cfg.Sources) == 0 }, // else it writes .sandboxd/sources/
})

func (s *Set) materializeSources(ctx context.Context, p materializeArgs, c *call) (Result, error) {
	decls := s.cfg.Sources
	if len(decls) == 0 {
		if len(p.Sources) > 0 {
			return Result{}, newError(workspace.ErrNotFound, "no source named %s: this workspace declares no sources", strings.Join(p.Sources, ", "))
		}
		msg := "This workspace declares no sources: there is nothing to materialize. Its files are already in " + s.root + "; inspect them with shell."
		return Result{Text: msg, Structured: &SourcesResult{Sources: []sources.Snapshot{}, Message: msg}}, nil
	}
	name, err := workspace.Resolve(s.root, p.Path)
	if err != nil {
		return Result{}, err
	}
	if err := workspace.Bookkeeping(ctx, c.raw, workspace.BookkeepingDir, 0o755); err != nil {
		return Result{}, err
	}
	res, err := sources.Materialize(ctx, c.raw, decls, sources.Request{Path: name, Names: p.Sources,
		Limits: sources.Limits{MaxFileBytes: s.cfg.MaxFileBytes}})
	snapshots := make([]string, 0, len(decls))
	for _, n := range decls.Names() {
		snapshots = append(snapshots, path.Join(sources.SnapshotDir, n))
	}
	s.own(ctx, snapshots...) // what it wrote, whatever became of the rest
	if err != nil {
		var k *workspace.Kind // an undeclared name or a path no snapshot is at, not a host file
		if errors.As(err, &k) && k == workspace.ErrNotFound {
			return Result{}, newError(workspace.ErrNotFound, "%v (declared sources: %s, materialized under %s/)", err, strings.Join(decls.Names(), ", "), path.Join(s.root, sources.SnapshotDir))
		}
		return Result{}, err
	}
	var b strings.Builder
	for _, src := range res.Sources {
		state := "unchanged"
		if src.Changed {
			state = "updated"
		}
		fmt.Fprintf(&b, "%s (%s): %s, %d files, %d bytes, %s, %s\n", src.Name, src.Kind, path.Join(s.root, src.Path), src.Files, src.Bytes, src.Digest, state)
		if src.Kind == sources.KindHTTP {
			fmt.Fprintf(&b, "  an API: its declared requests are in %s; send them with shell's curl\n", path.Join(s.root, src.Path, sources.DescriptorFile))
		}
	}
	b.WriteString("Snapshots are read-only; inspect them with shell (name the path: searches from the root skip .sandboxd).")
	return Result{Text: b.String(), Structured: &SourcesResult{Sources: res.Sources}}, nil
}
