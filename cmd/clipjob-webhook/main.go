// Command clipjob-webhook serves clipjob's admission webhooks.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/paperclipai/clipjob/webhook"
)

func main() {
	var o webhook.Options
	flag.StringVar(&o.ConfigFile, "config", "/etc/clipjob/config.yaml", "clipjob Config file; re-read when it changes")
	flag.DurationVar(&o.ConfigPollInterval, "config-poll-interval", 0, "how often to re-read the config file (default 2s)")
	flag.StringVar(&o.CertDir, "cert-dir", "", "directory with tls.crt and tls.key, reloaded on change")
	flag.StringVar(&o.Host, "host", "", "address to serve webhooks on (default all)")
	flag.IntVar(&o.Port, "port", 9443, "port to serve webhooks on")
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", `metrics and /configz address ("0" disables)`)
	flag.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "/healthz and /readyz address")
	flag.DurationVar(&o.ShutdownDelay, "shutdown-delay", 0, "keep serving this long after SIGTERM while reporting not ready")
	flag.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the Lease electing the claim controller (default $POD_NAMESPACE, else the source namespace)")
	flag.DurationVar(&o.SweepInterval, "claim-sweep-interval", 0, "how often to delete claims of finished or vanished Jobs (default 1m)")
	var qps float64
	flag.Float64Var(&qps, "kube-api-qps", 1000, "queries per second to the API server (claims, PVC checks)")
	flag.IntVar(&o.KubeAPIBurst, "kube-api-burst", 2000, "burst of queries to the API server")
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()
	o.KubeAPIQPS = float32(qps)

	o.Log = zap.New(zap.UseFlagOptions(&zo))
	ctrl.SetLogger(o.Log)
	rc, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clipjob-webhook: no Kubernetes API access:", err)
		os.Exit(1)
	}
	o.RestConfig = rc
	if err := webhook.Run(ctrl.SetupSignalHandler(), o); err != nil {
		o.Log.Error(err, "clipjob-webhook stopped")
		os.Exit(1)
	}
}
