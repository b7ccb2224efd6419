package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// replicaMetrics are what the simulator reads from a replica's /metrics:
// the decisions it proposed from its view (hinted) and those that walked
// the index in Redis (walked), and how long it took to answer, by
// histogram, since it started.
type replicaMetrics struct {
	hinted, walked float64
	// answered: rb_broker_http_request_duration_seconds by "METHOD route",
	// and rb_broker_decision_duration_seconds (every outcome) as "decide".
	answered map[string]histogram
}

// histogram is a Prometheus histogram's cumulative buckets.
type histogram struct {
	bounds []float64 // upper bounds, ascending, +Inf last
	counts []float64 // cumulative
}

// minus is h less an earlier reading of the same histogram.
func (h histogram) minus(earlier histogram) histogram {
	d := histogram{bounds: h.bounds, counts: slices.Clone(h.counts)}
	if len(earlier.counts) == len(h.counts) {
		for i := range d.counts {
			d.counts[i] -= earlier.counts[i]
		}
	}
	return d
}

func (h histogram) count() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile interpolates the q-quantile within its bucket as Prometheus'
// histogram_quantile does: the buckets double, so it is known to a factor
// of two at worst. Past the last finite bound it is that bound.
func (h histogram) quantile(q float64) float64 {
	n := h.count()
	if n == 0 {
		return math.NaN()
	}
	rank := q * n
	i := sort.Search(len(h.counts), func(i int) bool { return h.counts[i] >= rank })
	if i >= len(h.bounds)-1 {
		return h.bounds[len(h.bounds)-2]
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.bounds[i-1], h.counts[i-1]
	}
	in := h.counts[i] - below
	if in <= 0 {
		return h.bounds[i]
	}
	return lower + (h.bounds[i]-lower)*(rank-below)/in
}

// scrapeReplica reads a replica's metrics (health: its health address).
func scrapeReplica(ctx context.Context, health string) (replicaMetrics, error) {
	rm := replicaMetrics{answered: map[string]histogram{}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, health+"/metrics", nil)
	if err != nil {
		return rm, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rm, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return rm, fmt.Errorf("GET %s/metrics: %s", health, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return rm, fmt.Errorf("GET %s/metrics: %w", health, err)
	}
	if fam := fams["rb_broker_view_decisions_total"]; fam != nil {
		for _, m := range fam.GetMetric() {
			switch label(m, "how") {
			case "hinted":
				rm.hinted = m.GetCounter().GetValue()
			case "walked":
				rm.walked = m.GetCounter().GetValue()
			}
		}
	}
	if fam := fams["rb_broker_http_request_duration_seconds"]; fam != nil {
		for _, m := range fam.GetMetric() {
			rm.add(label(m, "method")+" "+label(m, "route"), m)
		}
	}
	if fam := fams["rb_broker_decision_duration_seconds"]; fam != nil {
		for _, m := range fam.GetMetric() {
			rm.add("decide", m)
		}
	}
	return rm, nil
}

// add adds metric m's histogram to the one read as key (a sum over labels).
func (rm replicaMetrics) add(key string, m *dto.Metric) {
	if h := m.GetHistogram(); h != nil {
		rm.answered[key] = rm.answered[key].plus(fromProto(h))
	}
}

// fromProto is a histogram as /metrics carries it.
func fromProto(h *dto.Histogram) histogram {
	var out histogram
	for _, b := range h.GetBucket() {
		out.bounds = append(out.bounds, b.GetUpperBound())
		out.counts = append(out.counts, float64(b.GetCumulativeCount()))
	}
	out.bounds = append(out.bounds, math.Inf(1))
	out.counts = append(out.counts, float64(h.GetSampleCount()))
	return out
}

// plus is the sum of h and o, histograms of the same buckets (an empty one
// adds nothing; o's buckets differing, h alone).
func (h histogram) plus(o histogram) histogram {
	if len(h.counts) == 0 {
		return o
	}
	sum := histogram{bounds: h.bounds, counts: slices.Clone(h.counts)}
	if len(o.counts) == len(sum.counts) {
		for i := range sum.counts {
			sum.counts[i] += o.counts[i]
		}
	}
	return sum
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
