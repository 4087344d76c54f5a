// Command cert-manager-controller runs the part of cert-manager's controller that a CA Issuer
// needs: the Issuer and ClusterIssuer controllers (a CA issuer is Ready once its key pair Secret
// is valid), the CertificateRequest approver and CA signer, and the Certificate controllers
// (trigger, key manager, request manager, issuing, readiness, revision manager). The controllers are the
// published packages of the github.com/cert-manager/cert-manager module; cert-manager's own
// command lives in a separate module that the Go module proxy does not serve, so this file does
// the wiring that command does: build the controller context from a kubeconfig, construct each
// registered controller, start the shared informers, run every controller until a signal.
//
// Built and cached by scripts/cert-manager.sh; used by the end-to-end tests on the single-node
// cluster (tests/kubelet) to issue and renew the quorum's certificates for `spec.tls.certManager`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	// Each import registers its controller(s) with controllerpkg in an init function.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	namespace := flag.String("namespace", "", "watch only this namespace (default: all)")
	clusterNS := flag.String("cluster-resource-namespace", "cert-manager",
		"namespace of ClusterIssuers' Secrets")
	workers := flag.Int("workers", 2, "workers per controller")
	flag.Parse()
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "cert-manager-controller: --kubeconfig (or KUBECONFIG) is required")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log.WithName("cert-manager-controller"))

	opts := controllerpkg.ContextOptions{Kubeconfig: *kubeconfig, Namespace: *namespace}
	opts.KubernetesAPIQPS = 20
	opts.KubernetesAPIBurst = 50
	opts.ClusterResourceNamespace = *clusterNS
	factory, err := controllerpkg.NewContextFactory(ctx, opts)
	if err != nil {
		fail("building the controller context", err)
	}

	known := controllerpkg.Known()
	names := make([]string, 0, len(known))
	for name := range known {
		names = append(names, name)
	}
	sort.Strings(names)
	controllers := make(map[string]controllerpkg.Interface, len(names))
	for _, name := range names {
		c, err := known[name](factory)
		if err != nil {
			fail("constructing controller "+name, err)
		}
		controllers[name] = c
	}

	// The informers the controllers asked for while being constructed; start them only now.
	shared, err := factory.Build()
	if err != nil {
		fail("building the shared context", err)
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	fmt.Fprintf(os.Stderr, "cert-manager-controller: running %v\n", names)
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func(name string, c controllerpkg.Interface) {
			defer wg.Done()
			if err := c.Run(*workers, ctx); err != nil {
				fmt.Fprintf(os.Stderr, "cert-manager-controller: %s: %v\n", name, err)
				stop()
			}
		}(name, controllers[name])
	}
	wg.Wait()
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "cert-manager-controller: %s: %v\n", what, err)
	os.Exit(1)
}
