package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/doctor"
	"github.com/paperclipai/clipjob/internal/command"
)

// errChecksFailed makes the command exit 1 after printing the results.
var errChecksFailed = errors.New("some checks failed; each names its fix")

func doctorCmd(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgFile := fs.String("config", "", "the clipjob Config in force (default: read from the release's ConfigMap)")
	namespace := fs.String("namespace", "clipjob-system", "namespace of the release")
	release := fs.String("release", "clipjob", "name of the Helm release")
	valuesFile := fs.String("values", "", "the values file the release was installed with (default: read from the cluster: Helm's record of the release, else the chart's defaults with the relay Deployment's store and the config ConfigMap's config and agent namespaces)")
	relayURL := fs.String("relay-url", "", "reach the relay here instead of through the API server's service proxy")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
	output := fs.String("o", "text", "output: text or json")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	if err := (commonFlags{fs: fs}).parse(args); err != nil {
		return err
	}
	if *output != "text" && *output != "json" {
		return usageError{fmt.Errorf("-o %q: want text or json", *output)}
	}
	o := doctor.Options{Release: charts.Release{Name: *release, Namespace: *namespace}, RelayURL: *relayURL}
	valuesFrom := ""
	if *valuesFile != "" {
		valuesFrom = "with the values in " + *valuesFile
		data, err := os.ReadFile(*valuesFile)
		if err != nil {
			return err
		}
		if err := yaml.Unmarshal(data, &o.Values); err != nil {
			return fmt.Errorf("%s: %w", *valuesFile, err)
		}
	}
	if *cfgFile != "" {
		cfg, err := loadConfig(*cfgFile)
		if err != nil {
			return err
		}
		o.Config = cfg
	}
	rc, err := command.RestConfig(*kubeconfig)
	if err != nil {
		return fmt.Errorf("no Kubernetes API access: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	results := doctorResults(ctx, cs, o, valuesFrom)
	if err := printResults(stdout, results, *output); err != nil {
		return err
	}
	for _, r := range results {
		if !r.OK {
			return errChecksFailed
		}
	}
	return nil
}

// doctorResults runs the checks on the install, first saying which values
// the expected objects and RBAC were rendered from: valuesFrom names where
// o.Values came from, else they are read from the cluster
// (installedValues).
func doctorResults(ctx context.Context, cs kubernetes.Interface, o doctor.Options, valuesFrom string) []doctor.Result {
	if valuesFrom == "" {
		o.Values, valuesFrom = installedValues(ctx, cs, o.Release)
	}
	return append([]doctor.Result{{Check: "values", OK: true, Detail: "the chart rendered " + valuesFrom}}, doctor.Run(ctx, cs, o)...)
}

func printResults(w io.Writer, results []doctor.Result, output string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	for _, r := range results {
		mark := "ok  "
		switch {
		case !r.OK:
			mark = "FAIL"
		case r.Warning:
			mark = "warn"
		}
		fmt.Fprintf(w, "%s %-22s %s\n", mark, r.Check, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(w, "     %-22s fix: %s\n", "", r.Fix)
		}
	}
	return nil
}
