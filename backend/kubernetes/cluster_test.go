package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/kubernetes"
	"github.com/sandboxd/sandboxd/conformance"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/testharness/k8stest"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspace"
)

func TestMain(m *testing.M) { k8stest.Main(m) }

// profile is the hardened default profile of the minimal image.
func profile(session string) policy.Profile {
	p := policy.DefaultProfile("minimal")
	p.Session, p.Tenant = session, "test-tenant"
	return p
}

// outsideDir is the directory beside the workspace that the conformance
// kit's Outside is served from, by a second agent.
const outsideDir = "/tmp/outside"

// pool lends pods with an empty workspace to subtests and wipes them when
// they end, as dockertest's pool lends containers: a pod takes seconds to
// start, a wipe milliseconds.
type pool struct {
	b    *kubernetes.Backend
	tb   testing.TB
	free chan *loan
	slot chan struct{}
}

type loan struct {
	*kubernetes.Pod
	outside *agent.Client
}

func newPool(tb testing.TB, b *kubernetes.Backend, size int) *pool {
	p := &pool{b: b, tb: tb, free: make(chan *loan, size), slot: make(chan struct{}, size)}
	for range size {
		p.slot <- struct{}{}
	}
	return p
}

func (p *pool) get(t *testing.T) *loan {
	t.Helper()
	var l *loan
	select {
	case l = <-p.free:
	case <-p.slot:
		var err error
		if l, err = p.start(); err != nil {
			p.slot <- struct{}{} // another subtest may start one
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := l.wipe(); err != nil {
			t.Logf("closing a pod that could not be wiped: %v", err)
			l.outside.Close()
			l.Close(context.Background())
			p.slot <- struct{}{}
			return
		}
		p.free <- l
	})
	return l
}

func (p *pool) start() (*loan, error) {
	ctx := context.Background()
	pod, err := p.b.Start(ctx, profile("conformance"), k8stest.Labels())
	if err != nil {
		return nil, err
	}
	if _, err := pod.Agent().Run(ctx, workspace.Command{Argv: []string{"mkdir", "-p", outsideDir}}); err != nil {
		pod.Close(ctx)
		return nil, err
	}
	out, err := pod.AgentAt(ctx, outsideDir)
	if err != nil {
		pod.Close(ctx)
		return nil, err
	}
	p.tb.Cleanup(func() { out.Close(); pod.Close(context.Background()) })
	return &loan{Pod: pod, outside: out}, nil
}

const wipeScript = `chmod -R u+rwX /workspace ` + outsideDir + ` 2>/dev/null
find /workspace ` + outsideDir + ` -mindepth 1 -maxdepth 1 -exec rm -rf {} +
ls -A /workspace ` + outsideDir

func (l *loan) wipe() error {
	var out strings.Builder
	res, err := l.Agent().Run(context.Background(), workspace.Command{Script: wipeScript,
		Output: func(_ workspace.Stream, p []byte) { out.Write(p) }})
	if err == nil && (res.ExitCode != 0 || strings.Count(out.String(), "\n") != 3) {
		err = fmt.Errorf("wipe left: %s", out.String())
	}
	return err
}

func TestConformanceFileSystem(t *testing.T) {
	p := newPool(t, k8stest.Backend(t), 4)
	conformance.TestFileSystem(t, conformance.FileSystemHarness{
		New: func(t *testing.T) conformance.Instance {
			l := p.get(t)
			return conformance.Instance{
				FS:      l.Agent(),
				Root:    policy.WorkspaceDir,
				Outside: conformance.OutsideFS(l.outside, outsideDir),
				MakeSpecial: func(name string, typ fs.FileMode) error {
					if typ != fs.ModeNamedPipe {
						return fmt.Errorf("cannot make %v", typ)
					}
					res, err := l.Agent().Run(context.Background(), workspace.Command{Argv: []string{"mkfifo", path.Join(policy.WorkspaceDir, name)}})
					if err == nil && res.ExitCode != 0 {
						err = fmt.Errorf("mkfifo %s: exit %d", name, res.ExitCode)
					}
					return err
				},
			}
		},
		Skip: map[conformance.Capability]string{
			conformance.CapSockets:   "the minimal image has no tool that binds a Unix socket",
			conformance.CapHardlinks: "the only directory outside the workspace is on /tmp, another file system than the workspace's emptyDir",
		},
	})
}

func TestConformanceBash(t *testing.T) {
	env := map[string]string{"SANDBOXD_CONFORMANCE_VAR": "configured value", "SANDBOXD_SESSION_ID": "s-1"}
	p := newPool(t, k8stest.Backend(t, kubernetes.WithEnv(env)), 4)
	conformance.TestBash(t, conformance.BashHarness{
		New: func(t *testing.T) conformance.BashInstance {
			l := p.get(t)
			return conformance.BashInstance{Bash: l.Agent(), FS: l.Agent(), Root: policy.WorkspaceDir, Env: env}
		},
		Skip: map[conformance.Capability]string{conformance.CapDurable: "the attach stream is the agent's standard input, closed for good with the stream (stdinOnce); " +
			"background commands outlive a replica's takeover on the direct stream (TestReplicas)"},
	})
}

// run runs script in inst and returns its standard output, failing t on
// an error or a non-zero exit.
func run(t *testing.T, bash workspace.Bash, script string) string {
	t.Helper()
	var out, errOut strings.Builder
	res, err := bash.Run(context.Background(), workspace.Command{Script: script, Output: func(s workspace.Stream, p []byte) {
		if s == workspace.Stdout {
			out.Write(p)
		} else {
			errOut.Write(p)
		}
	}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%q: exit %d, %v: %s", script, res.ExitCode, err, errOut.String())
	}
	return out.String()
}

// statusField is the value of field in a /proc/PID/status text.
func statusField(status, field string) string {
	for line := range strings.Lines(status) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestHardening reads, inside a session pod, what the kernel says of the
// agent (PID 1) and of a command: no capabilities, no_new_privs, a seccomp
// filter, a session uid that is not root; and the root file system refuses
// writes.
func TestHardening(t *testing.T) {
	b := k8stest.Backend(t)
	ctx := context.Background()
	inst, err := b.Open(ctx, backend.Spec{Profile: profile("hardening"), Labels: k8stest.Labels()})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	for _, proc := range []string{"1", "self"} {
		status := run(t, inst.Bash, "cat /proc/"+proc+"/status")
		for field, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"} {
			if got := statusField(status, field); got != want {
				t.Errorf("/proc/%s/status %s = %q, want %q", proc, field, got, want)
			}
		}
		uid, _ := strconv.Atoi(strings.Fields(statusField(status, "Uid") + " x")[0])
		if !policy.DefaultSessionUIDs.Contains(uid) {
			t.Errorf("/proc/%s/status Uid = %q, want a session uid of %+v", proc, statusField(status, "Uid"), policy.DefaultSessionUIDs)
		}
	}
	if out := run(t, inst.Bash, "touch /probe 2>&1 || echo refused"); !strings.Contains(out, "refused") {
		t.Errorf("writing the root file system: %q, want it refused", out)
	}
	if out := run(t, inst.Bash, "ls /var/run/secrets/kubernetes.io 2>&1 || echo none"); !strings.Contains(out, "none") {
		t.Errorf("a service account token is mounted: %q", out)
	}
	if out := run(t, inst.Bash, "echo $PWD; df -k /tmp | tail -1"); !strings.HasPrefix(out, "/workspace\n") || !strings.Contains(out, strconv.Itoa(policy.DefaultTmpfsBytes>>10)) {
		t.Errorf("pwd and /tmp: %q, want /workspace and a /tmp of %d KiB", out, policy.DefaultTmpfsBytes>>10)
	}
}

// TestPod checks the pod a session gets, as the API server has it.
func TestPod(t *testing.T) {
	b := k8stest.Backend(t)
	ctx := context.Background()
	p, err := b.Start(ctx, profile("pod-spec"), k8stest.Labels())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	pod, err := b.Client().CoreV1().Pods(b.Namespace()).Get(ctx, p.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{policy.LabelSandboxd: "1", policy.LabelSession: "pod-spec", policy.LabelTenant: "test-tenant", k8stest.LabelTest: k8stest.Label()} {
		if pod.Labels[k] != v || pod.Annotations[k] != v {
			t.Errorf("label and annotation %s = %q, %q; want %q", k, pod.Labels[k], pod.Annotations[k], v)
		}
	}
	if s := pod.Spec; s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken || s.HostNetwork || s.HostPID {
		t.Errorf("pod spec: token %v, host network %v, host pid %v", s.AutomountServiceAccountToken, s.HostNetwork, s.HostPID)
	}
	c := pod.Spec.Containers[0]
	if c.Resources.Limits.Memory().Value() != policy.DefaultMemoryBytes || c.Resources.Limits.Cpu().MilliValue() != 1000 {
		t.Errorf("limits %v", c.Resources.Limits)
	}
	np, err := b.Client().NetworkingV1().NetworkPolicies(b.Namespace()).Get(ctx, kubernetes.NetworkPolicyName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(np.Spec.Egress) != 0 || len(np.Spec.Ingress) != 0 || len(np.Spec.PolicyTypes) != 2 || np.Spec.PodSelector.MatchLabels[policy.LabelSandboxd] != "1" {
		t.Errorf("NetworkPolicy %+v, want all ingress and egress denied to sandboxd pods", np.Spec)
	}
}

// TestKilledFromOutside: a pod deleted by someone else ends its session at
// once, and the error says so.
func TestKilledFromOutside(t *testing.T) {
	b := k8stest.Backend(t)
	ctx := context.Background()
	p, err := b.Start(ctx, profile("killed"), k8stest.Labels())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	zero := int64(0)
	if err := b.Client().CoreV1().Pods(b.Namespace()).Delete(ctx, p.Name(), metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Agent().Done():
	case <-time.After(60 * time.Second):
		t.Fatal("the session did not end when its pod was deleted")
	}
	_, err = p.Agent().Stat(ctx, ".")
	if !errors.Is(err, workspace.ErrUnavailable) {
		t.Errorf("Stat after the pod was deleted: %v, want ErrUnavailable", err)
	}
}

// TestReap: Reap deletes the pods of an owner that has ended and of none,
// and leaves those of a living owner (this process).
func TestReap(t *testing.T) {
	b := k8stest.Backend(t)
	ctx := context.Background()
	daemon := map[string]string{backend.LabelDaemon: "reap-test-" + strconv.Itoa(os.Getpid())}
	maps.Copy(daemon, k8stest.Labels())
	dead := backend.Owner{Host: backend.Self().Host, PID: 1 << 22, Start: "1"} // above pid_max: never a live process
	var wg sync.WaitGroup
	pods := make([]*kubernetes.Pod, 3)
	for i, owner := range []map[string]string{backend.Self().Labels(), dead.Labels(), nil} {
		wg.Go(func() {
			l := maps.Clone(daemon)
			maps.Copy(l, owner)
			p, err := b.Start(ctx, profile("reap"), l)
			if err != nil {
				t.Error(err)
				return
			}
			pods[i] = p
		})
	}
	wg.Wait()
	for _, p := range pods {
		if p != nil {
			defer p.Close(ctx)
		}
	}
	if t.Failed() {
		return
	}
	n, err := b.Reap(ctx, daemon)
	if err != nil || n != 2 {
		t.Fatalf("Reap = %d, %v; want 2 (the dead owner's and the ownerless)", n, err)
	}
	for i, p := range pods {
		_, err := b.Client().CoreV1().Pods(b.Namespace()).Get(ctx, p.Name(), metav1.GetOptions{})
		if alive := err == nil; alive != (i == 0) {
			t.Errorf("pod %d (%s) present after Reap: %v, want %v", i, p.Name(), alive, i == 0)
		}
	}
	if _, err := pods[0].Agent().Stat(ctx, "."); err != nil {
		t.Errorf("the living owner's session broke: %v", err)
	}
}

// TestWarm: a warm pod serves a session as any other; Open refuses a
// Source, naming what to do instead.
func TestWarm(t *testing.T) {
	b := k8stest.Backend(t)
	ctx := context.Background()
	warm, err := b.Warm(ctx, backend.Spec{Profile: profile(""), Labels: k8stest.Labels()})
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close(ctx)
	if !strings.Contains(warm.ID, "/sandboxd-warm-") {
		t.Errorf("warm pod %s is not named as a pool's", warm.ID)
	}
	if out := run(t, warm.Bash, "echo hi > f && cat f"); out != "hi\n" {
		t.Errorf("a command in the warm pod: %q", out)
	}
	if _, err := b.Open(ctx, backend.Spec{Profile: profile("source"), Source: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "tar API") {
		t.Errorf("Open with a Source: %v, want a refusal naming the tar API", err)
	}
}

// manager is a runner.Manager on the test cluster, with the test labels and
// the minimal image.
func manager(t testing.TB, opts ...runner.Option) *runner.Manager {
	t.Helper()
	b := k8stest.Backend(t)
	opts = append([]runner.Option{runner.WithLabels(k8stest.Labels()), runner.WithPolicy(policy.Policy{DefaultImage: "minimal"})}, opts...)
	m, err := runner.New(context.Background(), b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	return m
}

// ready waits until the manager's first pool holds n ready workspaces.
func ready(t testing.TB, m *runner.Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for m.Stats().Pools[0].Ready != n {
		if time.Now().After(deadline) {
			t.Fatalf("the pool holds %d ready pods, want %d", m.Stats().Pools[0].Ready, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWarmPool: through the runner, a session takes a pod of the warm pool,
// its tools work, and the pool is refilled.
func TestWarmPool(t *testing.T) {
	m := manager(t, runner.WithPool(runner.PoolConfig{Size: 2}))
	ready(t, m, 2)
	ctx := context.Background()
	s, err := m.Create(ctx, runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Grants: []string{"shell.exec"}, Always: []string{"shell"}}})
	if err != nil {
		t.Fatal(err)
	}
	if info := s.Info(); !info.Pooled || !strings.Contains(info.Workspace, "/sandboxd-warm-") || info.Backend != "kubernetes" {
		t.Errorf("session %+v, want a pooled kubernetes pod", info)
	}
	res, err := s.Call(ctx, "bash", []byte(`{"command":"echo hello > f && cat f && pwd"}`), tools.CallOptions{})
	if err != nil || res.IsError || !strings.Contains(res.Text, "hello\n/workspace") {
		t.Fatalf("bash: %v %+v", err, res)
	}
	ready(t, m, 2)
	if err := m.Delete(ctx, "acme", s.ID()); err != nil {
		t.Fatal(err)
	}
}

// TestClaim: one run of a daemon holds its Lease; a second run of that
// daemon is refused while the first lives, and takes the Lease of a run
// that has ended; release deletes it.
func TestClaim(t *testing.T) {
	b := k8stest.Backend(t)
	ctx := context.Background()
	labels := func(owner backend.Owner) map[string]string {
		l := owner.Labels()
		l[backend.LabelDaemon] = "claim-test-" + strconv.Itoa(os.Getpid())
		return l
	}
	dead := backend.Owner{Host: backend.Self().Host, PID: 1 << 22, Start: "1"}
	releaseDead, err := b.Claim(ctx, backend.Spec{Labels: labels(dead)})
	if err != nil {
		t.Fatal(err)
	}
	defer releaseDead(ctx)
	release, err := b.Claim(ctx, backend.Spec{Labels: labels(backend.Self())})
	if err != nil {
		t.Fatalf("a run after one that ended: %v", err)
	}
	if _, err := b.Claim(ctx, backend.Spec{Labels: labels(backend.Self())}); !errors.Is(err, backend.ErrDaemonRunning) {
		t.Errorf("a second live run: %v, want ErrDaemonRunning", err)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := b.Claim(ctx, backend.Spec{Labels: labels(backend.Self())})
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	again(ctx)
}
