//go:build unix && !linux

package memory

// watcher is Linux's (inotify); elsewhere collect looks at everything.
type watcher struct{ broken bool }

func (b *Mirror) watch(*watcher, []string) *watcher { return nil }

func (w *watcher) close() {}

func (w *watcher) changes() ([]string, bool) { return nil, false }
