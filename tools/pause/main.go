// Command pause is the pod sandbox process of the single-node test cluster (scripts/k8s-node.sh):
// it holds the pod's namespaces, reaps the zombies it inherits as the pod's PID 1, and exits on
// SIGINT or SIGTERM. It is built as a static binary and packed into a one-file image, because no
// registry is reachable to pull the usual sandbox image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			// Reap every exited child; as PID 1 of a shared PID namespace nobody else will.
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
