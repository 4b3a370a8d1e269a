// Package workspaceshell is the workspace-shell profile: a second tool
// profile over the workspace ports ([workspace.FileSystem] and
// [workspace.Bash]), for hosts that want an inspection-first agent and for
// coding agents that bring their own tools and only need to run a few allowed
// programs. It knows nothing of MCP; the tool layer registers its operations.
//
//   - Settings and Validate: the profile's options ("mode", "commands",
//     "timeout", the driver and the session's write access) with every
//     definition-time diagnostic of the contract; Catalogue gives the
//     profile's entry in the tool catalogue.
//   - The shell tool is the line interpreter of package
//     [github.com/sandboxd/sandboxd/workspaceshell/interp]: a line is
//     parsed as Bash, checked against the mode's allowlist before anything
//     runs, and interpreted in this process over the FileSystem port. Mode
//     and Env are that package's, named here for the profile's callers.
//   - WriteFile, AppendFile, MakeDir, CopyPath, MovePath, DeletePath: the
//     structured mutations of write mode, under the guardrails of write and
//     edit (the interpreter's [interp.Mutator], which the shell's write
//     commands use too).
//   - ExecCommand: workspace_exec, one allowlisted executable run through
//     the Bash port without a shell.
//
// Commit and rollback of the changes a call makes belong to the workspace
// session around it, not to this package.
package workspaceshell
