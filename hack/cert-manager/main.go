// Command cert-manager runs cert-manager's controller and cainjector, built
// from the public packages of github.com/cert-manager/cert-manager.
//
// Why this exists: cert-manager's cmd/controller and cmd/cainjector are
// separate Go modules that the Go module proxy does not serve, so with only
// the proxy we cannot `go install` them. Their packages (pkg/controller,
// pkg/controller/cainjector, pkg/issuer/...) are in the main module, which
// the proxy does serve; this is the small main that wires them the way
// cmd/controller/app and cmd/cainjector/app do, for what the e2e suite uses:
// SelfSigned and CA issuers, Certificates, and CA injection into webhook
// configurations. No ACME, Vault, Venafi, shims, metrics or leader election.
//
// Usage:
//
//	cert-manager controller --kubeconfig FILE [--cluster-resource-namespace NS] [--feature-gates A=true,B=false] [-v N]
//	cert-manager cainjector --kubeconfig FILE [-v N]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	// Each controller package registers its constructor in controller.Known()
	// from init(); importing only these is how we choose what runs (the real
	// binary imports all and filters with --controllers).
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver" // auto-approves CertificateRequests, else nothing is signed
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	// The Issuer/ClusterIssuer controllers look issuer types up in a registry
	// that these fill from init().
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "controller" && os.Args[1] != "cainjector") {
		fmt.Fprintln(os.Stderr, "usage: cert-manager controller|cainjector --kubeconfig FILE [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (required)")
	// Same default as cert-manager: where ClusterIssuers' Secrets live.
	clusterNS := fs.String("cluster-resource-namespace", "kube-system", "namespace for resources of cluster-scoped issuers (controller)")
	gates := fs.String("feature-gates", "", "cert-manager feature gates, e.g. A=true,B=false (controller)")
	klog.InitFlags(fs) // -v etc.; cert-manager logs through klog
	_ = fs.Parse(os.Args[2:])
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig is required")
		os.Exit(2)
	}
	klog.EnableContextualLogging(true)
	ctrl.SetLogger(logf.Log) // controller-runtime (cainjector) logs through klog too

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, os.Args[1])

	var err error
	if os.Args[1] == "controller" {
		if err = utilfeature.DefaultMutableFeatureGate.Set(*gates); err == nil {
			err = runController(ctx, *kubeconfig, *clusterNS)
		}
	} else {
		err = runCAInjector(ctx, *kubeconfig)
	}
	if err != nil {
		klog.ErrorS(err, "exiting")
		klog.Flush()
		os.Exit(1)
	}
}

// runController is cmd/controller/app.Run without metrics, healthz, pprof
// and leader election: build the context factory, construct every
// registered controller, start the informers, run until ctx ends.
func runController(ctx context.Context, kubeconfig, clusterNS string) error {
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20, // cert-manager's defaults
		KubernetesAPIBurst: 50,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: clusterNS},
		// cert-manager's defaults; zero would disable the back-off after a
		// failed issuance and retry in a tight loop.
		CertificateOptions: controller.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return err
	}
	cctx, err := factory.Build()
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	for name, newController := range controller.Known() {
		c, err := newController(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		logf.FromContext(ctx).Info("starting controller", "controller", name)
		g.Go(func() error { return c.Run(5, ctx) })
	}
	// Informers are created by the constructors above, so start them after.
	cctx.SharedInformerFactory.Start(ctx.Done())
	cctx.KubeSharedInformerFactory.Start(ctx.Done())
	cctx.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	return g.Wait()
}

// runCAInjector is cmd/cainjector/app.Run without metrics, pprof and leader
// election, with only the webhook-configuration injectors.
func runCAInjector(ctx context.Context, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	utilruntime.Must(apireg.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(util.RestConfigWithUserAgent(cfg, "cainjector"), ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, // no metrics listener
		// As upstream: Secrets are read directly, not cached cluster-wide.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return err
	}
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true, // cert-manager.io/inject-ca-from
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
		},
	}); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
