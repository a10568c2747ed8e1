package claim

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	retries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_claim_retries_total",
		Help: "Claim writes that lost a race (AlreadyExists or Conflict) and were decided again.",
	})
	released = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clipjob_claims_released_total",
		Help: "Claims freed by the claim controller, by trigger (finished, deleted, sweep).",
	}, []string{"trigger"})
	queueStarts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_queue_started_total",
		Help: "Queued runs (Queue mode) started because their agent became free.",
	})
	startTimeoutsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_runs_start_timeout_total",
		Help: "Runs ended because none of their containers ran within the profile's startTimeoutSeconds.",
	})
	registerOnce sync.Once
)

// RegisterMetrics adds the claim metrics to controller-runtime's registry,
// which the manager serves on /metrics.
func RegisterMetrics() {
	registerOnce.Do(func() { metrics.Registry.MustRegister(retries, released, queueStarts, startTimeoutsTotal) })
}
