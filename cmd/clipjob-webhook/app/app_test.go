package app

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/paperclipai/clipjob/certs"
	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/internal/testing/kube"
	"github.com/paperclipai/clipjob/webhook"
)

// ignored: fields a flag does not set, or that cmp cannot compare.
var ignored = cmp.Options{cmpopts.IgnoreFields(webhook.Options{}, "Log", "RestConfig"), cmpopts.IgnoreFields(certs.Options{}, "Clock", "Log")}

// TestDefaults: no flags means webhook.DefaultOptions, which is what the
// chart and the manual (docs/configuration.md) document.
func TestDefaults(t *testing.T) {
	o, err := Parse(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(webhook.DefaultOptions(), o.Options, ignored); d != "" {
		t.Errorf("defaults differ from webhook.DefaultOptions (-want +got):\n%s", d)
	}
	want := webhook.Options{ConfigFile: "/etc/clipjob/config.yaml", ConfigPollInterval: 2 * time.Second,
		Port: 9443, MetricsAddr: ":8080", ProbeAddr: ":8081", SweepInterval: time.Minute,
		KubeAPIQPS: 1000, KubeAPIBurst: 2000}
	if d := cmp.Diff(want, o.Options, ignored); d != "" {
		t.Errorf("documented defaults changed (-want +got):\n%s", d)
	}
	if o.Kubeconfig != "" {
		t.Errorf("kubeconfig default %q", o.Kubeconfig)
	}
}

// TestFlags sets every flag and checks the option it lands in.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want func(*Options)
	}{
		{name: "config", args: []string{"--config", "/cfg/c.yaml"}, want: func(o *Options) { o.ConfigFile = "/cfg/c.yaml" }},
		{name: "config-poll-interval", args: []string{"--config-poll-interval", "200ms"}, want: func(o *Options) { o.ConfigPollInterval = 200 * time.Millisecond }},
		{name: "cert-dir", args: []string{"--cert-dir", "/certs"}, want: func(o *Options) { o.CertDir = "/certs" }},
		{name: "host and port", args: []string{"--host", "127.0.0.1", "--port", "10250"}, want: func(o *Options) { o.Host, o.Port = "127.0.0.1", 10250 }},
		{name: "metrics off", args: []string{"--metrics-bind-address", "0"}, want: func(o *Options) { o.MetricsAddr = "0" }},
		{name: "probes", args: []string{"--health-probe-bind-address", ":9000"}, want: func(o *Options) { o.ProbeAddr = ":9000" }},
		{name: "shutdown-delay", args: []string{"--shutdown-delay", "15s"}, want: func(o *Options) { o.ShutdownDelay = 15 * time.Second }},
		{name: "leader-election-namespace", args: []string{"--leader-election-namespace", "clipjob-system"}, want: func(o *Options) { o.LeaderElectionNamespace = "clipjob-system" }},
		{name: "claim-sweep-interval", args: []string{"--claim-sweep-interval", "30s"}, want: func(o *Options) { o.SweepInterval = 30 * time.Second }},
		{name: "compiled-policies", args: []string{"--compiled-policies"}, want: func(o *Options) { o.CompiledPolicies = true }},
		{name: "client rate", args: []string{"--kube-api-qps", "50.5", "--kube-api-burst", "100"}, want: func(o *Options) { o.KubeAPIQPS, o.KubeAPIBurst = 50.5, 100 }},
		{name: "kubeconfig", args: []string{"--kubeconfig", "/kc"}, want: func(o *Options) { o.Kubeconfig = "/kc" }},
		{name: "self-managed certificates", args: []string{"--cert-secret", "wh-tls", "--ca-secret", "ca", "--cert-dns-name", "wh.ns.svc",
			"--inject-ca-mutating", "m", "--inject-ca-validating", "v", "--relay-cert-secret", "relay-tls", "--relay-cert-dns-name", "relay.ns.svc",
			"--cert-check-interval", "2s", "--cert-propagation-delay", "3s"}, want: func(o *Options) {
			o.SelfManaged = SelfManagedCerts{CertSecret: "wh-tls", CASecret: "ca", RelayCertSecret: "relay-tls", DNSNames: []string{"wh.ns.svc"},
				RelayDNSNames: []string{"relay.ns.svc"}, MutatingWebhooks: []string{"m"}, ValidatingWebhooks: []string{"v"},
				CheckInterval: 2 * time.Second, PropagationDelay: 3 * time.Second}
			o.Certificates = &certs.Options{CASecret: "ca", Serving: []certs.Target{{Secret: "wh-tls", DNSNames: []string{"wh.ns.svc"}},
				{Secret: "relay-tls", DNSNames: []string{"relay.ns.svc"}}}, MutatingWebhooks: []string{"m"}, ValidatingWebhooks: []string{"v"},
				Interval: 2 * time.Second, PropagationDelay: 3 * time.Second}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			want := &Options{Options: webhook.DefaultOptions()}
			tc.want(want)
			if d := cmp.Diff(want, got, ignored, cmpopts.IgnoreFields(Options{}, "Server.Zap")); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestFlagsRefused: a typo or a bad value is a usage error that names it,
// never a start with a default the user did not ask for.
func TestFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: []string{"--prot", "9443"}, want: "flag provided but not defined: -prot"},
		{args: []string{"--port", "https"}, want: `invalid value "https" for flag -port`},
		{args: []string{"--kube-api-qps", "fast"}, want: `invalid value "fast" for flag -kube-api-qps`},
		{args: []string{"--config-poll-interval", "2"}, want: `invalid value "2" for flag -config-poll-interval`},
		{args: []string{"serve"}, want: `unexpected arguments ["serve"]`},
		{args: []string{"--publish-ca-configmap", "paperclip/clipjob-ca"}, want: "needs self-managed certificates"},
		{args: []string{"--cert-secret", "s", "--publish-ca-configmap", "clipjob-ca"}, want: `--publish-ca-configmap: "clipjob-ca": want namespace/name`},
	} {
		var stderr bytes.Buffer
		code := Main(context.Background(), tc.args, &stderr, func(context.Context, webhook.Options) error {
			t.Fatalf("%v: started", tc.args)
			return nil
		})
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestMainStartsWebhook runs the command to the point of starting the webhook: the
// options it starts with, API access from --kubeconfig, and exit codes.
func TestMainStartsWebhook(t *testing.T) {
	kubeconfig := kube.Kubeconfig(t)
	var started webhook.Options
	run := func(_ context.Context, o webhook.Options) error { started = o; return nil }
	var stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--kubeconfig", kubeconfig, "--port", "10250"}, &stderr, run); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if started.RestConfig == nil || started.RestConfig.Host != kube.Host || started.RestConfig.BearerToken != kube.Token {
		t.Errorf("API access %+v, want the kubeconfig's", started.RestConfig)
	}
	if started.Port != 10250 || started.ConfigFile != "/etc/clipjob/config.yaml" {
		t.Errorf("started with %+v", started)
	}

	stderr.Reset()
	failing := func(context.Context, webhook.Options) error {
		return errors.New("config /etc/clipjob/config.yaml: bad")
	}
	if code := Main(context.Background(), []string{"--kubeconfig", kubeconfig}, &stderr, failing); code != 1 ||
		!strings.Contains(stderr.String(), "config /etc/clipjob/config.yaml: bad") {
		t.Errorf("failing run: exit %d, stderr %q", code, stderr.String())
	}

	stderr.Reset()
	if code := Main(context.Background(), []string{"--kubeconfig", filepath.Join(t.TempDir(), "none")}, &stderr, run); code != 1 ||
		!strings.Contains(stderr.String(), "no Kubernetes API access") {
		t.Errorf("missing kubeconfig: exit %d, stderr %q", code, stderr.String())
	}

	stderr.Reset()
	if code := Main(context.Background(), []string{"-h"}, &stderr, run); code != 0 || !strings.Contains(stderr.String(), "-claim-sweep-interval") {
		t.Errorf("-h: exit %d, stderr %q", code, stderr.String())
	}
}

// TestChartArgs: the chart runs the binary with flags it has, in every
// certificate mode, and the self-managed flags turn self-managed
// certificates on.
func TestChartArgs(t *testing.T) {
	for _, mode := range []string{"selfManaged", "certManager", "external"} {
		r, err := charts.Render(charts.Release{Name: "clipjob", Namespace: "clipjob-system"},
			map[string]any{"certificates": map[string]any{"mode": mode, "caBundle": "Y2E="}})
		if err != nil {
			t.Fatal(err)
		}
		var d appsv1.Deployment
		if err := r.Into("Deployment", "clipjob-webhook", &d); err != nil {
			t.Fatal(err)
		}
		o, err := Parse(d.Spec.Template.Spec.Containers[0].Args, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%s: the chart's args do not parse: %v", mode, err)
		}
		if got := o.Certificates != nil; got != (mode == "selfManaged") {
			t.Errorf("%s: self-managed certificates %v", mode, got)
		}
		if mode == "selfManaged" {
			c := o.Certificates
			if c.CASecret != "clipjob-ca" || len(c.Serving) != 2 || c.Serving[0].Secret != "clipjob-webhook-tls" ||
				c.Serving[0].DNSNames[0] != "clipjob-webhook.clipjob-system.svc" || c.Serving[1].Secret != "clipjob-relay-tls" ||
				c.MutatingWebhooks[0] != "clipjob-mutating" || c.ValidatingWebhooks[0] != "clipjob-validating" {
				t.Errorf("self-managed certificates %+v", c)
			}
		} else if o.CertDir != "/tls" {
			t.Errorf("%s: cert dir %q", mode, o.CertDir)
		}
		if o.LeaderElectionNamespace != "clipjob-system" || o.ShutdownDelay != 10*time.Second || o.ConfigFile != "/etc/clipjob/config.yaml" {
			t.Errorf("%s: %+v", mode, o.Options)
		}
	}
}
