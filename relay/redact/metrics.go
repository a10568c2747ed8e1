package redact

import "github.com/prometheus/client_golang/prometheus"

var valuesReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "clipjob_relay_redact_values_reloads_total",
	Help: "Reads of --redact-values-file after the start that changed the values (applied) or failed (error: the values before stay in force).",
}, []string{"result"})

// Collectors returns the redaction metrics, for the relay to register.
func Collectors() []prometheus.Collector { return []prometheus.Collector{valuesReloads} }
