package kubernetes_test

import (
	"cmp"
	"context"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/kubernetes"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/k8stest"
	"github.com/sandboxd/sandboxd/workspace"
)

// The benchmarks run on the cluster SANDBOXD_KUBECONFIG names (.ci/k8s/up.sh)
// and report the median and 99th percentile besides Go's mean:
//
//	go test ./backend/kubernetes -run '^$' -bench . -benchtime 20x
//
// ColdSession is Backend.Start plus a first command against its floor,
// BarePod: a pod of the agent image alone created and watched until its
// container runs. RoundTrip is one Stat on an open session's stream, over
// WebSocket and over SPDY.

// percentiles reports the p50 and p99 of durs on b's line.
func percentiles(b *testing.B, durs []time.Duration) {
	slices.Sort(durs)
	at := func(p float64) float64 { return float64(durs[int(p*float64(len(durs)-1))].Microseconds()) }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

func BenchmarkColdSession(b *testing.B) {
	k := k8stest.Backend(b)
	ctx := context.Background()
	var durs []time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := k.Start(ctx, profile("bench"), k8stest.Labels())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Agent().Run(ctx, workspace.Command{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(t0))
		b.StopTimer()
		p.Close(ctx)
		b.StartTimer()
	}
	percentiles(b, durs)
}

func BenchmarkBarePod(b *testing.B) {
	k := k8stest.Backend(b)
	ctx := context.Background()
	pods := k.Client().CoreV1().Pods(k.Namespace())
	image := cmp.Or(os.Getenv(k8stest.EnvAgentImage), kubernetes.DefaultAgentImage)
	var durs []time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "sandboxd-bare-", Labels: k8stest.Labels()},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "c", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"/sandboxd-agent", "serve", "--root", "/"}, Stdin: true, StdinOnce: true}},
			},
		}
		created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", created.Name).String(), ResourceVersion: created.ResourceVersion})
		if err != nil {
			b.Fatal(err)
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil {
				break
			}
		}
		w.Stop()
		durs = append(durs, time.Since(t0))
		b.StopTimer()
		zero := int64(0)
		pods.Delete(ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		b.StartTimer()
	}
	percentiles(b, durs)
}

func BenchmarkRoundTrip(b *testing.B) {
	for _, proto := range []string{kubernetes.StreamWebSocket, kubernetes.StreamSPDY, "direct"} {
		b.Run(proto, func(b *testing.B) {
			opt := kubernetes.WithStreamProtocol(proto)
			if proto == "direct" {
				opt = kubernetes.WithDirect()
			}
			k := k8stest.Backend(b, opt)
			ctx := context.Background()
			p, err := k.Start(ctx, profile("bench"), k8stest.Labels())
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(ctx)
			var durs []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := p.Agent().Stat(ctx, "."); err != nil {
					b.Fatal(err)
				}
				durs = append(durs, time.Since(t0))
			}
			percentiles(b, durs)
		})
	}
}

// BenchmarkWarmClaim: a session created from a warm pool (4 pods kept
// ready), through the runner, up to its first command; the pool refills
// between iterations, outside the timer.
func BenchmarkWarmClaim(b *testing.B) {
	m := manager(b, runner.WithPool(runner.PoolConfig{Size: 4}))
	ctx := context.Background()
	var durs []time.Duration
	for b.Loop() {
		b.StopTimer()
		ready(b, m, 4)
		b.StartTimer()
		t0 := time.Now()
		s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme"})
		if err != nil {
			b.Fatal(err)
		}
		if !s.Info().Pooled {
			b.Fatal("the session did not come from the pool")
		}
		durs = append(durs, time.Since(t0))
		b.StopTimer()
		m.Delete(ctx, "acme", s.ID())
		b.StartTimer()
	}
	percentiles(b, durs)
}

// BenchmarkConcurrentSessions starts 50 sessions at once (requests of 10m
// CPU each, so that they fit a 2-core node), has each run a command while
// all are alive, and ends them; errors must be 0. Run it with -benchtime 1x.
func BenchmarkConcurrentSessions(b *testing.B) {
	const sessions = 50
	k := k8stest.Backend(b, kubernetes.WithRequests(resource.MustParse("10m"), resource.MustParse("32Mi")))
	ctx := context.Background()
	var failed atomic.Int64
	var starting, calling time.Duration
	for b.Loop() {
		pods := make([]*kubernetes.Pod, sessions)
		t0 := time.Now()
		var wg sync.WaitGroup
		for i := range pods {
			wg.Go(func() {
				p, err := k.Start(ctx, profile("concurrent"), k8stest.Labels())
				if err != nil {
					failed.Add(1)
					b.Error(err)
					return
				}
				pods[i] = p
			})
		}
		wg.Wait()
		starting += time.Since(t0)
		t0 = time.Now()
		for _, p := range pods {
			if p == nil {
				continue
			}
			wg.Go(func() {
				res, err := p.Agent().Run(ctx, workspace.Command{Script: "echo x > f && cat f"})
				if err != nil || res.ExitCode != 0 {
					failed.Add(1)
					b.Errorf("%s: exit %d, %v", p.Name(), res.ExitCode, err)
				}
			})
		}
		wg.Wait()
		calling += time.Since(t0)
		for _, p := range pods {
			if p != nil {
				wg.Go(func() { p.Close(ctx) })
			}
		}
		wg.Wait()
	}
	b.ReportMetric(float64(failed.Load()), "errors")
	b.ReportMetric(starting.Seconds()/float64(b.N), "start-s")
	b.ReportMetric(calling.Seconds()/float64(b.N), "calls-s")
}

// BenchmarkTakeover: two replicas take one session's pod from each other in
// turn (Backend.Adopt: the pod's update, the token, a new agent
// connection), up to a first Stat through the new holder.
func BenchmarkTakeover(b *testing.B) {
	ctx := context.Background()
	one := k8stest.Backend(b, kubernetes.WithReplica("bench-one"))
	two := k8stest.Backend(b, kubernetes.WithReplica("bench-two"))
	prof := profile("bench-takeover")
	p, err := one.Start(ctx, prof, k8stest.Labels())
	if err != nil {
		b.Fatal(err)
	}
	inst := p.Instance()
	defer func() { inst.Close(ctx) }()
	rec := backend.Record{Session: prof.Session, Tenant: prof.Tenant, Data: []byte("{}"), Created: time.Now()}
	if err := inst.Publish(ctx, rec); err != nil {
		b.Fatal(err)
	}
	replicas := []*kubernetes.Backend{two, one}
	var durs []time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		next, _, err := replicas[i%2].Adopt(ctx, prof.Session, k8stest.Labels())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := next.FS.Stat(ctx, "."); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(t0))
		inst = next
	}
	percentiles(b, durs)
}
