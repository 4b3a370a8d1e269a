// Package workspace defines the ports every sandboxd tool stands on — a
// FileSystem, a Bash and the Session they belong to — together with the
// guardrails that make a directory a workspace: path resolution, protect
// globs, exclude names and the command environment allowlist.
//
// The design follows io/fs. The core interfaces are small; what an adapter can
// do faster than the core allows (a walk, a search, a lock) is an optional
// extension interface, and a helper function of the same name uses the
// extension when the adapter has it and falls back to the core when it does
// not:
//
//	entries, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{Pattern: "**/*.go"})
//
// Names. Every FileSystem method takes names in the form of io/fs: slash
// separated, relative to the workspace root, cleaned, with "." for the root
// itself (see fs.ValidPath). Callers turn what an agent wrote into such a name
// with Resolve, which refuses paths that leave the root lexically; the adapter
// then guarantees that resolving symbolic links never leaves it either.
//
// Errors. A method fails with an *fs.PathError whose Err is one of the Kinds
// declared here (ErrNotFound, ErrOutsideWorkspace, ErrNotAFile, …), so
//
//	errors.Is(err, workspace.ErrNotAFile)
//
// works for every adapter, including those across a process or container
// boundary. Kinds that have an io/fs counterpart match it too:
// errors.Is(err, fs.ErrNotExist) holds for ErrNotFound.
//
// Conformance. The conformance package checks any implementation of these
// ports against one behaviour; each adapter's test is a few lines.
package workspace
