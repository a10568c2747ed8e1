package relay

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/paperclipai/clipjob/relay/collect"
	"github.com/paperclipai/clipjob/relay/mirror"
	"github.com/paperclipai/clipjob/relay/store/postgres"
)

// Options configure Serve. DefaultOptions holds every default; the
// command's flags start from it, so a default is written once.
type Options struct {
	// Store is where runs and lines are kept: StoreBolt (a file in
	// DataDir, one relay; also when empty) or StorePostgres.
	Store string
	// DataDir holds the bbolt store (a volume that outlives the pod).
	DataDir string
	// PostgresURLFile holds the PostgreSQL connection string (a mounted
	// Secret's key); empty: the environment variable PostgresURLEnv, never
	// a flag, which any process on the node can read.
	PostgresURLFile string
	// PostgresSchema holds the relay's tables on the PostgreSQL server,
	// created and migrated at start.
	PostgresSchema string
	// Replicas divide the runs among relays sharing a PostgreSQL store.
	Replicas ReplicaOptions
	// Namespaces to collect agent pods from; empty means all.
	Namespaces []string
	// APIAddr serves the HTTP API.
	APIAddr string
	// CertDir holds tls.crt and tls.key for the API, reloaded when they
	// change; empty: plain HTTP (callers send tokens: loopback only).
	CertDir string
	// MetricsAddr serves /metrics ("0" disables); ProbeAddr /healthz and
	// /readyz.
	MetricsAddr, ProbeAddr string
	// PprofAddr serves net/http/pprof; "" (the default) disables it.
	PprofAddr string
	// MaxStreams bounds open log streams.
	MaxStreams int
	Follow     collect.FollowOptions
	// RetentionMaxAge and RetentionMaxBytes (0: no size bound) bound what
	// is kept of finished runs; RetentionInterval between sweeps.
	RetentionMaxAge   time.Duration
	RetentionMaxBytes int64
	RetentionInterval time.Duration
	// ShutdownTimeout bounds how long the API waits for open responses
	// when the relay stops.
	ShutdownTimeout time.Duration
	// RedactPatterns (regular expressions) and RedactValues (literal
	// secrets) are removed from lines before storage, besides token shapes.
	RedactPatterns, RedactValues []string
	// RedactValuesFile holds more secret values, one per line (e.g. a
	// mounted Secret). It must be readable at start, and is re-read every
	// RedactValuesInterval: a change applies to lines stored after it.
	RedactValuesFile     string
	RedactValuesInterval time.Duration
	// MirrorDir, when set, is the shared volume's data directory, where
	// each run's agent output is mirrored as NDJSON (package mirror).
	MirrorDir string
	// MirrorBase is the run-log directory under MirrorDir, Paperclip's
	// RUN_LOG_BASE_PATH relative to the volume. Default "run-logs".
	MirrorBase string
	// TokenAudiences a caller's token must be for. Default
	// DefaultTokenAudience, so that a token sent to the relay cannot be
	// replayed against the API server. Empty accepts the API server's.
	TokenAudiences []string
	// RestConfig reaches the API server. Required.
	RestConfig *rest.Config
	Log        logr.Logger
	// Clock times retention, the stores' own timestamps, collection, the
	// replicas' renewals, the mirror's and redaction's waits and the API's
	// keepalives and caches. Default the real clock.
	Clock clock.WithTicker
}

// ReplicaOptions configure the membership of relays sharing a store
// (package replicas): a replica whose row was not renewed for
// LeaseDuration, by the server's clock, has its runs taken over.
type ReplicaOptions struct {
	// Identity is this replica's name for people. Default the host name.
	Identity                     string
	LeaseDuration, RenewInterval time.Duration
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
		Replicas:             ReplicaOptions{LeaseDuration: 4 * time.Second, RenewInterval: time.Second},
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

// validate fills the defaults that come from where the relay runs, and
// names what is missing.
func (r *ReplicaOptions) validate() error {
	var errs []error
	if r.Identity == "" {
		r.Identity, _ = os.Hostname()
	}
	if r.Identity == "" {
		errs = append(errs, errors.New("--replica-id (Replicas.Identity) is required with --store=postgres where the host has no name: this relay's name in the table of replicas"))
	}
	if r.RenewInterval <= 0 || r.LeaseDuration < 2*r.RenewInterval {
		errs = append(errs, fmt.Errorf("--lease-duration (%s) must be at least twice --lease-renew-interval (%s)", r.LeaseDuration, r.RenewInterval))
	}
	return errors.Join(errs...)
}
