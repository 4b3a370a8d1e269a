// Package backend is the port between the session host (package runner)
// and the places workspaces run: a [Backend] opens an [Instance] — a
// [workspace.FileSystem], a [workspace.Bash] and how to release them — for
// a [Spec], and reaps what earlier runs left, found by the labels of their
// [Owner]. Optional capabilities are interfaces a Backend may also
// implement: [Warmer] (workspaces started ahead of demand, for warm pools)
// [Claimer] (a backend several daemons share), [Adopter] (workspaces
// that outlive the daemon run that opened them, which another run — a
// replica — may take over), [Resumer] (workspaces that outlive the
// daemon's run, which its next run takes back), [Checker] (whether the
// engine answers, for readiness; [ErrUnreachable] when it does not) and
// [Remover] (removals the engine refused, retried in the background until
// they succeed).
//
// The implementations are packages of their own, so that the host imports
// none of them and a program wires the ones it offers:
//
//   - [github.com/sandboxd/sandboxd/backend/docker]: a hardened container
//     per session, served by the in-container agent;
//   - [github.com/sandboxd/sandboxd/backend/local]: a directory on the
//     host's disk, commands on the host;
//   - [github.com/sandboxd/sandboxd/backend/memory]: a tree in the daemon's
//     memory, commands in a host directory kept in step with it.
//
// A new backend (Kubernetes pods, say) is one more package implementing
// Backend, and one line where the program picks it.
package backend

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// Backend makes the workspaces sessions run in: a hardened container on
// Docker, a directory on local disk, a tree in memory. The tool layer never
// sees a backend, only the Instance's ports, so another one (Kubernetes pods,
// say) is one more implementation of this interface. Implementations must be
// safe for concurrent use.
type Backend interface {
	// Name is the backend's name as configuration spells it ("memory").
	Name() string
	// Open starts a workspace for the session spec names. On failure it
	// leaves nothing behind.
	Open(ctx context.Context, spec Spec) (*Instance, error)
	// Reap removes what earlier runs of this daemon left behind — found by
	// labels, which carry the daemon's name — and reports how many
	// workspaces it removed. A backend that keeps the owner's labels
	// (Owner) removes only what an owner that has ended left; one without
	// labels takes every run's leftovers as dead. It runs once, before the
	// first Open.
	Reap(ctx context.Context, labels map[string]string) (int, error)
}

// Claimer is a Backend that several daemons may share (a Docker engine).
// Claim makes this run the only live one of the daemon spec.Labels name
// (LabelDaemon) on it, until release: it fails with ErrDaemonRunning,
// naming the other, while another run of that daemon may live, and takes
// the place of one that has ended. The session host claims before it
// reaps, so that reaping never races a living run of its own name.
type Claimer interface {
	Backend
	Claim(ctx context.Context, spec Spec) (release func(context.Context) error, err error)
}

// Warmer is a Backend whose workspaces do not depend on the session they
// serve, so they may be started before a session asks (a warm pool) and
// handed to one later. Warm starts such a workspace for spec with
// spec.Session and spec.Tenant empty; what a session adds (its ID and
// variables) reaches commands through the tool layer, not the workspace.
type Warmer interface {
	Backend
	Warm(ctx context.Context, spec Spec) (*Instance, error)
}

// Adopter is a Backend whose workspaces live apart from the daemon (a
// cluster's pods), so that several runs of one daemon — replicas — share
// them: a session opened through one may be taken over by another, and
// outlives a run that dies. The session host keeps what it needs to adopt
// a session with its workspace (Instance.Publish) and asks Adopt for a
// session it does not hold.
type Adopter interface {
	Backend
	// Adopt takes the workspace of the session over for this run and
	// returns it with the Record last published for it. Of runs adopting at
	// once exactly one holds the workspace afterwards; the run that held it
	// before sees its Instance end with an Err wrapping ErrMoved (and its
	// Close then leaves the workspace alone). It fails wrapping
	// workspace.ErrNotFound when the backend has no such session of labels'
	// daemon.
	Adopt(ctx context.Context, session string, labels map[string]string) (*Instance, Record, error)
}

// Resumer is a Backend whose sessions' workspaces outlive the run of the
// daemon that opened them on one host (Docker containers, their records in
// the daemon's state directory): the session host keeps its record with
// the workspace (Instance.Publish) before it hands the session out, a
// stopping run leaves it (Instance.Leave), and the daemon's next run — a
// restart after a stop or a crash — resumes it.
type Resumer interface {
	Backend
	// Resume reconnects to every workspace of labels' daemon that has a
	// record and runs, and returns each with its record; one whose record
	// says it is paused (Instance.Pause) is returned paused (Resumed.Paused),
	// not started. It removes, with their records, the workspaces that no
	// longer run (a container that stopped or was removed; a paused one
	// whose container is gone) and those that cannot be taken back (their
	// uid held by another session); what it returns the caller holds, to
	// Close or Leave. It runs once, after Reap, before the first Open.
	Resume(ctx context.Context, labels map[string]string) ([]Resumed, error)
}

// Resumed is a workspace Resume took back.
type Resumed struct {
	// Instance is the running workspace; nil when it is paused.
	Instance *Instance
	// Paused is the workspace when it was paused (Instance.Pause), and
	// stays so until Paused.Resume; nil when it runs.
	Paused *Paused
	// Record is what the session host last published for it.
	Record Record
	// Seen is when the run that held the workspace was last known to be
	// alive (its last heartbeat, or when it left): the session's idle time
	// runs from then.
	Seen time.Time
}

// ImageReader is a Backend that can read a directory of an image, for
// the templates an operator declares from an image.
type ImageReader interface {
	Backend
	// ReadImage writes the tree at dir of spec.Profile.Image to w, in the
	// form of Instance.Export, from a container made of the image and never
	// started; it leaves nothing behind.
	ReadImage(ctx context.Context, spec Spec, dir string, w io.Writer) error
}

// Record is what the session host keeps with a workspace, for another run
// to adopt the session (Adopter): whose it is and the host's own account
// of it, opaque to the backend.
type Record struct {
	Session, Tenant string
	// Data is the host's encoding of the session's settings.
	Data []byte
	// Lifetime and Idle, when not zero, let a backend remove a workspace
	// whose holder has died and that nobody adopted once the session would
	// have expired: Lifetime after Created, Idle after the holder was last
	// seen alive.
	Created        time.Time
	Lifetime, Idle time.Duration
}

// ErrMoved is the Err of an Instance that another run of the daemon took
// over (Adopter): the workspace lives on, held by that run. Match it with
// errors.Is.
var ErrMoved = errors.New("the session moved to another replica of the daemon")

// Spec is what a backend needs to start one workspace.
type Spec struct {
	// Session and Tenant name the session ("" for a warm workspace).
	Session, Tenant string
	// Profile is the container isolation the operator's policy granted.
	// Backends without containers ignore it, after the policy has judged it.
	Profile policy.Profile
	// EnvAllow and InheritEnv say which host variables local commands see
	// (the tool options bashEnvAllow and bashInheritEnv, set by the operator).
	EnvAllow   []string
	InheritEnv bool
	// MaxBytes bounds the bytes a workspace held in memory may hold; 0 is
	// no bound.
	MaxBytes int64
	// Source, when set, is a host directory whose contents the workspace
	// starts with: its directories, regular files and symbolic links,
	// copied (nothing is written back). It is the operator's setting, never
	// a tenant's. A backend that cannot copy refuses it; warm workspaces
	// never have one.
	Source string
	// Labels mark everything the workspace creates as the daemon's, so that
	// Reap finds it after a crash.
	Labels map[string]string
}

// Instance is one session's workspace in a backend: its ports and how to
// release it.
type Instance struct {
	// FS is the workspace's files. Required.
	FS workspace.FileSystem
	// Bash runs commands in it; nil when the backend has no shell.
	Bash workspace.Bash
	// Root is the workspace root as commands see it ("/workspace").
	Root string
	// ID names the backend resource (a container ID, a directory) in logs.
	ID string
	// Close releases everything the instance holds. It is called once.
	Close func(ctx context.Context) error
	// Done, when not nil, is closed once the workspace is unusable — ended
	// by itself (a container killed from outside) or closed; Err then says
	// why. A warm pool never hands out such a workspace, and a session
	// whose workspace ends by itself ends with it
	// ([github.com/sandboxd/sandboxd/runner.ErrWorkspaceEnded]).
	Done <-chan struct{}
	Err  func() error
	// Accept, when not nil, waits for a program in the workspace to
	// connect to a loopback address of its own and returns that
	// connection (agent.Client.Accept): the path of the session's egress
	// proxy. It is nil where commands use the host's network (local,
	// memory), and egress is not served.
	Accept func(ctx context.Context, addr string) (net.Conn, error)
	// Dial, when not nil, connects to addr, a loopback address and port
	// of the workspace where a program listens, and returns that
	// connection (agent.Client.Dial): the way in to a server a command
	// started, carried by the workspace's agent, so the workspace needs
	// no network of its own. Nothing listening is workspace.ErrNotFound.
	// It is nil where the backend has no agent (local, memory).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Listen, when not nil, makes programs' connections to addr wait for
	// Accept from its return on (agent.Client.Listen); before it, or
	// before the first Accept where there is no Listen, they may be
	// refused. The session host calls it before the session serves a call.
	Listen func(ctx context.Context, addr string) error
	// Publish, when not nil, keeps rec with the workspace, for another run
	// of the daemon to adopt it ([Adopter]) or resume it ([Resumer]); the
	// session host calls it once the session has its workspace, before the
	// session serves a call, and again when rec changes.
	Publish func(ctx context.Context, rec Record) error
	// Export, when not nil, writes the workspace's tree to w as a tar
	// stream — names relative to the root, parents before what they hold,
	// directories, regular files and links with their permission bits —
	// taken at one moment (Docker freezes the container while the engine
	// reads it). Without it the session host reads the tree through FS
	// (snapshot.WriteTree), which does not stop commands meanwhile.
	Export func(ctx context.Context, w io.Writer) error
	// Import, when not nil, writes a tar stream of that form into the
	// workspace, before its session serves a call: its files then belong
	// to the workspace's user, with the stream's permission bits. Without
	// it the host writes them through FS (snapshot.ReadTree).
	Import func(ctx context.Context, r io.Reader) error
	// StateDir, when not nil, is a private directory of the daemon's host
	// (mode 0700, made if missing) for what the session host keeps of
	// session beside its record (Publish): its journal, its diff's first
	// tree. It lives as long as the record does — left by Leave, the same
	// directory again for the run that resumes the session ([Resumer]),
	// removed by Close — and the workspace's processes cannot reach it.
	// Nil where nothing of the host's outlives the run (a replica that
	// adopts the session has none of it).
	StateDir func(session string) (string, error)
	// Leave, when not nil, is Close for a run that stops while others of
	// its daemon go on (replicas, [Adopter]) or its next run takes the
	// session back ([Resumer]): it releases what this run holds and leaves
	// the workspace, and the session in it, for another run to adopt or
	// resume. It is called once, instead of Close.
	Leave func(ctx context.Context) error
	// Pause, when not nil, stops the workspace to give back its CPU and
	// memory, keeping its files: every process in it ends (what was in
	// flight is cut, background commands end with it) and what Publish
	// kept says it is paused, so that the daemon's next run finds it
	// paused (Resumer). On success the instance is over, as after Leave
	// (neither Close nor Leave is called), and the Paused it returns
	// brings the workspace back. On failure the workspace is still the
	// caller's: with a nil Paused, nothing was stopped and the instance
	// runs on as before; with a Paused, the workspace may have stopped (a
	// stop that failed or timed out half way) and this instance is over,
	// as on success — the Paused's Resume brings the workspace back
	// running, whether it stopped or not, and what Publish kept says it is
	// paused until then.
	Pause func(ctx context.Context) (*Paused, error)
}

// Paused is a workspace that Instance.Pause stopped: its files are kept,
// nothing runs in it and it holds no CPU or memory. Exactly one of a
// Resume that succeeds, Close and Leave ends the caller's hold of it.
type Paused struct {
	// ID and Root are the workspace's, as Instance's.
	ID, Root string
	// Resume starts the workspace again and returns it running, with the
	// files it had, as a new Instance whose Publish keeps the same record.
	// On failure the workspace stays paused: Resume may be tried again.
	Resume func(ctx context.Context) (*Instance, error)
	// Close removes the workspace, its files and its record.
	Close func(ctx context.Context) error
	// Leave, when not nil, releases what this run holds of the workspace
	// and keeps it, paused, for the daemon's next run (Resumer).
	Leave func(ctx context.Context) error
}

// Ended reports whether the workspace is unusable: Done is closed. It never
// blocks.
func (inst *Instance) Ended() bool {
	if inst.Done == nil {
		return false
	}
	select {
	case <-inst.Done:
		return true
	default:
		return false
	}
}

// ErrDaemonRunning is what Claim fails with while another run of the same
// daemon may live on the backend; match it with errors.Is.
var ErrDaemonRunning = errors.New("another run of this daemon is alive")

// LabelDaemon, on everything a daemon's backend makes, names the daemon, so
// that one daemon's reaping never touches another's workspaces.
const LabelDaemon = "sandboxd.daemon"
