package memory

import (
	"path"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchMask is every event that says an entry of a watched directory may
// have changed: its contents (a write, or a close after opening it for
// writing, which covers writes through a shared mapping), its metadata and
// link count, its creation, removal or move.
const watchMask = unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB | unix.IN_CREATE |
	unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW

// watcher records, while a command runs, where in the host directory
// something changed: an inotify instance with a watch on every directory.
// Adding a hundred watches costs a Run milliseconds, so a Run leaves its
// watcher to the next (Mirror.keep) for keepWatch; an idle workspace holds no
// instance longer than that (a user has few: fs.inotify.max_user_instances,
// 128 by default).
type watcher struct {
	fd     int
	dirs   map[int]string // watch descriptor → directory name
	wds    map[string]int // directory name → watch descriptor
	broken bool           // its events no longer tell it all: not to be kept
}

// watch returns a watch on every directory of dirs (names relative to the
// host root, "." the root): kept, a watcher an earlier Run left, drained of
// what happened since and given the directories it lacks, or a new one. It
// returns nil when it cannot watch them all: collect then looks at
// everything.
func (b *Mirror) watch(kept *watcher, dirs []string) *watcher {
	w := kept
	if w != nil && !w.drain() {
		w.close()
		w = nil
	}
	if w == nil {
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return nil
		}
		w = &watcher{fd: fd, dirs: make(map[int]string, len(dirs)), wds: make(map[string]int, len(dirs))}
	}
	for _, d := range dirs {
		if _, ok := w.wds[d]; ok {
			continue
		}
		wd, err := unix.InotifyAddWatch(w.fd, b.hostPath(d), watchMask)
		if err != nil {
			w.close()
			return nil
		}
		if old, ok := w.dirs[wd]; ok { // the same directory under another name: not to be told apart
			delete(w.wds, old)
		}
		w.dirs[wd], w.wds[d] = d, wd
	}
	return w
}

// close ends the watch. The kernel waits for a grace period before the
// close of an instance with watches returns (milliseconds), which no Run
// need wait for: a goroutine waits.
func (w *watcher) close() { go unix.Close(w.fd) }

// drain discards the events queued since the last read: what the Run that
// takes the watcher must not count (its prepare's own writes). It reports
// false when the watcher's names can no longer be trusted (a directory
// moved, or the queue overflowed and may have lost that news).
func (w *watcher) drain() bool {
	_, ok := w.changes()
	return ok
}

// changes returns the names of the entries the events queued so far name,
// each standing for what lies under it. ok is false when the events do not
// tell it all — the queue overflowed, or a directory moved (its watch would
// name it wrongly) — and everything must be looked at; the watcher is then
// broken, not to be kept.
func (w *watcher) changes() (names []string, ok bool) {
	defer func() { w.broken = w.broken || !ok }()
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(w.fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return names, true
		}
		if err != nil || n <= 0 {
			return nil, false
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0,
				ev.Mask&unix.IN_MOVE_SELF != 0,
				ev.Mask&unix.IN_ISDIR != 0 && ev.Mask&(unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0:
				return nil, false
			case ev.Mask&unix.IN_IGNORED != 0:
				// The directory is gone (its removal is its parent's
				// IN_DELETE): a later one of that name needs a watch.
				if d, ok := w.dirs[int(ev.Wd)]; ok {
					delete(w.dirs, int(ev.Wd))
					if w.wds[d] == int(ev.Wd) {
						delete(w.wds, d)
					}
				}
				continue
			}
			dir, known := w.dirs[int(ev.Wd)]
			if !known {
				return nil, false
			}
			name := dir
			if i := indexNUL(raw); i > 0 {
				name = path.Join(dir, string(raw[:i]))
			}
			names = append(names, name)
		}
	}
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}
