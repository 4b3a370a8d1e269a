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

// ErrUIDHeld is what HoldUID fails with for a uid that a session of this
// process or of another process of the host holds; match it with
// errors.Is.
var ErrUIDHeld = errors.New("the session uid is held by another session")

// keptMark is the content of a kept uid's lock file (KeepUID).
const keptMark = "kept\n"

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
// A uid kept for a session that outlives its daemon (KeepUID) is never
// taken. It fails, naming the setting, when every uid of r is in use.
func (r UIDRange) Take() (int, error) {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	if err := prepareUIDs(); err != nil {
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
		if f != nil && kept(f) {
			f.Close()
			continue
		}
		if f != nil {
			sessionUIDs.used[uid] = f
			return uid, nil
		}
	}
	return 0, fmt.Errorf("policy: every session uid of %d-%d is in use by this daemon's sessions and other daemons' of this host; "+
		"give this daemon a range of its own, or a larger one (policy.sessionUids: {\"first\", \"count\"})", r.First, r.First+r.Count-1)
}

// prepareUIDs readies the registry and the lock directory;
// sessionUIDs is locked.
func prepareUIDs() error {
	if sessionUIDs.used == nil {
		sessionUIDs.used = map[int]*os.File{}
	}
	return lockDir(UIDLockDir)
}

// HoldUID makes uid this process's, as Take would have, whether or not it
// is kept (KeepUID): the uid of a session that outlived the daemon that
// took it, for the daemon that takes the session back. It fails wrapping
// ErrUIDHeld while a session of this process or a process of the host
// holds uid. It is held until ReleaseUID or LeaveUID.
func HoldUID(uid int) error {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	if err := prepareUIDs(); err != nil {
		return err
	}
	if _, mine := sessionUIDs.used[uid]; mine {
		return fmt.Errorf("policy: session uid %d: %w of this daemon", uid, ErrUIDHeld)
	}
	f, err := lockUID(uid)
	if err != nil {
		return err
	}
	if f == nil {
		return fmt.Errorf("policy: session uid %d: %w, of another process of this host", uid, ErrUIDHeld)
	}
	sessionUIDs.used[uid] = f
	return nil
}

// KeepUID marks uid, which this process holds (Take, HoldUID), as kept
// for a session that outlives this process: no Take of any process of the
// host hands it out — after LeaveUID or this process's end too — until
// the session ends and its holder gives it back with ReleaseUID. The mark
// lives in the uid's lock file; a lock file of another user, which this
// one cannot write, fails it.
func KeepUID(uid int) error {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	f := sessionUIDs.used[uid]
	if f == nil {
		return fmt.Errorf("policy: session uid %d is not this daemon's to keep", uid)
	}
	if _, err := f.WriteAt([]byte(keptMark), 0); err != nil {
		return fmt.Errorf("policy: keeping session uid %d: %w", uid, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("policy: keeping session uid %d: %w", uid, err)
	}
	return nil
}

// ReleaseUID lets Take hand out uid again: no process of the session that
// ran as it is left. A mark of KeepUID goes with it.
func ReleaseUID(uid int) {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	if f := sessionUIDs.used[uid]; f != nil {
		if kept(f) {
			f.Truncate(0)
		}
		f.Close() // and with it the lock
	}
	delete(sessionUIDs.used, uid)
}

// LeaveUID lets go of uid as this process's end would, for a session
// that lives on without it: a uid kept (KeepUID) stays kept, for HoldUID
// to take back; one that is not may be taken again.
func LeaveUID(uid int) {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	if f := sessionUIDs.used[uid]; f != nil {
		f.Close()
	}
	delete(sessionUIDs.used, uid)
}

// kept reports whether the lock file f marks its uid kept (KeepUID).
func kept(f *os.File) bool {
	var b [len(keptMark)]byte
	n, _ := f.ReadAt(b[:], 0)
	return string(b[:n]) == keptMark
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
