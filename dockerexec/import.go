package dockerexec

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/workspace"
)

// importParallel is how many files an import writes at once; the agent
// serves calls concurrently, so this hides the round trips.
const importParallel = 8

// Import extracts a tar stream (names relative to the workspace root) into
// the running container's workspace through the agent, as the session's
// user: directories are made, regular files written (replacing those there)
// and symbolic links created; other entries, and names that would leave the
// root, are skipped. Owners in the archive are ignored, and directories get
// at least owner rwx so their files can be written.
//
// Going through the agent keeps the agent's confinement — links are never
// followed out of the workspace, whatever runs in the container meanwhile —
// so no pause is needed. Files are written importParallel at a time, each
// held in memory while it is sent. (The initial workspace of Start goes in
// through the archive API instead, before the container starts.)
func (c *Container) Import(ctx context.Context, r io.Reader) error {
	return importTar(ctx, c.agent, r)
}

// cleanName returns a tar entry's name cleaned and relative, or false for
// the root itself and names that leave it.
func cleanName(name string) (string, bool) {
	name = path.Clean(strings.TrimPrefix(name, "/"))
	return name, name != "." && name != ".." && !strings.HasPrefix(name, "../")
}

// importFS is what importTar needs of a FileSystem.
type importFS interface {
	workspace.SymlinkFS
	MkdirAll(ctx context.Context, name string, perm fs.FileMode) error
}

func importTar(ctx context.Context, fsys importFS, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	fail := func(err error) {
		once.Do(func() { first = fmt.Errorf("dockerexec: import: %w", err); cancel() })
	}
	sem := make(chan struct{}, importParallel)
	made := map[string]bool{".": true}
	mkdir := func(dir string, perm fs.FileMode) error {
		if made[dir] {
			return nil
		}
		made[dir] = true
		return fsys.MkdirAll(ctx, dir, perm|0o700)
	}
	tr := tar.NewReader(r)
	for ctx.Err() == nil {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(err)
			break
		}
		name, ok := cleanName(h.Name)
		if !ok {
			continue
		}
		perm := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			err = mkdir(name, perm)
		case tar.TypeSymlink:
			if err = mkdir(path.Dir(name), 0o755); err == nil {
				err = fsys.Symlink(ctx, h.Linkname, name)
				if errors.Is(err, workspace.ErrExists) && fsys.Remove(ctx, name) == nil {
					err = fsys.Symlink(ctx, h.Linkname, name)
				}
			}
		case tar.TypeReg:
			if err = mkdir(path.Dir(name), 0o755); err != nil {
				break
			}
			var data []byte
			if data, err = io.ReadAll(tr); err != nil {
				break
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if err := fsys.WriteFile(ctx, name, data, perm); err != nil {
					fail(err)
				}
			}()
		}
		if err != nil {
			fail(err)
		}
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}
