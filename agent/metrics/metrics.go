// Package metrics holds the agent's Prometheus metrics, registered on
// controller-runtime's registry (served by the manager's metrics endpoint).
package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

var (
	// BrokerCalls counts calls to the broker by call and outcome (ok, no_capacity, unavailable, refused).
	BrokerCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rb_agent_broker_calls_total",
		Help: "Calls from the agent to the broker, by call and outcome.",
	}, []string{"call", "outcome"})
	// StreamConnected is 1 while the broker's event stream is open.
	StreamConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rb_agent_event_stream_connected",
		Help: "1 while the agent follows the broker's event stream, 0 while it reconnects.",
	})
	// StreamEvents counts broker events handled, by type.
	StreamEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rb_agent_broker_events_total",
		Help: "Broker events handled, by type.",
	}, []string{"type"})
	// EvictionsHeld counts the evictions of ended reservations' pods a
	// provider holds back, by why: the requester is still heard
	// (requester_heard) or many leases lapsed at once (mass_expiry).
	EvictionsHeld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rb_agent_evictions_held_total",
		Help: "Evictions of an ended reservation's pods held back by this provider, by reason (requester_heard, mass_expiry); counted once per reservation and reason.",
	}, []string{"reason"})
	// Info is 1, labelled with the agent's cluster id and version: a
	// federation's dashboards join the agent's other series (which carry the
	// scrape's labels only) to the member cluster they come from.
	Info = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rb_agent_info",
		Help: "1, labelled with this agent's cluster id and version.",
	}, []string{"cluster", "version"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(BrokerCalls, StreamConnected, StreamEvents, EvictionsHeld, Info)
}

var reservationsDesc = prometheus.NewDesc("rb_agent_reservations",
	"Reservation objects in this cluster, by phase.", []string{"phase"}, nil)

// reservationCollector counts Reservations by phase from the manager's cache at scrape time.
type reservationCollector struct{ reader client.Reader }

// RegisterReservationCollector exports rb_agent_reservations from reader (the
// manager's cache). A second registration in one process is ignored.
func RegisterReservationCollector(reader client.Reader) error {
	err := ctrlmetrics.Registry.Register(&reservationCollector{reader: reader})
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		return nil
	}
	return err
}

func (c *reservationCollector) Describe(ch chan<- *prometheus.Desc) { ch <- reservationsDesc }

func (c *reservationCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var list rbv1.ReservationList
	if err := c.reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(reservationsDesc, err)
		return
	}
	counts := map[rbv1.ReservationPhase]int{}
	for _, p := range []rbv1.ReservationPhase{rbv1.ReservationPending, rbv1.ReservationReserved, rbv1.ReservationActive,
		rbv1.ReservationReleased, rbv1.ReservationFailed, rbv1.ReservationExpired} {
		counts[p] = 0
	}
	for _, r := range list.Items {
		phase := r.Status.Phase
		if phase == "" {
			phase = rbv1.ReservationPending
		}
		counts[phase]++
	}
	for phase, n := range counts {
		ch <- prometheus.MustNewConstMetric(reservationsDesc, prometheus.GaugeValue, float64(n), string(phase))
	}
}

// Outcome names the outcome of a broker call for BrokerCalls.
func Outcome(err error, noCapacity, retryable func(error) bool) string {
	switch {
	case err == nil:
		return "ok"
	case noCapacity(err):
		return "no_capacity"
	case retryable(err):
		return "unavailable"
	default:
		return "refused"
	}
}
