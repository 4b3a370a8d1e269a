//go:build unix && !linux

package localfs

import "errors"

// openBeneath would open name confined to dirfd in one call; this system has
// no such call that this package uses, so the caller resolves name through
// the root instead.
func openBeneath(dirfd int, name string, flags int) (int, error) {
	return -1, errors.ErrUnsupported
}
