package e2b_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	fspb "github.com/sandboxd/sandboxd/e2b/envdpb/filesystem"
	"github.com/sandboxd/sandboxd/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/e2b/envdpb/process/processconnect"
)

func eventList(evs []*fspb.FilesystemEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, fmt.Sprintf("%s %s", ev.Type, ev.Name))
	}
	return out
}

// TestWatcher: a watcher reports what changed since the last look, whoever
// changed it (a command, a file call), names relative to the watched
// directory; recursive or not; a missing directory, a file and a removed
// watcher are refused with the codes the SDK reads.
func TestWatcher(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base","timeout":300}`)
	fc := filesystemconnect.NewFilesystemClient(e.envd(c), e.url)
	pc := processconnect.NewProcessClient(e.envd(c), e.url)
	ctx := context.Background()
	sh := func(cmd string) {
		t.Helper()
		if _, out, errOut, end, err := run(t, pc, cmd, false); err != nil || end.GetExitCode() != 0 {
			t.Fatalf("%s: %s %s %v", cmd, out, errOut, err)
		}
	}
	sh("mkdir -p w/sub && echo old > w/kept && echo x > w/gone && chmod 600 w/kept")
	for _, tc := range []struct {
		recursive bool
		want      []string
	}{
		{false, []string{"EVENT_TYPE_CREATE empty", "EVENT_TYPE_WRITE kept", "EVENT_TYPE_CHMOD kept",
			"EVENT_TYPE_CREATE new", "EVENT_TYPE_WRITE new", "EVENT_TYPE_CREATE newdir", "EVENT_TYPE_REMOVE gone"}},
		{true, []string{"EVENT_TYPE_CREATE empty", "EVENT_TYPE_WRITE kept", "EVENT_TYPE_CHMOD kept",
			"EVENT_TYPE_CREATE new", "EVENT_TYPE_WRITE new", "EVENT_TYPE_CREATE newdir", "EVENT_TYPE_CREATE newdir/f", "EVENT_TYPE_WRITE newdir/f",
			"EVENT_TYPE_CREATE newdir/made", "EVENT_TYPE_CREATE sub/deep", "EVENT_TYPE_WRITE sub/deep", "EVENT_TYPE_REMOVE gone"}},
	} {
		t.Run(fmt.Sprint("recursive=", tc.recursive), func(t *testing.T) {
			sh("rm -rf w && mkdir -p w/sub && echo old > w/kept && echo x > w/gone && chmod 600 w/kept")
			cw, err := fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "/home/user/w", Recursive: tc.recursive}))
			if err != nil {
				t.Fatal(err)
			}
			id := cw.Msg.WatcherId
			got, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
			if err != nil || len(got.Msg.Events) != 0 {
				t.Fatalf("events before any change: %v %v", got, err)
			}
			sh("echo newer > w/kept && chmod 644 w/kept && rm w/gone && touch w/empty && mkdir -p w/newdir && echo f > w/newdir/f && echo d > w/sub/deep")
			if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "w/newdir/made"})); err != nil {
				t.Fatal(err)
			}
			put(t, e, c, "w/new", "by /files")
			got, err = fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
			if err != nil {
				t.Fatal(err)
			}
			if g := eventList(got.Msg.Events); !slices.Equal(g, tc.want) {
				t.Fatalf("events:\n got %q\nwant %q", g, tc.want)
			}
			got, err = fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
			if err != nil || len(got.Msg.Events) != 0 {
				t.Fatalf("events of a second look: %v %v", got, err)
			}
			if _, err := fc.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
				t.Fatal(err)
			}
			if _, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("events of a removed watcher: %v", err)
			}
		})
	}
	for path, code := range map[string]connect.Code{"nowhere": connect.CodeNotFound, "w/kept": connect.CodeInvalidArgument, "/etc": connect.CodePermissionDenied} {
		if _, err := fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: path})); connect.CodeOf(err) != code {
			t.Errorf("watch %s: %v, want %v", path, err, code)
		}
	}
	// Another sandbox's watcher is not found from this one.
	other := e.create("acme-key", `{"templateID":"base","timeout":300}`)
	cw, err := filesystemconnect.NewFilesystemClient(e.envd(other), e.url).CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "."}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: cw.Msg.WatcherId})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("another sandbox's watcher: %v", err)
	}
}

// TestWatchDir: the stream starts, then carries a change made after it
// started, in both codecs.
func TestWatchDir(t *testing.T) {
	e := start(t)
	c := e.create("acme-key", `{"templateID":"base","timeout":300}`)
	for i, opts := range [][]connect.ClientOption{nil, {connect.WithProtoJSON()}} {
		fc := filesystemconnect.NewFilesystemClient(e.envd(c), e.url, opts...)
		ctx, cancel := context.WithCancel(context.Background())
		st, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/home/user", Recursive: true}))
		if err != nil {
			t.Fatal(err)
		}
		if !st.Receive() || st.Msg().GetStart() == nil {
			t.Fatalf("first message: %v %v", st.Msg(), st.Err())
		}
		name := fmt.Sprintf("d%d/f.txt", i)
		put(t, e, c, name, "x")
		for st.Receive() {
			if ev := st.Msg().GetFilesystem(); ev != nil && ev.Name == name && ev.Type == fspb.EventType_EVENT_TYPE_CREATE {
				break
			}
		}
		if st.Err() != nil {
			t.Fatal(st.Err())
		}
		cancel()
		st.Close()
	}
	st, err := filesystemconnect.NewFilesystemClient(e.envd(c), e.url).WatchDir(context.Background(), connect.NewRequest(&fspb.WatchDirRequest{Path: "nowhere"}))
	if err == nil {
		for st.Receive() {
			t.Fatalf("watching a missing directory: %v", st.Msg())
		}
		err = st.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("watching a missing directory: %v", err)
	}
}

// put writes content to the sandbox's file name through /files.
func put(t *testing.T, e *env, c created, name, content string) {
	t.Helper()
	res, err := e.envd(c).Post(e.url+"/files?path="+url.QueryEscape(name), "application/octet-stream", strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("upload %s: %d", name, res.StatusCode)
	}
}
