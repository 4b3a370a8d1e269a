//go:build !linux

package policy

import specs "github.com/opencontainers/runtime-spec/specs-go"

// DeniedSyscalls are the system calls sandboxd's seccomp profile refuses;
// the profile is built on Linux only.
var DeniedSyscalls []string

// DefaultSeccomp returns nil off Linux: the engine's default profile
// applies. sandboxd's own profile needs the host's kernel version, which a
// daemon on another system cannot read.
func DefaultSeccomp() (*specs.LinuxSeccomp, error) { return nil, nil }
