package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	pb "github.com/sandboxd/sandboxd/e2b/envdpb/filesystem"
	"github.com/sandboxd/sandboxd/workspace"
)

// A watch here compares a directory's tree between two looks, through the
// session's FileSystem like every other call, rather than following the
// kernel's notifications inside the container: what a look finds changed
// since the one before is reported, whoever changed it (a command or a
// file call), in path order, parents before what they hold:
//
//   - an entry that is new: CREATE (a new file with content, CREATE and
//     WRITE);
//   - a file whose size or modification time changed: WRITE;
//   - an entry whose permissions changed: CHMOD;
//   - an entry that is gone: REMOVE.
//
// So a rename is a REMOVE and a CREATE, and an entry made and removed
// between two looks is not seen. GetWatcherEvents looks when it is called,
// so a change made before the call is always in its answer; WatchDir looks
// every watchInterval.

// watchInterval is how often WatchDir looks.
const watchInterval = 200 * time.Millisecond

// maxWatchers bounds a sandbox's watchers.
const maxWatchers = 64

// entryState is what a look keeps of one entry.
type entryState struct {
	mode fs.FileMode
	size int64
	mod  time.Time
}

// watcher is one watched directory.
type watcher struct {
	fsys      workspace.FileSystem
	dir       string // a workspace name
	recursive bool

	mu   sync.Mutex
	last map[string]entryState // by name relative to dir
}

// newWatcher makes the first look at dir, which must be a directory.
func newWatcher(ctx context.Context, b *sandbox, p string, recursive bool) (*watcher, error) {
	fsys, dir, err := dirOf(ctx, b, p)
	if err != nil {
		return nil, err
	}
	w := &watcher{fsys: fsys, dir: dir, recursive: recursive}
	if w.last, err = w.look(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// look lists the watched tree.
func (w *watcher) look(ctx context.Context) (map[string]entryState, error) {
	depth := 1
	if w.recursive {
		depth = 0
	}
	res, err := workspace.Walk(ctx, w.fsys, workspace.WalkRequest{Dir: w.dir, MaxDepth: depth, Info: true, Limit: maxListed})
	if err != nil {
		return nil, rpcError(err)
	}
	if res.Truncated {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s holds more than %d entries: watch less of it", e2bPath(w.dir), maxListed))
	}
	out := make(map[string]entryState, len(res.Entries))
	for _, e := range res.Entries {
		rel := e.Path
		if w.dir != "" {
			var ok bool
			if rel, ok = strings.CutPrefix(e.Path, w.dir+"/"); !ok {
				continue // the start itself
			}
		}
		if rel == "" || rel == "." || e.Err != nil {
			continue
		}
		out[rel] = entryState{mode: e.Mode, size: e.Size, mod: e.ModTime}
	}
	return out, nil
}

// events looks again and returns what changed since the last look.
func (w *watcher) events(ctx context.Context) ([]*pb.FilesystemEvent, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now, err := w.look(ctx)
	if err != nil {
		return nil, err
	}
	evs := changes(w.last, now)
	w.last = now
	return evs, nil
}

// changes is what turned was into now, as E2B's events.
func changes(was, now map[string]entryState) []*pb.FilesystemEvent {
	var out []*pb.FilesystemEvent
	add := func(name string, t pb.EventType) {
		out = append(out, &pb.FilesystemEvent{Name: name, Type: t})
	}
	names := slices.Sorted(maps.Keys(now))
	for _, name := range names {
		n := now[name]
		o, existed := was[name]
		switch {
		case !existed || o.mode.Type() != n.mode.Type():
			if existed {
				add(name, pb.EventType_EVENT_TYPE_REMOVE)
			}
			add(name, pb.EventType_EVENT_TYPE_CREATE)
			if n.mode.IsRegular() && n.size > 0 {
				add(name, pb.EventType_EVENT_TYPE_WRITE)
			}
		default:
			if !n.mode.IsDir() && (o.size != n.size || !o.mod.Equal(n.mod)) {
				add(name, pb.EventType_EVENT_TYPE_WRITE)
			}
			if o.mode.Perm() != n.mode.Perm() {
				add(name, pb.EventType_EVENT_TYPE_CHMOD)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(was)) {
		if _, ok := now[name]; !ok {
			add(name, pb.EventType_EVENT_TYPE_REMOVE)
		}
	}
	return out
}

// watchers are a sandbox's watchers, by ID.
type watchers struct {
	mu sync.Mutex
	by map[string]*watcher
}

func (ws *watchers) add(w *watcher) (string, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if len(ws.by) >= maxWatchers {
		return "", connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox has %d watchers, the most it may: remove one", maxWatchers))
	}
	if ws.by == nil {
		ws.by = map[string]*watcher{}
	}
	id := newToken()[3:]
	ws.by[id] = w
	return id, nil
}

func (ws *watchers) get(id string) (*watcher, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w, ok := ws.by[id]; ok {
		return w, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found (removed, or never made)", id))
}

func (ws *watchers) remove(id string) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if _, ok := ws.by[id]; !ok {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found (removed, or never made)", id))
	}
	delete(ws.by, id)
	return nil
}

func (svc *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	b := boxOf(ctx)
	w, err := newWatcher(ctx, b, req.Msg.Path, req.Msg.Recursive)
	if err != nil {
		return nil, err
	}
	id, err := b.watchers.add(w)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (svc *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := boxOf(ctx).watchers.get(req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	evs, err := w.events(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (svc *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	if err := boxOf(ctx).watchers.remove(req.Msg.WatcherId); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

// WatchDir streams the directory's changes as they are seen, with a
// keepalive at the interval the client asks for, until the client goes or
// the sandbox ends.
func (svc *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	b := boxOf(ctx)
	w, err := newWatcher(ctx, b, req.Msg.Path, req.Msg.Recursive)
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	var keepalive <-chan time.Time
	if secs := keepaliveSecs(req.Header()); secs > 0 {
		t := time.NewTicker(time.Duration(secs) * time.Second)
		defer t.Stop()
		keepalive = t.C
	}
	look := time.NewTicker(watchInterval)
	defer look.Stop()
	for {
		select {
		case <-look.C:
			evs, err := w.events(ctx)
			if err != nil {
				if errors.Is(ctx.Err(), context.Canceled) {
					return nil
				}
				return err
			}
			for _, ev := range evs {
				if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
		case <-keepalive:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-b.sess.Done():
			return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox has ended"))
		case <-ctx.Done():
			return nil
		}
	}
}
