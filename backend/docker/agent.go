package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// EnvAgent names the environment variable that points at the agent binary.
const EnvAgent = "SANDBOXD_AGENT"

// LabelAgent is set on agent volumes to the agent binary's SHA-256.
const LabelAgent = "sandboxd.agent"

// FindAgent returns the path of the sandboxd-agent binary that goes into
// containers: $SANDBOXD_AGENT when set, else sandboxd-agent beside the
// running executable, else sandboxd-agent on PATH. The binary must be a
// statically linked Linux executable (built with CGO_ENABLED=0), since it
// runs in images that may have no C library at all.
func FindAgent() (string, error) {
	if p := os.Getenv(EnvAgent); p != "" {
		return p, checkAgent(p)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "sandboxd-agent")
		if _, err := os.Stat(p); err == nil {
			return p, checkAgent(p)
		}
	}
	p, err := exec.LookPath("sandboxd-agent")
	if err != nil {
		return "", fmt.Errorf("dockerexec: no sandboxd-agent binary: set %s, or put it beside sandboxd or on PATH "+
			"(CGO_ENABLED=0 go build ./cmd/sandboxd-agent)", EnvAgent)
	}
	return p, checkAgent(p)
}

// checkAgent refuses a binary that is not a static ELF executable.
func checkAgent(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("dockerexec: agent %s: not a Linux executable: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("dockerexec: agent %s is dynamically linked; build it with CGO_ENABLED=0", p)
		}
	}
	return nil
}

// agentVolumes remembers, per agent binary (path, size, modification time),
// the volume verified to hold it, so a process checks each volume once.
var agentVolumes struct {
	sync.Mutex
	ready map[agentKey]string
}

type agentKey struct {
	path  string
	size  int64
	mtime time.Time
}

// agentVolume returns the name of a volume that holds the agent binary at
// its root as sandboxd-agent: sandboxd-agent-HASH, made and filled on first
// use. The volume is filled through the archive API into a container that is
// created and never started (any image will do; image is the session's), and
// checked by size before it is trusted. Volumes are shared by every session
// using the same agent build and are not removed by Close or Reap; once a
// process has filled the volume of its build, it removes those of other
// builds that are unused and older than StaleAgentAge (pruneAgentVolumes),
// and a volume it remembers is checked to be there before each use.
func agentVolume(ctx context.Context, cli Engine, binPath, image string) (string, error) {
	fi, err := os.Stat(binPath)
	if err != nil {
		return "", fmt.Errorf("dockerexec: agent: %w", err)
	}
	key := agentKey{binPath, fi.Size(), fi.ModTime()}
	agentVolumes.Lock()
	defer agentVolumes.Unlock()
	if v, ok := agentVolumes.ready[key]; ok {
		if _, err := cli.VolumeInspect(ctx, v, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
			return v, nil
		}
		delete(agentVolumes.ready, key) // removed since: filled anew below
	}
	if err := checkAgent(binPath); err != nil {
		return "", err
	}
	data, err := os.ReadFile(binPath)
	if err != nil {
		return "", fmt.Errorf("dockerexec: agent: %w", err)
	}
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	name := "sandboxd-agent-" + hash[:16]
	if err := fillAgentVolume(ctx, cli, name, hash, data, image); err != nil {
		return "", err
	}
	if agentVolumes.ready == nil {
		agentVolumes.ready = map[agentKey]string{}
	}
	agentVolumes.ready[key] = name
	pruneAgentVolumes(ctx, cli, hash, StaleAgentAge, nil)
	return name, nil
}

// StaleAgentAge is how old the agent volume of another build must be before
// a process of this build removes it when unused: long enough that a daemon
// of that build, between filling its volume and starting a container on it,
// is not caught out (and one that finds its volume gone fills it anew).
const StaleAgentAge = time.Hour

// pruneAgentVolumes removes the agent volumes (those labelled LabelAgent, and
// with every label of where) whose build is not keep and that were created
// more than age ago. The engine refuses to remove a volume a container uses,
// so a volume in use stays. It is best effort: errors are ignored.
func pruneAgentVolumes(ctx context.Context, cli Engine, keep string, age time.Duration, where map[string]string) {
	f := client.Filters{}.Add("label", LabelAgent)
	for k, v := range where {
		f = f.Add("label", k+"="+v)
	}
	list, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return
	}
	for _, v := range list.Items {
		created, err := time.Parse(time.RFC3339, v.CreatedAt)
		if v.Labels[LabelAgent] == keep || err != nil || time.Since(created) < age {
			continue
		}
		cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{})
	}
}

func fillAgentVolume(ctx context.Context, cli Engine, name, hash string, data []byte, image string) error {
	if _, err := cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{}); cerrdefs.IsNotFound(err) {
		_, err = cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Labels: map[string]string{policy.LabelSandboxd: "1", LabelAgent: hash}})
		if err != nil && !cerrdefs.IsConflict(err) {
			return fmt.Errorf("dockerexec: create agent volume: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("dockerexec: inspect agent volume: %w", err)
	}
	return withLoader(ctx, cli, nil, image, map[string]string{policy.LabelSandboxd: "1", LabelAgent: hash},
		mount.Mount{Type: mount.TypeVolume, Source: name, Target: mountAgent},
		func(loader string) error { return copyAgent(ctx, cli, loader, name, data) })
}

func copyAgent(ctx context.Context, cli Engine, loader, name string, data []byte) error {
	target := mountAgent + "/sandboxd-agent"
	if st, err := cli.ContainerStatPath(ctx, loader, client.ContainerStatPathOptions{Path: target}); err == nil && st.Stat.Size == int64(len(data)) {
		return nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "sandboxd-agent", Mode: 0o555, Size: int64(len(data)), ModTime: time.Now()})
	tw.Write(data)
	if err := tw.Close(); err != nil {
		return err
	}
	if _, err := cli.CopyToContainer(ctx, loader, client.CopyToContainerOptions{DestinationPath: mountAgent, Content: &buf}); err != nil {
		return fmt.Errorf("dockerexec: copy the agent into its volume: %w", err)
	}
	st, err := cli.ContainerStatPath(ctx, loader, client.ContainerStatPathOptions{Path: target})
	if err != nil {
		return fmt.Errorf("dockerexec: check the agent volume: %w", err)
	}
	if st.Stat.Size != int64(len(data)) {
		return fmt.Errorf("dockerexec: agent volume %s holds %d bytes, want %d", name, st.Stat.Size, len(data))
	}
	return nil
}

// withLoader runs f with the ID of a container that is created from image
// with m mounted, and never started, then removes the container. The archive
// API can write into m's volume through it while no code runs there.
//
// A loader whose removal fails is retried in q when q is not nil: it
// holds m's volume, which could not be removed while it lives.
func withLoader(ctx context.Context, cli Engine, q *removals, image string, labels map[string]string, m mount.Mount, f func(id string) error) error {
	loader, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image: image, Entrypoint: []string{"/.sandboxd-never-started"}, Cmd: []string{}, NetworkDisabled: true, Labels: labels,
		},
		HostConfig: &container.HostConfig{NetworkMode: "none", Mounts: []mount.Mount{m}},
	})
	if err != nil {
		return fmt.Errorf("dockerexec: create a loader container: %w", err)
	}
	remove := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, err := cli.ContainerRemove(ctx, loader.ID, client.ContainerRemoveOptions{Force: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("dockerexec: remove the loader container %s: %w", loader.ID, err)
		}
		return nil
	}
	defer func() {
		if err := remove(ctx); err != nil && q != nil {
			q.add("loader "+loader.ID, remove, err)
		}
	}()
	return f(loader.ID)
}

// ownedWorkspace remembers the images known to bring a /workspace that
// belongs to a given user: "image uid:gid" → true.
var ownedWorkspace sync.Map

// workspaceOwned reports whether image is a sandboxd image whose user is
// uid:gid, so that an empty volume mounted at /workspace takes its owner
// from the image's /workspace.
func workspaceOwned(ctx context.Context, cli Engine, image string, uid, gid int) bool {
	key := fmt.Sprintf("%s %d:%d", image, uid, gid)
	if _, ok := ownedWorkspace.Load(key); ok {
		return true
	}
	res, err := cli.ImageInspect(ctx, image)
	if err != nil || res.Config == nil {
		return false
	}
	ok := res.Config.Labels[images.LabelSandboxd] == "1" && res.Config.User == fmt.Sprintf("%d:%d", uid, gid)
	if ok {
		ownedWorkspace.Store(key, true)
	}
	return ok
}

// chownVolume makes the root of volume belong to uid:gid, through a loader
// container that mounts it (the archive API changes the owner of a directory
// it extracts over, but never of the destination itself).
func chownVolume(ctx context.Context, cli Engine, q *removals, image, volume string, uid, gid int, labels map[string]string) error {
	const at = "/.sandboxd-workspace"
	// The mount carries the volume's labels: a loader created after a
	// failed start removed the volume makes it anew, and then it is one
	// Reap finds, not an unlabelled leftover.
	return withLoader(ctx, cli, q, image, labels, mount.Mount{Type: mount.TypeVolume, Source: volume, Target: at, VolumeOptions: &mount.VolumeOptions{Labels: labels}},
		func(loader string) error {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: at[1:] + "/", Mode: 0o755, Uid: uid, Gid: gid, ModTime: time.Now()})
			tw.Close()
			if _, err := cli.CopyToContainer(ctx, loader, client.CopyToContainerOptions{DestinationPath: "/", Content: &buf}); err != nil {
				return fmt.Errorf("dockerexec: give the workspace volume to %d:%d: %w", uid, gid, err)
			}
			return nil
		})
}

// tarDir streams the contents of a host directory as a tar archive, names
// relative to dir: directories, regular files and symbolic links (stored as
// links, never followed). Other kinds of file are skipped. An error walking
// the directory ends the stream with that error. When sparse is set, a
// sparse file (fewer bytes on disk than its size) goes in as an empty file
// and is added to *sparse, for writeSparse to fill with its holes kept.
func tarDir(dir string, sparse *[]string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil || rel == "." {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			var link string
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			case !d.IsDir() && !d.Type().IsRegular():
				return nil
			}
			h, err := tar.FileInfoHeader(info, link)
			if err != nil {
				return err
			}
			h.Name = filepath.ToSlash(rel)
			if d.IsDir() {
				h.Name += "/"
			}
			if sparse != nil && d.Type().IsRegular() && isSparse(info) {
				*sparse = append(*sparse, h.Name)
				h.Size = 0
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if d.Type().IsRegular() && h.Size > 0 {
				return copyFile(tw, p, h.Size)
			}
			return nil
		})
		pw.CloseWithError(errors.Join(err, tw.Close()))
	}()
	return pr
}

// copyFile copies exactly size bytes of the file at p to w, padding with
// zeros or cutting when the file changed size since it was described.
func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return err
	}
	_, err = io.CopyN(w, zeros{}, size-n)
	return err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// isSparse reports whether a file takes fewer bytes on disk than its size.
func isSparse(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && st.Blocks*512 < info.Size()
}

// writeSparse writes the sparse file name of the host directory dir into
// the workspace with its holes kept: its data extents (found with
// SEEK_DATA and SEEK_HOLE) go to `sandboxd-agent sparse` run in the
// container as the session's user, which writes them at their offsets into
// the empty file the initial copy made. Every extent is counted against
// budget.
func (c *Container) writeSparse(ctx context.Context, dir, name string, budget *copyBudget) error {
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	size := info.Size()
	pr, pw := io.Pipe()
	sent := make(chan error, 1)
	go func() {
		var err error
		defer func() { sent <- err }()
		for off := int64(0); off < size && err == nil; {
			var start, end int64
			if start, err = f.Seek(off, unix.SEEK_DATA); err != nil {
				if errors.Is(err, syscall.ENXIO) { // no data past off
					err = nil
				}
				break
			}
			if end, err = f.Seek(start, unix.SEEK_HOLE); err != nil {
				break
			}
			end = min(end, size)
			if err = budget.take(name, end-start); err != nil {
				break
			}
			if _, err = fmt.Fprintf(pw, "%d %d\n", start, end-start); err == nil {
				_, err = io.Copy(pw, io.NewSectionReader(f, start, end-start))
			}
			off = end
		}
		pw.CloseWithError(err)
	}()
	var stderr strings.Builder
	res, err := c.agent.Run(ctx, workspace.Command{
		Argv:    []string{mountAgent + "/sandboxd-agent", "sparse", policy.WorkspaceDir, name, strconv.FormatInt(size, 10)},
		Stdin:   pr,
		Timeout: 10 * time.Minute,
		Output: func(_ workspace.Stream, p []byte) {
			if stderr.Len() < 1024 {
				stderr.Write(p)
			}
		},
	})
	pr.Close()
	if serr := <-sent; err == nil && serr != nil {
		err = serr // the agent saw the input end, not why
	}
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit code %d: %s", res.ExitCode, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return fmt.Errorf("dockerexec: copy the sparse file %s in: %w", name, err)
	}
	return nil
}

// copyBudget is what is left of Spec.MaxWorkspaceBytes as the initial copy
// writes; it is safe for concurrent use.
type copyBudget struct {
	mu          sync.Mutex
	limit, used int64
}

// take counts n bytes of the file name, or fails naming the cap when they
// would pass it.
func (b *copyBudget) take(name string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used += n; b.used > b.limit {
		return fmt.Errorf("the initial workspace holds over %d bytes (at %s): leave the large files out or raise the cap (docker.Spec.MaxWorkspaceBytes)", b.limit, name)
	}
	return nil
}
