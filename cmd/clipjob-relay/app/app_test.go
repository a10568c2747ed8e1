package app

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/paperclipai/clipjob/charts"
	"github.com/paperclipai/clipjob/internal/testing/kube"
	"github.com/paperclipai/clipjob/relay"
	"github.com/paperclipai/clipjob/relay/collect"
)

var ignored = cmpopts.IgnoreFields(relay.Options{}, "Log", "RestConfig")

// TestDefaults: no flags means relay.DefaultOptions, the values the manual
// and the chart document.
func TestDefaults(t *testing.T) {
	o, err := Parse(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(relay.DefaultOptions(), o.Options, ignored); d != "" {
		t.Errorf("defaults differ from relay.DefaultOptions (-want +got):\n%s", d)
	}
	want := relay.Options{Store: "bolt", DataDir: "/var/lib/clipjob-relay", PostgresSchema: "clipjob_relay",
		Replicas: relay.ReplicaOptions{LeaseDuration: 4 * time.Second, RenewInterval: 500 * time.Millisecond}, APIAddr: ":8090", MetricsAddr: ":8080", ProbeAddr: ":8081",
		MaxStreams: 200, Follow: collect.DefaultFollowOptions(), RetentionMaxAge: 168 * time.Hour,
		RetentionInterval: time.Minute, ShutdownTimeout: 5 * time.Second, TokenAudiences: []string{"clipjob-relay"},
		RedactValuesInterval: 30 * time.Second, MirrorBase: "run-logs"}
	if d := cmp.Diff(want, o.Options, ignored); d != "" {
		t.Errorf("documented defaults changed (-want +got):\n%s", d)
	}
	if f := o.Follow; f.MaxStreamLifetime != 30*time.Minute || f.DrainIdle != 3*time.Second {
		t.Errorf("follow defaults changed: %+v", f)
	}
}

// TestFlags sets every flag and checks the option it lands in.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want func(*Options)
	}{
		{name: "data-dir", args: []string{"--data-dir", "/data"}, want: func(o *Options) { o.DataDir = "/data" }},
		{name: "postgres store", args: []string{"--store", "postgres", "--postgres-url-file", "/secret/url", "--postgres-schema", "relay"}, want: func(o *Options) {
			o.Store, o.PostgresURLFile, o.PostgresSchema = "postgres", "/secret/url", "relay"
		}},
		{name: "replicas", args: []string{"--replica-id", "r-1", "--lease-duration", "6s", "--lease-renew-interval", "2s"}, want: func(o *Options) {
			o.Replicas = relay.ReplicaOptions{Identity: "r-1", LeaseDuration: 6 * time.Second, RenewInterval: 2 * time.Second}
		}},
		{name: "namespaces repeat", args: []string{"--namespace", "a", "--namespace", "b"}, want: func(o *Options) { o.Namespaces = []string{"a", "b"} }},
		{name: "api-address", args: []string{"--api-address", "127.0.0.1:9"}, want: func(o *Options) { o.APIAddr = "127.0.0.1:9" }},
		{name: "cert-dir", args: []string{"--cert-dir", "/certs"}, want: func(o *Options) { o.CertDir = "/certs" }},
		{name: "metrics and probes", args: []string{"--metrics-bind-address", "0", "--health-probe-bind-address", ":9"}, want: func(o *Options) { o.MetricsAddr, o.ProbeAddr = "0", ":9" }},
		{name: "max-streams", args: []string{"--max-streams", "7"}, want: func(o *Options) { o.MaxStreams = 7 }},
		{name: "max-line-bytes", args: []string{"--max-line-bytes", "4096"}, want: func(o *Options) { o.Follow.MaxLineBytes = 4096 }},
		{name: "stream timing", args: []string{"--max-stream-lifetime", "5m", "--drain-idle", "1s"}, want: func(o *Options) { o.Follow.MaxStreamLifetime, o.Follow.DrainIdle = 5*time.Minute, time.Second }},
		{name: "retention", args: []string{"--retention-max-age", "24h", "--retention-max-bytes", "1000", "--retention-interval", "10s"}, want: func(o *Options) {
			o.RetentionMaxAge, o.RetentionMaxBytes, o.RetentionInterval = 24*time.Hour, 1000, 10*time.Second
		}},
		{name: "redaction", args: []string{"--redact-pattern", "a+", "--redact-pattern", "b+", "--redact-values-file", "/v"}, want: func(o *Options) {
			o.RedactPatterns, o.RedactValuesFile = []string{"a+", "b+"}, "/v"
		}},
		{name: "mirror-dir", args: []string{"--mirror-dir", "/paperclip"}, want: func(o *Options) { o.MirrorDir = "/paperclip" }},
		{name: "mirror-run-log-base", args: []string{"--mirror-run-log-base", "instances/default/data/run-logs"}, want: func(o *Options) { o.MirrorBase = "instances/default/data/run-logs" }},
		{name: "token-audience replaces the default", args: []string{"--token-audience", "a", "--token-audience", "b"}, want: func(o *Options) { o.TokenAudiences = []string{"a", "b"} }},
		{name: "token-audience empty accepts the API server's", args: []string{"--token-audience="}, want: func(o *Options) { o.TokenAudiences = nil }},
		{name: "kubeconfig", args: []string{"--kubeconfig", "/kc"}, want: func(o *Options) { o.Kubeconfig = "/kc" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			want := &Options{Options: relay.DefaultOptions()}
			tc.want(want)
			if d := cmp.Diff(want, got, ignored, cmpopts.IgnoreFields(Options{}, "Server.Zap")); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestMainStartsRelay runs the command up to relay.Serve: API access
// comes from --kubeconfig, and each failure has its exit code.
func TestMainStartsRelay(t *testing.T) {
	kubeconfig := kube.Kubeconfig(t)
	var started relay.Options
	run := func(_ context.Context, o relay.Options) error { started = o; return nil }
	var stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--kubeconfig", kubeconfig}, &stderr, run); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if started.RestConfig == nil || started.RestConfig.Host != kube.Host {
		t.Errorf("API access %+v", started.RestConfig)
	}
	for _, tc := range []struct {
		args []string
		run  func(context.Context, relay.Options) error
		code int
		want string
	}{
		{args: []string{"--kubeconfig", filepath.Join(t.TempDir(), "none")}, run: run, code: 1, want: "no Kubernetes API access"},
		{args: []string{"--kubeconfig", kubeconfig}, run: func(context.Context, relay.Options) error { return errors.New("store locked") }, code: 1, want: "store locked"},
		{args: []string{"--max-streams", "many"}, run: run, code: 2, want: `invalid value "many" for flag -max-streams`},
		{args: []string{"serve"}, run: run, code: 2, want: `unexpected arguments ["serve"]`},
	} {
		stderr.Reset()
		if code := Main(context.Background(), tc.args, &stderr, tc.run); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// TestChartArgs: the chart runs the relay with flags it has.
func TestChartArgs(t *testing.T) {
	r, err := charts.Render(charts.Release{Name: "clipjob", Namespace: "clipjob-system"}, map[string]any{"relay": map[string]any{
		"mirror": map[string]any{"enabled": true}, "redactValuesSecret": "keys", "namespaces": []any{"paperclip"}, "redactPatterns": []any{"x+"}}})
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := r.Into("Deployment", "clipjob-relay", &d); err != nil {
		t.Fatal(err)
	}
	o, err := Parse(d.Spec.Template.Spec.Containers[0].Args, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("the chart's args do not parse: %v", err)
	}
	if o.MirrorDir != "/paperclip" || o.MirrorBase != "instances/default/data/run-logs" || o.CertDir != "/tls" || o.RedactValuesFile != "/etc/clipjob-relay/redact" ||
		o.Namespaces[0] != "paperclip" || o.TokenAudiences[0] != "clipjob-relay" || o.RetentionMaxAge != 168*time.Hour {
		t.Errorf("relay options from the chart: %+v", o.Options)
	}
}

// The relay collects at GCPercent unless $GOGC says otherwise.
func TestMainSetsGCPercent(t *testing.T) {
	kubeconfig := kube.Kubeconfig(t)
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "") // restored when the test ends
	var got int
	run := func(context.Context, relay.Options) error { got = debug.SetGCPercent(100); return nil }
	for _, tc := range []struct {
		env  *string
		want int
	}{{env: nil, want: GCPercent}, {env: ptr.To("100"), want: 100}} {
		debug.SetGCPercent(100)
		if tc.env != nil {
			os.Setenv("GOGC", *tc.env)
		} else {
			os.Unsetenv("GOGC")
		}
		if code := Main(context.Background(), []string{"--kubeconfig", kubeconfig}, &bytes.Buffer{}, run); code != 0 || got != tc.want {
			t.Errorf("GOGC %v: exit %d, GC percent %d; want %d", tc.env, code, got, tc.want)
		}
	}
}
