//go:build unix && !linux

package localfs

import (
	"errors"

	"golang.org/x/sys/unix"
)

// openBeneath would open name confined to dirfd in one call; this system has
// no such call that this package uses, so the caller resolves name through
// the root instead.
func openBeneath(dirfd int, name string, flags int, noLinks bool) (int, error) {
	return -1, errors.ErrUnsupported
}

// sysStat is st itself here: os's Sys differs from system to system.
func sysStat(st *unix.Stat_t) any { return st }

// replaceEntry renames tmp over the existing entry base, both in the
// directory dfd.
func replaceEntry(dfd int, tmp, base string) error {
	return unix.Renameat(dfd, tmp, dfd, base)
}

// followsNoFollow reports whether the kernel follows a link that open(2)
// is told not to (see the Linux version): no kernel of these systems is
// known to.
func followsNoFollow() bool { return false }
