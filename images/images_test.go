package images_test

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/images"
)

func TestDefinitions(t *testing.T) {
	defs, err := images.Definitions()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range defs {
		if strings.HasPrefix(d.Name, "itest-") {
			continue // declared by TestDeclare
		}
		names = append(names, d.Name)
		if len(d.Hash()) != 64 || !strings.HasPrefix(d.Ref(), "sandboxd/"+d.Name+":"+d.Hash()[:12]) {
			t.Errorf("%s: hash %q ref %q", d.Name, d.Hash(), d.Ref())
		}
		if d.User.UID == 0 || len(d.Packages) == 0 || d.Suite == "" {
			t.Errorf("%s: incomplete definition %+v", d.Name, d)
		}
	}
	if strings.Join(names, ",") != "dev,minimal" {
		t.Errorf("definitions %v, want dev and minimal", names)
	}
	again, _ := images.Lookup("minimal")
	if first, _ := images.Lookup("minimal"); again.Hash() != first.Hash() {
		t.Error("hash is not stable")
	}
	for _, bad := range []string{"nope", "../defs/minimal", ""} {
		if _, err := images.Lookup(bad); err == nil || !strings.Contains(err.Error(), "minimal") {
			t.Errorf("Lookup(%q) = %v, want an error listing the known images", bad, err)
		}
	}
}
