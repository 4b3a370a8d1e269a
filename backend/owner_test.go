package backend_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/backend"
)

func TestOwnerGone(t *testing.T) {
	self := backend.Self()
	if self.PID <= 0 || self.Host == "" {
		t.Fatalf("Self() = %+v", self)
	}
	name, boot, hasBoot := strings.Cut(self.Host, "/")
	tests := []struct {
		name  string
		owner backend.Owner
		gone  bool
	}{
		{"this process", self, false},
		{"a process that exited", backend.Owner{Host: self.Host, PID: exitedPID(t)}, true},
		{"this PID, reused by a process that started later", backend.Owner{Host: self.Host, PID: self.PID, Start: "1"}, self.Start != ""},
		{"another host: may be alive", backend.Owner{Host: "elsewhere/" + boot, PID: 1}, false},
		{"this host in an earlier boot", backend.Owner{Host: name + "/an-earlier-boot", PID: self.PID, Start: self.Start}, hasBoot},
		{"a process this user may not signal (init)", backend.Owner{Host: self.Host, PID: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.owner.Gone(); got != tt.gone {
				t.Errorf("%+v.Gone() = %v, want %v", tt.owner, got, tt.gone)
			}
			back, ok := backend.OwnerOf(tt.owner.Labels())
			if !ok || back != tt.owner {
				t.Errorf("OwnerOf(Labels()) = %+v, %v", back, ok)
			}
		})
	}
	if _, ok := backend.OwnerOf(map[string]string{backend.LabelDaemon: "d"}); ok {
		t.Error("OwnerOf found an owner in labels that name none")
	}
}

// exitedPID is the PID of a process that has exited.
func exitedPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}
