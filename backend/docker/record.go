package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"golang.org/x/sync/errgroup"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
)

// Sessions that outlive the daemon: with a Backend.StateDir, each
// session's record is a file of the daemon's own,
// STATEDIR/docker/daemon-NAME/SESSION.json (mode 0600, its directories
// 0700), written whole (a temporary file synced, then renamed) before the
// session is handed out and removed once the session's container is; what
// the session host keeps beside it (Instance.StateDir: its journal, its
// diff's first tree) is the directory SESSION.state there, removed with
// it.
// A daemon's run that stops leaves its sessions' containers running
// (Instance.Leave); its next run reconnects to them (Resume). While a run
// lives it touches the directory's heartbeat file every heartbeatEvery,
// so that the next run knows when it was last alive, for the sessions'
// idle timeouts.

// heartbeatFile is the name of a daemon's heartbeat in its directory;
// seenFile's time is the last heartbeat of the run before the one that
// holds the daemon's name now.
const (
	heartbeatFile = "alive"
	seenFile      = "seen"
)

// heartbeatEvery is how often a living run touches its heartbeat.
const heartbeatEvery = 5 * time.Second

// sessionRecord is the file of one session.
type sessionRecord struct {
	// Record is what the session host published (Instance.Publish).
	Record backend.Record `json:"record"`
	// Container, Name and Volume name the container and its workspace
	// volume; Label is its policy.LabelSession (a pooled container's is
	// its pool ID, not the session's).
	Container string `json:"container"`
	Name      string `json:"name"`
	Volume    string `json:"volume"`
	Label     string `json:"label"`
	// UID is the session uid it runs as (policy.KeepUID), or 0; Owner the
	// uid and gid its files belong to.
	UID   int    `json:"uid,omitempty"`
	Owner [2]int `json:"owner"`
	// HandoffDir is the host's side of its handoff mount, or "".
	HandoffDir string `json:"handoffDir,omitempty"`
	MaxBytes   int64  `json:"maxBytes,omitempty"`
	// Disk is the image of the workspace's own file system, or "".
	Disk string `json:"disk,omitempty"`
	// Paused says the session is paused (Instance.Pause): its container
	// stopped on purpose, which Resume keeps, stopped, rather than remove.
	Paused bool `json:"paused,omitempty"`
}

// daemonDir is the directory of the records of daemon's sessions, or ""
// without a StateDir.
func (d *Backend) daemonDir(daemon string) string {
	if d.StateDir == "" {
		return ""
	}
	return filepath.Join(d.StateDir, "docker", "daemon-"+strings.Trim(markerUnsafe.ReplaceAllString(daemon, "-"), "-."))
}

// recordName is the file of session's record in dir.
func recordName(dir, session string) (string, error) {
	if session == "" || nameUnsafe.MatchString(session) || strings.Trim(session, ".") == "" {
		return "", fmt.Errorf("docker backend: session ID %q cannot name a record", session)
	}
	return filepath.Join(dir, session+recordExt), nil
}

// Names in a daemon's directory: a session's record, and the directory
// of what its host keeps beside it (Instance.StateDir).
const (
	recordExt = ".json"
	stateExt  = ".state"
)

// stateName is the state directory of the session whose record is the
// file record.
func stateName(record string) string {
	return strings.TrimSuffix(record, recordExt) + stateExt
}

// dropRecord removes the record file name and its session's state
// directory, the record first: a state directory without a record is
// removed by the next Resume.
func dropRecord(name string) error {
	err := os.Remove(name)
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, os.RemoveAll(stateName(name)))
}

// recorder keeps one container's record: written by publish, removed by
// drop.
type recorder struct {
	dir   string
	c     *Container
	label string

	mu     sync.Mutex
	path   string // the record's file once published
	kept   bool   // the uid is kept (policy.KeepUID)
	rec    backend.Record
	paused bool // the record says the session is paused
	// state is the session's state directory once made (stateDir).
	state string
}

// stateDir makes the state directory of the container's session
// (Instance.StateDir).
func (r *recorder) stateDir(session string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name, err := recordName(r.dir, session)
	if err != nil {
		return "", err
	}
	dir := stateName(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("docker backend: the session's state directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("docker backend: the session's state directory: %w", err)
	}
	r.state = dir
	return dir, nil
}

// publish writes the record of the container's session (Instance.Publish).
func (r *recorder) publish(_ context.Context, rec backend.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.write(rec, r.paused)
}

// setPaused writes the record again, saying whether the session is
// paused; it does nothing before the record is published, or without a
// StateDir.
func (r *recorder) setPaused(paused bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dir == "" || r.path == "" {
		r.paused = paused
		return nil
	}
	return r.write(r.rec, paused)
}

// write writes rec as the record of the container's session; r.mu is held.
func (r *recorder) write(rec backend.Record, paused bool) error {
	path, err := recordName(r.dir, rec.Session)
	if err != nil {
		return err
	}
	if r.c.uid != 0 && !r.kept {
		if err := policy.KeepUID(r.c.uid); err != nil {
			return fmt.Errorf("docker backend: %w", err)
		}
		r.kept = true
	}
	data, err := json.Marshal(sessionRecord{
		Record: rec, Container: r.c.id, Name: r.c.name, Volume: r.c.volume, Label: r.label,
		UID: r.c.uid, Owner: r.c.owner, HandoffDir: r.c.handoffDir, MaxBytes: r.c.maxBytes, Disk: r.c.disk, Paused: paused,
	})
	if err != nil {
		return err
	}
	if err := writePrivate(path, data); err != nil {
		return fmt.Errorf("docker backend: the session's record: %w", err)
	}
	r.path, r.rec, r.paused = path, rec, paused
	return nil
}

// drop removes the record and the session's state directory, once the
// container is removed.
func (r *recorder) drop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if r.path != "" {
		err = dropRecord(r.path)
	}
	if r.state != "" {
		err = errors.Join(err, os.RemoveAll(r.state))
	}
	r.path, r.state = "", ""
	return err
}

// writePrivate writes data to path whole or not at all: a temporary file
// of path's directory (made 0700 with its parents), mode 0600, synced,
// renamed over path, and the directory synced.
func writePrivate(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // gone once renamed
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return err
	}
	if df, err := os.Open(dir); err == nil {
		df.Sync()
		df.Close()
	}
	return nil
}

// records reads the records of dir, by file; a record that cannot be read
// is an error of its own in errs.
func records(dir string) (recs map[string]sessionRecord, errs []error) {
	recs = map[string]sessionRecord{}
	if dir == "" {
		return recs, nil
	}
	names, err := filepath.Glob(filepath.Join(dir, "*"+recordExt))
	if err != nil {
		return recs, []error{err}
	}
	for _, name := range names {
		data, err := os.ReadFile(name)
		var rec sessionRecord
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err == nil && rec.Container == "" {
			err = errors.New("it names no container")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("docker backend: the session record %s: %w", name, err))
			continue
		}
		recs[name] = rec
	}
	return recs, errs
}

// recordedLabels are the policy.LabelSession of the containers daemon's
// records name: Reap leaves them alone, for Resume (which reports the
// records it cannot read).
func (d *Backend) recordedLabels(daemon string) map[string]bool {
	recs, _ := records(d.daemonDir(daemon))
	out := map[string]bool{}
	for _, rec := range recs {
		out[rec.Label] = true
	}
	return out
}

// heartbeat touches daemon's heartbeat file until stop, which touches it a
// last time; it does nothing without a StateDir.
func (d *Backend) heartbeat(daemon string) (stop func()) {
	dir := d.daemonDir(daemon)
	if dir == "" {
		return func() {}
	}
	name := filepath.Join(dir, heartbeatFile)
	if fi, err := os.Stat(name); err == nil { // the run before this one's last
		seen := filepath.Join(dir, seenFile)
		if writePrivate(seen, nil) == nil {
			os.Chtimes(seen, fi.ModTime(), fi.ModTime())
		}
	}
	touch := func() {
		now := time.Now()
		if os.Chtimes(name, now, now) != nil {
			writePrivate(name, nil)
		}
	}
	touch()
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				touch()
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-ended
			touch()
		})
	}
}

// lastSeen is when the run that wrote dir's records was last alive: its
// last heartbeat's time (kept as Claim began), or, without one, the
// record's.
func lastSeen(dir, record string) time.Time {
	for _, name := range []string{filepath.Join(dir, seenFile), record} {
		if fi, err := os.Stat(name); err == nil {
			return fi.ModTime()
		}
	}
	return time.Now()
}

var _ backend.Resumer = (*Backend)(nil)

// resumeParallel is how many sessions Resume reconnects to at once: each
// is a few round trips to the engine (inspect, attach, the agent's
// hello), so a restart's wait grows with the sessions divided by it, not
// with the sessions (BENCHMARKS.md, *Recovery*).
const resumeParallel = 8

// Resume reconnects to the running containers of the sessions labels'
// daemon recorded ([backend.Resumer]), each on its own uid (policy.HoldUID)
// and with its record, resumeParallel at a time. It removes, container,
// volume and record, every session whose container no longer runs, does
// not carry labels, or whose uid another session holds, and drops the
// records of containers that are gone, with their state directories
// (Instance.StateDir), and the state directories no record names. What it
// returns is the caller's, as from Open.
func (d *Backend) Resume(ctx context.Context, labels map[string]string) ([]backend.Resumed, error) {
	dir := d.daemonDir(labels[backend.LabelDaemon])
	recs, errs := records(dir)
	var (
		mu  sync.Mutex
		out []backend.Resumed
		g   errgroup.Group
	)
	g.SetLimit(resumeParallel)
	for name, rec := range recs {
		g.Go(func() error {
			c, err := d.resume(ctx, rec, labels)
			var rerr error
			if c == nil {
				rerr = dropRecord(name)
			}
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err, rerr) // nils are dropped by Join
			if c == nil {
				return nil
			}
			r := &recorder{dir: dir, c: c, label: rec.Label, path: name, kept: c.uid != 0, rec: rec.Record, paused: rec.Paused}
			if _, err := os.Stat(stateName(name)); err == nil {
				r.state = stateName(name)
			}
			got := backend.Resumed{Record: rec.Record, Seen: lastSeen(dir, name)}
			if rec.Paused {
				got.Paused = d.paused(c, r)
			} else {
				got.Instance = d.instance(c, r)
			}
			out = append(out, got)
			return nil
		})
	}
	g.Wait() // each returns nil: its errors are in errs
	return out, errors.Join(append(errs, dropStrayStates(dir))...)
}

// dropStrayStates removes the state directories of dir that no record
// names (a run that died between a record's removal and its state's).
func dropStrayStates(dir string) error {
	if dir == "" {
		return nil
	}
	names, err := filepath.Glob(filepath.Join(dir, "*"+stateExt))
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		record := strings.TrimSuffix(name, stateExt) + recordExt
		if _, err := os.Lstat(record); errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, os.RemoveAll(name))
		}
	}
	return errors.Join(errs...)
}

// resume takes back the container of rec, or removes it and returns nil.
func (d *Backend) resume(ctx context.Context, rec sessionRecord, labels map[string]string) (*Container, error) {
	c := &Container{
		cli: d.Client, id: rec.Container, name: rec.Name, volume: rec.Volume,
		owner: rec.Owner, maxBytes: rec.MaxBytes, handoffDir: rec.HandoffDir, disk: rec.Disk, q: d.queue(),
	}
	res, err := d.Client.ContainerInspect(ctx, rec.Container, client.ContainerInspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		return nil, c.removeCtx(ctx) // its volume and handoff directory
	case err != nil:
		return nil, fmt.Errorf("docker backend: the container %s of session %s: %w", rec.Name, rec.Record.Session, err)
	}
	var have map[string]string
	if res.Container.Config != nil {
		have = res.Container.Config.Labels
	}
	for k, v := range labels {
		if have[k] != v {
			// Not this daemon's: its record is dropped, the container left.
			return nil, fmt.Errorf("docker backend: the container %s of session %s is not this daemon's (label %s)", rec.Name, rec.Record.Session, k)
		}
	}
	if rec.UID != 0 {
		if err := policy.HoldUID(rec.UID); err != nil {
			return nil, errors.Join(fmt.Errorf("docker backend: session %s is not resumed: %w", rec.Record.Session, err), c.removeCtx(ctx))
		}
		c.uid = rec.UID
	}
	if rec.Paused {
		// Kept stopped, for its session's resume; one started from outside
		// meanwhile is stopped again.
		if st := res.Container.State; st != nil && (st.Running || st.Paused) {
			if err := c.stop(ctx); err != nil {
				return nil, errors.Join(fmt.Errorf("docker backend: paused session %s is not resumed: %w", rec.Record.Session, err), c.removeCtx(ctx))
			}
		}
		return c, nil
	}
	if st := res.Container.State; st == nil || !st.Running || st.Paused {
		return nil, c.removeCtx(ctx)
	}
	if err := c.connect(ctx, nil); err != nil {
		return nil, errors.Join(fmt.Errorf("docker backend: session %s is not resumed: %w", rec.Record.Session, err), c.removeCtx(ctx))
	}
	return c, nil
}

// leave ends this process's hold of the container and leaves it running
// (Instance.Leave): its agent's stream is dropped — what was in flight is
// cut, background commands run on — its handoff listener closed and its
// uid left kept (policy.LeaveUID).
func (c *Container) leave(context.Context) error {
	c.dropStream()
	if c.uid != 0 {
		c.release.Do(func() { policy.LeaveUID(c.uid) })
	}
	return nil
}

// dropStream closes this process's stream to the container's agent and its
// handoff listener.
func (c *Container) dropStream() {
	c.agent.Close()
	c.conn.Close()
	c.hmu.Lock()
	if c.handoff != nil {
		c.handoff.Close()
	}
	c.hmu.Unlock()
}
