package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// scrape is one reading of a Prometheus endpoint; two readings around a
// cell give what happened during it.
type scrape map[string]*dto.MetricFamily

func parseMetrics(r io.Reader) (scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// apiServerMetrics reads the API server's /metrics.
func apiServerMetrics(ctx context.Context, cs kubernetes.Interface) (scrape, error) {
	rc, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return parseMetrics(rc)
}

// httpMetrics reads a plain-HTTP /metrics (the webhook's, the relay's).
func httpMetrics(addr string) (scrape, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// histogram is a histogram's change between two scrapes, summed over the
// series whose labels match.
type histogram struct {
	count  uint64
	sum    float64
	bounds []float64
	cum    []uint64 // cumulative counts per bound
}

func (s scrape) histogram(name string, match map[string]string) histogram {
	var h histogram
	mf := s[name]
	if mf == nil {
		return h
	}
	byBound := map[float64]uint64{}
	for _, m := range mf.Metric {
		if !labelsMatch(m, match) || m.Histogram == nil {
			continue
		}
		h.count += m.Histogram.GetSampleCount()
		h.sum += m.Histogram.GetSampleSum()
		for _, b := range m.Histogram.Bucket {
			byBound[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	for b := range byBound {
		h.bounds = append(h.bounds, b)
	}
	sort.Float64s(h.bounds)
	for _, b := range h.bounds {
		h.cum = append(h.cum, byBound[b])
	}
	return h
}

// minus is h - before: what was observed between the two scrapes.
func (h histogram) minus(before histogram) histogram {
	d := histogram{count: h.count - before.count, sum: h.sum - before.sum, bounds: h.bounds}
	for i, b := range h.bounds {
		var prev uint64
		for j, bb := range before.bounds {
			if bb == b {
				prev = before.cum[j]
			}
		}
		d.cum = append(d.cum, h.cum[i]-prev)
	}
	return d
}

func (h histogram) mean() float64 {
	if h.count == 0 {
		return math.NaN()
	}
	return h.sum / float64(h.count)
}

// quantileBound is the upper bound of the bucket holding quantile q: the
// honest reading of a histogram ("p99 ≤ 5 ms"), no interpolation.
func (h histogram) quantileBound(q float64) float64 {
	if h.count == 0 {
		return math.NaN()
	}
	want := uint64(math.Ceil(q * float64(h.count)))
	for i, c := range h.cum {
		if c >= want {
			return h.bounds[i]
		}
	}
	return math.Inf(1)
}

func labelsMatch(m *dto.Metric, match map[string]string) bool {
	for k, v := range match {
		found := false
		for _, l := range m.Label {
			if l.GetName() == k && (l.GetValue() == v || strings.HasSuffix(v, "*") && strings.HasPrefix(l.GetValue(), strings.TrimSuffix(v, "*"))) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// gauge sums a gauge's series whose labels match.
func (s scrape) gauge(name string, match map[string]string) float64 {
	mf := s[name]
	if mf == nil {
		return math.NaN()
	}
	var v float64
	for _, m := range mf.Metric {
		if labelsMatch(m, match) && m.Gauge != nil {
			v += m.Gauge.GetValue()
		}
	}
	return v
}
