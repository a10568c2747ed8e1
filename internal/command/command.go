// Package command holds what the binaries' commands share: API access from
// a --kubeconfig flag, the flag types the standard library lacks, and the
// Main of the two server commands (ServerMain).
package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// RestConfig reaches the API server through kubeconfig, or when it is
// empty in-cluster, else through $KUBECONFIG or ~/.kube/config.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}

// Float32 is a flag.Value for a client's float32 QPS.
type Float32 float32

func (f *Float32) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 32) }

func (f *Float32) Set(s string) error {
	v, err := strconv.ParseFloat(s, 32)
	if err != nil {
		return err
	}
	*f = Float32(v)
	return nil
}

// List is a repeatable string flag.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

func (l *List) Set(v string) error { *l = append(*l, v); return nil }

// Replacing is a repeatable string flag over a default that its first use
// replaces. An empty value adds nothing, so `--flag=` alone clears it.
type Replacing struct {
	Values  *[]string
	changed bool
}

func (r *Replacing) String() string {
	if r.Values == nil {
		return ""
	}
	return strings.Join(*r.Values, ",")
}

func (r *Replacing) Set(v string) error {
	if !r.changed {
		*r.Values, r.changed = nil, true
	}
	if v != "" {
		*r.Values = append(*r.Values, v)
	}
	return nil
}

// Server is what the two server commands (the webhook and the relay) have
// besides their own options: API access and logging.
type Server struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster, else
	// $KUBECONFIG or ~/.kube/config.
	Kubeconfig string
	Zap        zap.Options
}

// BindFlags adds --kubeconfig and the logging flags to fs.
func (s *Server) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.Kubeconfig, "kubeconfig", s.Kubeconfig, "kubeconfig file (default in-cluster, else $KUBECONFIG or ~/.kube/config)")
	s.Zap.BindFlags(fs)
}

// ParseFlags parses args with fs, writing usage to stderr; a server
// command takes flags only.
func ParseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: %s takes only flags", fs.Args(), fs.Name())
	}
	return nil
}

// ServerMain runs a server command named name and returns the process exit
// code: 0 after a clean stop (or -h), 2 on a usage error, 1 when the API
// server is out of reach or run fails. parse parses the command's flags
// and returns their Server part; run is given the logger those flags ask
// for and API access.
func ServerMain(ctx context.Context, name string, stderr io.Writer, parse func() (*Server, error), run func(context.Context, logr.Logger, *rest.Config) error) int {
	s, err := parse()
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	s.Zap.DestWriter = stderr
	log := zap.New(zap.UseFlagOptions(&s.Zap))
	ctrl.SetLogger(log)
	cfg, err := RestConfig(s.Kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "%s: no Kubernetes API access: %v\n", name, err)
		return 1
	}
	if err := run(ctx, log, cfg); err != nil {
		log.Error(err, name+" stopped")
		return 1
	}
	return 0
}
