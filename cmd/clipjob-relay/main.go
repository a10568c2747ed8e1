// Command clipjob-relay follows every agent pod's logs, keeps them and
// serves them with the run's result. See package relay.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/paperclipai/clipjob/relay"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o relay.Options
	var namespaces, patterns, audiences list
	var valuesFile string
	flag.StringVar(&o.DataDir, "data-dir", "/var/lib/clipjob-relay", "directory of the store (a persistent volume)")
	flag.Var(&namespaces, "namespace", "namespace to collect agent pods from (repeatable; default all)")
	flag.StringVar(&o.APIAddr, "api-address", ":8090", "HTTP API address")
	flag.StringVar(&o.CertDir, "cert-dir", "", "directory with tls.crt and tls.key to serve the API over TLS (reloaded on change; default plain HTTP)")
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "metrics address")
	flag.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "/healthz and /readyz address")
	flag.IntVar(&o.MaxStreams, "max-streams", 200, "log streams open at once")
	flag.DurationVar(&o.Follow.MaxStreamLifetime, "max-stream-lifetime", 0, "reconnect streams proactively after this long (default 30m)")
	flag.DurationVar(&o.Follow.DrainIdle, "drain-idle", 0, "after a container ended, stop following after this long without a line (default 3s)")
	flag.DurationVar(&o.RetentionMaxAge, "retention-max-age", 0, "delete finished runs idle this long (default 168h)")
	flag.Int64Var(&o.RetentionMaxBytes, "retention-max-bytes", 0, "delete the oldest finished runs beyond this many stored bytes (default unbounded)")
	flag.Var(&patterns, "redact-pattern", "regular expression to redact before storage (repeatable)")
	flag.StringVar(&valuesFile, "redact-values-file", "", "file of secret values to redact, one per line (e.g. a mounted Secret)")
	flag.StringVar(&o.MirrorDir, "mirror-dir", "", "also keep each run's agent output as run-logs/<company>/<agent>/<run>.pod.ndjson under this directory (the shared volume), as Paperclip's Claude adapter reads it")
	flag.Var(&audiences, "token-audience", "audience callers' tokens must be for (repeatable; default the API server's)")
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()
	o.Namespaces, o.RedactPatterns, o.TokenAudiences = namespaces, patterns, audiences

	o.Log = zap.New(zap.UseFlagOptions(&zo))
	ctrl.SetLogger(o.Log)
	if valuesFile != "" {
		f, err := os.Open(valuesFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "clipjob-relay:", err)
			os.Exit(1)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v := strings.TrimSpace(sc.Text()); v != "" {
				o.RedactValues = append(o.RedactValues, v)
			}
		}
		f.Close()
	}
	rc, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clipjob-relay: no Kubernetes API access:", err)
		os.Exit(1)
	}
	o.RestConfig = rc
	if err := relay.Serve(ctrl.SetupSignalHandler(), o); err != nil {
		o.Log.Error(err, "clipjob-relay stopped")
		os.Exit(1)
	}
}
