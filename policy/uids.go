package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// sessionUIDs are the uids this process's sessions run as (Take), whatever
// backend runs them, each with the lock that keeps every other process of
// the host off it.
var sessionUIDs struct {
	sync.Mutex
	used map[int]*os.File
}

// UIDLockDir is where Take keeps its locks, a file per uid: a directory
// every daemon of the host shares, whatever its user, its $TMPDIR or its
// service's private /tmp — /run/lock (the system's, world-writable and
// sticky) where it exists, else the temporary directory's root (/tmp).
var UIDLockDir = func() string {
	if fi, err := os.Stat("/run/lock"); err == nil && fi.IsDir() {
		return "/run/lock/sandboxd-session-uids"
	}
	return "/tmp/sandboxd-session-uids"
}()

// Take returns a uid of r that no session of this process, nor of any
// other process of this host that takes its uids here (every sandboxd
// daemon), runs as, and holds it until ReleaseUID: the lowest one free. Two
// daemons on one host given the same range (the default one, say) share
// it, and no uid. What holds a uid is a lock (flock) on a file of
// UIDLockDir, which ends with the process that holds it; the files stay.
// It fails, naming the setting, when every uid of r is in use.
func (r UIDRange) Take() (int, error) {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	if sessionUIDs.used == nil {
		sessionUIDs.used = map[int]*os.File{}
	}
	if err := lockDir(UIDLockDir); err != nil {
		return 0, err
	}
	for i := range r.Count {
		uid := r.First + i
		if _, mine := sessionUIDs.used[uid]; mine {
			continue
		}
		f, err := lockUID(uid)
		if err != nil {
			return 0, err
		}
		if f != nil {
			sessionUIDs.used[uid] = f
			return uid, nil
		}
	}
	return 0, fmt.Errorf("policy: every session uid of %d-%d is in use by this daemon's sessions and other daemons' of this host; "+
		"give this daemon a range of its own, or a larger one (policy.sessionUids: {\"first\", \"count\"})", r.First, r.First+r.Count-1)
}

// ReleaseUID lets Take hand out uid again: no process of the session that
// ran as it is left.
func ReleaseUID(uid int) {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	if f := sessionUIDs.used[uid]; f != nil {
		f.Close() // and with it the lock
	}
	delete(sessionUIDs.used, uid)
}

// lockDir makes dir, shared by every user of the host (sticky and
// world-writable, as /tmp), when it is missing, and checks that it is such
// a directory, or one of this process's user: not a link, nor one another
// user could empty of others' locks.
func lockDir(dir string) error {
	if err := os.Mkdir(dir, 0o777); err == nil {
		if err := os.Chmod(dir, 0o777|fs.ModeSticky); err != nil {
			return fmt.Errorf("policy: the session uids' lock directory: %w", err)
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("policy: the session uids' lock directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("policy: the session uids' lock directory: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	shared := fi.Mode()&fs.ModeSticky != 0
	if !fi.IsDir() || st == nil || (!shared && int(st.Uid) != os.Geteuid()) || (fi.Mode().Perm()&0o022 != 0 && !shared) {
		return fmt.Errorf("policy: the session uids' lock directory %s must be a directory, sticky if others may write it (as /tmp), or this user's; it is %v: remove it", dir, fi.Mode())
	}
	return nil
}

// lockUID takes the lock of uid, or returns nil when another process holds
// it.
func lockUID(uid int) (*os.File, error) {
	name := filepath.Join(UIDLockDir, strconv.Itoa(uid))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o666)
	if errors.Is(err, fs.ErrPermission) {
		f, err = os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0) // another user's file: a lock needs no write
	}
	if err != nil {
		return nil, fmt.Errorf("policy: the session uid %d's lock: %w", uid, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("policy: the session uid %d's lock %s is not a file", uid, name)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("policy: the session uid %d's lock: %w", uid, err)
	}
	return f, nil
}
