package kubernetes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/policy"
)

// TestPodName: every session name gives a valid, distinct pod name.
func TestPodName(t *testing.T) {
	for _, session := range []string{"", "s-1", "Tenant/Session 42", strings.Repeat("x", 200), "---", "ÄÖÜ"} {
		a, b := podName(session), podName(session)
		if errs := validation.IsDNS1123Label(a); len(errs) > 0 {
			t.Errorf("podName(%q) = %q: %v", session, a, errs)
		}
		if a == b {
			t.Errorf("podName(%q) twice = %q", session, a)
		}
	}
}

// TestLabels: label values a label may not hold are hashed, distinct
// values stay distinct, and annotations select exactly.
func TestLabels(t *testing.T) {
	owner := backend.Owner{Host: "host/6b1c9a0e-1f0e-4c7e-a3b4-0d1b7d2c9e11", PID: 42, Start: "1234"}.Labels()
	enc := encodeLabels(owner)
	for k, v := range enc {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %s = %q: %v", k, v, errs)
		}
	}
	if enc[backend.LabelOwnerPID] != "42" || !strings.HasPrefix(enc[backend.LabelOwnerHost], hashPrefix) {
		t.Errorf("encoded %v", enc)
	}
	if labelValue("a/b") == labelValue("a/c") || labelValue(hashPrefix+"x") == hashPrefix+"x" {
		t.Error("distinct values share a label, or a value that looks hashed is kept")
	}
	if !matches(owner, owner) || matches(owner, map[string]string{backend.LabelOwnerHost: "host/other"}) {
		t.Error("matches")
	}
	if sel := selector(owner).String(); !strings.Contains(sel, backend.LabelOwnerPID+"=42") {
		t.Errorf("selector %s", sel)
	}
}

// TestPodSpec: the pod of the default profile is hardened as the package
// says, and a profile's runtime becomes its RuntimeClass.
func TestPodSpec(t *testing.T) {
	b, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, WithAgentImage("agent:1"), WithRuntimeClass("gvisor"))
	if err != nil {
		t.Fatal(err)
	}
	prof := policy.DefaultProfile("minimal")
	prof.User = "1000000007:1000000007"
	pod := b.podSpec("sandboxd-x", prof, map[string]string{"k": "v"})
	s := pod.Spec
	if s.DNSPolicy != corev1.DNSNone || s.DNSConfig == nil || len(s.DNSConfig.Nameservers) != 1 || s.DNSConfig.Nameservers[0] != "127.0.0.1" {
		t.Errorf("DNS %v %+v: want none but the pod's loopback, where a lookup fails at once", s.DNSPolicy, s.DNSConfig)
	}
	if *s.AutomountServiceAccountToken || *s.EnableServiceLinks || s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("token %v, service links %v, restart %v", *s.AutomountServiceAccountToken, *s.EnableServiceLinks, s.RestartPolicy)
	}
	if s.RuntimeClassName == nil || *s.RuntimeClassName != "gvisor" {
		t.Errorf("RuntimeClass %v, want the backend's gvisor", s.RuntimeClassName)
	}
	if *s.SecurityContext.RunAsUser != 1000000007 || *s.SecurityContext.FSGroup != 1000000007 || !*s.SecurityContext.RunAsNonRoot {
		t.Errorf("pod security context %+v", s.SecurityContext)
	}
	for _, c := range append(s.InitContainers, s.Containers...) {
		sc := c.SecurityContext
		if !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || !*sc.RunAsNonRoot ||
			len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container %s security context %+v", c.Name, sc)
		}
		if c.Resources.Limits.Memory().Value() != policy.DefaultMemoryBytes {
			t.Errorf("container %s memory limit %v", c.Name, c.Resources.Limits.Memory())
		}
	}
	agent := s.Containers[0]
	if !agent.Stdin || !agent.StdinOnce || agent.TTY || agent.Command[0] != mountAgent+"/sandboxd-agent" {
		t.Errorf("agent container: stdin %v once %v tty %v command %v", agent.Stdin, agent.StdinOnce, agent.TTY, agent.Command)
	}
	if !strings.HasPrefix(agent.Image, "sandboxd/minimal:") || s.InitContainers[0].Image != "agent:1" {
		t.Errorf("images %s, %s", agent.Image, s.InitContainers[0].Image)
	}
	for _, v := range s.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil {
			t.Errorf("volume %s is not a size-limited emptyDir", v.Name)
		}
		if v.Name == "tmp" && (v.EmptyDir.Medium != corev1.StorageMediumMemory || v.EmptyDir.SizeLimit.Value() != policy.DefaultTmpfsBytes) {
			t.Errorf("/tmp %+v", v.EmptyDir)
		}
	}
	prof.Runtime = "kata"
	if pod := b.podSpec("sandboxd-x", prof, nil); *pod.Spec.RuntimeClassName != "kata" {
		t.Errorf("RuntimeClass %v, want the profile's kata", *pod.Spec.RuntimeClassName)
	}
	if pod.Labels[LabelPod] != "sandboxd-x" || pod.Labels["k"] != "v" || pod.Annotations["k"] != "v" {
		t.Errorf("labels %v annotations %v", pod.Labels, pod.Annotations)
	}
}
