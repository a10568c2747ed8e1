package mirror

import "github.com/prometheus/client_golang/prometheus"

var refused = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "clipjob_relay_mirror_refused_total",
	Help: "Mirror writes refused because the path on the shared volume was a symlink, hard link or other non-regular file.",
})

// Collectors returns the mirror's metrics, for the relay to register.
func Collectors() []prometheus.Collector { return []prometheus.Collector{refused} }
