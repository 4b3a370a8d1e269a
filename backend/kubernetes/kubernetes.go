// Package kubernetes is the sandboxd backend of Kubernetes pods: one pod per
// session, hardened as the Docker backend's containers are, its files and
// commands served by the sandboxd agent running as the pod's PID 1 and
// reached over the API server's attach stream.
//
//	cfg, err := kubernetes.LoadConfig(kubeconfig)
//	b, err := kubernetes.New(cfg, kubernetes.WithNamespace("sandboxd"), kubernetes.WithAgentImage(ref))
//	inst, err := b.Open(ctx, backend.Spec{Profile: prof, Labels: labels})
//
// A session's pod runs the session's image with:
//   - runAsNonRoot, as the profile's user or a session uid of its own
//     (policy.Profile.SessionUIDs), with fsGroup set to its gid;
//   - a read-only root file system, every capability dropped, no privilege
//     escalation, the RuntimeDefault seccomp profile (or the Localhost
//     profile WithSeccompProfile names), no service account token, no
//     service links, hostname "sandbox";
//   - /workspace and /tmp as size-limited emptyDirs (/tmp in memory, as the
//     Docker backend's tmpfs), memory and CPU limits from the profile and
//     small requests (WithRequests), the profile's runtime as the
//     RuntimeClass when it is not runc;
//   - labels naming sandboxd, the session, the tenant and what the caller's
//     labels say (the owner, the daemon), and a NetworkPolicy of the
//     namespace that denies every sandboxd pod all ingress and egress.
//
// The agent reaches any image through an init container: it runs the agent
// image (FROM scratch, the static agent binary alone; WithAgentImage) and
// copies the agent into an emptyDir that the session container mounts
// read-only at /.sandboxd-agent and runs as its PID 1. The pod keeps stdin
// open once (stdinOnce): the backend attaches to PID 1's standard input and
// output through the API server (client-go's remotecommand, WebSocket with
// a SPDY fallback) and speaks the agent protocol over it; closing the stream
// closes the agent's input, which ends the session as on Docker.
//
// What is not guaranteed: the pids limit is the kubelet's podPidsLimit, not
// the profile's; the NetworkPolicy holds only where the cluster's network
// plugin enforces NetworkPolicies; the workspace's size limit is enforced by
// the kubelet's eviction, not by the file system; the agent's stream goes
// through the container runtime's log of the container's output as well.
package kubernetes

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// Names of what the backend puts in a pod.
const (
	// ContainerAgent is the session container: the session's image, the
	// agent as its PID 1.
	ContainerAgent = "agent"
	// ContainerInstall is the init container that copies the agent in.
	ContainerInstall = "install-agent"
	// LabelPod is set on every session pod to its own name; the
	// NetworkPolicy and the backend select pods by LabelSandboxd.
	LabelPod = "sandboxd.pod"
	// NetworkPolicyName is the namespace's NetworkPolicy that denies every
	// sandboxd pod all traffic (ensured by the first Open; see
	// WithoutNetworkPolicy).
	NetworkPolicyName = "sandboxd-sessions-deny-all"
	// DefaultAgentImage is the agent image when none is configured.
	DefaultAgentImage = "localhost/sandboxd-agent:latest"
	// DefaultWorkspaceBytes bounds a session's /workspace emptyDir.
	DefaultWorkspaceBytes = 1 << 30
	// mountAgent is where the agent's emptyDir is mounted, read-only.
	mountAgent = "/.sandboxd-agent"
)

// LoadConfig returns the client configuration of a kubeconfig file, or the
// in-cluster configuration (the pod's service account) for "".
func LoadConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes backend: no kubeconfig given and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// Option configures a Backend.
type Option func(*options)

type options struct {
	namespace      string
	agentImage     string
	pullPolicy     corev1.PullPolicy
	runtimeClass   string
	seccomp        string
	workspaceBytes int64
	cpuRequest     resource.Quantity
	memRequest     resource.Quantity
	startTimeout   time.Duration
	noNetPolicy    bool
	protocol       string
	env            map[string]string
	stderr         io.Writer
	agentOptions   []agent.ClientOption
	direct         bool
	replica        string
}

// WithNamespace sets the namespace of the session pods (default "default").
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithAgentImage sets the image of the init container that copies the agent
// in: one holding the static agent binary at /sandboxd-agent (default
// DefaultAgentImage).
func WithAgentImage(ref string) Option { return func(o *options) { o.agentImage = ref } }

// WithPullPolicy sets the image pull policy of both containers (default
// IfNotPresent).
func WithPullPolicy(p corev1.PullPolicy) Option { return func(o *options) { o.pullPolicy = p } }

// WithRuntimeClass sets the RuntimeClass of every pod whose profile asks for
// no runtime other than runc (gVisor, Kata: whatever the cluster names).
func WithRuntimeClass(name string) Option { return func(o *options) { o.runtimeClass = name } }

// WithSeccompProfile makes the pods use the Localhost seccomp profile at
// path, relative to the kubelet's seccomp directory (sandboxd's own profile,
// installed on the nodes), in place of RuntimeDefault.
func WithSeccompProfile(path string) Option { return func(o *options) { o.seccomp = path } }

// WithWorkspaceBytes bounds the /workspace emptyDir (default
// DefaultWorkspaceBytes).
func WithWorkspaceBytes(n int64) Option { return func(o *options) { o.workspaceBytes = n } }

// WithRequests sets what each pod requests of a node (default 50m CPU, 64Mi
// memory); its limits are the profile's.
func WithRequests(cpu, memory resource.Quantity) Option {
	return func(o *options) { o.cpuRequest, o.memRequest = cpu, memory }
}

// WithStartTimeout bounds how long Open waits for a pod to run (default two
// minutes; the caller's context may end it sooner).
func WithStartTimeout(d time.Duration) Option { return func(o *options) { o.startTimeout = d } }

// WithoutNetworkPolicy leaves the namespace's NetworkPolicy to the operator
// entirely: the backend neither looks for it nor creates it. (Without this
// option it looks, and creates it when absent; deploy/kubernetes makes it,
// so that sandboxd needs only the right to get it.)
func WithoutNetworkPolicy() Option { return func(o *options) { o.noNetPolicy = true } }

// WithEnv adds variables to every session container's environment, which
// every command inherits.
func WithEnv(env map[string]string) Option { return func(o *options) { o.env = env } }

// WithStderr sends the agents' logs (their standard error) to w.
func WithStderr(w io.Writer) Option { return func(o *options) { o.stderr = w } }

// WithAgentOptions configure every agent client.
func WithAgentOptions(opts ...agent.ClientOption) Option {
	return func(o *options) { o.agentOptions = opts }
}

// Backend runs sessions in pods of one namespace. It is safe for concurrent
// use.
type Backend struct {
	client clientset.Interface
	config *rest.Config
	o      options

	netPolicy sync.Mutex
	netReady  bool
}

var _ backend.Adopter = (*Backend)(nil)

var _ backend.Warmer = (*Backend)(nil)

// New returns the backend of the cluster cfg reaches. It asks the cluster
// nothing until Open or Reap.
func New(cfg *rest.Config, opts ...Option) (*Backend, error) {
	o := options{
		namespace: "default", agentImage: DefaultAgentImage, pullPolicy: corev1.PullIfNotPresent,
		workspaceBytes: DefaultWorkspaceBytes, startTimeout: 2 * time.Minute,
		cpuRequest: resource.MustParse("50m"), memRequest: resource.MustParse("64Mi"),
	}
	for _, opt := range opts {
		opt(&o)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = max(cfg.QPS, 50), max(cfg.Burst, 100)
	cli, err := clientset.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: %w", err)
	}
	return &Backend{client: cli, config: cfg, o: o}, nil
}

// Client is the backend's clientset.
func (b *Backend) Client() clientset.Interface { return b.client }

// Namespace is where the backend's pods run.
func (b *Backend) Namespace() string { return b.o.namespace }

// Name returns "kubernetes".
func (*Backend) Name() string { return "kubernetes" }

// Open starts the session's pod and attaches to its agent. It refuses a
// spec.Source: a host directory of the daemon's is not where the pod runs
// (upload the files through the tar API instead).
func (b *Backend) Open(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	if spec.Source != "" {
		return nil, errors.New("kubernetes backend: a session pod starts with an empty workspace (no Source); upload files with the tar API")
	}
	p, err := b.Start(ctx, spec.Profile, spec.Labels)
	if err != nil {
		return nil, err
	}
	return p.Instance(), nil
}

// Warm starts a pod for a pool: named after a pool ID, labelled as the
// daemon's, handed to a session as it is.
func (b *Backend) Warm(ctx context.Context, spec backend.Spec) (*backend.Instance, error) {
	prof := spec.Profile
	prof.Session = "warm-" + strings.ToLower(rand.Text()[:16])
	p, err := b.Start(ctx, prof, spec.Labels)
	if err != nil {
		return nil, err
	}
	return p.Instance(), nil
}

// Reap removes the session pods of the namespace that carry labels and
// whose owner has ended (backend.Owner.Gone), or that name none: what dead
// runs left. Pods of an owner that may live, here or on another host, are
// left alone. A replica (WithReplica) reaps what no live replica holds
// instead: see reapReplicas.
func (b *Backend) Reap(ctx context.Context, want map[string]string) (int, error) {
	if len(want) == 0 {
		return 0, errors.New("kubernetes backend: Reap needs at least one label")
	}
	if b.o.replica != "" {
		return b.reapReplicas(ctx, want)
	}
	return b.deletePods(ctx, want, func(pod *corev1.Pod) bool {
		o, ok := backend.OwnerOf(pod.Annotations)
		return !ok || o.Gone()
	})
}

// deletePods deletes the pods of the namespace that carry labels want and
// that doomed picks, and reports how many it deleted.
func (b *Backend) deletePods(ctx context.Context, want map[string]string, doomed func(*corev1.Pod) bool) (int, error) {
	list, err := b.client.CoreV1().Pods(b.o.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector(want).String()})
	if err != nil {
		return 0, fmt.Errorf("kubernetes backend: reap: %w", err)
	}
	n := 0
	var errs []error
	for i := range list.Items {
		pod := &list.Items[i]
		if !matches(pod.Annotations, want) || !doomed(pod) {
			continue
		}
		err := b.client.CoreV1().Pods(b.o.namespace).Delete(ctx, pod.Name, deleteNow(pod.UID))
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("kubernetes backend: reap: %w", errors.Join(errs...))
	}
	return n, nil
}

// Pod is a running session pod and the agent client talking to its PID 1.
type Pod struct {
	b      *Backend
	name   string
	uid    int
	stream *attachStream
	agent  *agent.Client
	once   sync.Once
	err    error

	// Of a direct stream (WithDirect): the pod's address, the agent's token
	// and this client's epoch; moved is set once another replica took the
	// pod over (its epoch is above ours).
	ip    string
	token string
	epoch uint64
	moved atomic.Bool
	left  atomic.Bool // leave: Close leaves the pod to another replica
}

// Name is the pod's name.
func (p *Pod) Name() string { return p.name }

// Agent is the client of the agent in the pod: a workspace.FileSystem with
// its extensions, and a workspace.Bash.
func (p *Pod) Agent() *agent.Client { return p.agent }

// Instance is the pod as a backend.Instance.
func (p *Pod) Instance() *backend.Instance {
	inst := &backend.Instance{
		FS: p.agent, Bash: p.agent, Root: policy.WorkspaceDir, ID: p.b.o.namespace + "/" + p.name, Close: p.Close,
		Done: p.agent.Done(), Err: p.agentErr, Accept: p.agent.Accept, Listen: p.agent.Listen,
	}
	if p.b.o.replica != "" {
		inst.Publish, inst.Leave = p.publish, p.leave
	}
	return inst
}

// leave closes this replica's stream to the pod and leaves the pod, and
// its session, for another replica to take over (Backend.Adopt): a replica
// that stops, as in a rolling update, loses no session.
func (p *Pod) leave(ctx context.Context) error {
	p.left.Store(true)
	return p.Close(ctx)
}

// agentErr is why the agent's stream ended, wrapping backend.ErrMoved when
// another replica took the pod over.
func (p *Pod) agentErr() error {
	err := p.agent.Err()
	if err != nil && p.moved.Load() {
		return fmt.Errorf("%w: %w", backend.ErrMoved, err)
	}
	return err
}

// Start creates a pod for prof, labelled with prof's labels and extra,
// waits for its agent container to run, attaches to it and completes the
// agent's handshake. On failure the pod is deleted.
func (b *Backend) Start(ctx context.Context, prof policy.Profile, extra map[string]string) (*Pod, error) {
	if err := prof.Validate(); err != nil {
		return nil, err
	}
	if prof.IsRoot() || prof.Privileged || len(prof.HostMounts) > 0 || len(prof.CapAdd) > 0 || cmp.Or(prof.NetworkMode, policy.NetworkNone) != policy.NetworkNone {
		return nil, fmt.Errorf("kubernetes backend: the profile asks for root, privilege, host mounts, added capabilities or a network, "+
			"which this backend never gives a session pod (its egress goes through the daemon): %w", workspace.ErrUnavailable)
	}
	if !b.o.noNetPolicy {
		if err := b.ensureNetworkPolicy(ctx); err != nil {
			return nil, err
		}
	}
	p := &Pod{b: b, name: podName(prof.Session)}
	if prof.SessionUIDs.Count > 0 {
		var err error
		if p.uid, err = prof.SessionUIDs.Take(); err != nil {
			return nil, err
		}
		prof.User = fmt.Sprintf("%d:%d", p.uid, p.uid)
	}
	all := prof.Labels()
	maps.Copy(all, extra)
	if b.o.replica != "" {
		all[LabelReplica] = b.o.replica
	}
	pod := b.podSpec(p.name, prof, all)
	if b.o.direct {
		if err := p.directSpec(ctx, pod); err != nil {
			p.release()
			return nil, err
		}
	}
	created, err := b.client.CoreV1().Pods(b.o.namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		p.release()
		p.deleteSecret(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("kubernetes backend: create pod: %w", err)
	}
	if b.o.direct {
		if err := p.ownSecret(ctx, created); err != nil {
			p.Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	if err := p.start(ctx, created); err != nil {
		p.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return p, nil
}

func (p *Pod) start(ctx context.Context, created *corev1.Pod) error {
	wctx, cancel := context.WithTimeout(ctx, p.b.o.startTimeout)
	defer cancel()
	up, err := p.b.waitRunning(wctx, created)
	if err != nil {
		return err
	}
	if p.b.o.direct {
		p.ip = up.Status.PodIP
		return p.connect(wctx)
	}
	logTail := agent.NewLogTail(1024)
	stderr := io.MultiWriter(logTail, cmp.Or[io.Writer](p.b.o.stderr, io.Discard))
	s, err := p.b.attach(ctx, p.name, stderr)
	if err != nil {
		return err
	}
	p.stream = s
	opts := append([]agent.ClientOption{agent.WithEndExplained(p.endState), agent.WithHangup(p.kill)}, p.b.o.agentOptions...)
	ag, err := agent.NewClient(s, opts...)
	if err != nil {
		s.Close()
		return fmt.Errorf("kubernetes backend: agent in pod %s: %w%s%s", p.name, err, p.state(context.WithoutCancel(ctx)), logTail)
	}
	p.agent = ag
	return nil
}

// Close ends the session: it closes the agent's stream (the agent exits at
// the end of its input) and deletes the pod. It is safe to call more than
// once; later calls return the first's error.
//
// A pod another replica took over (its Instance's Err wraps
// backend.ErrMoved) is not deleted: Close only drops this replica's
// connection to it.
func (p *Pod) Close(ctx context.Context) error {
	p.once.Do(func() {
		if p.agent != nil {
			p.agent.Close()
		}
		if p.stream != nil {
			p.stream.Close()
		}
		if p.moved.Load() || p.left.Load() {
			p.release()
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err := p.b.client.CoreV1().Pods(p.b.o.namespace).Delete(ctx, p.name, deleteNow(""))
		if err != nil && !apierrors.IsNotFound(err) {
			p.err = fmt.Errorf("kubernetes backend: delete pod %s: %w", p.name, err)
			return
		}
		p.deleteSecret(ctx)
		p.release()
	})
	return p.err
}

// release hands the session uid back once no process runs as it: the pod
// is deleted (its processes end with it).
func (p *Pod) release() {
	if p.uid != 0 {
		policy.ReleaseUID(p.uid)
		p.uid = 0
	}
}

// kill deletes the pod of an agent that stopped answering: the agent can no
// longer enforce a command's timeout, so the cluster ends the pod. It
// returns words for the error every call of the session gives from then on.
func (p *Pod) kill() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.b.client.CoreV1().Pods(p.b.o.namespace).Delete(ctx, p.name, deleteNow("")); err != nil && !apierrors.IsNotFound(err) {
		return "deleting the pod failed: " + err.Error()
	}
	return "the pod was deleted"
}

// endState is how the pod ended, for the errors of an agent stream that
// broke: the kubelet may take a moment to report it, so it asks a few times
// while the container still looks alive.
func (p *Pod) endState() string {
	for range 10 {
		if st := p.state(context.Background()); st != "" {
			return st
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ""
}

// state describes how the pod stands, for error messages: "" while its
// agent container runs, else what ended it.
func (p *Pod) state(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pod, err := p.b.client.CoreV1().Pods(p.b.o.namespace).Get(ctx, p.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf(" (pod %s was deleted)", p.name)
	case err != nil:
		return ""
	case pod.DeletionTimestamp != nil:
		return fmt.Sprintf(" (pod %s is being deleted)", p.name)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != ContainerAgent || cs.State.Terminated == nil {
			continue
		}
		t := cs.State.Terminated
		msg := fmt.Sprintf(" (pod %s: container %s, exit code %d", p.name, strings.ToLower(t.Reason), t.ExitCode)
		if t.Reason == "OOMKilled" {
			msg += ", killed for lack of memory"
		}
		if t.Message != "" {
			msg += ": " + t.Message
		}
		return msg + ")"
	}
	return ""
}

// fatalWaiting are the reasons a container waits for that will not pass by
// themselves.
var fatalWaiting = []string{
	"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
	"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff",
}

// waitRunning watches the pod until its agent container runs, and fails as
// soon as the pod cannot get there, saying why.
func (b *Backend) waitRunning(ctx context.Context, created *corev1.Pod) (*corev1.Pod, error) {
	pods := b.client.CoreV1().Pods(b.o.namespace)
	w, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", created.Name).String(), ResourceVersion: created.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: watch pod %s: %w", created.Name, err)
	}
	defer w.Stop()
	last := created
	for {
		if done, err := running(last); done || err != nil {
			return last, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kubernetes backend: pod %s did not start (%s): %w", created.Name, describe(last), ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The watch ended (the server's timeout): look, and watch anew.
				pod, err := pods.Get(ctx, created.Name, metav1.GetOptions{})
				if err != nil {
					return nil, fmt.Errorf("kubernetes backend: pod %s: %w", created.Name, err)
				}
				last = pod
				w.Stop()
				if w, err = pods.Watch(ctx, metav1.ListOptions{
					FieldSelector: fields.OneTermEqualSelector("metadata.name", created.Name).String(), ResourceVersion: pod.ResourceVersion,
				}); err != nil {
					return nil, fmt.Errorf("kubernetes backend: watch pod %s: %w", created.Name, err)
				}
				continue
			}
			switch ev.Type {
			case watch.Deleted:
				return nil, fmt.Errorf("kubernetes backend: pod %s was deleted while it started: %w", created.Name, workspace.ErrUnavailable)
			case watch.Error:
				return nil, fmt.Errorf("kubernetes backend: watch pod %s: %v", created.Name, apierrors.FromObject(ev.Object))
			}
			if pod, ok := ev.Object.(*corev1.Pod); ok {
				last = pod
			}
		}
	}
}

// running reports whether the pod's agent container runs, or an error when
// it never will.
func running(pod *corev1.Pod) (bool, error) {
	fail := func(what string) error {
		return fmt.Errorf("kubernetes backend: pod %s cannot start: %s: %w", pod.Name, what, workspace.ErrUnavailable)
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return false, fail(describe(pod))
	}
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && slices.Contains(fatalWaiting, w.Reason) {
			return false, fail(fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message))
		}
		if t := cs.State.Terminated; t != nil && (cs.Name == ContainerAgent || t.ExitCode != 0) {
			return false, fail(fmt.Sprintf("container %s ended: %s, exit code %d %s", cs.Name, t.Reason, t.ExitCode, t.Message))
		}
		if cs.Name == ContainerAgent && cs.State.Running != nil {
			return true, nil
		}
	}
	return false, nil
}

// describe says where a pod stands, for a timeout's error.
func describe(pod *corev1.Pod) string {
	parts := []string{"phase " + string(cmp.Or(pod.Status.Phase, "unknown"))}
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			parts = append(parts, fmt.Sprintf("%s: %s", c.Type, c.Message))
		}
	}
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			parts = append(parts, fmt.Sprintf("container %s waits: %s %s", cs.Name, w.Reason, w.Message))
		}
	}
	return strings.Join(parts, "; ")
}

// ensureNetworkPolicy makes sure the namespace has the NetworkPolicy that
// denies every sandboxd pod all ingress and egress, once per backend: it
// looks first (an operator may have made it, and given sandboxd no right to
// create one), then creates it.
func (b *Backend) ensureNetworkPolicy(ctx context.Context) error {
	b.netPolicy.Lock()
	defer b.netPolicy.Unlock()
	if b.netReady {
		return nil
	}
	nps := b.client.NetworkingV1().NetworkPolicies(b.o.namespace)
	_, err := nps.Get(ctx, NetworkPolicyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = nps.Create(ctx, denyAll(), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("kubernetes backend: the NetworkPolicy %s that denies session pods all traffic: %w "+
			"(give sandboxd the right to get and create it, or create it yourself: deploy/kubernetes has it)", NetworkPolicyName, err)
	}
	b.netReady = true
	return nil
}

// denyAll is the NetworkPolicy that selects every sandboxd pod and allows
// it no traffic in or out.
func denyAll() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: NetworkPolicyName, Labels: map[string]string{policy.LabelSandboxd: "1"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{policy.LabelSandboxd: "1"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// podSpec is the pod of one session, hardened as the package documentation
// says.
func (b *Backend) podSpec(name string, prof policy.Profile, all map[string]string) *corev1.Pod {
	uid, gid := ids(prof.User)
	podLabels := encodeLabels(all)
	podLabels[LabelPod] = name
	escalation, nonRoot, readOnly, noToken, noLinks := !prof.NoNewPrivileges, true, prof.ReadonlyRootfs, false, false
	grace := int64(0)
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	if b.o.seccomp != "" {
		seccomp = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &b.o.seccomp}
	}
	hardened := func() *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsUser: &uid, RunAsGroup: &gid, RunAsNonRoot: &nonRoot,
			ReadOnlyRootFilesystem: &readOnly, AllowPrivilegeEscalation: &escalation,
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, SeccompProfile: seccomp,
		}
	}
	requests := corev1.ResourceList{corev1.ResourceCPU: b.o.cpuRequest, corev1.ResourceMemory: b.o.memRequest}
	limits := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(max(prof.NanoCPUs/1e6, 1), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(prof.MemoryBytes, resource.BinarySI),
	}
	var env []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(b.o.env)) {
		env = append(env, corev1.EnvVar{Name: k, Value: b.o.env[k]})
	}
	size := func(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.BinarySI) }
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: podLabels, Annotations: maps.Clone(all)},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &noToken,
			EnableServiceLinks:            &noLinks,
			Hostname:                      "sandbox",
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser: &uid, RunAsGroup: &gid, FSGroup: &gid, RunAsNonRoot: &nonRoot, SeccompProfile: seccomp,
			},
			Volumes: []corev1.Volume{
				{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: size(64 << 20)}}},
				{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: size(b.o.workspaceBytes)}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: size(prof.TmpfsBytes)}}},
			},
			InitContainers: []corev1.Container{{
				Name: ContainerInstall, Image: b.o.agentImage, ImagePullPolicy: b.o.pullPolicy,
				Command:         []string{"/sandboxd-agent", "install", mountAgent + "/sandboxd-agent"},
				SecurityContext: hardened(),
				Resources:       corev1.ResourceRequirements{Requests: requests, Limits: limits},
				VolumeMounts:    []corev1.VolumeMount{{Name: "agent", MountPath: mountAgent}},
			}},
			Containers: []corev1.Container{{
				Name: ContainerAgent, Image: images.Canonical(prof.Image), ImagePullPolicy: b.o.pullPolicy,
				Command:    []string{mountAgent + "/sandboxd-agent", "serve", "--root", policy.WorkspaceDir},
				WorkingDir: policy.WorkspaceDir,
				Env:        env,
				Stdin:      true, StdinOnce: true,
				SecurityContext: hardened(),
				Resources:       corev1.ResourceRequirements{Requests: requests, Limits: limits},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "agent", MountPath: mountAgent, ReadOnly: true},
					{Name: "workspace", MountPath: policy.WorkspaceDir},
					{Name: "tmp", MountPath: "/tmp"},
				},
			}},
		},
	}
	switch {
	case prof.Runtime != "" && prof.Runtime != policy.RuntimeRunc:
		pod.Spec.RuntimeClassName = &prof.Runtime
	case b.o.runtimeClass != "":
		pod.Spec.RuntimeClassName = &b.o.runtimeClass
	}
	return pod
}

// deleteNow deletes at once (no grace: the agent has ended or must end),
// only the pod of uid when it is not "".
func deleteNow(uid types.UID) metav1.DeleteOptions {
	zero := int64(0)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &zero}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	return opts
}

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// podName is "sandboxd-SESSION-RANDOM", a DNS label: the session's name
// lowercased, what a name may not hold turned into dashes, cut to 40.
func podName(session string) string {
	var b [4]byte
	rand.Read(b[:])
	s := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(session), "-"), "-")
	if len(s) > 40 {
		s = strings.TrimRight(s[:40], "-")
	}
	if s == "" {
		return "sandboxd-" + hex.EncodeToString(b[:])
	}
	return "sandboxd-" + s + "-" + hex.EncodeToString(b[:])
}

// hashPrefix starts a label value that stands for a value a label may not
// hold (too long, or with characters such as "/"): its SHA-256.
const hashPrefix = "sha256-"

// labelValue is v when a label may hold it, else hashPrefix and 40 hex
// digits of its SHA-256. The annotation of the same key keeps v itself.
func labelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 && !strings.HasPrefix(v, hashPrefix) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return hashPrefix + hex.EncodeToString(sum[:20])
}

// encodeLabels turns labels into pod labels (labelValue of each value).
func encodeLabels(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = labelValue(v)
	}
	return out
}

// selector selects the pods labelled with every label of m.
func selector(m map[string]string) labels.Selector {
	return labels.SelectorFromSet(encodeLabels(m))
}

// matches reports whether annotations hold every label of want exactly (a
// hashed label value matches the value it stands for and no other).
func matches(annotations, want map[string]string) bool {
	for k, v := range want {
		if got, ok := annotations[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ids parses "uid[:gid]"; a missing gid is the uid.
func ids(user string) (uid, gid int64) {
	u, g, ok := strings.Cut(user, ":")
	uid, _ = strconv.ParseInt(u, 10, 64)
	gid = uid
	if ok {
		gid, _ = strconv.ParseInt(g, 10, 64)
	}
	return uid, gid
}
