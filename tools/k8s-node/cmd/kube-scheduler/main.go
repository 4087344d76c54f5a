// Command kube-scheduler is the upstream kube-scheduler built from the pinned k8s.io/kubernetes module, for the
// single-node test cluster of scripts/k8s-node.sh. It adds nothing: the wrapper only makes the
// build a plain, reproducible `go build` from the Go module proxy.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
