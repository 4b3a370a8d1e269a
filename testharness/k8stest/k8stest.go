// Package k8stest connects tests to the Kubernetes cluster that
// SANDBOXD_KUBECONFIG names (.ci/k8s/up.sh starts one and writes the
// variables) and cleans up after them.
//
// A test that needs the cluster calls Backend; when no kubeconfig is given
// the test is skipped on a developer's machine and fails when CI is set
// (CI=true), so a CI run never passes without having run its Kubernetes
// tests. A package's TestMain calls Main, which deletes, before and after the
// run, every pod carrying the checkout's test label — also those of a run that
// failed or was killed.
package k8stest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sandboxd/sandboxd/backend/kubernetes"
)

// The variables that point the tests at a cluster.
const (
	// EnvKubeconfig is the kubeconfig file of the test cluster.
	EnvKubeconfig = "SANDBOXD_KUBECONFIG"
	// EnvAgentImage is the agent image imported into the cluster's runtime.
	EnvAgentImage = "SANDBOXD_K8S_AGENT_IMAGE"
	// EnvNamespace is the namespace of the test pods ("default" when unset).
	EnvNamespace = "SANDBOXD_K8S_NAMESPACE"
)

// LabelTest marks every pod a test creates; its value (Label) names the
// checkout the tests run from, so checkouts tested side by side on one
// cluster sweep only their own.
const LabelTest = "sandboxd.test"

// Label is the test label's value for this checkout: a hash of the
// directory that holds go.mod above the test's working directory.
func Label() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			dir = d
			break
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	sum := sha256.Sum256([]byte(dir))
	return "k8s-" + hex.EncodeToString(sum[:6])
}

// Labels are the labels a test gives what it starts.
func Labels() map[string]string { return map[string]string{LabelTest: Label()} }

// Unavailable ends tb for a missing cluster: Fatal under CI, Skip elsewhere.
func Unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf("a Kubernetes cluster is required when CI is set (%s, from .ci/k8s/up.sh): %v", EnvKubeconfig, err)
	}
	tb.Skipf("no Kubernetes cluster: %v", err)
}

// Kubeconfig is the test cluster's kubeconfig, or ends tb (Unavailable).
func Kubeconfig(tb testing.TB) string {
	tb.Helper()
	path := os.Getenv(EnvKubeconfig)
	if path == "" {
		Unavailable(tb, fmt.Errorf("%s is not set", EnvKubeconfig))
	}
	return path
}

// Options are the backend options of the test cluster: its namespace and
// agent image.
func Options() []kubernetes.Option {
	opts := []kubernetes.Option{kubernetes.WithNamespace(Namespace())}
	if img := os.Getenv(EnvAgentImage); img != "" {
		opts = append(opts, kubernetes.WithAgentImage(img))
	}
	return opts
}

// Namespace is the namespace of the test pods.
func Namespace() string {
	if ns := os.Getenv(EnvNamespace); ns != "" {
		return ns
	}
	return "default"
}

// Backend returns a backend of the test cluster with Options and opts, or
// ends tb (Unavailable).
func Backend(tb testing.TB, opts ...kubernetes.Option) *kubernetes.Backend {
	tb.Helper()
	cfg, err := kubernetes.LoadConfig(Kubeconfig(tb))
	if err != nil {
		Unavailable(tb, err)
	}
	b, err := kubernetes.New(cfg, append(Options(), opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Main runs the package's tests between two sweeps of the checkout's test
// pods, and exits with their status.
func Main(m *testing.M) {
	sweep()
	code := m.Run()
	sweep()
	os.Exit(code)
}

// sweep deletes the pods carrying this checkout's test label.
func sweep() {
	path := os.Getenv(EnvKubeconfig)
	if path == "" {
		return
	}
	cfg, err := kubernetes.LoadConfig(path)
	if err != nil {
		return
	}
	b, err := kubernetes.New(cfg, Options()...)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	zero := int64(0)
	b.Client().CoreV1().Pods(b.Namespace()).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: labels.SelectorFromSet(Labels()).String()})
}
