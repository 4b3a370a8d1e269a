package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/tools"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
)

var cmdDoctor = &command{
	name:    "doctor",
	args:    "[--config FILE]",
	summary: "check what sandboxd needs (Docker, API version, images, agent, runtimes, cgroups, seccomp, disk) and say how to fix what is missing",
	setup: func(fs *flag.FlagSet) runFunc {
		config := fs.String("config", "", "the daemon's configuration `file`, whose images and runtimes are checked too")
		return func(ctx context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q", args)
			}
			cfg, err := loadServeConfig(*config)
			if err != nil {
				return err
			}
			checks := diagnose(ctx, cfg)
			printChecks(sio, checks)
			failed := 0
			for _, c := range checks {
				if c.status == statusFail {
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d checks failed", failed, len(checks))
			}
			return nil
		}
	},
}

// testedAPIVersion is the oldest Engine API version sandboxd is tested
// against (Docker Engine 20.10); older ones may work, with warnings.
const testedAPIVersion = "1.41"

// Free disk space below which doctor warns, and fails.
const (
	diskWarnBytes = 5 << 30
	diskFailBytes = 1 << 30
)

type checkStatus string

const (
	statusOK   checkStatus = "ok"
	statusWarn checkStatus = "warn"
	statusFail checkStatus = "fail"
	statusSkip checkStatus = "skip" // not checked: what it needs failed
)

// check is one line of doctor's report: what was checked, how it stands,
// and for a warning or failure how to fix it.
type check struct {
	name   string
	status checkStatus
	detail string
	fix    string
}

func printChecks(sio stdio, checks []check) {
	tw := tabwriter.NewWriter(sio.out, 0, 4, 2, ' ', 0)
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.status, c.name, c.detail)
		if c.fix != "" && (c.status == statusFail || c.status == statusWarn) {
			fmt.Fprintf(tw, "\t\tfix: %s\n", c.fix)
		}
	}
	tw.Flush()
}

// diagnose runs every check, in the order a person would fix them: what
// needs no engine (the agent, disk for the image cache) is checked even
// when Docker is unreachable; the engine's checks are then skipped.
func diagnose(ctx context.Context, cfg serveConfig) []check {
	checks := append([]check{checkAgent()}, checkSources(ctx, cfg)...)
	checks = append(checks, checkSecrets(cfg)...)
	checks = append(checks, checkTrust(cfg))
	cli, reach := checkDocker(ctx)
	checks = append(checks, reach)
	if cli == nil {
		for _, name := range []string{"engine", "images", "runtime", "cgroups", "seccomp", "userns", "gvisor", "workspace-disk"} {
			checks = append(checks, check{name: name, status: statusSkip, detail: "needs a reachable engine"})
		}
		return append(checks, checkDisk(nil)...)
	}
	defer cli.Close()
	outer := ctx // the gVisor check starts sessions: it bounds itself
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	checks = append(checks, checkEngine(ctx, cli))
	res, err := cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		checks = append(checks, check{name: "info", status: statusFail, detail: "the engine's /info failed: " + err.Error(),
			fix: "check the engine's log (journalctl -u docker)"})
		return append(checks, checkDisk(nil)...)
	}
	info := res.Info
	checks = append(checks, checkImages(ctx, cli, cfg)...)
	checks = append(checks, checkRuntimes(info, cfg.Policy), checkCgroups(info))
	checks = append(checks, checkSecurity(info, cfg.Policy)...)
	checks = append(checks, checkGVisor(outer, cli, info, cfg)...)
	checks = append(checks, checkWorkspaceDisk(ctx, cli, cfg))
	var engineDir string
	if strings.HasPrefix(cli.DaemonHost(), "unix://") {
		engineDir = info.DockerRootDir // the engine is on this machine
	}
	return append(checks, checkDisk(&engineDir)...)
}

// checkSources checks each source the configuration declares (one line
// "source:NAME" each): there and readable, and an http source's credential
// where it says — never printing the credential.
func checkSources(ctx context.Context, cfg serveConfig) []check {
	if len(cfg.Tools) == 0 {
		return nil
	}
	tc, err := tools.ParseConfig(cfg.Tools)
	if err != nil {
		return []check{{name: "tools", status: statusFail, detail: err.Error(), fix: "correct the \"tools\" section of the configuration"}}
	}
	var checks []check
	for _, d := range tc.Sources {
		c := check{name: "source:" + d.Name, status: statusOK}
		switch d.Kind {
		case sources.KindHTTP:
			c.detail = fmt.Sprintf("%s, %d requests", d.URL, len(d.Requests))
			if cr := d.Credential; cr != nil {
				c.detail += ", credential from " + cmp.Or(cr.Env, cr.File)
			}
		case sources.KindGit:
			c.detail = fmt.Sprintf("git %s at %s", d.Path, d.Commit[:12])
		default:
			c.detail = string(d.Kind) + " " + d.Path
		}
		if err := d.Check(ctx); err != nil {
			c.status, c.detail = statusFail, err.Error()
			c.fix = "make it readable by the daemon's user, or correct sources[] in the configuration"
			switch cr := d.Credential; {
			case d.Kind != sources.KindHTTP || cr == nil:
			case cr.Env != "":
				c.fix = "set " + cr.Env + " in the daemon's environment"
			default:
				c.fix = "put the credential in " + cr.File + ", readable by the daemon"
			}
		}
		checks = append(checks, c)
	}
	return checks
}

// checkSecrets checks each secret the configuration declares (one line
// "secret:NAME" each): its value readable where it says, now — never
// printing it.
func checkSecrets(cfg serveConfig) []check {
	var checks []check
	for _, sec := range cfg.Secrets {
		c := check{name: "secret:" + sec.Name, status: statusOK,
			detail: fmt.Sprintf("from %s, for %s", cmp.Or(sec.Env, sec.File), strings.Join(sec.Allow, ", "))}
		if _, err := sec.Read(nil); err != nil {
			c.status, c.detail = statusFail, err.Error()
			c.fix = "put the secret in " + sec.File + ", readable by the daemon"
			if sec.Env != "" {
				c.fix = "set " + sec.Env + " in the daemon's environment"
			}
		}
		checks = append(checks, c)
	}
	return checks
}

// checkTrust says whether sessions trust every certificate authority this
// host's administrator added (hostCADirs): on a network that re-signs TLS
// with one — a corporate proxy, these build machines — a session that
// does not trust it fails every HTTPS request with "x509: certificate
// signed by unknown authority". It fails when caCerts names a file that
// is not PEM certificates.
func checkTrust(cfg serveConfig) check {
	c := check{name: "trust"}
	files, _, err := sessionCAs(cfg.CACerts)
	if err != nil {
		c.status, c.detail = statusFail, err.Error()
		c.fix = "name PEM certificate files the daemon can read in caCerts, or leave caCerts out"
		return c
	}
	trusted := map[[32]byte]bool{}
	for _, f := range files {
		certs, _ := readCerts(f)
		for _, cert := range certs {
			trusted[sha256.Sum256(cert.Raw)] = true
		}
	}
	var missing []string
	added := 0
	for _, f := range hostAddedCAs() {
		certs, err := readCerts(f)
		if err != nil {
			continue // not one the host can use either
		}
		for _, cert := range certs {
			added++
			if !trusted[sha256.Sum256(cert.Raw)] {
				missing = append(missing, fmt.Sprintf("%q (%s)", cmp.Or(cert.Subject.CommonName, cert.Subject.String()), f))
			}
		}
	}
	switch {
	case len(missing) > 0:
		c.status = statusWarn
		c.detail = fmt.Sprintf("this host trusts %d certificate authorities its sessions do not: %s; on a network that re-signs TLS with one, "+
			"sessions' HTTPS fails with \"x509: certificate signed by unknown authority\"", len(missing), strings.Join(missing, ", "))
		c.fix = "add their files to caCerts in the configuration, or leave caCerts out: sessions then trust every authority this host's administrator added"
	case added > 0:
		c.status, c.detail = statusOK, fmt.Sprintf("sessions trust the %d certificate authorities this host's administrator added, and their images' own", added)
	default:
		c.status, c.detail = statusOK, fmt.Sprintf("this host adds no certificate authority (%s); sessions trust their images' own", strings.Join(hostCADirs, ", "))
		if len(files) > 0 {
			c.detail += fmt.Sprintf(" and the %d files of caCerts", len(files))
		}
	}
	return c
}

func checkAgent() check {
	p, err := docker.FindAgent()
	if err != nil {
		return check{name: "agent", status: statusFail, detail: strings.TrimPrefix(err.Error(), "dockerexec: "),
			fix: "CGO_ENABLED=0 go build -o \"$(dirname \"$(command -v sandboxd)\")\" ./cmd/sandboxd-agent, or set " + docker.EnvAgent}
	}
	detail := p
	if fi, err := os.Stat(p); err == nil {
		detail += fmt.Sprintf(" (%.1f MB, static)", float64(fi.Size())/1e6)
	}
	return check{name: "agent", status: statusOK, detail: detail}
}

// checkDocker connects to the engine DOCKER_HOST (or the default socket)
// names and negotiates the API version. It returns no client when the
// engine cannot be reached.
func checkDocker(ctx context.Context) (*client.Client, check) {
	host := cmp.Or(os.Getenv("DOCKER_HOST"), client.DefaultDockerHost)
	c := check{name: "docker"}
	cli, err := client.New(client.FromEnv)
	if err != nil {
		c.status, c.detail = statusFail, "DOCKER_HOST="+host+": "+err.Error()
		c.fix = "set DOCKER_HOST to unix:///var/run/docker.sock, tcp://HOST:2376 or ssh://USER@HOST, or unset it"
		return nil, c
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		cli.Close()
		c.status, c.detail = statusFail, "cannot reach the engine at "+host+": "+err.Error()
		switch msg := err.Error(); {
		case errors.Is(err, os.ErrPermission) || strings.Contains(msg, "permission denied"):
			c.fix = "give your user the socket: sudo usermod -aG docker $USER, then log in again (or run sandboxd as a user that may use Docker)"
		case strings.Contains(msg, "no such file") || strings.Contains(msg, "connection refused"):
			c.fix = "start the engine (sudo systemctl start docker; install it with apt-get install docker.io), or point DOCKER_HOST at a running one"
		default:
			c.fix = "check that the engine at " + host + " runs and answers (docker version), or point DOCKER_HOST at another"
		}
		return nil, c
	}
	c.status, c.detail = statusOK, "reachable at "+host
	return cli, c
}

func checkEngine(ctx context.Context, cli *client.Client) check {
	c := check{name: "engine"}
	v, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		c.status, c.detail, c.fix = statusFail, "version: "+err.Error(), "check the engine's log (journalctl -u docker)"
		return c
	}
	api := cli.ClientVersion()
	c.detail = fmt.Sprintf("Docker Engine %s on %s/%s, API %s (engine up to %s)", v.Version, v.Os, v.Arch, api, v.APIVersion)
	switch {
	case v.Os != "" && v.Os != "linux":
		c.status, c.fix = statusFail, "sandboxd runs Linux containers: use an engine in Linux containers mode"
	case apiLess(api, testedAPIVersion):
		c.status = statusWarn
		c.detail += fmt.Sprintf("; sandboxd is tested with API %s and later", testedAPIVersion)
		c.fix = "upgrade Docker Engine to 20.10 or later"
	default:
		c.status = statusOK
	}
	return c
}

// apiLess reports whether API version a ("1.41") is below b.
func apiLess(a, b string) bool {
	parse := func(s string) (int, int) {
		maj, min, _ := strings.Cut(s, ".")
		x, _ := strconv.Atoi(maj)
		y, _ := strconv.Atoi(min)
		return x, y
	}
	ax, ay := parse(a)
	bx, by := parse(b)
	return ax < bx || ax == bx && ay < by
}

// checkImages reports sandboxd's images (sandboxd serve builds the default
// one when missing, so a missing one is a warning) and the configuration's
// default image when it is another (a failure when missing).
func checkImages(ctx context.Context, cli *client.Client, cfg serveConfig) []check {
	defs, err := images.Definitions()
	if err != nil {
		return []check{{name: "images", status: statusFail, detail: err.Error()}}
	}
	var out []check
	refs := map[string]bool{}
	for _, d := range defs {
		refs[d.Ref()] = true
		c := check{name: "image " + d.Name}
		switch found, err := imageSize(ctx, cli, d.Ref()); {
		case err != nil:
			c.status, c.detail = statusFail, err.Error()
		case found < 0:
			c.status, c.detail = statusWarn, d.Ref()+" is not built"
			if d.Name == cmp.Or(cfg.Image, images.Default) || images.Canonical(cfg.Policy.DefaultImage) == d.Ref() {
				c.detail += " (sandboxd serve needs it, and does not start without it unless --build-missing)"
			}
			c.fix = "sandboxd image build " + d.Name
		default:
			c.status, c.detail = statusOK, fmt.Sprintf("%s (%.1f MB)", d.Ref(), float64(found)/1e6)
		}
		out = append(out, c)
	}
	// An image definition's name is that definition's image, checked above.
	if ref := images.Canonical(cfg.Policy.DefaultImage); ref != "" && !refs[ref] {
		c := check{name: "image", detail: ref}
		switch found, err := imageSize(ctx, cli, ref); {
		case err != nil:
			c.status, c.detail = statusFail, err.Error()
		case found < 0:
			c.status, c.detail, c.fix = statusFail, ref+" (policy.defaultImage) is not on the engine", "docker pull "+ref
		default:
			c.status = statusOK
		}
		out = append(out, c)
	}
	return out
}

// imageSize returns the size of image ref, or -1 when the engine lacks it.
func imageSize(ctx context.Context, cli *client.Client, ref string) (int64, error) {
	res, err := cli.ImageInspect(ctx, ref)
	switch {
	case cerrdefs.IsNotFound(err):
		return -1, nil
	case err != nil:
		return 0, fmt.Errorf("inspecting %s: %w", ref, err)
	}
	return res.Size, nil
}

// checkRuntimes checks that the OCI runtimes the policy uses are
// registered with the engine.
func checkRuntimes(info system.Info, p policy.Policy) check {
	have := slices.Sorted(maps.Keys(info.Runtimes))
	need := []string{cmp.Or(p.DefaultRuntime, policy.RuntimeRunc)}
	for _, r := range p.Runtimes {
		if !slices.Contains(need, r) {
			need = append(need, r)
		}
	}
	var missing []string
	for _, r := range need {
		if !slices.Contains(have, r) {
			missing = append(missing, r)
		}
	}
	c := check{name: "runtime", detail: fmt.Sprintf("sessions use %s; the engine has %s (default %s)",
		strings.Join(need, ", "), strings.Join(have, ", "), info.DefaultRuntime)}
	if len(missing) == 0 {
		c.status = statusOK
		return c
	}
	c.status = statusFail
	c.detail = "the engine has no " + strings.Join(missing, ", ") + " runtime (it has " + strings.Join(have, ", ") + ")"
	if slices.Contains(missing, policy.RuntimeRunsc) {
		c.fix = "install gVisor (https://gvisor.dev/docs/user_guide/install/), then: sudo runsc install && sudo systemctl restart docker"
	} else {
		c.fix = "install runc (apt-get install runc) or register the runtime in /etc/docker/daemon.json \"runtimes\", then restart the engine"
	}
	return c
}

// checkCgroups checks that the limits every session container gets can be
// enforced: memory (with swap), processes and CPU quota.
func checkCgroups(info system.Info) check {
	version := cmp.Or(info.CgroupVersion, "1")
	c := check{name: "cgroups", detail: fmt.Sprintf("v%s (%s driver)", version, info.CgroupDriver)}
	var fails, warns []string
	if !info.MemoryLimit {
		fails = append(fails, "memory")
	}
	if !info.PidsLimit {
		fails = append(fails, "pids")
	}
	if !info.CPUCfsQuota {
		warns = append(warns, "cpu quota (sessions' CPU limit is not enforced)")
	}
	if info.MemoryLimit && !info.SwapLimit {
		warns = append(warns, "swap limit (a session may swap beyond its memory limit)")
	}
	enable := "enable the controllers: on cgroup v2 make sure the engine's cgroup has them delegated (cat /sys/fs/cgroup/cgroup.subtree_control); on v1 boot with cgroup_enable=memory swapaccount=1"
	switch {
	case len(fails) > 0:
		c.status = statusFail
		c.detail += "; the engine cannot limit " + strings.Join(fails, ", ")
		c.fix = enable
	case len(warns) > 0:
		c.status = statusWarn
		c.detail += "; no " + strings.Join(warns, ", no ")
		c.fix = enable
	default:
		c.status = statusOK
		c.detail += "; memory, swap, pids and cpu quota limits usable"
	}
	return c
}

// checkSecurity reports the engine's seccomp and user-namespace support.
func checkSecurity(info system.Info, p policy.Policy) []check {
	opts := map[string]string{} // name → the rest ("profile=default")
	for _, o := range info.SecurityOptions {
		name, rest, _ := strings.Cut(o, ",")
		opts[strings.TrimPrefix(name, "name=")] = rest
	}
	sec := check{name: "seccomp"}
	if rest, ok := opts["seccomp"]; ok {
		sec.status, sec.detail = statusOK, "the engine filters system calls ("+cmp.Or(rest, "profile=default")+")"
		if p.Seccomp != nil {
			sec.detail += "; the policy's own profile replaces it"
		}
	} else {
		sec.status, sec.detail = statusWarn, "the engine has no seccomp support: session containers run without a system-call filter"
		if p.Seccomp != nil {
			sec.status, sec.detail = statusFail, "the policy sets a seccomp profile, but the engine has no seccomp support"
		}
		sec.fix = "use an engine built with seccomp (Debian's docker.io is) and libseccomp installed"
	}
	ns := check{name: "userns", status: statusOK}
	switch _, remap := opts["userns"]; {
	case remap:
		ns.detail = "the engine remaps container users to subordinate IDs (userns-remap)"
	case hasKey(opts, "rootless"):
		ns.detail = "rootless engine: container users map into your user's subordinate IDs"
	default:
		uids := cmp.Or(p.SessionUIDs, policy.DefaultSessionUIDs)
		ns.detail = fmt.Sprintf("no remapping: each session runs as a host uid of its own, from %d to %d (policy.sessionUids), which is that uid on the host (sessions still run unprivileged, with no capabilities); userns-remap in daemon.json adds a layer",
			uids.First, uids.First+uids.Count-1)
	}
	if _, ok := opts["cgroupns"]; ok {
		ns.detail += "; private cgroup namespaces"
	}
	return []check{sec, ns}
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

// checkWorkspaceDisk reports whether a Docker session's disk can be
// bounded here (limits.workspaceDisk loop): it makes, attaches and removes
// a small disk. Asked for and not working fails; off, it warns that a
// session's disk is unbounded, saying whether loop would work.
func checkWorkspaceDisk(ctx context.Context, cli *client.Client, cfg serveConfig) check {
	c := check{name: "workspace-disk"}
	dir, err := os.MkdirTemp("", "sandboxd-doctor-disk-")
	if err == nil {
		defer os.RemoveAll(dir)
		err = docker.CheckDisks(ctx, cli, dir)
	}
	size := cmp.Or(cfg.Limits.WorkspaceBytes, defaultWorkspaceBytes)
	switch on := cfg.Limits.WorkspaceDisk == diskLoop; {
	case on && err == nil:
		c.status, c.detail = statusOK, fmt.Sprintf("each Docker session's /workspace is a file system of %d bytes of its own (limits.workspaceDisk: loop)", size)
	case on:
		c.status, c.detail, c.fix = statusFail, "limits.workspaceDisk is loop, but a session's disk cannot be made here: "+err.Error(), "see the detail, or set limits.workspaceDisk to off"
	case err == nil:
		c.status, c.detail = statusWarn, "a Docker session's disk is not bounded (limits.workspaceDisk is off): one session can fill the engine's disk"
		c.fix = fmt.Sprintf("set limits.workspaceDisk to loop, which works here: each session gets %d bytes (limits.workspaceBytes)", size)
	default:
		c.status, c.detail = statusWarn, "a Docker session's disk is not bounded (limits.workspaceDisk is off), and loop would not work here: "+err.Error()
		c.fix = "see the detail; README: Configuration, limits.workspaceDisk"
	}
	return c
}

// checkDisk reports the free space where images live (the engine's root
// directory, when the engine is on this machine and *engineDir names it)
// and where sandboxd caches root filesystems for image builds.
func checkDisk(engineDir *string) []check {
	type place struct{ what, dir string }
	var places []place
	if engineDir != nil && *engineDir != "" {
		places = append(places, place{"Docker's data", *engineDir})
	}
	if base, err := os.UserCacheDir(); err == nil {
		places = append(places, place{"image build cache", filepath.Join(base, "sandboxd", "images")})
	}
	var out []check
	seen := map[uint64]bool{}
	for _, pl := range places {
		c := check{name: "disk"}
		dir := pl.dir
		for { // the cache directory may not exist yet: its nearest parent
			if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
				break
			}
			dir = filepath.Dir(dir)
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			c.status, c.detail = statusWarn, fmt.Sprintf("%s (%s): %v", pl.what, pl.dir, err)
			c.fix = "run doctor as a user that may read " + pl.dir
			out = append(out, c)
			continue
		}
		if fi, err := os.Stat(dir); err == nil {
			if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
				if seen[uint64(sys.Dev)] {
					continue // the file system of a place already reported
				}
				seen[uint64(sys.Dev)] = true
			}
		}
		free := int64(st.Bavail) * int64(st.Bsize)
		c.detail = fmt.Sprintf("%.1f GB free for %s (%s)", float64(free)/1e9, pl.what, pl.dir)
		switch {
		case free < diskFailBytes:
			c.status = statusFail
		case free < diskWarnBytes:
			c.status = statusWarn
		default:
			c.status = statusOK
		}
		c.fix = "free space on " + dir + " (docker system prune removes stopped containers, unused images and build cache)"
		out = append(out, c)
	}
	return out
}
