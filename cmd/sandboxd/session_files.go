package main

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/sandboxd/sandboxd/client"
	"github.com/sandboxd/sandboxd/runner"
)

// The session verbs that move work in and out: a session's diff, and files
// and trees as tar streams (the API's uploads and downloads).

var cmdSessionDiff = &command{
	name:    "session diff",
	args:    "[--since COMMIT] [-o FILE] ID",
	summary: "print what a session changed as a git-format patch (git apply takes it)",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		since := fs.Int("since", -1, "only the paths the journal's commits after this `commit` touched (0: the journal's start); default: everything since the session's baseline (its start, or the last session baseline)")
		out := fs.String("o", "", "write the patch to this `file` (default: standard output)")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) != 1 {
				return usagef("want a session ID")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			var opts client.SessionDiffOptions
			if *since >= 0 {
				opts.Since = since
			}
			res, err := cl.SessionDiff(ctx, args[0], opts)
			if err != nil {
				return err
			}
			defer res.Patch.Close()
			return writeOut(sio, *out, res.Patch)
		}
	},
}

var cmdSessionGet = &command{
	name:    "session get",
	args:    "[-o FILE | -C DIR] ID PATH",
	summary: "download a file or directory of a session: a tar stream to standard output or FILE, or extracted into DIR",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		out := fs.String("o", "", "write the tar stream to this `file` (default: standard output)")
		dir := fs.String("C", "", "extract into this `directory` (created when missing) instead: a directory's entries relative to it, a file by its base name")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) != 2 {
				return usagef("want a session ID and a workspace path (\".\" for the whole workspace)")
			}
			if *out != "" && *dir != "" {
				return usagef("-o and -C exclude each other")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			res, err := cl.CopyFromSession(ctx, args[0], client.CopyFromSessionOptions{Path: args[1]})
			if err != nil {
				return err
			}
			defer res.Content.Close()
			if *dir != "" {
				return extractTar(res.Content, *dir)
			}
			return writeOut(sio, *out, res.Content)
		}
	},
}

var cmdSessionPut = &command{
	name:    "session put",
	args:    "[--baseline] ID PATH [SOURCE | -]",
	summary: "upload into a session's directory PATH: a host file (by its name), a host directory's contents, or a tar stream from standard input",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		baseline := fs.Bool("baseline", false, "take a new diff baseline just after the upload, with no other change between the two (session baseline): the diff then shows only what changes after it")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) < 2 || len(args) > 3 {
				return usagef("want a session ID, a workspace directory (\".\" for the root) and a file, a directory or - (a tar stream on standard input)")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			var content io.Reader = sio.in
			if len(args) == 3 && args[2] != "-" {
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(packTar(pw, args[2])) }()
				defer pr.Close()
				content = pr
			}
			res, err := cl.CopyToSession(ctx, args[0], client.CopyToSessionOptions{Path: args[1], Content: content, Baseline: *baseline})
			if err != nil {
				return err
			}
			fmt.Fprintf(sio.err, "%d files, %d directories, %d links, %d bytes\n", res.Files, res.Dirs, res.Links, res.Bytes)
			if res.Baseline != nil {
				printBaseline(sio, *res.Baseline)
			}
			return nil
		}
	},
}

var cmdSessionBaseline = &command{
	name:    "session baseline",
	args:    "ID",
	summary: "take a new diff baseline: session diff shows only what changes after it (the project put into an empty session is not in it)",
	setup: func(fs *flag.FlagSet) runFunc {
		c := daemonFlags(fs)
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) != 1 {
				return usagef("want a session ID")
			}
			cl, err := c.open()
			if err != nil {
				return err
			}
			res, err := cl.SessionBaseline(ctx, args[0], client.SessionBaselineOptions{})
			if err != nil {
				return err
			}
			printBaseline(sio, res.Baseline)
			return nil
		}
	},
}

// printBaseline says what a new baseline holds, on standard error.
func printBaseline(sio stdio, b runner.BaselineInfo) {
	fmt.Fprintf(sio.err, "new diff baseline: %d files and links", b.Files)
	if len(b.Skipped) > 0 {
		fmt.Fprintf(sio.err, " (%d left out, too large: a diff names them)", len(b.Skipped))
	}
	fmt.Fprintln(sio.err)
}

// writeOut copies r to the named file, or standard output when name is ""
// or "-". A file is written whole or not at all: to a temporary name,
// renamed in.
func writeOut(sio stdio, name string, r io.Reader) error {
	if name == "" || name == "-" {
		_, err := io.Copy(sio.out, r)
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// packTar writes src as a tar stream: a directory's contents (its
// directories, regular files and symbolic links, named relative to it), or
// a file by its base name. Other kinds of file are refused.
func packTar(w io.Writer, src string) error {
	info, err := os.Stat(src)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	if info.IsDir() {
		err = tw.AddFS(os.DirFS(src))
	} else if !info.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file or a directory", src)
	} else {
		err = addFile(tw, src, info)
	}
	if err != nil {
		return err
	}
	return tw.Close()
}

// addFile writes one host file into tw under its base name.
func addFile(tw *tar.Writer, name string, info fs.FileInfo) error {
	hdr, err := tar.FileInfoHeader(info, "")
	if err != nil {
		return err
	}
	hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// extractTar writes a download's entries into dir (created when missing),
// through an os.Root: no entry reaches outside dir, whatever its name or
// the links before it. Files are replaced, with the archive's permission
// bits; links are made as they are.
func extractTar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean(hdr.Name)
		if name == "." {
			continue
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err = root.MkdirAll(name, mode); err == nil {
				err = root.Chmod(name, mode)
			}
		case tar.TypeSymlink:
			if err = root.Remove(name); err == nil || errors.Is(err, fs.ErrNotExist) {
				err = root.Symlink(hdr.Linkname, name)
			}
		case tar.TypeReg:
			err = extractFile(root, name, mode, tr)
		default:
			err = fmt.Errorf("%s: an entry of type %q, which a download does not hold", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

func extractFile(root *os.Root, name string, mode fs.FileMode, r io.Reader) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Chmod(name, mode)
	}
	return err
}
