package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/workspace"
)

// What replicas keep on a session pod (WithReplica).
const (
	// LabelReplica (label and annotation) names the replica that holds the
	// pod: the one whose agent connection is served.
	LabelReplica = "sandboxd.replica"
	// annotationEpoch counts the pod's holders: each takeover raises it by
	// one, the agent serves only a connection of a higher epoch than the
	// last, and a holder whose epoch is passed has lost the pod.
	annotationEpoch = "sandboxd.epoch"
	// annotationRecord is the session host's record (backend.Record.Data);
	// annotationCreated, annotationLifetime and annotationIdle are what
	// reaping needs of it.
	annotationRecord   = "sandboxd.record"
	annotationCreated  = "sandboxd.created"
	annotationLifetime = "sandboxd.lifetime"
	annotationIdle     = "sandboxd.idle"
	// annotationAdopted is when the holder took the pod over.
	annotationAdopted = "sandboxd.adopted"
	// labelLease marks the Leases of replicas.
	labelLease = "sandboxd.lease"
)

// Timing of a replica's Lease: renewed every replicaRenew, taken for dead
// replicaLeaseDuration after its last renewal. Every replicaReapEvery-th
// renewal also reaps what dead replicas left.
const (
	replicaLeaseDuration = 15 * time.Second
	replicaRenew         = 5 * time.Second
	replicaReapEvery     = 12
)

// WithReplica makes this daemon one replica, named name, of several that
// share the daemon's sessions (backend.Adopter); it implies WithDirect.
// Claim makes a Lease per replica, renewed while it runs; each pod names
// the replica that holds it (LabelReplica) and carries the session's
// record, so any replica can take a session over (Adopt). Reap removes
// only what no live replica holds: warm pods of dead replicas, and
// sessions of dead ones once they would have expired. The replicas must
// share the daemon name and configuration and have distinct replica names
// (the pod name of a Deployment's replica).
func WithReplica(name string) Option {
	return func(o *options) { o.replica, o.direct = name, true }
}

// Replica is the replica name (WithReplica), "" for a daemon that runs
// alone.
func (b *Backend) Replica() string { return b.o.replica }

// publish keeps the session's record on its pod, and names the session and
// tenant in its labels (a pod from a warm pool named none).
func (p *Pod) publish(ctx context.Context, rec backend.Record) error {
	ann := map[string]string{
		policy.LabelSession: rec.Session, policy.LabelTenant: rec.Tenant,
		annotationRecord: string(rec.Data), annotationCreated: rec.Created.UTC().Format(time.RFC3339Nano),
	}
	if rec.Lifetime > 0 {
		ann[annotationLifetime] = rec.Lifetime.String()
	}
	if rec.Idle > 0 {
		ann[annotationIdle] = rec.Idle.String()
	}
	patch := map[string]any{"metadata": map[string]any{
		"labels":      map[string]string{policy.LabelSession: labelValue(rec.Session), policy.LabelTenant: labelValue(rec.Tenant)},
		"annotations": ann,
	}}
	return p.b.patchPod(ctx, p.name, patch)
}

func (b *Backend) patchPod(ctx context.Context, name string, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := b.client.CoreV1().Pods(b.o.namespace).Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("kubernetes backend: annotate pod %s: %w", name, err)
	}
	return nil
}

// Adopt takes the session's pod over for this replica: it raises the pod's
// epoch and names this replica its holder in one update (which the API
// server applies only to the version read, so of replicas adopting at once
// one wins and the others read again), then connects to the agent with the
// new epoch — the agent drops the former holder's connection, whose Pod
// then reports backend.ErrMoved. want must select the session's daemon and
// tenant; a pod they do not select is not found, and so is every session
// for a daemon that is no replica.
func (b *Backend) Adopt(ctx context.Context, session string, want map[string]string) (*backend.Instance, backend.Record, error) {
	if b.o.replica == "" {
		// A daemon that runs alone holds every session of its own.
		return nil, backend.Record{}, fmt.Errorf("kubernetes backend: session %s (only a replica adopts sessions): %w", session, workspace.ErrNotFound)
	}
	sel := maps.Clone(want)
	sel[policy.LabelSession] = session
	pods := b.client.CoreV1().Pods(b.o.namespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector(sel).String()})
	if err != nil {
		return nil, backend.Record{}, fmt.Errorf("kubernetes backend: find the pod of session %s: %w", session, err)
	}
	var pod *corev1.Pod
	for i := range list.Items {
		if q := &list.Items[i]; matches(q.Annotations, sel) && q.DeletionTimestamp == nil && q.Annotations[annotationRecord] != "" {
			pod = q
		}
	}
	if pod == nil {
		return nil, backend.Record{}, fmt.Errorf("kubernetes backend: no pod of session %s: %w", session, workspace.ErrNotFound)
	}
	for attempt := 0; ; attempt++ {
		if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
			return nil, backend.Record{}, fmt.Errorf("kubernetes backend: pod %s of session %s does not run (%s): %w", pod.Name, session, describe(pod), workspace.ErrUnavailable)
		}
		epoch, _ := strconv.ParseUint(pod.Annotations[annotationEpoch], 10, 64)
		next := pod.DeepCopy()
		next.Annotations[annotationEpoch] = strconv.FormatUint(epoch+1, 10)
		next.Annotations[LabelReplica], next.Labels[LabelReplica] = b.o.replica, labelValue(b.o.replica)
		next.Annotations[annotationAdopted] = time.Now().UTC().Format(time.RFC3339Nano)
		updated, err := pods.Update(ctx, next, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && attempt < 10 {
			if pod, err = pods.Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
				return nil, backend.Record{}, fmt.Errorf("kubernetes backend: pod %s of session %s: %w", next.Name, session, err)
			}
			continue
		}
		if err != nil {
			return nil, backend.Record{}, fmt.Errorf("kubernetes backend: take pod %s over: %w", pod.Name, err)
		}
		pod = updated
		break
	}
	secret, err := b.client.CoreV1().Secrets(b.o.namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, backend.Record{}, fmt.Errorf("kubernetes backend: the agent token of pod %s: %w", pod.Name, err)
	}
	p := &Pod{b: b, name: pod.Name, ip: pod.Status.PodIP, token: string(secret.Data[secretKey])}
	p.epoch, _ = strconv.ParseUint(pod.Annotations[annotationEpoch], 10, 64)
	if err := p.connect(ctx); err != nil {
		return nil, backend.Record{}, err
	}
	return p.Instance(), recordOf(pod), nil
}

// recordOf reads the session's record from its pod.
func recordOf(pod *corev1.Pod) backend.Record {
	a := pod.Annotations
	rec := backend.Record{Session: a[policy.LabelSession], Tenant: a[policy.LabelTenant], Data: []byte(a[annotationRecord])}
	rec.Created, _ = time.Parse(time.RFC3339Nano, a[annotationCreated])
	rec.Lifetime, _ = time.ParseDuration(a[annotationLifetime])
	rec.Idle, _ = time.ParseDuration(a[annotationIdle])
	return rec
}

// replicaLeaseName is the name of the Lease of replica of daemon.
func replicaLeaseName(daemon, replica string) string {
	return dnsName(leasePrefix + daemon + "-r-" + replica)
}

// dnsName is s lowercased, what a name may not hold turned into dashes,
// cut to 63.
func dnsName(s string) string {
	s = strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(s), "-"), "-")
	if len(s) > 63 {
		s = strings.TrimRight(s[:63], "-")
	}
	return s
}

// claimReplica is Claim for a replica: it holds a Lease of the replica's
// own name, renewed every replicaRenew, and takes over one whose holder
// stopped renewing it. While the Lease is renewed, the replica is live:
// other replicas leave what it holds alone.
func (b *Backend) claimReplica(ctx context.Context, spec backend.Spec) (release func(context.Context) error, err error) {
	daemon := spec.Labels[backend.LabelDaemon]
	name := replicaLeaseName(daemon, b.o.replica)
	leases := b.client.CoordinationV1().Leases(b.o.namespace)
	labels := map[string]string{backend.LabelDaemon: daemon, policy.LabelSandboxd: "1", labelLease: "replica"}
	seconds := int32(replicaLeaseDuration / time.Second)
	var held *coordinationv1.Lease
	for attempt := 0; held == nil; attempt++ {
		if attempt == 5 {
			return nil, fmt.Errorf("kubernetes backend: the Lease %s of replica %s changed hands while it was claimed; try again", name, b.o.replica)
		}
		now := metav1.NewMicroTime(time.Now())
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: encodeLabels(labels), Annotations: maps.Clone(spec.Labels)},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &b.o.replica, LeaseDurationSeconds: &seconds,
				AcquireTime: &now, RenewTime: &now},
		}
		lease.Annotations[LabelReplica] = b.o.replica
		created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
		if err == nil {
			held = created
			break
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("kubernetes backend: creating the Lease %s of replica %s: %w", name, b.o.replica, err)
		}
		old, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes backend: the Lease %s of replica %s: %w", name, b.o.replica, err)
		}
		if leaseLive(old, time.Now()) {
			return nil, fmt.Errorf("%w: replica %q of daemon %q runs on this cluster (its Lease %s/%s was renewed at %s): "+
				"give this replica another name, or wait %s for that one's Lease to expire",
				backend.ErrDaemonRunning, b.o.replica, daemon, b.o.namespace, name, renewed(old).Format(time.RFC3339), replicaLeaseDuration)
		}
		lease.ResourceVersion = old.ResourceVersion
		updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes backend: taking over the expired Lease %s: %w", name, err)
		}
		held = updated
	}
	sel := maps.Clone(spec.Labels)
	for k := range backend.Self().Labels() {
		delete(sel, k)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		b.renew(rctx, held, sel)
	}()
	return func(ctx context.Context) error {
		cancel()
		<-stopped
		err := leases.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &held.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("kubernetes backend: deleting the Lease %s of replica %s: %w", name, b.o.replica, err)
		}
		return nil
	}, nil
}

// renew renews the replica's Lease until ctx ends, and now and then reaps
// what dead replicas of the daemon sel names left (reapReplicas). A renewal
// that fails is tried again at the next tick: the Lease lasts three ticks.
func (b *Backend) renew(ctx context.Context, held *coordinationv1.Lease, sel map[string]string) {
	leases := b.client.CoordinationV1().Leases(b.o.namespace)
	t := time.NewTicker(replicaRenew)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := held.DeepCopy()
		now := metav1.NewMicroTime(time.Now())
		next.Spec.RenewTime = &now
		updated, err := leases.Update(ctx, next, metav1.UpdateOptions{})
		switch {
		case err == nil:
			held = updated
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// Changed by someone else (an operator): renew what is there,
			// or make it anew.
			if cur, gerr := leases.Get(ctx, held.Name, metav1.GetOptions{}); gerr == nil {
				held = cur
			} else if apierrors.IsNotFound(gerr) {
				fresh := held.DeepCopy()
				fresh.ResourceVersion, fresh.UID = "", ""
				if created, cerr := leases.Create(ctx, fresh, metav1.CreateOptions{}); cerr == nil {
					held = created
				}
			}
			b.logf("kubernetes backend: renewing the Lease %s of replica %s: %v", held.Name, b.o.replica, err)
		default:
			b.logf("kubernetes backend: renewing the Lease %s of replica %s: %v", held.Name, b.o.replica, err)
		}
		if tick%replicaReapEvery == 0 {
			if n, err := b.reapReplicas(ctx, sel); err != nil {
				b.logf("kubernetes backend: reaping what dead replicas left: %v", err)
			} else if n > 0 {
				b.logf("kubernetes backend: reaped %d pods of dead replicas", n)
			}
		}
	}
}

// logf writes a line to the agents' log sink (WithStderr), if any.
func (b *Backend) logf(format string, args ...any) {
	if b.o.stderr != nil {
		fmt.Fprintf(b.o.stderr, format+"\n", args...)
	}
}

// leaseLive reports whether l was renewed within its duration at now.
func leaseLive(l *coordinationv1.Lease, now time.Time) bool {
	d := replicaLeaseDuration
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return now.Before(renewed(l).Add(d))
}

// renewed is when l was last renewed (or acquired, or made).
func renewed(l *coordinationv1.Lease) time.Time {
	switch {
	case l.Spec.RenewTime != nil:
		return l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		return l.Spec.AcquireTime.Time
	}
	return l.CreationTimestamp.Time
}

// reapReplicas removes the pods of the daemon want names that no live
// replica holds and no replica may still want: warm pods and pods that
// never got a session's record (their session never began), and sessions
// past their lifetime, or idle past their idle timeout counted from when
// their holder was last seen alive. The sessions of dead replicas that
// would not have expired yet are left for another replica to adopt. Pods
// of a daemon that runs alone (no LabelReplica) are judged by their owner,
// as Reap does.
func (b *Backend) reapReplicas(ctx context.Context, want map[string]string) (int, error) {
	leases, err := b.client.CoordinationV1().Leases(b.o.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: selector(map[string]string{backend.LabelDaemon: want[backend.LabelDaemon], labelLease: "replica"}).String(),
	})
	if err != nil {
		return 0, fmt.Errorf("kubernetes backend: the replicas' Leases: %w", err)
	}
	now := time.Now()
	seen := map[string]time.Time{} // replica → last renewal
	live := map[string]bool{b.o.replica: true}
	for i := range leases.Items {
		l := &leases.Items[i]
		r := l.Annotations[LabelReplica]
		seen[r] = renewed(l)
		live[r] = live[r] || leaseLive(l, now)
	}
	return b.deletePods(ctx, want, func(pod *corev1.Pod) bool { return orphaned(pod, live, seen, now) })
}

// orphaned reports whether pod is one that reapReplicas removes.
func orphaned(pod *corev1.Pod, live map[string]bool, seen map[string]time.Time, now time.Time) bool {
	a := pod.Annotations
	holder, ok := a[LabelReplica]
	if !ok {
		o, named := backend.OwnerOf(a)
		return !named || o.Gone()
	}
	if live[holder] {
		return false
	}
	if a[annotationRecord] == "" {
		return true
	}
	rec := recordOf(pod)
	if rec.Lifetime > 0 && now.Sub(rec.Created) >= rec.Lifetime {
		return true
	}
	if rec.Idle <= 0 {
		return false
	}
	last := rec.Created
	if t, err := time.Parse(time.RFC3339Nano, a[annotationAdopted]); err == nil && t.After(last) {
		last = t
	}
	if t := seen[holder]; t.After(last) {
		last = t
	}
	return now.Sub(last) >= rec.Idle
}
