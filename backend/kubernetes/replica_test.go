package kubernetes

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
)

func fakeReplica(name string, cli *fake.Clientset) *Backend {
	return &Backend{client: cli, o: options{namespace: "ns", replica: name, direct: true}}
}

// TestClaimReplica: a replica's name is claimed once while its Lease is
// renewed, another replica claims its own, and a Lease that expired is
// taken over; release deletes it.
func TestClaimReplica(t *testing.T) {
	ctx := context.Background()
	cli := fake.NewClientset()
	spec := backend.Spec{Labels: map[string]string{backend.LabelDaemon: "d", policy.LabelSandboxd: "1"}}
	releaseA, err := fakeReplica("a", cli).Claim(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fakeReplica("a", cli).Claim(ctx, spec); !errors.Is(err, backend.ErrDaemonRunning) {
		t.Fatalf("a second run of replica a: %v", err)
	}
	releaseB, err := fakeReplica("b", cli).Claim(ctx, spec)
	if err != nil {
		t.Fatalf("replica b: %v", err)
	}
	if err := releaseB(ctx); err != nil {
		t.Fatal(err)
	}
	// Replica a dies: its Lease stops being renewed.
	leases := cli.CoordinationV1().Leases("ns")
	name := replicaLeaseName("d", "a")
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := metav1.NewMicroTime(time.Now().Add(-time.Minute))
	l.Spec.RenewTime, l.Spec.AcquireTime = &old, &old
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	releaseA2, err := fakeReplica("a", cli).Claim(ctx, spec)
	if err != nil {
		t.Fatalf("taking over an expired Lease: %v", err)
	}
	if err := releaseA2(ctx); err != nil {
		t.Fatal(err)
	}
	releaseA(ctx) // the first run's release finds its Lease gone: no error
	if list, _ := leases.List(ctx, metav1.ListOptions{}); len(list.Items) != 0 {
		t.Fatalf("left: %v", list.Items)
	}
}

// TestOrphaned: reaping takes what no live replica holds and no replica
// may adopt any more, and leaves the rest.
func TestOrphaned(t *testing.T) {
	now := time.Now()
	live := map[string]bool{"a": true}
	seen := map[string]time.Time{"dead": now.Add(-10 * time.Minute)}
	pod := func(holder string, ann ...string) *corev1.Pod {
		a := map[string]string{LabelReplica: holder}
		for i := 0; i+1 < len(ann); i += 2 {
			a[ann[i]] = ann[i+1]
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: a}}
	}
	created := now.Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"live holder", pod("a"), false},
		{"dead holder, no session (warm)", pod("dead"), true},
		{"dead holder, no expiry", pod("dead", annotationRecord, "{}", annotationCreated, created), false},
		{"dead holder, lifetime over", pod("dead", annotationRecord, "{}", annotationCreated, created, annotationLifetime, "30m"), true},
		{"dead holder, lifetime left", pod("dead", annotationRecord, "{}", annotationCreated, created, annotationLifetime, "2h"), false},
		{"dead holder, idle since last seen", pod("dead", annotationRecord, "{}", annotationCreated, created, annotationIdle, "5m"), true},
		{"dead holder, not idle long enough", pod("dead", annotationRecord, "{}", annotationCreated, created, annotationIdle, "20m"), false},
		{"no replica, no owner", &corev1.Pod{}, true},
	} {
		if got := orphaned(tt.pod, live, seen, now); got != tt.want {
			t.Errorf("%s: orphaned = %v, want %v", tt.name, got, tt.want)
		}
	}
	lease := &coordinationv1.Lease{}
	at := metav1.NewMicroTime(now.Add(-10 * time.Second))
	lease.Spec.RenewTime = &at
	if !leaseLive(lease, now) || leaseLive(lease, now.Add(10*time.Second)) {
		t.Error("leaseLive")
	}
}
