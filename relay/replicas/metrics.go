package replicas

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	replicasLive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_relay_replicas",
		Help: "Relay replicas sharing this replica's store it sees live (their rows in the table of replicas renewed), itself included when it collects.",
	})
	collecting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_relay_replica_collecting",
		Help: "1 while this replica collects its share of the runs; 0 while it does not (its store unreachable, its row not renewed, stopping).",
	})
)

var registerOnce sync.Once

// RegisterMetrics adds the membership metrics to controller-runtime's
// registry, which the manager serves on /metrics.
func RegisterMetrics() {
	registerOnce.Do(func() { metrics.Registry.MustRegister(replicasLive, collecting) })
}
