//go:build kubernetes

package main

import (
	"cmp"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/kubernetes"
	"github.com/sandboxd/sandboxd/images"
)

// The kubernetes backend links client-go, which is most of the binary and
// of its build: it is in a build of sandboxd made with -tags kubernetes
// (BENCHMARKS.md, "First run"). This file is its entry's half in such a
// build; kubernetes_off.go is the other builds'.

// withKubernetes says this build has the kubernetes backend.
const withKubernetes = true

// kubernetesAbout is the backend's entry's words.
const kubernetesAbout = "hardened pods, as the configuration's kubernetes key says"

// kubernetesBackend is the kubernetes backend the configuration describes.
// It asks the cluster nothing yet: the images must be where its nodes find
// them, which only the first pod tells.
func kubernetesBackend(cfg *serveConfig) (backend.Backend, string, error) {
	k := cfg.Kubernetes
	rc, err := kubernetes.LoadConfig(k.Kubeconfig)
	if err != nil {
		return nil, "", err
	}
	opts := []kubernetes.Option{kubernetes.WithRuntimeClass(k.RuntimeClass), kubernetes.WithWorkspaceBytes(cmp.Or(cfg.Limits.WorkspaceBytes, defaultWorkspaceBytes))}
	if k.Namespace != "" {
		opts = append(opts, kubernetes.WithNamespace(k.Namespace))
	}
	if k.AgentImage != "" {
		opts = append(opts, kubernetes.WithAgentImage(k.AgentImage))
	}
	switch k.Stream {
	case "", "attach":
	case "direct":
		opts = append(opts, kubernetes.WithDirect())
	default:
		return nil, "", usagef("kubernetes.stream is %q: it is attach or direct", k.Stream)
	}
	if k.Replica != "" {
		opts = append(opts, kubernetes.WithReplica(k.Replica))
	}
	b, err := kubernetes.New(rc, opts...)
	if err != nil {
		return nil, "", err
	}
	return b, images.Canonical(cmp.Or(cfg.Policy.DefaultImage, cfg.Image, images.Default)), nil
}
