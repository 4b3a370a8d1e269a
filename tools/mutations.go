package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxd/sandboxd/workspaceshell"
)

// The structured mutations of the workspace-shell profile's write mode:
// writeFile, appendFile, makeDir, copyPath, movePath and deletePath, each
// one journal commit.

// guardText is what a mutation's description says of paths.
func (s *Set) guardText() string {
	return fmt.Sprintf(" Paths are relative to %s; paths matching %s are refused.", s.root, strings.Join(s.cfg.Protect, ", "))
}

// mutationTool declares a mutation: describe is what it does.
func mutationTool[In, Out any](name, describe string, handle func(s *Set, ctx context.Context, p In, c *call) (Result, error)) *tool {
	return newTool(spec[In, Out]{
		name: name, skill: SkillWorkspaceShell,
		describe:  func(s *Set) string { return describe + s.guardText() },
		handle:    handle,
		journaled: yes,
	})
}

type fileTextArgs struct {
	Path    string  `json:"path" jsonschema:"the file"`
	Content *string `json:"content" jsonschema:"the text"`
}

func (a fileTextArgs) missing() string {
	switch {
	case a.Path == "":
		return "path"
	case a.Content == nil:
		return "content"
	}
	return ""
}

type makeDirArgs struct {
	Path string `json:"path" jsonschema:"the directory"`
}

// fromToArgs are copyPath's and movePath's arguments.
type fromToArgs struct {
	From      string `json:"from" jsonschema:"the path to copy or move"`
	To        string `json:"to" jsonschema:"the exact new path (not a directory to put it in)"`
	Overwrite bool   `json:"overwrite,omitempty" jsonschema:"replace a file at to (a directory is never replaced)"`
}

func (a fromToArgs) missing() string {
	switch {
	case a.From == "":
		return "from"
	case a.To == "":
		return "to"
	}
	return ""
}

type deletePathArgs struct {
	Path      string `json:"path" jsonschema:"what to delete"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"delete a directory with everything in it"`
}

var (
	writeFileTool = mutationTool[fileTextArgs, *workspaceshell.WriteFileResult](workspaceshell.ToolWriteFile,
		"Create or replace a file, creating missing parent directories; readers never see half a file.", (*Set).writeFile)
	appendFileTool = mutationTool[fileTextArgs, *workspaceshell.AppendFileResult](workspaceshell.ToolAppendFile,
		"Add text to the end of a file, creating it (and its parents) when missing.", (*Set).appendFile)
	makeDirTool = mutationTool[makeDirArgs, *workspaceshell.MakeDirResult](workspaceshell.ToolMakeDir,
		"Create a directory and any missing parents; an existing directory is fine.", (*Set).makeDir)
	copyPathTool = mutationTool[fromToArgs, *workspaceshell.CopyPathResult](workspaceshell.ToolCopyPath,
		"Copy a file or a directory tree to a new path (links inside are copied as links).", (*Set).copyPath)
	movePathTool = mutationTool[fromToArgs, *workspaceshell.MovePathResult](workspaceshell.ToolMovePath,
		"Move (rename) a file or a directory.", (*Set).movePath)
	deletePathTool = mutationTool[deletePathArgs, *workspaceshell.DeletePathResult](workspaceshell.ToolDeletePath,
		"Delete a file, a link (never its target) or a directory (with recursive, one that has entries).", (*Set).deletePath)
)

func (s *Set) writeFile(ctx context.Context, p fileTextArgs, c *call) (Result, error) {
	return mutate(p.missing(), func() (workspaceshell.WriteFileResult, string, error) {
		r, err := workspaceshell.WriteFile(ctx, s.shellEnv(c), workspaceshell.WriteFileRequest{Path: p.Path, Content: *p.Content})
		return r, fmt.Sprintf("Wrote %s (%d bytes%s).", r.Path, r.Bytes, createdWord(r.Created)), err
	})
}

func (s *Set) appendFile(ctx context.Context, p fileTextArgs, c *call) (Result, error) {
	return mutate(p.missing(), func() (workspaceshell.AppendFileResult, string, error) {
		r, err := workspaceshell.AppendFile(ctx, s.shellEnv(c), workspaceshell.AppendFileRequest{Path: p.Path, Content: *p.Content})
		return r, fmt.Sprintf("Appended %d bytes to %s (now %d bytes%s).", r.Bytes, r.Path, r.Size, createdWord(r.Created)), err
	})
}

func (s *Set) makeDir(ctx context.Context, p makeDirArgs, c *call) (Result, error) {
	return mutate(pathMissing(p.Path), func() (workspaceshell.MakeDirResult, string, error) {
		r, err := workspaceshell.MakeDir(ctx, s.shellEnv(c), workspaceshell.MakeDirRequest(p))
		verb := "Created"
		if !r.Created {
			verb = "Already there:"
		}
		return r, fmt.Sprintf("%s %s/", verb, r.Path), err
	})
}

func (s *Set) copyPath(ctx context.Context, p fromToArgs, c *call) (Result, error) {
	return mutate(p.missing(), func() (workspaceshell.CopyPathResult, string, error) {
		r, err := workspaceshell.CopyPath(ctx, s.shellEnv(c), workspaceshell.CopyPathRequest(p))
		return r, fmt.Sprintf("Copied %s to %s (%d entries).", r.From, r.To, r.Entries), err
	})
}

func (s *Set) movePath(ctx context.Context, p fromToArgs, c *call) (Result, error) {
	return mutate(p.missing(), func() (workspaceshell.MovePathResult, string, error) {
		r, err := workspaceshell.MovePath(ctx, s.shellEnv(c), workspaceshell.MovePathRequest(p))
		return r, fmt.Sprintf("Moved %s to %s.", r.From, r.To), err
	})
}

func (s *Set) deletePath(ctx context.Context, p deletePathArgs, c *call) (Result, error) {
	return mutate(pathMissing(p.Path), func() (workspaceshell.DeletePathResult, string, error) {
		r, err := workspaceshell.DeletePath(ctx, s.shellEnv(c), workspaceshell.DeletePathRequest(p))
		return r, fmt.Sprintf("Deleted %s (%d entries).", r.Path, r.Removed), err
	})
}

func pathMissing(p string) string {
	if p == "" {
		return "path"
	}
	return ""
}

// mutate refuses a call whose required argument missing is not given (""
// when all are), or runs op, which returns the result and its text.
func mutate[R any](missing string, op func() (R, string, error)) (Result, error) {
	if missing != "" {
		return Result{}, invalid("%s is required", missing)
	}
	r, text, err := op()
	if err != nil {
		return Result{}, err
	}
	return Result{Text: text, Structured: &r}, nil
}

func createdWord(created bool) string {
	if created {
		return ", created"
	}
	return ""
}
