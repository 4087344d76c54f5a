// Command coredns is CoreDNS with only the plugins the single-node test cluster needs
// (scripts/k8s-node.sh): it answers cluster.local names from the Kubernetes API and nothing
// else. No `forward` plugin is compiled in, so no query ever leaves the machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// Order in which the compiled-in plugins run (a subset of CoreDNS's plugin.cfg order).
	dnsserver.Directives = []string{"bind", "errors", "log", "health", "ready", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
