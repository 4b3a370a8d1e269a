// Package policy describes how a sandboxd session container is hardened, as a
// typed value, and what an operator lets a session relax.
//
// A Profile is the full set of isolation settings for one container: no
// network, no capabilities, no-new-privileges, a read-only root with a
// writable /workspace volume and a size-capped /tmp, limits on processes,
// memory and CPU, a non-root user, the OCI runtime and a seccomp profile
// (sandboxd's own, DefaultSeccomp, unless the operator gives one). DefaultProfile returns the hardened defaults. A Policy is the
// operator's word on what a session may ask for; Policy.Apply turns a
// session's Request into a Profile, or refuses it with a *DeniedError naming
// the setting.
//
// The package knows no Docker types: package backend/docker turns a Profile
// into a container configuration. What the profile promises is what the
// kernel and the OCI runtime enforce; see the README for the limits.
package policy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Labels that name sandboxd, the session and the tenant on every container and
// volume sandboxd creates.
const (
	LabelSandboxd = "sandboxd"
	LabelSession  = "sandboxd.session"
	LabelTenant   = "sandboxd.tenant"
)

// WorkspaceDir is where the workspace is mounted inside a session container.
const WorkspaceDir = "/workspace"

// Runtimes sandboxd knows by name.
const (
	RuntimeRunc  = "runc"
	RuntimeRunsc = "runsc" // gVisor
)

// Network modes a profile may use.
const (
	NetworkNone   = "none"
	NetworkBridge = "bridge"
	NetworkHost   = "host"
)

// Defaults of the hardened profile.
const (
	DefaultUser        = "1000:1000"
	DefaultPidsLimit   = 256
	DefaultMemoryBytes = 1 << 30   // 1 GiB, swap included
	DefaultNanoCPUs    = 1e9       // one CPU
	DefaultTmpfsBytes  = 256 << 20 // /tmp
)

// DefaultSessionUIDs is the range of host uids sessions run as, one of
// its own each: 65536 uids from 1000000000, far from the uids of a host's
// users, its services and the usual /etc/subuid ranges. Daemons on one host
// may share it: a uid is held host-wide (UIDRange.Take). Daemons on
// different hosts that share an engine should each have a range of their
// own (Policy.SessionUIDs).
var DefaultSessionUIDs = UIDRange{First: 1_000_000_000, Count: 65536}

// UIDRange is a range of host uids: First, First+1, ..., First+Count-1.
type UIDRange struct {
	// First is the first uid of the range.
	First int `json:"first"`
	// Count is how many uids the range holds.
	Count int `json:"count"`
}

// Contains reports whether uid is in the range.
func (r UIDRange) Contains(uid int) bool { return uid >= r.First && uid-r.First < r.Count }

func (r UIDRange) validate() error {
	if r.Count < 0 || r.First <= 0 && r.Count > 0 || r.First+r.Count-1 > 1<<31-2 {
		return fmt.Errorf("policy: session uids %d+%d: want a first uid over 0 and a range below 2147483647", r.First, r.Count)
	}
	return nil
}

// dockerSockets are host paths that hand out control of the engine; no
// policy lets a session mount them or a directory above them.
var dockerSockets = []string{"/var/run/docker.sock", "/run/docker.sock"}

// Profile is the isolation of one session container. The zero value is not
// hardened; start from DefaultProfile or Policy.Apply.
type Profile struct {
	// Image is the image reference the container runs.
	Image string
	// Runtime is the OCI runtime name as the engine knows it ("runc", "runsc").
	Runtime string
	// User is "uid:gid" for every process in the container. Never root in a
	// hardened profile.
	User string
	// SessionUIDs, when its Count is above 0 and User is not root, gives
	// the container a host uid of its own in place of User: one of the
	// range no other container of this host's daemons has (UIDRange.Take), as uid and gid, chosen
	// when it starts. Per-user kernel limits (inotify instances, processes,
	// keys, locked memory) are then the session's alone; without a user
	// namespace every session running as one uid shares them.
	SessionUIDs UIDRange
	// NetworkMode is "none" unless the operator allows another.
	NetworkMode string
	// CapDrop and CapAdd adjust the capability set; the default drops ALL and
	// adds none.
	CapDrop, CapAdd []string
	// NoNewPrivileges stops setuid binaries and file capabilities from raising
	// privileges (PR_SET_NO_NEW_PRIVS).
	NoNewPrivileges bool
	// Privileged gives the container every device and capability. Never set
	// unless the operator allows it.
	Privileged bool
	// ReadonlyRootfs mounts the image's root filesystem read-only; the
	// workspace volume and /tmp stay writable.
	ReadonlyRootfs bool
	// TmpfsBytes caps the tmpfs mounted at /tmp (noexec is not set: build
	// tools run from /tmp).
	TmpfsBytes int64
	// PidsLimit caps the number of processes and threads in the container.
	PidsLimit int64
	// MemoryBytes caps memory, swap included.
	MemoryBytes int64
	// NanoCPUs is the CPU quota in billionths of a CPU.
	NanoCPUs int64
	// Seccomp, when set, is the container's seccomp profile. Nil is
	// sandboxd's own, DefaultSeccomp: the engine's default allowlist less
	// DeniedSyscalls (io_uring, bpf, userfaultfd, new namespaces, ...).
	Seccomp *specs.LinuxSeccomp
	// HostMounts are host paths bind-mounted into the container. Empty in a
	// hardened profile.
	HostMounts []HostMount
	// Session and Tenant name the session and its tenant in labels.
	Session, Tenant string
}

// HostMount is a host path bind-mounted into a container.
type HostMount struct {
	Source, Target string
	ReadOnly       bool
}

// DefaultProfile returns the hardened profile for image, as described in the
// package documentation.
func DefaultProfile(image string) Profile {
	return Profile{
		Image:           image,
		Runtime:         RuntimeRunc,
		User:            DefaultUser,
		SessionUIDs:     DefaultSessionUIDs,
		NetworkMode:     NetworkNone,
		CapDrop:         []string{"ALL"},
		NoNewPrivileges: true,
		ReadonlyRootfs:  true,
		TmpfsBytes:      DefaultTmpfsBytes,
		PidsLimit:       DefaultPidsLimit,
		MemoryBytes:     DefaultMemoryBytes,
		NanoCPUs:        DefaultNanoCPUs,
	}
}

// Labels returns the labels every object of this profile's session carries.
func (p Profile) Labels() map[string]string {
	return map[string]string{
		LabelSandboxd: "1",
		LabelSession:  p.Session,
		LabelTenant:   p.Tenant,
	}
}

// Validate reports a profile that cannot be run as written: no image, a user
// that is not "uid[:gid]", a non-positive limit, a relative mount target.
// It does not judge how hardened the profile is; that is Policy.Apply's job.
func (p Profile) Validate() error {
	var errs []error
	if p.Image == "" {
		errs = append(errs, errors.New("policy: profile has no image"))
	}
	if !validUser(p.User) {
		errs = append(errs, fmt.Errorf("policy: user %q is not uid[:gid]", p.User))
	}
	for name, v := range map[string]int64{"pids limit": p.PidsLimit, "memory": p.MemoryBytes, "cpu quota": p.NanoCPUs, "tmpfs size": p.TmpfsBytes} {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("policy: %s must be positive, is %d", name, v))
		}
	}
	for _, m := range p.HostMounts {
		if !path.IsAbs(m.Source) || !path.IsAbs(m.Target) {
			errs = append(errs, fmt.Errorf("policy: host mount %s:%s must use absolute paths", m.Source, m.Target))
		}
	}
	if err := p.SessionUIDs.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func validUser(u string) bool {
	uid, gid, hasGID := strings.Cut(u, ":")
	isNum := func(s string) bool {
		return s != "" && strings.Trim(s, "0123456789") == ""
	}
	return isNum(uid) && (!hasGID || isNum(gid))
}

// IsRoot reports whether the profile runs its processes as uid 0.
func (p Profile) IsRoot() bool {
	uid, _, _ := strings.Cut(p.User, ":")
	return strings.Trim(uid, "0") == "" && uid != ""
}

// Request is what a session asks for. Zero fields take the policy's defaults;
// anything beyond the hardened profile must be allowed by the Policy.
type Request struct {
	Session, Tenant string
	// Image is the image reference; "" is the policy's default image.
	Image string
	// Runtime is the OCI runtime; "" is the policy's default runtime.
	Runtime string
	// Network is the network mode; "" is "none".
	Network string
	// Privileged asks for a privileged container.
	Privileged bool
	// CapAdd lists capabilities to add back (names with or without "CAP_").
	CapAdd []string
	// HostMounts asks for host paths in the container.
	HostMounts []HostMount
	// WritableRootfs asks for a writable root filesystem.
	WritableRootfs bool
	// RootUser asks to run as uid 0 inside the container.
	RootUser bool
	// PidsLimit, MemoryBytes and NanoCPUs ask for other limits; zero is the
	// policy's default and more than the policy's maximum is refused.
	PidsLimit, MemoryBytes, NanoCPUs int64
}

// Policy is the operator's word on sessions: the image and runtime they get
// by default, what they may choose instead, and how far they may relax the
// hardened profile. The zero Policy allows nothing beyond DefaultProfile, with
// the images named by DefaultImage only. Its JSON names (the "policy"
// section of sandboxd serve's configuration) are the field names with a
// lower-case first letter; CPU quotas are "nanoCpus" and "maxNanoCpus", as
// in a session's limits.
type Policy struct {
	// DefaultImage is used when a request names none.
	DefaultImage string `json:"defaultImage,omitempty"`
	// Images lists the image references sessions may use, as path.Match
	// patterns ("sandboxd/*"). DefaultImage is always allowed.
	Images []string `json:"images,omitempty"`
	// DefaultRuntime is used when a request names none; "" is runc.
	DefaultRuntime string `json:"defaultRuntime,omitempty"`
	// Runtimes lists the OCI runtimes sessions may choose; DefaultRuntime is
	// always allowed.
	Runtimes []string `json:"runtimes,omitempty"`
	// Networks lists network modes other than "none" sessions may use.
	Networks []string `json:"networks,omitempty"`
	// Privileged lets sessions ask for privileged containers.
	Privileged bool `json:"privileged,omitempty"`
	// Capabilities lists capabilities sessions may add back.
	Capabilities []string `json:"capabilities,omitempty"`
	// HostPaths lists host directories sessions may bind-mount, themselves or
	// below them. The Docker socket and its directories are never allowed.
	HostPaths []string `json:"hostPaths,omitempty"`
	// WritableRootfs lets sessions ask for a writable root filesystem.
	WritableRootfs bool `json:"writableRootfs,omitempty"`
	// RootUser lets sessions run as uid 0 inside the container.
	RootUser bool `json:"rootUser,omitempty"`
	// Seccomp replaces sandboxd's seccomp profile (DefaultSeccomp) in every
	// container.
	Seccomp *specs.LinuxSeccomp `json:"seccomp,omitempty"`
	// SessionUIDs is the range of host uids sessions run as, one each
	// (Profile.SessionUIDs); a zero range is DefaultSessionUIDs.
	SessionUIDs UIDRange `json:"sessionUids,omitzero"`
	// Pids is the default process limit (zero: DefaultPidsLimit).
	Pids int64 `json:"pids,omitempty"`
	// Memory is the default memory limit in bytes, swap included (zero:
	// DefaultMemoryBytes).
	Memory int64 `json:"memory,omitempty"`
	// NanoCPUs is the default CPU quota in billionths of a CPU (zero:
	// DefaultNanoCPUs, one CPU).
	NanoCPUs int64 `json:"nanoCpus,omitempty"`
	// MaxPids is the most processes a session may ask for (zero: Pids).
	MaxPids int64 `json:"maxPids,omitempty"`
	// MaxMemory is the most memory in bytes a session may ask for (zero:
	// Memory).
	MaxMemory int64 `json:"maxMemory,omitempty"`
	// MaxNanoCPUs is the most CPU quota a session may ask for (zero:
	// NanoCPUs).
	MaxNanoCPUs int64 `json:"maxNanoCpus,omitempty"`
	// TmpfsBytes sizes /tmp; zero is DefaultTmpfsBytes.
	TmpfsBytes int64 `json:"tmpfsBytes,omitempty"`
}

// DeniedError says which setting a session asked for beyond its operator's
// word: a Policy, or (from other packages) the operator's grants and tool
// options, which a session may narrow and never widen.
type DeniedError struct {
	// Setting names the setting: "privileged", "host mount", "network",
	// "capability", "image", "runtime", "writable rootfs", "root user",
	// "pids limit", "memory", "cpu quota"; "grant", "options.protect", …
	// elsewhere.
	Setting string
	// Value is what was asked for: a plain string, or JSON.
	Value string
	// Limit, when set, says what the operator allows instead, naming its
	// value and the session's setting ("limits.memoryBytes may be at most
	// the operator's 1073741824").
	Limit string
}

func (e *DeniedError) Error() string {
	msg := "policy: session may not ask for " + e.Setting
	switch {
	case json.Valid([]byte(e.Value)): // a number, a list, a quoted string
		msg += " " + e.Value
	case e.Value != "":
		msg += fmt.Sprintf(" %q", e.Value)
	}
	if e.Limit != "" {
		msg += ": " + e.Limit
	}
	return msg
}

// Apply returns the profile a request gets under p: the hardened defaults,
// relaxed where the request asks and p allows. It refuses the whole request
// with a *DeniedError naming the first setting beyond p; errors.As finds it.
func (p Policy) Apply(req Request) (Profile, error) {
	image := req.Image
	if image == "" {
		image = p.DefaultImage
	}
	if image == "" {
		return Profile{}, &DeniedError{Setting: "image", Value: ""}
	}
	if image != p.DefaultImage && !matchAny(p.Images, image) {
		return Profile{}, &DeniedError{Setting: "image", Value: image,
			Limit: fmt.Sprintf("the operator's policy allows %s and policy.images %q", p.DefaultImage, p.Images)}
	}
	prof := DefaultProfile(image)
	prof.Session, prof.Tenant = req.Session, req.Tenant
	prof.Seccomp = p.Seccomp
	if p.SessionUIDs != (UIDRange{}) {
		prof.SessionUIDs = p.SessionUIDs
	}
	if p.TmpfsBytes > 0 {
		prof.TmpfsBytes = p.TmpfsBytes
	}

	defRuntime := cmp.Or(p.DefaultRuntime, RuntimeRunc)
	prof.Runtime = cmp.Or(req.Runtime, defRuntime)
	if prof.Runtime != defRuntime && !slices.Contains(p.Runtimes, prof.Runtime) {
		return Profile{}, &DeniedError{Setting: "runtime", Value: prof.Runtime,
			Limit: fmt.Sprintf("the operator's policy allows %s and policy.runtimes %q", defRuntime, p.Runtimes)}
	}

	if req.Network != "" && req.Network != NetworkNone {
		if !slices.Contains(p.Networks, req.Network) {
			return Profile{}, &DeniedError{Setting: "network", Value: req.Network,
				Limit: fmt.Sprintf("the operator's policy allows none and policy.networks %q", p.Networks)}
		}
		prof.NetworkMode = req.Network
	}
	if req.Privileged {
		if !p.Privileged {
			return Profile{}, &DeniedError{Setting: "privileged", Limit: "the operator's policy.privileged is false"}
		}
		prof.Privileged = true
	}
	for _, c := range req.CapAdd {
		name := capName(c)
		if !slices.ContainsFunc(p.Capabilities, func(a string) bool { return capName(a) == name }) {
			return Profile{}, &DeniedError{Setting: "capability", Value: name,
				Limit: fmt.Sprintf("capAdd may name only the operator's policy.capabilities %q", p.Capabilities)}
		}
		prof.CapAdd = append(prof.CapAdd, name)
	}
	for _, m := range req.HostMounts {
		if !p.hostPathAllowed(m.Source) {
			return Profile{}, &DeniedError{Setting: "host mount", Value: m.Source,
				Limit: fmt.Sprintf("hostMounts may name only the operator's policy.hostPaths %q, never the Docker socket", p.HostPaths)}
		}
		m.Source, m.Target = path.Clean(m.Source), path.Clean(m.Target)
		prof.HostMounts = append(prof.HostMounts, m)
	}
	if req.WritableRootfs {
		if !p.WritableRootfs {
			return Profile{}, &DeniedError{Setting: "writable rootfs", Limit: "the operator's policy.writableRootfs is false"}
		}
		prof.ReadonlyRootfs = false
	}
	if req.RootUser {
		if !p.RootUser {
			return Profile{}, &DeniedError{Setting: "root user", Limit: "the operator's policy.rootUser is false"}
		}
		prof.User = "0:0"
	}

	limits := []struct {
		setting, key, maxKey string
		dst                  *int64
		asked, def, max, d   int64
	}{
		{"pids limit", "limits.pids", "maxPids", &prof.PidsLimit, req.PidsLimit, p.Pids, p.MaxPids, DefaultPidsLimit},
		{"memory", "limits.memoryBytes", "maxMemory", &prof.MemoryBytes, req.MemoryBytes, p.Memory, p.MaxMemory, DefaultMemoryBytes},
		{"cpu quota", "limits.nanoCpus", "maxNanoCPUs", &prof.NanoCPUs, req.NanoCPUs, p.NanoCPUs, p.MaxNanoCPUs, DefaultNanoCPUs},
	}
	for _, l := range limits {
		def := cmp.Or(l.def, l.d)
		ceiling := cmp.Or(l.max, def)
		switch {
		case l.asked < 0:
			return Profile{}, &DeniedError{Setting: l.setting, Value: fmt.Sprint(l.asked), Limit: l.key + " must not be negative"}
		case l.asked == 0:
			*l.dst = def
		case l.asked > ceiling:
			return Profile{}, &DeniedError{Setting: l.setting, Value: fmt.Sprint(l.asked),
				Limit: fmt.Sprintf("%s may be at most the operator's %d (policy.%s)", l.key, ceiling, l.maxKey)}
		default:
			*l.dst = l.asked
		}
	}
	if err := prof.Validate(); err != nil {
		return Profile{}, err
	}
	return prof, nil
}

func (p Policy) hostPathAllowed(src string) bool {
	if !path.IsAbs(src) {
		return false
	}
	src = path.Clean(src)
	for _, s := range dockerSockets {
		if src == s || src == "/" || strings.HasPrefix(s, src+"/") {
			return false
		}
	}
	for _, h := range p.HostPaths {
		h = path.Clean(h)
		if src == h || strings.HasPrefix(src, strings.TrimSuffix(h, "/")+"/") {
			return true
		}
	}
	return false
}

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}

func capName(c string) string {
	c = strings.ToUpper(c)
	if c == "ALL" {
		return c
	}
	return "CAP_" + strings.TrimPrefix(c, "CAP_")
}
