package relay

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/paperclipai/clipjob/relay/collect"
	"github.com/paperclipai/clipjob/relay/mirror"
	"github.com/paperclipai/clipjob/relay/redact"
	"github.com/paperclipai/clipjob/relay/store/postgres"
)

var (
	storeSize = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_relay_store_bytes", Help: "Size of the store file.",
	})
	runsRetired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_relay_runs_deleted_total", Help: "Runs deleted by retention.",
	})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(storeSize, runsRetired)
		metrics.Registry.MustRegister(postgres.Collectors()...)
		collect.RegisterMetrics()
		metrics.Registry.MustRegister(mirror.Collectors()...)
		metrics.Registry.MustRegister(redact.Collectors()...)
	})
}
