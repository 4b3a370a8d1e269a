package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
)

// A session's disk (Spec.DiskBytes) is a file system of a fixed size, made
// for it alone: an image file DIR/VOLUME.img, sparse, formatted ext4 with
// its root owned by the session's user, attached to a loop device by the
// daemon, and DIR/VOLUME.dev a link to that device. The workspace volume is
// a volume of the engine's local driver over the link (type ext4, device
// DIR/VOLUME.dev), which the engine mounts, with mount(2), when a container
// that uses it starts. A write past the size fails inside the session with
// ENOSPC, whatever wrote it: the file system's blocks are all there is, so
// sparse files count by their blocks, hard links once, and the image on the
// host never grows past its size.
//
// Why not another way: moby's local driver hands its options to mount(2),
// which has no "loop" option (mount(8) attaches loop devices, not the
// kernel), so the daemon attaches the device itself; `--storage-opt size`
// is refused by the overlay drivers without XFS project quotas (and by
// fuse-overlayfs always); an XFS project quota needs the engine's volumes
// on an XFS mounted with prjquota; a tmpfs with a size holds the workspace
// in memory.
//
// The volume carries LabelDisk, the image's path, so whoever removes the
// volume (Container.Close, Reap) removes the disk after it; a disk whose
// volume is gone — a daemon killed in between — is found by Backend.Reap
// in the daemon's disk directory. The link, not the device, is what the
// volume names, so a disk whose device went away (the host restarted) is
// attached again to whichever device is free, and the link pointed there
// (attachDisk), before its container starts again.

// LabelDisk is set on a workspace volume that lives on a disk of its own
// (Spec.DiskBytes) to the path of the disk's image file.
const LabelDisk = "sandboxd.disk"

// diskExt and devExt end the names of a disk's image file and of the link
// to its loop device.
const (
	diskExt = ".img"
	devExt  = ".dev"
)

// diskOpts are the local driver's options of a volume on the disk img.
func diskOpts(img string) map[string]string {
	return map[string]string{"type": "ext4", "device": devLink(img), "o": "nodev,nosuid"}
}

// devLink is the link to img's loop device.
func devLink(img string) string { return strings.TrimSuffix(img, diskExt) + devExt }

// diskMaking holds the images being made, which Backend.Reap must not take
// for orphans before their volume exists.
var diskMaking struct {
	sync.Mutex
	names map[string]bool
}

func markMaking(img string, on bool) {
	diskMaking.Lock()
	defer diskMaking.Unlock()
	if diskMaking.names == nil {
		diskMaking.names = map[string]bool{}
	}
	if on {
		diskMaking.names[img] = true
	} else {
		delete(diskMaking.names, img)
	}
}

// makeDisk makes the disk of volume in dir: an image of size bytes whose
// root belongs to uid:gid and holds nothing (no lost+found, so the engine
// copies an image's /workspace into it as into an empty volume), attached
// to a loop device. It returns the image's path, marked as being made
// (markMaking) until the caller unmarks it. On failure nothing is left.
func makeDisk(ctx context.Context, dir, volume string, size int64, uid, gid int) (img string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("dockerexec: the disk directory: %w", err)
	}
	img = filepath.Join(dir, volume+diskExt)
	markMaking(img, true)
	defer func() {
		if err != nil {
			removeDisk(context.WithoutCancel(ctx), img)
			markMaking(img, false)
		}
	}()
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return img, fmt.Errorf("dockerexec: the disk's image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return img, fmt.Errorf("dockerexec: the disk's image: %w", err)
	}
	// No blocks reserved for root (the session's user is not root anyway),
	// no discard pass over a file that is all holes.
	if err := run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", fmt.Sprintf("root_owner=%d:%d,nodiscard", uid, gid), img); err != nil {
		return img, err
	}
	if err := run(ctx, "debugfs", "-w", "-R", "rmdir lost+found", img); err != nil {
		return img, err
	}
	return img, attachDisk(ctx, img)
}

// attachDisk makes sure img is attached to a loop device and that its link
// names that device: a device its link names is kept when it is still
// img's; otherwise img is attached anew (losetup --nooverlap reuses a
// device img is already on) and the link replaced.
func attachDisk(ctx context.Context, img string) error {
	link := devLink(img)
	if dev, err := os.Readlink(link); err == nil && backingFile(dev) == img {
		return nil
	}
	out, err := output(ctx, "losetup", "--find", "--show", "--nooverlap", img)
	if err != nil {
		return err
	}
	dev := strings.TrimSpace(out)
	tmp := link + ".new"
	os.Remove(tmp)
	if err := os.Symlink(dev, tmp); err != nil {
		return fmt.Errorf("dockerexec: the disk's device link: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dockerexec: the disk's device link: %w", err)
	}
	return nil
}

// removeDisk detaches img from every loop device it is on and removes it
// and its link. A device still mounted (its volume not yet unmounted) is
// detached by the kernel once it is (LOOP_CLR_FD on a busy device sets
// autoclear). It is safe to call for a disk that is gone.
func removeDisk(ctx context.Context, img string) error {
	var errs []error
	for _, dev := range loopsOf(img) {
		if err := run(ctx, "losetup", "--detach", dev); err != nil && backingFile(dev) == img {
			errs = append(errs, err)
		}
	}
	for _, name := range []string{devLink(img), img} {
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("dockerexec: remove the disk: %w", err))
		}
	}
	return errors.Join(errs...)
}

// sweepDisks removes the disks of dir whose volume is gone, being made by
// no one: those a daemon killed between making a disk and its volume, or
// between removing them, left. It also detaches the loop devices left on
// a deleted image of dir.
func sweepDisks(ctx context.Context, cli Engine, dir string) error {
	if dir == "" {
		return nil
	}
	imgs, err := filepath.Glob(filepath.Join(dir, "*"+diskExt))
	if err != nil {
		return err
	}
	var errs []error
	for _, img := range imgs {
		diskMaking.Lock()
		making := diskMaking.names[img]
		diskMaking.Unlock()
		if making {
			continue
		}
		volume := strings.TrimSuffix(filepath.Base(img), diskExt)
		_, err := cli.VolumeInspect(ctx, volume, client.VolumeInspectOptions{})
		switch {
		case cerrdefs.IsNotFound(err):
			errs = append(errs, removeDisk(ctx, img))
		case err != nil:
			errs = append(errs, fmt.Errorf("dockerexec: the volume of disk %s: %w", img, err))
		}
	}
	for _, dev := range loopsUnder(dir) {
		if err := run(ctx, "losetup", "--detach", dev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deletedSuffix ends a loop device's backing file once it was removed.
const deletedSuffix = " (deleted)"

// backingFile is the file the loop device dev is attached to, as the
// kernel names it, or "" when it is attached to none.
func backingFile(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// loops lists the attached loop devices and their backing files.
func loops() map[string]string {
	names, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	out := map[string]string{}
	for _, n := range names {
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(n)))
		if f := backingFile(dev); f != "" {
			out[dev] = f
		}
	}
	return out
}

// loopsOf lists the loop devices attached to img, removed or not.
func loopsOf(img string) []string {
	var devs []string
	for dev, f := range loops() {
		if strings.TrimSuffix(f, deletedSuffix) == img {
			devs = append(devs, dev)
		}
	}
	return devs
}

// loopsUnder lists the loop devices attached to a removed image of dir.
func loopsUnder(dir string) []string {
	var devs []string
	for dev, f := range loops() {
		if strings.HasSuffix(f, deletedSuffix) && filepath.Dir(strings.TrimSuffix(f, deletedSuffix)) == dir {
			devs = append(devs, dev)
		}
	}
	return devs
}

// CheckDisks reports whether sessions can have disks of their own in dir
// (Backend.DiskBytes): the daemon must run as root, on the engine's host,
// with losetup, mkfs.ext4 and debugfs (util-linux, e2fsprogs) and loop
// devices; it makes, attaches and removes a small disk to know. The
// error names what is missing and how to get it.
func CheckDisks(ctx context.Context, cli Engine, dir string) error {
	if !strings.HasPrefix(cli.DaemonHost(), "unix://") {
		return fmt.Errorf("the engine (%s) is not on this host: a session's disk is a loop device of the daemon's host, so run the daemon beside the engine, or set limits.workspaceDisk to \"off\"", cli.DaemonHost())
	}
	if os.Geteuid() != 0 {
		return errors.New("the daemon does not run as root: attaching a loop device needs root (CAP_SYS_ADMIN); run it as root, or set limits.workspaceDisk to \"off\"")
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed: install util-linux and e2fsprogs (apt-get install util-linux e2fsprogs), or set limits.workspaceDisk to \"off\"", tool)
		}
	}
	img, err := makeDisk(ctx, dir, "sandboxd-disk-check-"+strconv.Itoa(os.Getpid()), 8<<20, 0, 0)
	markMaking(img, false)
	if err != nil {
		return fmt.Errorf("%w (are loop devices available? modprobe loop)", err)
	}
	return removeDisk(ctx, img)
}

// run runs a tool of the disks', its standard error in the error.
func run(ctx context.Context, name string, args ...string) error {
	_, err := output(ctx, name, args...)
	return err
}

func output(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("dockerexec: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// driverConfig is the mount's driver of a workspace volume with the local
// driver's options opts, or nil for a plain volume.
func driverConfig(opts map[string]string) *mount.Driver {
	if opts == nil {
		return nil
	}
	return &mount.Driver{Name: "local", Options: opts}
}
