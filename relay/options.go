package relay

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/internal/command"
	"github.com/paperclipai/clipjob/relay/collect"
	"github.com/paperclipai/clipjob/relay/mirror"
	"github.com/paperclipai/clipjob/relay/store/postgres"
)

// Options configure Serve. DefaultOptions holds every default, and
// BindFlags says what each field with a flag does, in the flag's help:
// the command's flags start from the defaults, so each is written once.
type Options struct {
	Store, DataDir, PostgresURLFile, PostgresSchema string
	Replicas                                        ReplicaOptions
	Namespaces                                      []string
	APIAddr, CertDir, MetricsAddr, ProbeAddr        string
	PprofAddr                                       string
	MaxStreams                                      int
	Follow                                          collect.FollowOptions
	RetentionMaxAge, RetentionInterval              time.Duration
	RetentionMaxBytes                               int64
	RedactPatterns                                  []string
	RedactValuesFile                                string
	MirrorDir, MirrorBase                           string
	TokenAudiences                                  []string
	// ShutdownTimeout bounds how long the API waits for open responses
	// when the relay stops.
	ShutdownTimeout time.Duration
	// RedactValues are literal secrets removed from lines besides the
	// file's; RedactValuesInterval is how often the file is re-read.
	RedactValues         []string
	RedactValuesInterval time.Duration
	// RestConfig reaches the API server. Required.
	RestConfig *rest.Config
	Log        logr.Logger
	// Clock times retention, the stores' own timestamps, collection, the
	// replicas' renewals, the mirror's and redaction's waits and the API's
	// keepalives and caches. Default the real clock.
	Clock clock.WithTicker
}

// ReplicaOptions configure the membership of relays sharing a store
// (package replicas; BindFlags).
type ReplicaOptions struct {
	Identity                     string
	LeaseDuration, RenewInterval time.Duration
}

// BindFlags binds o's fields with a flag to fs, their defaults o's values.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Store, "store", o.Store, `where runs and lines are kept: "bolt" (a file in --data-dir; one relay) or "postgres" (a PostgreSQL server; the connection string from --postgres-url-file or $`+PostgresURLEnv+`)`)
	fs.StringVar(&o.DataDir, "data-dir", o.DataDir, "directory of the store (a persistent volume)")
	// The connection string itself is never a flag: any process on the
	// node can read a process's arguments.
	fs.StringVar(&o.PostgresURLFile, "postgres-url-file", o.PostgresURLFile, "file holding the PostgreSQL connection string for --store=postgres (a mounted Secret's key; default $"+PostgresURLEnv+")")
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
}

// The stores Options.Store names.
const (
	StoreBolt     = "bolt"
	StorePostgres = "postgres"
)

// PostgresURLEnv holds the PostgreSQL connection string when
// Options.PostgresURLFile is empty.
const PostgresURLEnv = "CLIPJOB_RELAY_POSTGRES_URL"

// DefaultTokenAudience is the audience callers' tokens are for by
// default: `kubectl create token <sa> --audience clipjob-relay`, or a
// projected ServiceAccount token with that audience.
const DefaultTokenAudience = "clipjob-relay"

// DefaultOptions returns the options of a relay started with no flags:
// everything but RestConfig.
func DefaultOptions() Options {
	return Options{
		Store:                StoreBolt,
		DataDir:              "/var/lib/clipjob-relay",
		PostgresSchema:       postgres.DefaultSchema,
		Replicas:             ReplicaOptions{LeaseDuration: 4 * time.Second, RenewInterval: 500 * time.Millisecond},
		APIAddr:              ":8090",
		MetricsAddr:          ":8080",
		ProbeAddr:            ":8081",
		MaxStreams:           200,
		Follow:               collect.DefaultFollowOptions(),
		RetentionMaxAge:      7 * 24 * time.Hour,
		RetentionInterval:    time.Minute,
		ShutdownTimeout:      5 * time.Second,
		TokenAudiences:       []string{DefaultTokenAudience},
		RedactValuesInterval: 30 * time.Second,
		MirrorBase:           "run-logs",
		Log:                  logr.Discard(),
	}
}

// validate names every option Serve cannot start with.
func (o *Options) validate() error {
	var errs []error
	if o.RestConfig == nil {
		errs = append(errs, errors.New("RestConfig is required"))
	}
	switch o.Store {
	case StoreBolt, "": // bbolt unless told otherwise
		if o.DataDir == "" {
			errs = append(errs, errors.New("--data-dir (DataDir) is required: the directory of the store"))
		}
	case StorePostgres:
		if o.PostgresSchema == "" {
			errs = append(errs, errors.New("--postgres-schema (PostgresSchema) is required with --store=postgres"))
		}
		errs = append(errs, o.Replicas.validate())
	default:
		errs = append(errs, fmt.Errorf("--store (Store) %q: want %q or %q", o.Store, StoreBolt, StorePostgres))
	}
	if o.APIAddr == "" || o.ProbeAddr == "" {
		errs = append(errs, errors.New("--api-address and --health-probe-bind-address (APIAddr, ProbeAddr) are required"))
	}
	if o.MirrorDir != "" {
		if why := mirror.ValidBase(o.MirrorBase); why != "" {
			errs = append(errs, fmt.Errorf("--mirror-run-log-base (MirrorBase) %q: %s", o.MirrorBase, why))
		}
	}
	if o.MaxStreams <= 0 {
		errs = append(errs, fmt.Errorf("--max-streams (MaxStreams) must be positive, not %d", o.MaxStreams))
	}
	if o.RetentionMaxAge <= 0 || o.RetentionInterval <= 0 {
		errs = append(errs, fmt.Errorf("--retention-max-age (RetentionMaxAge) and --retention-interval (RetentionInterval) must be positive, not %s and %s", o.RetentionMaxAge, o.RetentionInterval))
	}
	if o.RetentionMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("--retention-max-bytes (RetentionMaxBytes) must not be negative, not %d", o.RetentionMaxBytes))
	}
	return errors.Join(errs...)
}

// postgresURL reads the connection string: from PostgresURLFile, else
// from the environment variable PostgresURLEnv.
func (o *Options) postgresURL() (string, error) {
	if o.PostgresURLFile != "" {
		b, err := os.ReadFile(o.PostgresURLFile)
		if err != nil {
			return "", fmt.Errorf("--postgres-url-file: %w", err)
		}
		if url := strings.TrimSpace(string(b)); url != "" {
			return url, nil
		}
		return "", fmt.Errorf("--postgres-url-file %s is empty: it holds the PostgreSQL connection string", o.PostgresURLFile)
	}
	if url := strings.TrimSpace(os.Getenv(PostgresURLEnv)); url != "" {
		return url, nil
	}
	return "", fmt.Errorf("--store=postgres needs a connection string: in the file --postgres-url-file names, or in the environment variable %s", PostgresURLEnv)
}

// hostname names the relay's host: a replica's default identity.
var hostname = os.Hostname

// validate fills the defaults that come from where the relay runs, and
// names what is missing.
func (r *ReplicaOptions) validate() error {
	var errs []error
	if r.Identity == "" {
		r.Identity, _ = hostname()
	}
	if r.Identity == "" {
		errs = append(errs, errors.New("--replica-id (Replicas.Identity) is required with --store=postgres where the host has no name: this relay's name in the table of replicas"))
	}
	if r.RenewInterval <= 0 || r.LeaseDuration < 2*r.RenewInterval {
		errs = append(errs, fmt.Errorf("--lease-duration (%s) must be at least twice --lease-renew-interval (%s)", r.LeaseDuration, r.RenewInterval))
	}
	return errors.Join(errs...)
}
