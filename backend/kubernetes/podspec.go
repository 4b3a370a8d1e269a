package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
)

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
	one := "1"
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
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &noToken,
			EnableServiceLinks:           &noLinks,
			Hostname:                     "sandbox",
			// No cluster DNS: the NetworkPolicy drops its packets, so a
			// program resolving a name itself would wait out the
			// resolver's timeouts. The pod's own loopback has no server on
			// port 53, and a lookup fails at once; the egress proxy resolves
			// names for the programs that use it.
			DNSPolicy: corev1.DNSNone,
			DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"127.0.0.1"}, Options: []corev1.PodDNSConfigOption{
				{Name: "attempts", Value: &one}, {Name: "timeout", Value: &one},
			}},
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
