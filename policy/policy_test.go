package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestDefaultProfileIsHardened(t *testing.T) {
	p := DefaultProfile("sandboxd/minimal:x")
	checks := []struct {
		name string
		ok   bool
	}{
		{"network none", p.NetworkMode == NetworkNone},
		{"cap drop ALL", reflect.DeepEqual(p.CapDrop, []string{"ALL"}) && len(p.CapAdd) == 0},
		{"no new privileges", p.NoNewPrivileges},
		{"read-only root", p.ReadonlyRootfs},
		{"not privileged", !p.Privileged},
		{"not root", !p.IsRoot() && p.User != ""},
		{"no host mounts", len(p.HostMounts) == 0},
		{"limits", p.PidsLimit > 0 && p.MemoryBytes > 0 && p.NanoCPUs > 0 && p.TmpfsBytes > 0},
		{"runc", p.Runtime == RuntimeRunc},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("default profile: %s does not hold: %+v", c.name, p)
		}
	}
	if err := p.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestApply(t *testing.T) {
	const img = "sandboxd/minimal:abc"
	strict := Policy{DefaultImage: img}
	open := Policy{
		DefaultImage:   img,
		Images:         []string{"sandboxd/*", "example.com/tools:1.*"},
		Runtimes:       []string{RuntimeRunsc},
		Networks:       []string{NetworkBridge},
		Privileged:     true,
		Capabilities:   []string{"NET_BIND_SERVICE", "CAP_SYS_PTRACE"},
		HostPaths:      []string{"/srv/data/"},
		WritableRootfs: true,
		RootUser:       true,
		MaxPids:        1024,
		MaxMemory:      4 << 30,
		MaxNanoCPUs:    2e9,
	}
	tests := []struct {
		name    string
		pol     Policy
		req     Request
		denied  string // setting named by the DeniedError; "" for success
		want    func(Profile) bool
		wantMsg string
	}{
		{name: "defaults", pol: strict, req: Request{Session: "s1", Tenant: "t1"},
			want: func(p Profile) bool {
				d := DefaultProfile(img)
				d.Session, d.Tenant = "s1", "t1"
				return reflect.DeepEqual(p, d)
			}},
		{name: "no image at all", pol: Policy{}, req: Request{}, denied: "image"},
		{name: "image not listed", pol: strict, req: Request{Image: "alpine"}, denied: "image", wantMsg: `"alpine"`},
		{name: "image by pattern", pol: open, req: Request{Image: "sandboxd/dev:1"},
			want: func(p Profile) bool { return p.Image == "sandboxd/dev:1" }},
		{name: "image pattern does not cross slash", pol: open, req: Request{Image: "sandboxd/a/b"}, denied: "image"},
		{name: "runtime not listed", pol: strict, req: Request{Runtime: RuntimeRunsc}, denied: "runtime"},
		{name: "runtime listed", pol: open, req: Request{Runtime: RuntimeRunsc},
			want: func(p Profile) bool { return p.Runtime == RuntimeRunsc }},
		{name: "default runtime named", pol: strict, req: Request{Runtime: RuntimeRunc},
			want: func(p Profile) bool { return p.Runtime == RuntimeRunc }},
		// A policy requires gVisor by making runsc the default and listing
		// nothing else: every session runs under it, and none may ask for runc.
		{name: "runsc required: the default", pol: Policy{DefaultImage: img, DefaultRuntime: RuntimeRunsc}, req: Request{},
			want: func(p Profile) bool { return p.Runtime == RuntimeRunsc }},
		{name: "runsc required: runc refused", pol: Policy{DefaultImage: img, DefaultRuntime: RuntimeRunsc}, req: Request{Runtime: RuntimeRunc},
			denied: "runtime", wantMsg: `"runc"`},
		{name: "host network", pol: open, req: Request{Network: NetworkHost}, denied: "network"},
		{name: "bridge refused by strict", pol: strict, req: Request{Network: NetworkBridge}, denied: "network"},
		{name: "bridge allowed", pol: open, req: Request{Network: NetworkBridge},
			want: func(p Profile) bool { return p.NetworkMode == NetworkBridge }},
		{name: "none always fine", pol: strict, req: Request{Network: NetworkNone},
			want: func(p Profile) bool { return p.NetworkMode == NetworkNone }},
		{name: "privileged refused", pol: strict, req: Request{Privileged: true}, denied: "privileged"},
		{name: "privileged allowed", pol: open, req: Request{Privileged: true},
			want: func(p Profile) bool { return p.Privileged }},
		{name: "capability refused", pol: strict, req: Request{CapAdd: []string{"NET_ADMIN"}}, denied: "capability", wantMsg: "CAP_NET_ADMIN"},
		{name: "capability not in list", pol: open, req: Request{CapAdd: []string{"SYS_ADMIN"}}, denied: "capability"},
		{name: "capability ALL not in list", pol: open, req: Request{CapAdd: []string{"all"}}, denied: "capability"},
		{name: "capability spelled either way", pol: open, req: Request{CapAdd: []string{"cap_net_bind_service", "SYS_PTRACE"}},
			want: func(p Profile) bool {
				return reflect.DeepEqual(p.CapAdd, []string{"CAP_NET_BIND_SERVICE", "CAP_SYS_PTRACE"}) && reflect.DeepEqual(p.CapDrop, []string{"ALL"})
			}},
		{name: "host mount refused", pol: strict, req: Request{HostMounts: []HostMount{{Source: "/srv/data", Target: "/data"}}}, denied: "host mount"},
		{name: "host mount below allowed", pol: open, req: Request{HostMounts: []HostMount{{Source: "/srv/data/x", Target: "/data", ReadOnly: true}}},
			want: func(p Profile) bool { return len(p.HostMounts) == 1 && p.HostMounts[0].ReadOnly }},
		{name: "host mount sibling prefix", pol: open, req: Request{HostMounts: []HostMount{{Source: "/srv/database", Target: "/d"}}}, denied: "host mount"},
		{name: "host mount dot-dot escape", pol: open, req: Request{HostMounts: []HostMount{{Source: "/srv/data/../../etc", Target: "/d"}}}, denied: "host mount"},
		{name: "relative host mount", pol: open, req: Request{HostMounts: []HostMount{{Source: "srv/data", Target: "/d"}}}, denied: "host mount"},
		{name: "docker socket never", pol: Policy{DefaultImage: img, HostPaths: []string{"/"}}, req: Request{HostMounts: []HostMount{{Source: "/var/run/docker.sock", Target: "/s"}}}, denied: "host mount"},
		{name: "socket directory never", pol: Policy{DefaultImage: img, HostPaths: []string{"/var"}}, req: Request{HostMounts: []HostMount{{Source: "/var/run", Target: "/s"}}}, denied: "host mount"},
		{name: "host root never", pol: Policy{DefaultImage: img, HostPaths: []string{"/"}}, req: Request{HostMounts: []HostMount{{Source: "/", Target: "/h"}}}, denied: "host mount"},
		{name: "writable rootfs refused", pol: strict, req: Request{WritableRootfs: true}, denied: "writable rootfs"},
		{name: "writable rootfs allowed", pol: open, req: Request{WritableRootfs: true},
			want: func(p Profile) bool { return !p.ReadonlyRootfs }},
		{name: "root refused", pol: strict, req: Request{RootUser: true}, denied: "root user"},
		{name: "root allowed", pol: open, req: Request{RootUser: true},
			want: func(p Profile) bool { return p.IsRoot() }},
		{name: "pids above default max", pol: strict, req: Request{PidsLimit: DefaultPidsLimit + 1}, denied: "pids limit"},
		{name: "pids lower is fine", pol: strict, req: Request{PidsLimit: 10},
			want: func(p Profile) bool { return p.PidsLimit == 10 }},
		{name: "negative pids", pol: open, req: Request{PidsLimit: -1}, denied: "pids limit"},
		{name: "memory within max", pol: open, req: Request{MemoryBytes: 2 << 30},
			want: func(p Profile) bool { return p.MemoryBytes == 2<<30 }},
		{name: "memory above max", pol: open, req: Request{MemoryBytes: 8 << 30}, denied: "memory"},
		{name: "cpu above max", pol: open, req: Request{NanoCPUs: 3e9}, denied: "cpu quota"},
		{name: "policy defaults for limits", pol: Policy{DefaultImage: img, Pids: 64, Memory: 512 << 20, NanoCPUs: 5e8, TmpfsBytes: 1 << 20},
			req: Request{},
			want: func(p Profile) bool {
				return p.PidsLimit == 64 && p.MemoryBytes == 512<<20 && p.NanoCPUs == 5e8 && p.TmpfsBytes == 1<<20
			}},
		{name: "seccomp from policy", pol: Policy{DefaultImage: img, Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}},
			req:  Request{},
			want: func(p Profile) bool { return p.Seccomp != nil && p.Seccomp.DefaultAction == specs.ActAllow }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.pol.Apply(tt.req)
			if tt.denied != "" {
				var de *DeniedError
				if !errors.As(err, &de) {
					t.Fatalf("Apply = %+v, %v; want a DeniedError for %s", got, err, tt.denied)
				}
				if de.Setting != tt.denied {
					t.Errorf("denied setting %q, want %q", de.Setting, tt.denied)
				}
				if !strings.Contains(err.Error(), tt.denied) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("message %q does not name %q and %q", err, tt.denied, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if !tt.want(got) {
				t.Errorf("Apply gave %+v", got)
			}
			if tt.req.Session != "" && got.Labels()[LabelSession] != tt.req.Session {
				t.Errorf("labels %v", got.Labels())
			}
		})
	}
}

func TestValidate(t *testing.T) {
	good := DefaultProfile("img")
	tests := []struct {
		name   string
		mutate func(*Profile)
		bad    string
	}{
		{"good", func(*Profile) {}, ""},
		{"no image", func(p *Profile) { p.Image = "" }, "no image"},
		{"user name", func(p *Profile) { p.User = "nobody" }, "uid"},
		{"user empty gid", func(p *Profile) { p.User = "1000:" }, "uid"},
		{"uid only", func(p *Profile) { p.User = "1000" }, ""},
		{"zero pids", func(p *Profile) { p.PidsLimit = 0 }, "pids limit"},
		{"zero memory", func(p *Profile) { p.MemoryBytes = 0 }, "memory"},
		{"relative mount", func(p *Profile) { p.HostMounts = []HostMount{{Source: "/a", Target: "b"}} }, "absolute"},
		{"no session uids", func(p *Profile) { p.SessionUIDs = UIDRange{} }, ""},
		{"session uids from 0", func(p *Profile) { p.SessionUIDs = UIDRange{First: 0, Count: 10} }, "session uids"},
		{"session uids past 2^31-2", func(p *Profile) { p.SessionUIDs = UIDRange{First: 1<<31 - 10, Count: 10} }, "session uids"},
		{"session uids up to 2^31-2", func(p *Profile) { p.SessionUIDs = UIDRange{First: 1<<31 - 11, Count: 10} }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := good
			tt.mutate(&p)
			err := p.Validate()
			if tt.bad == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.bad) {
				t.Fatalf("Validate = %v, want an error about %q", err, tt.bad)
			}
		})
	}
}

func TestIsRoot(t *testing.T) {
	for user, want := range map[string]bool{"0": true, "0:0": true, "00:1000": true, "1000:0": false, "1000": false, "10": false} {
		if got := (Profile{User: user}).IsRoot(); got != want {
			t.Errorf("IsRoot(%q) = %v, want %v", user, got, want)
		}
	}
}

func TestApplySessionUIDs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy UIDRange
		want   UIDRange
	}{
		{"default", UIDRange{}, DefaultSessionUIDs},
		{"operator's", UIDRange{First: 500000, Count: 100}, UIDRange{First: 500000, Count: 100}},
	} {
		prof, err := Policy{DefaultImage: "img", SessionUIDs: tc.policy}.Apply(Request{})
		if err != nil || prof.SessionUIDs != tc.want {
			t.Errorf("%s: SessionUIDs = %+v, %v; want %+v", tc.name, prof.SessionUIDs, err, tc.want)
		}
	}
}
