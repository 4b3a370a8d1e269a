package kubernetes_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/kubernetes"
	"github.com/sandboxd/sandboxd/testharness/k8stest"
)

// manifests decodes deploy/kubernetes/sandboxd.yaml.
func manifests(t *testing.T) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile("../../deploy/kubernetes/sandboxd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("deploy/kubernetes/sandboxd.yaml: %v", err)
		}
		objs = append(objs, obj)
	}
}

// TestDeployRBAC applies the manifests' namespaces, service account, Role,
// RoleBinding and NetworkPolicies, has the API server accept every object
// of them in a dry run (dryRunApply), and runs a session as that service
// account, in the sessions namespace (Pod Security "restricted"): the Role
// is enough for everything the backend does, and the pods pass.
func TestDeployRBAC(t *testing.T) {
	admin := k8stest.Backend(t).Client()
	ctx := context.Background()
	for _, obj := range manifests(t) {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = admin.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) { // left by an earlier run: take the labels
				_, err = admin.CoreV1().Namespaces().Update(ctx, o, metav1.UpdateOptions{})
			}
		case *corev1.ServiceAccount:
			_, err = admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = admin.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *networkingv1.NetworkPolicy:
			_, err = admin.NetworkingV1().NetworkPolicies(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			continue // the daemon's own Deployment, Service and ConfigMap need its image
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%T: %v", obj, err)
		}
	}
	t.Cleanup(func() {
		for _, ns := range []string{"sandboxd", "sandboxd-sessions"} {
			admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		}
	})
	adminCfg, err := kubernetes.LoadConfig(k8stest.Kubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	dryRunApply(t, adminCfg, admin)

	tok, err := admin.CoreV1().ServiceAccounts("sandboxd").CreateToken(ctx, "sandboxd", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: adminCfg.Host, BearerToken: tok.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: adminCfg.CAData, CAFile: adminCfg.CAFile}}
	b, err := kubernetes.New(cfg, append(k8stest.Options(), kubernetes.WithNamespace("sandboxd-sessions"))...)
	if err != nil {
		t.Fatal(err)
	}
	// What the service account may not do, it may not: no pods elsewhere.
	sa, _ := clientset.NewForConfig(cfg)
	if _, err := sa.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the service account lists pods in default: %v, want Forbidden", err)
	}

	labels := k8stest.Labels()
	labels[backend.LabelDaemon] = "deploy-test"
	for k, v := range backend.Self().Labels() {
		labels[k] = v
	}
	release, err := b.Claim(ctx, backend.Spec{Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	defer release(ctx)
	if _, err := b.Reap(ctx, map[string]string{backend.LabelDaemon: "deploy-test"}); err != nil {
		t.Fatal(err)
	}
	inst, err := b.Open(ctx, backend.Spec{Profile: profile("deploy"), Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	if out := run(t, inst.Bash, "echo ok > f && cat f"); out != "ok\n" {
		t.Errorf("a command as the service account's session: %q", out)
	}

	// Replicas (the Deployment's configuration): their Leases, the direct
	// stream's Secret, the record on the pod, a takeover.
	replica := func(name string) *kubernetes.Backend {
		r, err := kubernetes.New(cfg, append(k8stest.Options(), kubernetes.WithNamespace("sandboxd-sessions"), kubernetes.WithReplica(name))...)
		if err != nil {
			t.Fatal(err)
		}
		rl := maps.Clone(labels)
		rl[backend.LabelDaemon] = "deploy-test-replicas"
		release, err := r.Claim(ctx, backend.Spec{Labels: rl})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { release(context.Background()) })
		if _, err := r.Reap(ctx, map[string]string{backend.LabelDaemon: "deploy-test-replicas"}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	one, two := replica("one"), replica("two")
	prof := profile("deploy-replicas")
	held, err := one.Open(ctx, backend.Spec{Profile: prof, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Publish(ctx, backend.Record{Session: prof.Session, Tenant: prof.Tenant, Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	run(t, held.Bash, "echo kept > f")
	taken, _, err := two.Adopt(ctx, prof.Session, k8stest.Labels())
	if err != nil {
		held.Close(ctx)
		t.Fatal(err)
	}
	defer taken.Close(ctx)
	if out := run(t, taken.Bash, "cat f"); out != "kept\n" {
		t.Errorf("after the takeover: %q", out)
	}
	<-held.Done
	if !errors.Is(held.Err(), backend.ErrMoved) {
		t.Errorf("the former holder ended with %v, want ErrMoved", held.Err())
	}
}

// dryRunApply has the API server take every object of the manifests, the
// daemon's Deployment, Service and ConfigMap too, in a server-side apply
// dry run (kubectl apply --dry-run=server): the manifests are what this
// Kubernetes accepts, nothing is changed.
func dryRunApply(t *testing.T, cfg *rest.Config, admin clientset.Interface) {
	t.Helper()
	ctx := context.Background()
	groups, err := restmapper.GetAPIGroupResources(admin.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range manifests(t) {
		gvk := obj.GetObjectKind().GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%v: %v", gvk, err)
		}
		fields, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: fields}
		var res dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			res = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		if _, err := res.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "sandboxd-deploy-test", Force: true}); err != nil {
			t.Errorf("deploy/kubernetes: %s %s/%s refused: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
	}
}
