package dockertest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/testharness/dockertest"
)

// fatalTB records the Fatalf it is given and ends the goroutine, as
// testing.T's does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestNamedImageSaysBuildFirst asks for an image the engine lacks: the test
// fails at once, saying to build the images first, and nothing is built.
func TestNamedImageSaysBuildFirst(t *testing.T) {
	cli := dockertest.Client(t)
	name := fmt.Sprintf("dtest-missing-%d", time.Now().UnixNano())
	d, err := images.Declare(images.Definition{Name: name, Builder: "busybox", Packages: []string{"busybox-static"},
		Files: []images.File{{Path: "/etc/motd", Content: name + "\n", Mode: "0644"}}})
	if err != nil {
		t.Fatal(err)
	}
	tb := &fatalTB{TB: t}
	done := make(chan string, 1)
	go func() {
		defer close(done)
		done <- dockertest.NamedImage(tb, name)
	}()
	if ref, ok := <-done; ok {
		t.Fatalf("NamedImage(%s) = %q for an image the engine lacks", name, ref)
	}
	if !strings.Contains(tb.msg, dockertest.BuildFirst) || !strings.Contains(tb.msg, d.Ref()) {
		t.Errorf("NamedImage's failure %q does not say %q and name %s", tb.msg, dockertest.BuildFirst, d.Ref())
	}
	if _, err := cli.ImageInspect(context.Background(), d.Ref()); err == nil {
		t.Errorf("%s was built", d.Ref())
	}
}
