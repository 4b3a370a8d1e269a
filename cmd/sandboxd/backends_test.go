package main

import (
	"os"
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/backend"
	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/backend/kubernetes"
	"github.com/sandboxd/sandboxd/backend/local"
	"github.com/sandboxd/sandboxd/backend/memory"
)

// TestBackendRegistry: backends is the one list of the backends sandboxd
// offers — one entry per package under backend/ (but the port itself), each
// named once and offered by some command — so a new backend package is
// wired here or this fails. An entry's name is its backend's Name, which
// serve looks the entry up by.
func TestBackendRegistry(t *testing.T) {
	made := map[string]backend.Backend{
		"local": &local.Backend{}, "memory": memory.Backend{}, "docker": &docker.Backend{}, "kubernetes": &kubernetes.Backend{},
	}
	dirs, err := os.ReadDir("../../backend")
	if err != nil {
		t.Fatal(err)
	}
	var packages []string
	for _, d := range dirs {
		if d.IsDir() {
			packages = append(packages, d.Name())
		}
	}
	var names []string
	for _, b := range backends {
		if slices.Contains(names, b.name) {
			t.Errorf("backend %q has two entries", b.name)
		}
		names = append(names, b.name)
		if b.serve == nil && b.session == nil {
			t.Errorf("backend %q is offered by no command", b.name)
		}
		if m, ok := made[b.name]; !ok {
			t.Errorf("backend %q: add its Backend to made, above, to check its Name", b.name)
		} else if m.Name() != b.name {
			t.Errorf("backend %q: its Backend's Name is %q", b.name, m.Name())
		}
		if !slices.Contains(packages, b.name) {
			t.Errorf("backend %q has no package backend/%s", b.name, b.name)
		}
	}
	for _, p := range packages {
		if !slices.Contains(names, p) {
			t.Errorf("the package backend/%s has no entry in backends (cmd/sandboxd/backends.go)", p)
		}
	}
}
