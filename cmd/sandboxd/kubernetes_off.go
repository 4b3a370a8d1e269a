//go:build !kubernetes

package main

import (
	"errors"

	"github.com/sandboxd/sandboxd/backend"
)

// withKubernetes says this build has the kubernetes backend: not without
// -tags kubernetes, which keeps client-go (two thirds of the binary, and
// three quarters of a cold build's time) out of the binaries of those who
// do not run Kubernetes.
const withKubernetes = false

// kubernetesAbout is the backend's entry's words.
const kubernetesAbout = "hardened pods; not in this build: build sandboxd with -tags kubernetes"

// kubernetesBackend refuses: this build has no kubernetes backend.
func kubernetesBackend(*serveConfig) (backend.Backend, string, error) {
	return nil, "", errors.New("this sandboxd is built without the kubernetes backend: build it with -tags kubernetes " +
		"(CGO_ENABLED=0 go build -tags kubernetes -o bin/ ./cmd/...)")
}
