package engine

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/images"
)

// rootfs returns the cached root filesystem tarball of d, making it first
// when the cache has none (or WithRebuild asked for a new one). The tarball
// is written beside its final name and renamed, so a cache entry is always
// whole.
func rootfs(ctx context.Context, d images.Definition, o *options) (string, error) {
	final := filepath.Join(o.cacheDir, d.Name+"-"+d.Hash()[:16]+".tar")
	if !o.rebuild {
		if fi, err := os.Stat(final); err == nil && fi.Mode().IsRegular() {
			o.progress("using cached root filesystem " + final)
			return final, nil
		}
	}
	if err := os.MkdirAll(o.cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	removeStale(o)
	work, err := os.MkdirTemp(o.cacheDir, d.Name+"-work-")
	if err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	defer removeWork(work)
	unlock, err := lockWork(work)
	if err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	defer unlock()
	partial := filepath.Join(work, "rootfs.tar")
	start := time.Now()
	switch d.Builder {
	case "busybox":
		err = busyboxRootfs(ctx, d, o, work, partial)
	case "debootstrap":
		err = debootstrapRootfs(ctx, d, o, work, partial)
	}
	if err != nil {
		return "", fmt.Errorf("images: build %s root filesystem: %w", d.Name, err)
	}
	if err := os.Rename(partial, final); err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	o.progress(fmt.Sprintf("root filesystem of %s made in %s, cached as %s", d.Name, time.Since(start).Round(time.Second), final))
	return final, nil
}

// busyboxRootfs writes a root filesystem holding busybox from the Debian
// package, a link for every applet, /etc/passwd and /etc/group with the
// definition's user, /tmp and a /workspace owned by that user.
func busyboxRootfs(ctx context.Context, d images.Definition, o *options, work, out string) error {
	debs := filepath.Join(work, "debs")
	if err := os.Mkdir(debs, 0o755); err != nil {
		return err
	}
	args := append([]string{"-o", "APT::Sandbox::User=root", "download"}, d.Packages...)
	o.progress("running apt-get download " + strings.Join(d.Packages, " "))
	if err := aptGet(ctx, o, debs, args...); err != nil {
		return err
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(files) == 0 {
		return errors.New("apt-get download left no .deb file")
	}
	tree := filepath.Join(work, "tree")
	for _, deb := range files {
		o.progress("extracting " + filepath.Base(deb))
		if err := run(ctx, o, "", "dpkg-deb", "-x", deb, tree); err != nil {
			return err
		}
	}
	bb := filepath.Join(tree, "bin", "busybox")
	list, err := exec.CommandContext(ctx, bb, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("list busybox applets: %w", err)
	}

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	w := treeWriter{tw: tw, seen: map[string]bool{}}
	for _, dir := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "var"} {
		w.dir(dir, 0o755, 0, 0)
	}
	w.dir("root", 0o700, 0, 0)
	w.dir("tmp", 0o1777, 0, 0) // sticky, as tar spells it
	w.dir("workspace", 0o755, d.User.UID, d.User.GID)
	w.file("etc/passwd", 0o644, []byte(passwd(d, "root:x:0:0:root:/root:/bin/sh\n", "/bin/sh")))
	w.file("etc/group", 0o644, []byte(group(d, "root:x:0:\n")))
	w.tree(tree, "usr/share/man") // the packages' files; no man pages without man
	for _, name := range slices.Sorted(maps.Keys(d.Links)) {
		w.symlink(strings.TrimPrefix(name, "/"), d.Links[name])
	}
	for _, f := range d.Files {
		perm, _ := f.Perm() // checked by Lookup
		w.file(strings.TrimPrefix(f.Path, "/"), perm, []byte(f.Content))
	}
	applets := strings.Fields(string(list))
	slices.Sort(applets)
	for _, a := range applets {
		if a == "bin/busybox" || !filepath.IsLocal(a) {
			continue
		}
		w.symlink(a, "/bin/busybox")
	}
	// Debian's busybox has no nohup applet; scripts expect one.
	w.file("usr/bin/nohup", 0o755, []byte(nohupScript))
	if w.err != nil {
		return w.err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	o.progress(fmt.Sprintf("busybox root filesystem: %d applets", len(applets)))
	return f.Close()
}

// nohupScript is nohup for an image without one: it ignores SIGHUP and runs
// its command (output stays where it was; sandbox commands have no terminal).
const nohupScript = `#!/bin/sh
trap '' HUP
exec "$@"
`

func passwd(d images.Definition, base, shell string) string {
	return base + fmt.Sprintf("%s:x:%d:%d:%s:/workspace:%s\n", d.User.Name, d.User.UID, d.User.GID, d.User.Name, shell)
}

func group(d images.Definition, base string) string {
	return base + fmt.Sprintf("%s:x:%d:\n", d.User.Name, d.User.GID)
}

// treeWriter writes tar entries, remembering the first error and adding each
// entry's parent directories it has not written.
type treeWriter struct {
	tw   *tar.Writer
	seen map[string]bool
	err  error
}

func (w *treeWriter) header(h *tar.Header, body []byte) {
	if w.err != nil || w.seen[h.Name] {
		return
	}
	w.seen[h.Name] = true
	h.ModTime = time.Unix(0, 0)
	h.Format = tar.FormatPAX
	if w.err = w.tw.WriteHeader(h); w.err == nil && body != nil {
		_, w.err = w.tw.Write(body)
	}
}

func (w *treeWriter) dir(name string, mode int64, uid, gid int) {
	w.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: gid}, nil)
}

func (w *treeWriter) file(name string, mode int64, body []byte) {
	w.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body)
}

func (w *treeWriter) symlink(name, target string) {
	w.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

// tree writes the directories, regular files and symbolic links under dir,
// owned by root, leaving out the subtree skip (a slash path relative to dir).
func (w *treeWriter) tree(dir, skip string) {
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if rel == skip {
			return fs.SkipDir
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		switch mode := int64(fi.Mode().Perm()); {
		case e.IsDir():
			w.dir(rel, mode, 0, 0)
		case e.Type().IsRegular():
			body, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			w.file(rel, mode, body)
		case e.Type() == fs.ModeSymlink:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			w.symlink(rel, target)
		}
		return w.err
	})
	if w.err == nil {
		w.err = err
	}
}

// debootstrapRootfs makes a Debian root filesystem with debootstrap (installed
// with apt-get when missing), installs the definition's packages in it with
// apt-get — whose resolver, unlike debootstrap's, follows virtual packages
// (npm needs that) — adds the definition's user, links, files and
// /workspace, drops apt's caches and tars it with numeric owners.
func debootstrapRootfs(ctx context.Context, d images.Definition, o *options, work, out string) error {
	if err := ensureTool(ctx, o, "debootstrap", "debootstrap"); err != nil {
		return err
	}
	mirror := debianMirror(d.Suite)
	target := filepath.Join(work, "rootfs")
	// debootstrap keeps what it downloads in the cache for the next build.
	debs := filepath.Join(o.cacheDir, "debs", d.Suite)
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	args := []string{"--variant=" + d.Variant, "--cache-dir=" + debs, d.Suite, target, mirror}
	o.progress("running debootstrap " + strings.Join(args, " ") + " (this takes a few minutes)")
	if err := run(ctx, o, "", "debootstrap", args...); err != nil {
		return err
	}
	resolv := filepath.Join(target, "etc", "resolv.conf")
	if data, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		os.Remove(resolv)
		if err := os.WriteFile(resolv, data, 0o644); err != nil {
			return err
		}
		defer os.Remove(resolv)
	}
	o.progress("installing " + strings.Join(d.Packages, " ") + " with apt-get in the new root")
	if err := run(ctx, o, "", "chroot", target, "apt-get", "update"); err != nil {
		return err
	}
	// The packages fetched by earlier builds are offered to apt first, and
	// what it fetched is kept for the next; dpkg unpacks without an fsync
	// per file (the tree is tarred, and a build cut short is redone).
	archives := filepath.Join(target, "var/cache/apt/archives")
	debCache := filepath.Join(o.cacheDir, "debs", d.Suite)
	copyDebs(debCache, archives)
	install := append([]string{target, "apt-get", "install", "-y", "--no-install-recommends",
		"-o", "Dpkg::Options::=--force-unsafe-io"}, d.Packages...)
	if err := run(ctx, o, "", "chroot", install...); err != nil {
		return err
	}
	copyDebs(archives, debCache)
	if err := run(ctx, o, "", "chroot", target, "apt-get", "clean"); err != nil {
		return err
	}
	if err := addToTree(target, d); err != nil {
		return err
	}
	if d.Go != nil {
		if err := installGo(ctx, o, d, target); err != nil {
			return err
		}
	}
	if err := appendFile(filepath.Join(target, "etc/passwd"), passwd(d, "", "/bin/bash")); err != nil {
		return err
	}
	if err := appendFile(filepath.Join(target, "etc/group"), group(d, "")); err != nil {
		return err
	}
	ws := filepath.Join(target, "workspace")
	if err := os.Mkdir(ws, 0o755); err != nil {
		return err
	}
	if err := os.Chown(ws, d.User.UID, d.User.GID); err != nil {
		return err
	}
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"} {
		matches, _ := filepath.Glob(filepath.Join(target, glob))
		for _, m := range matches {
			os.Remove(m)
		}
	}
	o.progress("packing the root filesystem")
	return run(ctx, o, "", "tar", "--numeric-owner", "-C", target, "-cf", out,
		"--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./dev/*", ".")
}

// addToTree adds d's links and files to the root filesystem at dir, through
// an os.Root: a link in the tree never leads a write outside it.
func addToTree(dir string, d images.Definition) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for name, to := range d.Links {
		if err := root.Symlink(to, name[1:]); err != nil {
			return err
		}
	}
	for _, f := range d.Files {
		perm, _ := f.Perm() // checked by Lookup
		name := f.Path[1:]
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		if err := root.WriteFile(name, []byte(f.Content), os.FileMode(perm)); err != nil {
			return err
		}
		if err := root.Chmod(name, os.FileMode(perm)); err != nil { // past the umask
			return err
		}
	}
	return nil
}

// copyDebs copies the .deb files of from that to lacks into to, best
// effort: a package missing from the cache is fetched again.
func copyDebs(from, to string) {
	if err := os.MkdirAll(to, 0o755); err != nil {
		return
	}
	debs, _ := filepath.Glob(filepath.Join(from, "*.deb"))
	for _, deb := range debs {
		dst := filepath.Join(to, filepath.Base(deb))
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		data, err := os.ReadFile(deb)
		if err != nil {
			continue
		}
		if os.WriteFile(dst+".part", data, 0o644) == nil {
			os.Rename(dst+".part", dst)
		}
	}
}

// lockWork holds a lock on a build's work directory while the build runs,
// so that another build tells a directory in use from one a killed build
// left (removeStale).
func lockWork(work string) (unlock func(), err error) {
	f, err := os.Create(filepath.Join(work, ".lock"))
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// removeStale removes the work directories that builds killed before they
// could clean up (SIGKILL, a machine that went down) left in the cache: each
// one whose lock no build holds.
func removeStale(o *options) {
	dirs, _ := filepath.Glob(filepath.Join(o.cacheDir, "*-work-*"))
	for _, dir := range dirs {
		f, err := os.Open(filepath.Join(dir, ".lock"))
		if err == nil {
			held := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
			f.Close()
			if held {
				continue // a build is running there
			}
		} else if fi, serr := os.Stat(dir); serr != nil || time.Since(fi.ModTime()) < time.Minute {
			continue // just made, its lock not yet taken
		}
		o.progress("removing " + dir + ", left by a build that was killed")
		removeWork(dir)
	}
}

// removeWork removes a build's work directory, unmounting first what a
// failed debootstrap left mounted in it (its /proc), which would otherwise
// keep the directory from being removed.
func removeWork(work string) {
	if mounts, err := os.ReadFile("/proc/mounts"); err == nil {
		var under []string
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], work+"/") {
				under = append(under, f[1])
			}
		}
		slices.Reverse(under) // the innermost first
		for _, m := range under {
			exec.Command("umount", "-l", m).Run() // lazily: a busy mount is detached all the same
		}
	}
	os.RemoveAll(work)
}

func appendFile(name, text string) error {
	f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ensureTool installs pkg with apt-get when bin is not on PATH.
func ensureTool(ctx context.Context, o *options, bin, pkg string) error {
	if _, err := exec.LookPath(bin); err == nil {
		return nil
	}
	o.progress(fmt.Sprintf("%s not found; running apt-get install -y %s", bin, pkg))
	return aptGet(ctx, o, "", "install", "-y", "--no-install-recommends", pkg)
}

// aptGet runs apt-get, and once more after apt-get update if it fails (a
// fresh machine has no package lists).
func aptGet(ctx context.Context, o *options, dir string, args ...string) error {
	if err := run(ctx, o, dir, "apt-get", args...); err == nil {
		return nil
	}
	o.progress("apt-get failed; running apt-get update and trying again")
	if err := run(ctx, o, "", "apt-get", "update"); err != nil {
		return err
	}
	return run(ctx, o, dir, "apt-get", args...)
}

// run runs a command, passing each line of its output to the progress
// function; a failure's error carries the last lines.
func run(ctx context.Context, o *options, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			o.progress(name + ": " + line)
			if tail = append(tail, line); len(tail) > 10 {
				tail = tail[1:]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.Join(tail, "\n"))
	}
	return nil
}

// debianMirror returns the Debian archive URI that /etc/apt's sources use for
// suite, or deb.debian.org when they name none.
func debianMirror(suite string) string {
	var files []string
	files = append(files, "/etc/apt/sources.list")
	more, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	files = append(files, more...)
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		if uri := mirrorIn(data, suite, strings.HasSuffix(name, ".sources")); uri != "" {
			return uri
		}
	}
	return "http://deb.debian.org/debian"
}

// mirrorIn finds the URI serving suite's main component in one sources file,
// in the one-line format or, when deb822 is set, the deb822 format.
func mirrorIn(data []byte, suite string, deb822 bool) string {
	if !deb822 {
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "deb" {
				continue
			}
			f = f[1:]
			if len(f) > 0 && strings.HasPrefix(f[0], "[") { // [options]
				i := slices.IndexFunc(f, func(s string) bool { return strings.HasSuffix(s, "]") })
				f = f[i+1:]
			}
			if len(f) >= 3 && f[1] == suite && slices.Contains(f[2:], "main") {
				return f[0]
			}
		}
		return ""
	}
	for _, stanza := range bytes.Split(data, []byte("\n\n")) {
		fields := map[string][]string{}
		for _, line := range strings.Split(string(stanza), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, " ") {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.Fields(v)
			}
		}
		if slices.Contains(fields["types"], "deb") && slices.Contains(fields["suites"], suite) &&
			slices.Contains(fields["components"], "main") && len(fields["uris"]) > 0 {
			return fields["uris"][0]
		}
	}
	return ""
}
