// Command kube is the single-node cluster of the kubernetes backend's tests in one binary: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kubelet, chosen by the name it is run
// as (build.sh links each name to it) or, as `kube NAME ARGS...`, by its first argument.
//
// One binary, not five: the five share almost all of their ~2,500 packages, so each separate binary
// repeated a link of ~100 MB, and etcd built in a module of its own compiled its gRPC, protobuf and
// OpenTelemetry dependencies a second time, at other versions. Each main below is the component's own
// (its cmd/NAME/main.go, v1.37.2; etcd's server/main.go); only the dispatch is this file's.
package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	_ "time/tzdata" // for CronJob time zones (kube-apiserver, kube-controller-manager)

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	args := os.Args
	name := filepath.Base(args[0])
	if name == "kube" && len(args) > 1 {
		name, args = args[1], args[1:]
	}
	if name == "etcd" {
		etcdmain.Main(args)
		return
	}
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kube: run as etcd or %s, not %q\n", strings.Join(slices.Sorted(maps.Keys(commands)), ", "), name)
		os.Exit(2)
	}
	os.Args = args // cobra reads os.Args[1:]
	os.Exit(cli.Run(newCommand()))
}
