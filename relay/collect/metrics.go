package collect

import "github.com/prometheus/client_golang/prometheus"

var (
	streamsOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clipjob_relay_streams_open", Help: "Log streams open to the API server.",
	})
	streamLimitWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_relay_stream_limit_waits_total",
		Help: "Times a follower waited because the bound on open streams (--max-streams) was reached.",
	})
	linesStored = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_relay_lines_stored_total", Help: "Log lines stored.",
	})
	bytesStored = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_relay_bytes_stored_total", Help: "Bytes of log lines stored (after redaction).",
	})
	storeLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "clipjob_relay_store_lag_seconds",
		Help:    "From a line's timestamp to its commit in the store.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
	})
	linesTruncated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_relay_lines_truncated_total",
		Help: "Log lines longer than --max-line-bytes, stored cut and marked.",
	})
	podsIgnored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clipjob_relay_pods_ignored_total",
		Help: "Pods labeled with a run id that are not collected, by reason (no-job: no controlling Job; job-uid: the run id is another Job's and this Job's UID is malformed; retired: retention deleted the run while its pod remains).",
	}, []string{"reason"})
	podsKeptApart = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clipjob_relay_pods_kept_apart_total",
		Help: "Pod events of a Job whose run id another Job took first, by reason (namespace or job): kept as a run of their own, under id@jobUID.",
	}, []string{"reason"})
	reconnects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clipjob_relay_reconnects_total",
		Help: "Log stream reconnects by cause (error, eof before the container ended, lifetime: proactive, final: a log that ended while followed read once more, unsure: a line read again or written twice, read again from the cursor, refused: the store refused a commit because another writer had stored the stream's lines first, as after a replica lost its runs while frozen or cut off).",
	}, []string{"cause"})
	unsureStored = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clipjob_relay_unsure_lines_stored_total",
		Help: "Lines read again or written twice, stamped alike, stored without reading the log again: their stream had read it again 3 times within 10 minutes (a file served again is stored twice).",
	})
)

// Collectors returns the collection metrics, for the relay to register.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{streamsOpen, streamLimitWaits, linesStored, bytesStored, storeLag, reconnects, unsureStored, podsIgnored, podsKeptApart, linesTruncated}
}
