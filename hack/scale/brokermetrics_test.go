package main

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHistogramQuantile reads a real Prometheus histogram as the replicas'
// /metrics carries it: sums over labels, subtracts an earlier reading and
// interpolates in the buckets as histogram_quantile does.
func TestHistogramQuantile(t *testing.T) {
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d", Buckets: []float64{0.001, 0.002, 0.004, 0.008}}, []string{"route"})
	read := func() replicaMetrics {
		rm := replicaMetrics{answered: map[string]histogram{}}
		for _, route := range []string{"a", "b"} {
			var m dto.Metric
			require.NoError(t, vec.WithLabelValues(route).(prometheus.Metric).Write(&m))
			rm.add("both", &m)
		}
		return rm
	}
	for range 10 {
		vec.WithLabelValues("a").Observe(0.0005) // before the window
	}
	before := read()
	for range 50 {
		vec.WithLabelValues("a").Observe(0.0015) // (1, 2] ms
	}
	for range 49 {
		vec.WithLabelValues("b").Observe(0.003) // (2, 4] ms
	}
	vec.WithLabelValues("b").Observe(1) // past the last bound
	h := read().answered["both"].minus(before.answered["both"])

	assert.Equal(t, 100.0, h.count())
	assert.InDelta(t, 0.002, h.quantile(0.5), 1e-12, "the 50th of 100 is the last of (1, 2] ms")
	assert.InDelta(t, 0.001+0.001*25/50, h.quantile(0.25), 1e-12, "half-way through (1, 2] ms")
	assert.InDelta(t, 0.002+0.002*49/49, h.quantile(0.99), 1e-12)
	assert.Equal(t, 0.008, h.quantile(0.999), "past the last finite bound: that bound")
	assert.True(t, math.IsNaN(histogram{}.quantile(0.5)))
}
