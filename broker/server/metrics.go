package server

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fluidos-project/resource-broker/broker/store"
)

// Reservation outcomes, the label of rb_broker_reservations_total.
const (
	outcomeReserved = "reserved"
	outcomeReplayed = "replayed"
	outcomeNoFit    = "no_fit"
	outcomeConflict = "conflict"
	outcomeInvalid  = "invalid"
	outcomeError    = "error"
)

// Renewal outcomes, the label of rb_broker_renewals_total (one per id).
const (
	renewRenewed   = "renewed"
	renewNotFound  = "not_found"
	renewEnded     = "ended"
	renewNotALease = "not_a_lease"
	// renewByRequester: a provider's renewal its requester made needless.
	renewByRequester = "by_requester"
	renewError       = "error"
)

// Heartbeat outcomes, the label of rb_broker_heartbeats_total.
const (
	heartbeatAccepted            = "accepted"
	heartbeatAdvertisementNeeded = "advertisement_needed"
)

// renewOutcomes are the outcomes of postRenewals' counts, in their order.
var renewOutcomes = [5]string{renewRenewed, renewNotFound, renewEnded, renewNotALease, renewByRequester}

type metrics struct {
	registry     *prometheus.Registry
	reservations *prometheus.CounterVec
	decision     *prometheus.HistogramVec
	ended        *prometheus.CounterVec
	scriptErrors *prometheus.CounterVec
	clamps       prometheus.Counter
	outages      prometheus.Counter
	outageSecs   prometheus.Counter
	credited     prometheus.Counter
	covered      *prometheus.CounterVec
	requests     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	streams      prometheus.Gauge
	renewals     *prometheus.CounterVec
	renewBatch   prometheus.Histogram
	v1Capped     *prometheus.CounterVec
	rateLimited  *prometheus.CounterVec
	// advertisementsShed counts advertisements answered 503 Busy (advertGate).
	advertisementsShed prometheus.Counter
	// heartbeats counts heartbeats by outcome (heartbeatAccepted, heartbeatAdvertisementNeeded).
	heartbeats *prometheus.CounterVec

	outcomes      map[string]*lazyCounter        // reservations' children by outcome; read-only once built
	renewOutcomes map[string]*lazyCounter        // renewals' children by outcome; read-only once built
	decisions     map[string]prometheus.Observer // decision's children by outcome; read-only once built
}

func newMetrics(stores []*store.Store, memory *redisMemory, advertising *advertGate) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		reservations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_reservations_total",
			Help: "Reservation requests by outcome (reserved, replayed, no_fit, conflict, invalid, error).",
		}, []string{"outcome"}),
		decision: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rb_broker_decision_duration_seconds",
			Help: "Time to decide a reservation request, by outcome (reserved, replayed, no_fit, conflict, limited, error): " +
				"its wait for a batch and the reserve script's round trip to Redis.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 100µs .. 3.3s
		}, []string{"outcome"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_reservations_ended_total",
			Help: "Reservations ended, by how (released, expired).",
		}, []string{"how"}),
		scriptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_script_errors_total",
			Help: "Failed Lua script calls, by script.",
		}, []string{"script"}),
		outages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rb_broker_outages_total",
			Help: "Broker outages found by this replica: no expiry run of any replica for longer than --outage-gap (all replicas down, Redis frozen, restarting or failing over).",
		}),
		outageSecs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rb_broker_outage_seconds_total",
			Help: "Length of the broker outages this replica found; their time does not count against leases.",
		}),
		credited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rb_broker_leases_credited_total",
			Help: "Due leases given a whole lease after a broker outage instead of expiring.",
		}),
		covered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_covered_leases_total",
			Help: "Leases covered by their requester's renewal set that this replica's expiry parked (the set's end stands for them), unparked (the set's end passed: their ends written back) or moved (a set not committed: the score moved to its end).",
		}, []string{"action"}),
		clamps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rb_broker_invariant_clamps_total",
			Help: "Reserved counters that would have gone below zero on release (should stay 0).",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_http_requests_total",
			Help: "API requests by method, route (the registered pattern, e.g. /api/v2/reservations/{id}) and status code.",
		}, []string{"method", "route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rb_broker_http_request_duration_seconds",
			Help: "Time to answer an API request, by method and route (the registered pattern); " +
				"not the event streams (GET /api/v2/events), which last as long as their connection.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 500µs .. 4s
		}, []string{"method", "route"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rb_broker_event_streams",
			Help: "Open event streams.",
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_renewals_total",
			Help: "Lease renewals, one per id, by outcome (renewed, not_found, ended, not_a_lease, error).",
		}, []string{"outcome"}),
		renewBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rb_broker_renewal_batch_size",
			Help:    "Ids per valid renewal request (POST /api/v2/renewals).",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000},
		}),
		v1Capped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_v1_allocated_capped_total",
			Help: "Seed (v1) advertisements whose allocated exceeded allocatable, capped at allocatable, by resource (cpu, memory, gpu, storage).",
		}, []string{"resource"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_rate_limited_total",
			Help: "Members' calls refused by one of their rates (broker/policy members), by rate (advertisements, renewals, renewed-ids, renewal-bytes, writes, protections); reserve calls refused by their rate count as rb_broker_reservations_total{outcome=\"limited\"}.",
		}, []string{"rate"}),
		advertisementsShed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rb_broker_advertisements_shed_total",
			Help: "Advertisements answered 503 Busy with a Retry-After: their turn to reach Redis (two at a time per replica) did not come within 3s.",
		}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_broker_heartbeats_total",
			Help: "Heartbeats (PUT /api/v2/clusters/{id}/heartbeat) by outcome: accepted (liveness refreshed), advertisement_needed (409: the broker does not hold the advertisement named, or the cluster went stale).",
		}, []string{"outcome"}),
	}
	m.registry.MustRegister(m.reservations, m.decision, m.ended, m.scriptErrors, m.clamps, m.outages, m.outageSecs, m.credited, m.covered, m.requests, m.latency, m.streams,
		m.renewals, m.renewBatch, m.v1Capped, m.rateLimited, m.advertisementsShed, m.heartbeats,
		&clusterCollector{stores: stores}, &redisMemoryCollector{memory: memory},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rb_broker_advertisements_waiting",
			Help: "Advertisements waiting for their turn to reach Redis on this replica.",
		}, func() float64 { return float64(advertising.waiting()) }),
		viewCounter(stores, "hinted", func(v store.ViewStats) uint64 { return v.Hinted }),
		viewCounter(stores, "walked", func(v store.ViewStats) uint64 { return v.Walked }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rb_broker_view_catchup_errors_total",
			Help: "Failed catch-ups of this replica's view of the candidate index (--decide-from-view): the batch walked the index.",
		}, func() float64 { return sumView(stores, func(v store.ViewStats) uint64 { return v.CatchUpErrors }) }),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.outcomes = map[string]*lazyCounter{}
	for _, o := range []string{outcomeReserved, outcomeReplayed, outcomeNoFit, outcomeConflict, outcomeInvalid, outcomeError} {
		m.outcomes[o] = &lazyCounter{vec: m.reservations, values: []string{o}}
	}
	// The decisions' series exist from the start: a dashboard's quantiles
	// and rates need no first decision.
	m.decisions = map[string]prometheus.Observer{}
	for _, o := range []string{outcomeReserved, outcomeReplayed, outcomeNoFit, outcomeConflict, outcomeLimited, outcomeError} {
		m.decisions[o] = m.decision.WithLabelValues(o)
	}
	m.renewOutcomes = map[string]*lazyCounter{}
	for _, o := range []string{renewRenewed, renewNotFound, renewEnded, renewNotALease, renewByRequester, renewError} {
		m.renewOutcomes[o] = &lazyCounter{vec: m.renewals, values: []string{o}}
	}
	for _, o := range []string{heartbeatAccepted, heartbeatAdvertisementNeeded} {
		m.heartbeats.WithLabelValues(o)
	}
	return m
}

// viewCounter is rb_broker_view_decisions_total{how}: requests this
// replica sent with candidates from its view (hinted), or without (walked:
// reserve.lua walks the index), summed over its stores (cells).
func viewCounter(stores []*store.Store, how string, of func(store.ViewStats) uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "rb_broker_view_decisions_total",
		Help:        "Reservation requests sent by this replica with --decide-from-view, by how their candidates were found: hinted (proposed by its view of the candidate index) or walked (the view could not propose them, or its catch-up failed: reserve.lua walked the index).",
		ConstLabels: prometheus.Labels{"how": how},
	}, func() float64 { return sumView(stores, of) })
}

func sumView(stores []*store.Store, of func(store.ViewStats) uint64) float64 {
	var n uint64
	for _, s := range stores {
		n += of(s.ViewStats())
	}
	return float64(n)
}

// The counters of the request path are resolved once and cached: a
// CounterVec's WithLabelValues hashes the label values and takes a lock on
// every call. Children are still created on first use, as WithLabelValues
// creates them, so /metrics lists the same series.

// lazyCounter is one child of a CounterVec, created on its first use.
type lazyCounter struct {
	vec    *prometheus.CounterVec
	values []string
	c      atomic.Pointer[prometheus.Counter]
}

func (l *lazyCounter) get() prometheus.Counter {
	if c := l.c.Load(); c != nil {
		return *c
	}
	c := l.vec.WithLabelValues(l.values...) // idempotent: a race creates nothing twice
	l.c.Store(&c)
	return c
}

// reservation returns the rb_broker_reservations_total counter of an outcome.
func (m *metrics) reservation(outcome string) prometheus.Counter {
	if l, ok := m.outcomes[outcome]; ok {
		return l.get()
	}
	return m.reservations.WithLabelValues(outcome)
}

// decided counts a decision of a reservation request and its duration.
func (m *metrics) decided(outcome string, took time.Duration) {
	m.reservation(outcome).Inc()
	if o, ok := m.decisions[outcome]; ok {
		o.Observe(took.Seconds())
		return
	}
	m.decision.WithLabelValues(outcome).Observe(took.Seconds())
}

// renewal returns the rb_broker_renewals_total counter of an outcome.
func (m *metrics) renewal(outcome string) prometheus.Counter {
	if l, ok := m.renewOutcomes[outcome]; ok {
		return l.get()
	}
	return m.renewals.WithLabelValues(outcome)
}

// routeCounters are one route's rb_broker_http_requests_total counters, by
// status code, and its rb_broker_http_request_duration_seconds histogram.
type routeCounters struct {
	vec           *prometheus.CounterVec
	method, route string
	latency       prometheus.Observer                     // nil: not observed (event streams)
	codes         [500]atomic.Pointer[prometheus.Counter] // status codes 100-599
}

// route returns the metrics of the route registered as pattern ("GET
// /api/v2/clusters/{id}"): its method and path pattern are separate labels,
// and a request is never labelled with its raw path.
func (m *metrics) route(pattern string, streaming bool) *routeCounters {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "", pattern
	}
	r := &routeCounters{vec: m.requests, method: method, route: path}
	if !streaming {
		r.latency = m.latency.WithLabelValues(method, path)
	}
	return r
}

// done counts a request answered with code that began at start.
func (r *routeCounters) done(code int, start time.Time) {
	if r.latency != nil {
		r.latency.Observe(time.Since(start).Seconds())
	}
	r.inc(code)
}

func (r *routeCounters) inc(code int) {
	if code < 100 || code >= 600 {
		r.vec.WithLabelValues(r.method, r.route, strconv.Itoa(code)).Inc()
		return
	}
	slot := &r.codes[code-100]
	if c := slot.Load(); c != nil {
		(*c).Inc()
		return
	}
	c := r.vec.WithLabelValues(r.method, r.route, strconv.Itoa(code))
	slot.Store(&c)
	c.Inc()
}

// clusterCollector reports live and stale clusters, read from Redis at
// scrape time: those of every cell.
type clusterCollector struct{ stores []*store.Store }

var clustersDesc = prometheus.NewDesc("rb_broker_clusters", "Advertised clusters by state (live, stale), broker clock.", []string{"state"}, nil)

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- clustersDesc }

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var live, stale int64
	for _, st := range c.stores {
		l, s, err := st.CountClusters(ctx)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(clustersDesc, err)
			return
		}
		live, stale = live+l, stale+s
	}
	ch <- prometheus.MustNewConstMetric(clustersDesc, prometheus.GaugeValue, float64(live), "live")
	ch <- prometheus.MustNewConstMetric(clustersDesc, prometheus.GaugeValue, float64(stale), "stale")
}
