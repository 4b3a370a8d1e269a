// Package dockertest connects tests to the Docker engine through
// testcontainers-go and cleans up after them.
//
// A test that needs Docker calls Client; when the engine is unreachable the
// test is skipped on a developer's machine and fails when CI is set (CI=true),
// so a CI run never passes without having run its Docker tests. A package's
// TestMain calls Main, which disables Ryuk (TESTCONTAINERS_RYUK_DISABLED=true)
// and removes, before and after the run, every container and volume carrying
// the package's test label — also those of a run that failed or was killed.
// Start starts a session container for a test and removes it with the test.
//
// The same tests run on gVisor when EnvGVisorHost names an engine with the
// runsc runtime registered: then every client of the package is that
// engine's, and every session container it starts (Spec, Policy) runs under
// runsc. CI runs the tests of the runtime's surface a second time so.
package dockertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"

	"github.com/sandboxd/sandboxd/backend/docker"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/images/engine"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/testharness/agentbin"
)

// LabelTest marks every container and volume a test creates; its value
// (Label) names the test package and the checkout it runs from, so packages
// tested at once, and checkouts tested side by side on one engine, sweep only
// their own.
const LabelTest = "sandboxd.test"

var (
	once   sync.Once
	cli    *client.Client
	cliErr error
)

// EnvGVisorHost, when set, is the address of the engine (as DOCKER_HOST
// gives one: unix:///run/sandboxd-gvisor/docker.sock) on which the tests
// run their session containers under gVisor: Connect connects to it, and
// Runtime is runsc. .ci/gvisor.sh starts such an engine.
const EnvGVisorHost = "SANDBOXD_TEST_GVISOR_HOST"

// Runtime returns the OCI runtime the tests' session containers run
// under: policy.RuntimeRunsc when EnvGVisorHost is set, else
// policy.RuntimeRunc.
func Runtime() string {
	if os.Getenv(EnvGVisorHost) != "" {
		return policy.RuntimeRunsc
	}
	return policy.RuntimeRunc
}

// GVisor reports whether the tests run under gVisor (Runtime is runsc): a
// test names there what gVisor does differently.
func GVisor() bool { return Runtime() == policy.RuntimeRunsc }

// Policy returns p with Runtime as its default runtime, for a daemon or a
// runner.Manager a test makes: its sessions run where the test's do.
func Policy(p policy.Policy) policy.Policy {
	if GVisor() {
		p.DefaultRuntime = policy.RuntimeRunsc
	}
	return p
}

// Connect returns a client for the engine testcontainers-go finds (DOCKER_HOST,
// its configuration, or the default socket), or for EnvGVisorHost's when it
// is set, with API version negotiation on.
// The client is shared by the test binary; do not close it.
func Connect(ctx context.Context) (*client.Client, error) {
	once.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if host := os.Getenv(EnvGVisorHost); host != "" {
			cli, cliErr = client.New(client.WithHost(host))
			if cliErr != nil {
				return
			}
		} else {
			var dc *testcontainers.DockerClient
			dc, cliErr = testcontainers.NewDockerClientWithOpts(ctx)
			if cliErr != nil {
				return
			}
			cli = dc.Client
		}
		_, cliErr = cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	})
	return cli, cliErr
}

// Client returns the shared client, or ends the test: skipped when Docker is
// unreachable on a developer's machine, failed when CI is set.
func Client(tb testing.TB) *client.Client {
	tb.Helper()
	c, err := Connect(context.Background())
	if err != nil {
		Unavailable(tb, err)
	}
	return c
}

// Unavailable ends tb for a missing engine or image: Fatal under CI, Skip
// elsewhere.
func Unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf("Docker is required when CI is set: %v", err)
	}
	tb.Skipf("Docker unavailable: %v", err)
}

// Main runs a package's tests: it disables Ryuk, sweeps every container and
// volume labelled LabelTest=Label() before and after m runs, and removes the
// agent binary agentbin built. It exits with m's code, or 1 when a sweep
// fails.
func Main(m *testing.M, pkg string) {
	os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	pkgName = pkg
	testPkg = pkg + "@" + checkoutHash()
	ctx := context.Background()
	c, err := Connect(ctx)
	if err == nil {
		if err := Sweep(ctx, c, testPkg); err != nil {
			fmt.Fprintf(os.Stderr, "dockertest: %v\n", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if c != nil {
		if err := Sweep(ctx, c, testPkg); err != nil {
			fmt.Fprintf(os.Stderr, "dockertest: %v\n", err)
			code = max(code, 1)
		}
	}
	agentbin.Remove()
	os.Exit(code)
}

// pkgName is the package name Main was given, the default session name of
// a test's containers; testPkg, the value of LabelTest, adds the checkout.
var pkgName, testPkg = "unknown", "unknown"

// Label returns the value of LabelTest on this test binary's containers and
// volumes: "pkg@checkout", the checkout a short hash of the module's root.
func Label() string { return testPkg }

// Labels returns the labels that mark a test's containers and volumes.
func Labels() map[string]string { return map[string]string{LabelTest: testPkg} }

// DaemonName returns name made this checkout's: a sandboxd daemon's name
// claims its marker container on the engine, so a fixed name in a test
// would collide with the same test run from another checkout.
func DaemonName(name string) string { return name + "-" + checkoutHash() }

var checkoutHash = sync.OnceValue(checkout)

// Sweep removes, forcibly, every container and then every volume labelled
// LabelTest=label.
func Sweep(ctx context.Context, c *client.Client, label string) error {
	_, err := docker.Reap(ctx, c, map[string]string{LabelTest: label}, nil)
	return err
}

// Leftovers lists what the engine holds that f matches — containers (ID,
// state), then volumes — asked of Client(tb), never through a proxy, for
// a test's check that nothing is left.
func Leftovers(tb testing.TB, f client.Filters) []string {
	tb.Helper()
	ctx := context.Background()
	cli := Client(tb)
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		tb.Fatal(err)
	}
	vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, c := range cs.Items {
		out = append(out, "container "+strings.Join(c.Names, ",")+" "+c.ID[:12]+" "+string(c.State))
	}
	for _, v := range vs.Items {
		out = append(out, "volume "+v.Name)
	}
	return out
}

// checkout names the module root the test runs from (the nearest directory
// above the working directory holding go.mod) by a short hash of its path.
func checkout() string {
	dir, err := os.Getwd()
	if err != nil {
		return "unknown"
	}
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
	return hex.EncodeToString(sum[:4])
}

// BuildFirst is what a test without its image says to do: tests build no
// image of sandboxd's (dev takes minutes, past a test binary's timeout).
const BuildFirst = "build the images first (bin/sandboxd image build minimal dev)"

var imageRefs sync.Map // image name -> reference the engine has

// Image returns the reference of the minimal image (images.Default); see
// NamedImage.
func Image(tb testing.TB) string {
	tb.Helper()
	return NamedImage(tb, images.Default)
}

// NamedImage returns the reference of the image sandboxd defines as name
// ("minimal", "dev") once the engine is known to have it. It builds
// nothing: without the image the test fails at once, saying to build the
// images first (BuildFirst), on a developer's machine as under CI.
func NamedImage(tb testing.TB, name string) string {
	tb.Helper()
	if ref, ok := imageRefs.Load(name); ok {
		return ref.(string)
	}
	ref, err := engine.Resolve(context.Background(), Client(tb), name)
	if err != nil {
		tb.Fatalf("%s: %v", BuildFirst, err)
	}
	imageRefs.Store(name, ref)
	return ref
}

// Spec completes spec for a test: the minimal image and the default
// hardened profile unless spec names an image, Runtime unless the profile
// names another than runc, the agent from agentbin, the test labels.
func Spec(tb testing.TB, spec docker.Spec) docker.Spec {
	tb.Helper()
	if spec.Profile.Image == "" {
		img := Image(tb)
		if spec.Profile.User == "" {
			spec.Profile = policy.DefaultProfile(img)
		}
		spec.Profile.Image = img
	}
	if spec.Profile.Runtime == "" || spec.Profile.Runtime == policy.RuntimeRunc {
		spec.Profile.Runtime = Runtime()
	}
	if spec.Profile.Session == "" {
		spec.Profile.Session = pkgName
	}
	if spec.Agent == "" {
		p, err := agentbin.Path()
		if err != nil {
			tb.Fatal(err)
		}
		spec.Agent = p
	}
	spec.Labels = Labels()
	return spec
}

// Start starts a session container for a test from Spec(tb, spec). The
// container is removed when the test ends, whatever its outcome.
func Start(tb testing.TB, spec docker.Spec) *docker.Container {
	tb.Helper()
	ctr, err := docker.Start(context.Background(), Client(tb), Spec(tb, spec))
	if err != nil {
		tb.Fatalf("docker.Start: %v", err)
	}
	tb.Cleanup(func() {
		if err := ctr.Close(context.Background()); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return ctr
}
