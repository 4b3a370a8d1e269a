package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/backend"
)

var _ backend.Claimer = (*Backend)(nil)

// leasePrefix starts the name of a daemon's Lease (Claim).
const leasePrefix = "sandboxd-daemon-"

// Claim makes this run the only live one of its daemon (spec.Labels'
// backend.LabelDaemon) in the namespace: it creates a Lease named after the
// daemon (coordination.k8s.io), held by this process and carrying
// spec.Labels, owner included, as annotations. The API server refuses a
// second Lease of a name, so of two runs only one holds it. A Lease whose
// owner has ended (backend.Owner.Gone) is deleted, by its UID, and taken.
// While its owner may live, Claim fails with backend.ErrDaemonRunning naming
// it. release deletes the Lease. (The Lease is not renewed: an owner on
// another host is never taken for gone, as on Docker.)
//
// A replica (WithReplica) claims its own name instead: see claimReplica.
func (b *Backend) Claim(ctx context.Context, spec backend.Spec) (release func(context.Context) error, err error) {
	if b.o.replica != "" {
		return b.claimReplica(ctx, spec)
	}
	daemon := spec.Labels[backend.LabelDaemon]
	name := strings.TrimRight(leasePrefix+strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(daemon), "-"), "-"), "-")
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	leases := b.client.CoordinationV1().Leases(b.o.namespace)
	holder := backend.Self().String()
	for range 3 {
		now := metav1.NewMicroTime(time.Now())
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: encodeLabels(spec.Labels), Annotations: maps.Clone(spec.Labels)},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: &now},
		}
		created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
		if err == nil {
			return func(ctx context.Context) error {
				err := leases.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &created.UID}})
				if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					return fmt.Errorf("kubernetes backend: deleting the daemon's Lease %s: %w", name, err)
				}
				return nil
			}, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("kubernetes backend: creating the daemon's Lease %s: %w", name, err)
		}
		held, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // its holder just released it
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes backend: the daemon's Lease %s: %w", name, err)
		}
		owner, ok := backend.OwnerOf(held.Annotations)
		if ok && owner.Gone() {
			// By UID: a run that took the name meanwhile keeps it.
			err := leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &held.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return nil, fmt.Errorf("kubernetes backend: deleting the Lease %s of an ended run: %w", name, err)
			}
			continue
		}
		who := "a run that names no owner"
		if ok {
			who = owner.String()
		}
		return nil, fmt.Errorf("%w: daemon %q runs on this cluster (%s, since %s; its Lease is %s/%s): stop it, or give this daemon "+
			"another name (\"daemon\" in the configuration); once that daemon is gone for sure, delete its Lease",
			backend.ErrDaemonRunning, daemon, who, held.CreationTimestamp.Format(time.RFC3339), b.o.namespace, name)
	}
	return nil, fmt.Errorf("kubernetes backend: the daemon's Lease %s changed hands while it was claimed; try again", name)
}
