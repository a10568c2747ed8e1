// Package app is the clipjob-relay command: its flags, bound to
// relay.DefaultOptions so each default is written once, and the start of
// relay.Serve with a logger, API access and the redaction values file.
// main only calls Main, so the whole command is testable without a
// cluster.
package app

import (
	"context"
	"flag"
	"io"
	"os"
	"runtime/debug"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/paperclipai/clipjob/internal/command"
	"github.com/paperclipai/clipjob/relay"
)

// Options are the relay's options and what the command alone needs.
type Options struct {
	relay.Options
	command.Server
}

// NewFlags returns the command's flags bound to o; their defaults are
// o's values.
func NewFlags(o *Options) *flag.FlagSet {
	fs := flag.NewFlagSet("clipjob-relay", flag.ContinueOnError)
	fs.StringVar(&o.Store, "store", o.Store, `where runs and lines are kept: "bolt" (a file in --data-dir; one relay) or "postgres" (a PostgreSQL server; the connection string from --postgres-url-file or $`+relay.PostgresURLEnv+`)`)
	fs.StringVar(&o.DataDir, "data-dir", o.DataDir, "directory of the store (a persistent volume)")
	fs.StringVar(&o.PostgresURLFile, "postgres-url-file", o.PostgresURLFile, "file holding the PostgreSQL connection string for --store=postgres (a mounted Secret's key; default $"+relay.PostgresURLEnv+")")
	fs.StringVar(&o.PostgresSchema, "postgres-schema", o.PostgresSchema, "schema of the relay's tables on the PostgreSQL server, created and migrated at start")
	fs.StringVar(&o.Replicas.Identity, "replica-id", o.Replicas.Identity, "with --store=postgres, this relay's name in the store's table of replicas and its log (default: the host name, the pod's name)")
	fs.DurationVar(&o.Replicas.LeaseDuration, "lease-duration", o.Replicas.LeaseDuration, "with --store=postgres, a relay whose row in the store's table of replicas was not renewed for this long, by the server's clock, has its runs taken over")
	fs.DurationVar(&o.Replicas.RenewInterval, "lease-renew-interval", o.Replicas.RenewInterval, "with --store=postgres, how often a relay renews its row in the store's table of replicas and reads the others'")
	fs.Var((*command.List)(&o.Namespaces), "namespace", "namespace to collect agent pods from (repeatable; default all)")
	fs.StringVar(&o.APIAddr, "api-address", o.APIAddr, "HTTP API address")
	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir, "directory with tls.crt and tls.key to serve the API over TLS (reloaded on change; default plain HTTP)")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, `metrics address ("0" disables)`)
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", o.ProbeAddr, "/healthz and /readyz address")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, `net/http/pprof address for profiling ("" disables)`)
	fs.IntVar(&o.MaxStreams, "max-streams", o.MaxStreams, "log streams open at once")
	fs.DurationVar(&o.Follow.MaxStreamLifetime, "max-stream-lifetime", o.Follow.MaxStreamLifetime, "reconnect streams proactively after this long")
	fs.IntVar(&o.Follow.MaxLineBytes, "max-line-bytes", o.Follow.MaxLineBytes, "longest line stored; longer ones are cut and marked")
	fs.DurationVar(&o.Follow.DrainIdle, "drain-idle", o.Follow.DrainIdle, "after a container ended, stop following after this long without a line")
	fs.DurationVar(&o.RetentionMaxAge, "retention-max-age", o.RetentionMaxAge, "delete finished runs idle this long")
	fs.Int64Var(&o.RetentionMaxBytes, "retention-max-bytes", o.RetentionMaxBytes, "delete the oldest finished runs beyond this many stored bytes (0: unbounded)")
	fs.DurationVar(&o.RetentionInterval, "retention-interval", o.RetentionInterval, "how often retention runs")
	fs.Var((*command.List)(&o.RedactPatterns), "redact-pattern", "regular expression to redact before storage (repeatable)")
	fs.StringVar(&o.RedactValuesFile, "redact-values-file", o.RedactValuesFile, "file of secret values to redact, one per line, or a directory of such files (a mounted Secret); must be readable at start, re-read every 30s")
	fs.StringVar(&o.MirrorDir, "mirror-dir", o.MirrorDir, "also keep each run's agent output as run-logs/<company>/<agent>/<run>.pod.ndjson under this directory (the shared volume), as Paperclip's Claude adapter reads it")
	fs.StringVar(&o.MirrorBase, "mirror-run-log-base", o.MirrorBase, "the run-log directory under --mirror-dir (Paperclip's RUN_LOG_BASE_PATH relative to the volume, e.g. instances/default/data/run-logs)")
	fs.Var(&command.Replacing{Values: &o.TokenAudiences}, "token-audience", "audience callers' tokens must be for (repeatable; an empty value alone accepts tokens for the API server, which a relay could replay there)")
	o.Server.BindFlags(fs)
	return fs
}

// Parse returns the options that args select, starting from the defaults.
func Parse(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{Options: relay.DefaultOptions()}
	fs := NewFlags(o)
	if err := command.ParseFlags(fs, args, stderr); err != nil {
		return nil, err
	}
	return o, nil
}

// Main runs the command with args and returns the process exit code: 0
// after a clean stop, 1 when the relay fails or cannot start, 2 on a usage
// error. run is relay.Serve outside tests.
func Main(ctx context.Context, args []string, stderr io.Writer, run func(context.Context, relay.Options) error) int {
	setGCPercent()
	mem := setMemoryLimit(cgroupRoot)
	var o *Options
	return command.ServerMain(ctx, "clipjob-relay", stderr, func() (*command.Server, error) {
		var err error
		if o, err = Parse(args, stderr); err != nil {
			return nil, err
		}
		return &o.Server, nil
	}, func(ctx context.Context, log logr.Logger, cfg *rest.Config) error {
		o.Log, o.RestConfig = log, cfg
		mem.log(log)
		return run(ctx, o.Options)
	})
}

// GCPercent is the relay's GOGC unless the environment sets one. Go's
// 100 lets the heap grow to twice what is live before collecting: at 500
// runs the relay's live heap peaks during a flood (lines read, queued and
// committing), and its resident memory followed at twice that
// (docs/benchmarks.md, "Memory per stream"). Collecting at one and a half
// times costs the relay more CPU in collections, measured there too.
const GCPercent = 50

// setGCPercent applies GCPercent unless $GOGC chose.
func setGCPercent() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(GCPercent)
	}
}
