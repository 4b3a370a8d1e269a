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
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend"
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
