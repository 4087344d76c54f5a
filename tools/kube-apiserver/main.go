// Command kube-apiserver is the upstream API server built from the pinned k8s.io/kubernetes
// module, for the KRaftKeeper test environment (scripts/k8s-testenv.sh). It adds nothing:
// the point of the wrapper is a reproducible `go build` from the Go module proxy.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	os.Exit(cli.Run(command))
}
