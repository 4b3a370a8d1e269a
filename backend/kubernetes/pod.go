package kubernetes

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

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
		Dial: p.agent.Dial,
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
