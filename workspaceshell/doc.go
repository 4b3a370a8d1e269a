// Package workspaceshell is the engine of the workspace-shell capability: a
// second tool profile over the workspace ports (workspace.FileSystem and
// workspace.Bash), for hosts that want an inspection-first agent and for
// coding agents that bring their own tools and only need to run a few allowed
// programs. It knows nothing of MCP; the tool layer registers its operations.
//
//   - Settings and Validate: the profile's options ("mode", "commands",
//     "timeout", the driver and the session's write access) with every
//     definition-time diagnostic of the contract; Catalogue gives the
//     profile's entry in the tool catalogue.
//   - Run: the shell tool. A command line is parsed as Bash
//     (mvdan.cc/sh/v3/syntax), every command in the whole syntax tree is
//     checked against the mode's allowlist (Check), and the line is then
//     interpreted in this process, its commands (pwd, ls, find, cat, head,
//     tail, wc, grep, rg; mkdir, touch, cp, mv, rm in write mode) implemented
//     over the FileSystem port — so it starts no process and behaves the same
//     on the memory, local and Docker backends.
//   - WriteFile, AppendFile, MakeDir, CopyPath, MovePath, DeletePath: the
//     structured mutations of write mode, under the guardrails of write and
//     edit.
//   - ExecCommand and Exec: workspace_exec, one allowlisted executable run
//     through the Bash port without a shell.
//
// Commit and rollback of the changes a call makes belong to the workspace
// session around it, not to this package.
package workspaceshell
