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
	h := m.GetHistogram()
	if h == nil {
		return
	}
	sum := rm.answered[key]
	if sum.bounds == nil {
		for _, b := range h.GetBucket() {
			sum.bounds = append(sum.bounds, b.GetUpperBound())
		}
		sum.bounds = append(sum.bounds, math.Inf(1))
		sum.counts = make([]float64, len(sum.bounds))
	}
	if len(sum.bounds) != len(h.GetBucket())+1 {
		return // not the same buckets: cannot be summed
	}
	for i, b := range h.GetBucket() {
		sum.counts[i] += float64(b.GetCumulativeCount())
	}
	sum.counts[len(sum.counts)-1] += float64(h.GetSampleCount())
	rm.answered[key] = sum
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
