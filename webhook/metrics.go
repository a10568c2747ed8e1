package webhook

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/paperclipai/clipjob/claim"
	"github.com/paperclipai/clipjob/config"
)

// Metrics beside controller-runtime's own controller_runtime_webhook_*
// series, which count HTTP codes only: a denial is an HTTP 200 there.
var (
	admissionTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clipjob_admission_requests_total",
		Help: "Admission requests by webhook (mutate, validate), outcome (patched, unchanged, skipped, denied, errored) and dry-run.",
	}, []string{"webhook", "outcome", "dry_run"})
	admissionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "clipjob_admission_duration_seconds",
		Help:    "Time spent handling one admission request inside clipjob.",
		Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
	}, []string{"webhook"})
	configReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clipjob_config_reloads_total",
		Help: "Attempts to load a changed configuration file, by result (applied, refused).",
	}, []string{"result"})
	configLastReloadOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_config_last_reload_successful",
		Help: "1 if the newest configuration file content is in force, 0 if it was refused and the previous one keeps serving.",
	})
	configInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "clipjob_config_info",
		Help: "The configuration in force, by content hash (value 1).",
	}, []string{"hash"})
	policyDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clipjob_policy_decisions_total",
		Help: "Policy rule evaluations by rule (namespace, labels, images, pod-security, volume, concurrency) and outcome (allowed, denied, error).",
	}, []string{"rule", "outcome"})
	claimConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_claim_conflicts_total",
		Help: "Agent Jobs refused because the agent already has an active run.",
	})
	sourceAvailable = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_source_available",
		Help: "1 if the source Deployment is found and can be inherited from, else 0.",
	})
)

var registerOnce sync.Once

func registerMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(admissionTotal, admissionDuration, configReloads,
			configLastReloadOK, configInfo, sourceAvailable, policyDecisions, claimConflicts)
		claim.RegisterMetrics()
	})
}

func observe(webhook, outcome string, dryRun bool, d time.Duration) {
	admissionTotal.WithLabelValues(webhook, outcome, strconv.FormatBool(dryRun)).Inc()
	admissionDuration.WithLabelValues(webhook).Observe(d.Seconds())
}

// recordConfig updates the config metrics after a load attempt.
func recordConfig(cfg *config.Config, err error) {
	if err != nil {
		configReloads.WithLabelValues("refused").Inc()
		configLastReloadOK.Set(0)
		return
	}
	configReloads.WithLabelValues("applied").Inc()
	configLastReloadOK.Set(1)
	configInfo.Reset()
	configInfo.WithLabelValues(cfg.Hash()).Set(1)
}
