package runner_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend/memory"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/runner"
)

// TestImageNames: an image definition's name means its image in every
// setting — the policy's default, its allowed list and a session's image —
// and a refused image lists what is allowed and names the setting.
func TestImageNames(t *testing.T) {
	dev, _ := images.Lookup("dev")
	m := newManager(t, memory.Backend{}, runner.WithPolicy(policy.Policy{DefaultImage: "minimal", Images: []string{"dev"}}))
	for _, tt := range []struct {
		image string
		ok    bool
	}{
		{"", true},
		{"minimal", true},
		{images.Canonical("minimal"), true},
		{"dev", true},
		{dev.Ref(), true},
		{"alpine:latest", false},
		{"sandboxd/dev:latest", false}, // a moving tag is another image
	} {
		s, err := m.Create(context.Background(), runner.CreateRequest{Tenant: "acme", Settings: runner.Settings{Image: tt.image}})
		var denied *policy.DeniedError
		switch {
		case tt.ok && err != nil:
			t.Errorf("image %q: %v", tt.image, err)
		case !tt.ok && !errors.As(err, &denied):
			t.Errorf("image %q: %v, want a refusal", tt.image, err)
		case !tt.ok && (!strings.Contains(err.Error(), "policy.images") || !strings.Contains(err.Error(), dev.Ref())):
			t.Errorf("image %q: the refusal %q does not list the allowed images and name the setting", tt.image, err)
		}
		if s != nil {
			m.Delete(context.Background(), "acme", s.ID())
		}
	}
}
