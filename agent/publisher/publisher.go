// Package publisher sends this cluster's advertisement to the broker (its
// totals, the summary of its nodes and the reservations running on them,
// for the broker's per-node fit): on a change of the collector's figures
// (at most one publish per debounce interval; a change after a quiet spell
// goes out at once) and at least
// every period, on wall-clock multiples of it (every :00 and :30 for 30 s),
// so the broker keeps the cluster live. A failed publish is retried with
// exponential back-off until it succeeds.
//
// Heartbeats: while the measurement stays within Config.Band of the
// advertisement the broker last stored (withinBand: the same nodes, labels,
// prices and reservations listed, every used figure within a few % of its
// allocatable), a change publishes nothing and a period's publish is a
// heartbeat naming that advertisement by the digest the broker answered
// with: the broker refreshes the cluster's liveness only, without reading
// its nodes again. A heartbeat the broker cannot take (409
// AdvertisementNeeded: it lost its state, holds a newer advertisement, or
// the cluster went stale) is followed at once by the full advertisement.
// docs/architecture.md says why figures up to a band old are safe.
//
// The cluster-scoped Advertisement named after the cluster id shows it: its
// spec is the advertisement last sent, its status the broker's
// acknowledgement (lastPublished, reserved, available) or, while publishing
// fails, condition Published=False with the reason and consecutiveFailures.
// The Published condition's observedGeneration is the generation of the
// spec it is about. A change of the condition is reported as an event.
//
// Metrics (on controller-runtime's registry unless Config.Registerer says
// otherwise): rb_agent_publish_duration_seconds{result},
// rb_agent_publish_failures_total{reason}, rb_agent_published_timestamp_seconds,
// rb_agent_publish_consecutive_failures and rb_agent_heartbeats_total{outcome}.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/fluidos-project/resource-broker/agent/collector"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

// Defaults of Config.
const (
	DefaultDebounce   = time.Second
	DefaultPeriod     = 30 * time.Second
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
	DefaultTimeout    = 15 * time.Second
)

// Reasons of the Published condition (and labels of the failures metric).
const (
	// ReasonAcknowledged: the broker stored the advertisement.
	ReasonAcknowledged = "Acknowledged"
	// ReasonBrokerUnreachable: no answer (connection refused or reset, timeout, TLS failure).
	ReasonBrokerUnreachable = "BrokerUnreachable"
	// ReasonBrokerUnavailable: the broker answered 5xx or 429 (e.g. it lost Redis).
	ReasonBrokerUnavailable = "BrokerUnavailable"
	// ReasonBrokerBusy: the broker shed the advertisement (503 Busy: more
	// members advertising at once than it stores in time); published again
	// after its Retry-After.
	ReasonBrokerBusy = "BrokerBusy"
	// ReasonBrokerRejected: the broker refused the advertisement (4xx: invalid, wrong identity).
	ReasonBrokerRejected = "BrokerRejected"
)

// Event reasons.
const (
	EventPublished     = "Published"
	EventPublishFailed = "PublishFailed"
)

// Source is what the publisher needs of the collector (*collector.Collector).
type Source interface {
	Measure() collector.Measurement
	Changed() <-chan struct{}
	WaitForSync(ctx context.Context) bool
}

// Broker is what the publisher needs of the broker client (*client.Client).
type Broker interface {
	Advertise(ctx context.Context, id string, a api.Advertisement) (api.Cluster, error)
	Heartbeat(ctx context.Context, id, digest string) (api.Heartbeat, error)
}

// Heartbeat outcomes, the label of rb_agent_heartbeats_total.
const (
	HeartbeatAccepted            = "accepted"
	HeartbeatAdvertisementNeeded = "advertisement_needed"
)

// Config configures a Publisher.
type Config struct {
	// ClusterID is this cluster's identity at the broker (the certificate's
	// CN) and the name of the Advertisement object. Required.
	ClusterID string
	// Endpoint, Labels and Prices are advertised as they are.
	Endpoint string
	Labels   map[string]string
	Prices   *rbv1.Prices

	// Debounce is the shortest time between two publishes caused by
	// changes (DefaultDebounce).
	Debounce time.Duration
	// Period: a publish at least at every multiple of Period on the wall
	// clock (DefaultPeriod).
	Period time.Duration
	// Band: while every used cpu, memory and storage figure (of each node
	// and of the cluster) stays within Band of its allocatable of the
	// advertisement the broker holds, and nothing else changed, a change
	// publishes nothing and a period's publish is a heartbeat (DefaultBand,
	// when zero; negative: every publish is a full advertisement).
	Band float64
	// MinBackoff and MaxBackoff bound the wait before retrying a failed
	// publish; it doubles with each failure, with jitter (up to half more:
	// internal/backoff) (DefaultMinBackoff, DefaultMaxBackoff). A refusal
	// (4xx) waits MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Timeout bounds one publish, the broker client's own retries included
	// (DefaultTimeout).
	Timeout time.Duration

	// Source gives the measurements. Required.
	Source Source
	// Broker receives the advertisements. Required.
	Broker Broker
	// Client writes the Advertisement object (spec, and status through its
	// subresource). Required.
	Client client.Client
	// APIReader, when set, reads the Advertisement (once at start and after
	// a conflict) instead of Client, e.g. the manager's GetAPIReader() so as
	// not to start an informer for one object.
	APIReader client.Reader
	// Recorder, when set, reports changes of the Published condition as
	// events on the Advertisement (e.g. the manager's GetEventRecorder).
	Recorder events.EventRecorder
	// Registerer takes the metrics (controller-runtime's metrics.Registry
	// when nil). Metrics already registered there are reused.
	Registerer prometheus.Registerer
}

// Publisher is a manager.Runnable that runs on the leader only.
type Publisher struct {
	cfg     Config
	metrics *metrics
	log     logr.Logger

	adv      *rbv1.Advertisement // as last read or written; nil: read it again
	failures int32               // consecutive failed publishes

	// stored is the advertisement the broker last stored and digest its
	// name there ("": none, the next publish is a full advertisement).
	stored rbv1.AdvertisementSpec
	digest string
}

// New checks cfg and returns a publisher; add it to a manager (or call SetupWithManager).
func New(cfg Config) (*Publisher, error) {
	switch {
	case cfg.ClusterID == "":
		return nil, errors.New("publisher: ClusterID is required")
	case cfg.Source == nil:
		return nil, errors.New("publisher: Source is required")
	case cfg.Broker == nil:
		return nil, errors.New("publisher: Broker is required")
	case cfg.Client == nil:
		return nil, errors.New("publisher: Client is required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.Debounce, DefaultDebounce)
	def(&cfg.Period, DefaultPeriod)
	def(&cfg.MinBackoff, DefaultMinBackoff)
	def(&cfg.MaxBackoff, DefaultMaxBackoff)
	def(&cfg.Timeout, DefaultTimeout)
	if cfg.Band == 0 {
		cfg.Band = DefaultBand
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	if cfg.APIReader == nil {
		cfg.APIReader = cfg.Client
	}
	if cfg.Registerer == nil {
		cfg.Registerer = crmetrics.Registry
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg, metrics: m, log: logr.Discard()}, nil
}

// SetupWithManager adds the publisher to mgr.
func (p *Publisher) SetupWithManager(mgr ctrl.Manager) error { return mgr.Add(p) }

// NeedLeaderElection is true: only the leader publishes.
func (p *Publisher) NeedLeaderElection() bool { return true }

// Start publishes until ctx ends. It waits for the collector to sync
// first: incomplete totals are never published.
func (p *Publisher) Start(ctx context.Context) error {
	p.log = ctrl.LoggerFrom(ctx).WithName("publisher").WithValues("cluster", p.cfg.ClusterID)
	ctx = ctrl.LoggerInto(ctx, p.log)
	p.log.Info("waiting for the collector to sync")
	if !p.cfg.Source.WaitForSync(ctx) {
		return nil
	}
	p.resume(ctx)

	var (
		now           = time.Now()
		nextTick      = nextAligned(now, p.cfg.Period)
		due           = true // a publish is wanted (at start, after a change, at a tick)
		tick          = true // ... and it need not wait for the debounce interval
		debounceUntil time.Time
		backoffUntil  time.Time
		timer         = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	p.log.Info("publishing", "debounce", p.cfg.Debounce, "period", p.cfg.Period, "firstTick", nextTick.Format(time.RFC3339Nano))
	for {
		now = time.Now()
		if !now.Before(nextTick) {
			due, tick = true, true
			nextTick = nextAligned(now, p.cfg.Period)
		}
		if due && !now.Before(backoffUntil) && (tick || !now.Before(debounceUntil)) {
			err := p.publish(ctx, tick)
			if ctx.Err() != nil {
				return nil
			}
			now = time.Now()
			if err == nil {
				due, tick = false, false
				debounceUntil, backoffUntil = now.Add(p.cfg.Debounce), time.Time{}
			} else {
				tick = false
				backoffUntil = now.Add(p.backoff(err))
			}
			continue // a tick may have passed while publishing
		}
		wake := nextTick
		if due {
			at := backoffUntil
			if !tick && debounceUntil.After(at) {
				at = debounceUntil
			}
			if at.Before(wake) {
				wake = at
			}
		}
		timer.Reset(time.Until(wake))
		select {
		case <-ctx.Done():
			return nil
		case <-p.cfg.Source.Changed():
			due = true
		case <-timer.C:
		}
	}
}

// nextAligned is the first multiple of period on the wall clock after now.
func nextAligned(now time.Time, period time.Duration) time.Time {
	return now.Truncate(period).Add(period)
}

// backoff is the wait after the p.failures-th consecutive failure (with
// jitter, so that agents that failed together do not all come back at once),
// no shorter than the broker's Retry-After.
func (p *Publisher) backoff(err error) time.Duration {
	b := backoff.Exponential(p.cfg.MinBackoff, p.cfg.MaxBackoff)
	if !brokerclient.IsRetryable(err) {
		b.Duration = p.cfg.MaxBackoff
	}
	d := backoff.Nth(b, int(p.failures))
	// A broker over its rate for this member (429) or busy (503) says when
	// to come back.
	if ra, ok := brokerclient.RetryAfter(err); ok && ra > d {
		d = min(ra, p.cfg.MaxBackoff)
	}
	return d
}

// resume reads the Advertisement left by an earlier leader, to continue its
// count of consecutive failures.
func (p *Publisher) resume(ctx context.Context) {
	var adv rbv1.Advertisement
	if err := p.cfg.APIReader.Get(ctx, client.ObjectKey{Name: p.cfg.ClusterID}, &adv); err != nil {
		if !apierrors.IsNotFound(err) {
			p.log.Error(err, "reading the Advertisement")
		}
		return
	}
	p.adv = &adv
	if c := meta.FindStatusCondition(adv.Status.Conditions, rbv1.ConditionPublished); c != nil && c.Status == metav1.ConditionFalse {
		p.failures = adv.Status.ConsecutiveFailures
	}
}

// publish sends one advertisement, or a heartbeat when the measurement is
// within the band of the advertisement the broker holds, and records the
// outcome. On a tick (or a retry) something is always sent, to keep the
// cluster live; otherwise a change within the band sends nothing.
func (p *Publisher) publish(ctx context.Context, tick bool) error {
	// Changes signalled so far are in this measurement: drop the signal,
	// so that only a later change causes another publish.
	select {
	case <-p.cfg.Source.Changed():
	default:
	}
	m := p.cfg.Source.Measure()
	spec := rbv1.AdvertisementSpec{
		ClusterID: p.cfg.ClusterID, Endpoint: p.cfg.Endpoint, Labels: p.cfg.Labels, Prices: p.cfg.Prices,
		Capacity: m.Capacity, Allocatable: m.Allocatable, Allocated: m.Allocated,
		Nodes: nodesOf(m.NodeSummary), ReservationsOnNodes: m.ReservationsOnNodes,
	}
	began := time.Now()
	if p.digest != "" && withinBand(p.stored, spec, p.cfg.Band) {
		if !tick && p.failures == 0 {
			return nil // the broker's copy still stands: the next tick's heartbeat keeps it live
		}
		ack, err := p.heartbeat(ctx)
		if !brokerclient.IsAdvertisementNeeded(err) {
			return p.outcome(ctx, m, p.stored, ack, err, time.Since(began), true)
		}
		// The broker wants the advertisement itself: send it now.
		p.log.V(1).Info("the broker does not hold the advertisement a heartbeat named: advertising in full", "digest", p.digest, "err", err.Error())
		p.digest = ""
	}
	actx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	ack, err := p.cfg.Broker.Advertise(actx, p.cfg.ClusterID, toWire(spec))
	cancel()
	if err == nil {
		p.stored, p.digest = spec, ack.Digest
	}
	if brokerclient.IsBusy(err) && p.digest != "" && offersNoMore(p.stored, spec, p.cfg.Band) {
		// The broker shed the new figures, and its copy offers no more than
		// the cluster has: a heartbeat keeps the cluster a candidate until
		// the advertisement is taken (after the Retry-After), rather than
		// let it go stale while the broker is loaded.
		if _, herr := p.heartbeat(ctx); herr != nil {
			p.log.V(1).Info("heartbeat after a shed advertisement", "err", herr.Error())
		}
	}
	return p.outcome(ctx, m, spec, ack, err, time.Since(began), false)
}

// heartbeat sends a heartbeat naming the advertisement the broker holds,
// and answers as an advertisement would.
func (p *Publisher) heartbeat(ctx context.Context) (api.Cluster, error) {
	actx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	hb, err := p.cfg.Broker.Heartbeat(actx, p.cfg.ClusterID, p.digest)
	cancel()
	switch {
	case err == nil:
		p.metrics.heartbeats.WithLabelValues(HeartbeatAccepted).Inc()
	case brokerclient.IsAdvertisementNeeded(err):
		p.metrics.heartbeats.WithLabelValues(HeartbeatAdvertisementNeeded).Inc()
	}
	return api.Cluster{ClusterID: hb.ClusterID, SeenAt: hb.SeenAt, Digest: hb.Digest,
		Resources: api.ClusterResources{Reserved: &hb.Reserved, Available: &hb.Available}}, err
}

// outcome records a publish, an advertisement of spec or a heartbeat
// naming it, that took elapsed.
func (p *Publisher) outcome(ctx context.Context, m collector.Measurement, spec rbv1.AdvertisementSpec, ack api.Cluster, err error, elapsed time.Duration, heartbeat bool) error {
	if ctx.Err() != nil {
		return ctx.Err() // stopping: not a failure of the broker
	}
	reason := ReasonAcknowledged
	if err != nil {
		reason = classify(err)
		p.failures++
		p.metrics.duration.WithLabelValues("failure").Observe(elapsed.Seconds())
		p.metrics.failures.WithLabelValues(reason).Inc()
		if reason != ReasonBrokerBusy {
			p.log.Error(err, "publishing failed", "reason", reason, "consecutiveFailures", p.failures, "took", elapsed)
		} else if p.failures&(p.failures-1) == 0 {
			// A busy broker is the federation's load, not this cluster's
			// fault: the 1st, 2nd, 4th, 8th... busy answer in a row is
			// logged, each is in the metrics and the Published condition.
			p.log.Info("the broker is busy: publishing again after its Retry-After", "consecutiveFailures", p.failures, "took", elapsed, "err", err.Error())
		}
	} else {
		if p.failures > 0 {
			p.log.Info("publishing again", "after", p.failures, "failures")
		}
		p.failures = 0
		p.metrics.duration.WithLabelValues("success").Observe(elapsed.Seconds())
		p.metrics.published.SetToCurrentTime()
		p.log.V(1).Info("published", "took", elapsed, "heartbeat", heartbeat, "nodes", m.Nodes, "pods", m.Pods,
			"allocatable", m.Allocatable, "allocated", m.Allocated,
			"nodesListed", len(m.NodeSummary), "nodeSummaryExact", m.NodeSummaryExact, "reservationsOnNodes", len(m.ReservationsOnNodes))
	}
	p.metrics.consecutive.Set(float64(p.failures))
	if werr := p.record(ctx, spec, ack, err, reason); werr != nil && ctx.Err() == nil {
		p.log.Error(werr, "updating the Advertisement")
	}
	return err
}

// classify names why a publish failed.
func classify(err error) string {
	var ae *brokerclient.APIError
	if errors.As(err, &ae) {
		if brokerclient.IsBusy(err) {
			return ReasonBrokerBusy
		}
		if ae.StatusCode >= 500 || ae.StatusCode == http.StatusTooManyRequests {
			return ReasonBrokerUnavailable
		}
		return ReasonBrokerRejected
	}
	return ReasonBrokerUnreachable
}

// record writes the spec sent and the outcome to the Advertisement, and
// reports a change of the Published condition as an event.
func (p *Publisher) record(ctx context.Context, spec rbv1.AdvertisementSpec, ack api.Cluster, pubErr error, reason string) error {
	var before, after *metav1.Condition
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := p.ensureSpec(ctx, spec); err != nil {
			return err
		}
		adv := p.adv.DeepCopy()
		before = meta.FindStatusCondition(p.adv.Status.Conditions, rbv1.ConditionPublished)
		cond := metav1.Condition{Type: rbv1.ConditionPublished, Reason: reason, ObservedGeneration: adv.Generation}
		if pubErr == nil {
			cond.Status = metav1.ConditionTrue
			cond.Message = "the broker stored the advertisement"
			seen := ack.SeenAt
			if seen.IsZero() {
				seen = time.Now()
			}
			adv.Status.LastPublished = &metav1.Time{Time: seen.Truncate(time.Second)}
			adv.Status.Reserved = toList(ack.Resources.Reserved)
			adv.Status.Available = toList(ack.Resources.Available)
		} else {
			cond.Status = metav1.ConditionFalse
			cond.Message = truncate(pubErr.Error(), 1024)
		}
		adv.Status.ConsecutiveFailures = p.failures
		meta.SetStatusCondition(&adv.Status.Conditions, cond)
		after = meta.FindStatusCondition(adv.Status.Conditions, rbv1.ConditionPublished)
		if equality.Semantic.DeepEqual(adv.Status, p.adv.Status) {
			return nil
		}
		if err := p.cfg.Client.Status().Update(ctx, adv); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				p.adv = nil // read it again
			}
			return err
		}
		p.adv = adv
		return nil
	})
	if err != nil {
		return err
	}
	if p.cfg.Recorder != nil && after != nil && (before == nil || before.Status != after.Status || before.Reason != after.Reason) {
		if after.Status == metav1.ConditionTrue {
			p.cfg.Recorder.Eventf(p.adv, nil, corev1.EventTypeNormal, EventPublished, "Publish",
				"the broker accepted the advertisement (generation %d)", after.ObservedGeneration)
		} else {
			p.cfg.Recorder.Eventf(p.adv, nil, corev1.EventTypeWarning, EventPublishFailed, "Publish",
				"%s: %s", after.Reason, after.Message)
		}
	}
	return nil
}

// ensureSpec makes p.adv an up-to-date Advertisement with spec.
func (p *Publisher) ensureSpec(ctx context.Context, spec rbv1.AdvertisementSpec) error {
	if p.adv == nil {
		var adv rbv1.Advertisement
		err := p.cfg.APIReader.Get(ctx, client.ObjectKey{Name: p.cfg.ClusterID}, &adv)
		switch {
		case apierrors.IsNotFound(err):
			adv = rbv1.Advertisement{
				ObjectMeta: metav1.ObjectMeta{Name: p.cfg.ClusterID, Labels: map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue}},
				Spec:       spec,
			}
			if err := p.cfg.Client.Create(ctx, &adv); err != nil {
				return err
			}
			p.adv = &adv
			return nil
		case err != nil:
			return err
		}
		p.adv = &adv
	}
	if equality.Semantic.DeepEqual(p.adv.Spec, spec) {
		return nil
	}
	adv := p.adv.DeepCopy()
	adv.Spec = spec
	if err := p.cfg.Client.Update(ctx, adv); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			p.adv = nil
		}
		return err
	}
	p.adv = adv
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// PricesFromWire converts the broker's price type to the Advertisement's.
func PricesFromWire(p *api.Prices) *rbv1.Prices {
	if p == nil {
		return nil
	}
	return &rbv1.Prices{Currency: p.Currency, CPU: p.CPU, Memory: p.Memory, GPU: p.GPU}
}

// toWire converts the spec to the broker's advertisement.
func toWire(spec rbv1.AdvertisementSpec) api.Advertisement {
	a := api.Advertisement{
		ClusterName: spec.ClusterID, Endpoint: spec.Endpoint, Labels: spec.Labels,
		Resources: api.ClusterResources{
			Capacity:    toQuantities(spec.Capacity),
			Allocatable: toQuantities(spec.Allocatable),
			Allocated:   toQuantities(spec.Allocated),
		},
	}
	if pr := spec.Prices; pr != nil {
		a.Prices = &api.Prices{Currency: pr.Currency, CPU: pr.CPU, Memory: pr.Memory, GPU: pr.GPU}
	}
	for _, n := range spec.Nodes {
		a.Resources.Nodes = append(a.Resources.Nodes, api.NodeResources{
			Name: n.Name, Allocatable: amountsToWire(n.Allocatable), Allocated: amountsToWire(n.Allocated),
		})
	}
	a.Resources.ReservationsOnNodes = spec.ReservationsOnNodes
	return a
}

// nodesOf converts the collector's node summary to the Advertisement's
// nodes; GPUs and storage only where there are some, to keep it small.
func nodesOf(summary []collector.NodeMeasurement) []rbv1.NodeResources {
	var out []rbv1.NodeResources
	for _, n := range summary {
		out = append(out, rbv1.NodeResources{Name: n.Name, Allocatable: nodeAmounts(n.Allocatable), Allocated: nodeAmounts(n.Allocated)})
	}
	return out
}

func nodeAmounts(l corev1.ResourceList) rbv1.NodeAmounts {
	get := func(name corev1.ResourceName, always bool) *resource.Quantity {
		if q, ok := l[name]; ok && (always || !q.IsZero()) {
			return &q
		}
		return nil
	}
	return rbv1.NodeAmounts{
		CPU: get(corev1.ResourceCPU, true), Memory: get(corev1.ResourceMemory, true),
		GPU: get(rbv1.ResourceGPU, false), EphemeralStorage: get(corev1.ResourceEphemeralStorage, false),
	}
}

func amountsToWire(a rbv1.NodeAmounts) api.Quantities {
	return api.Quantities{CPU: a.CPU, Memory: a.Memory, GPU: a.GPU, Storage: a.EphemeralStorage}
}

func toQuantities(l corev1.ResourceList) api.Quantities {
	get := func(name corev1.ResourceName) *resource.Quantity {
		if q, ok := l[name]; ok {
			return &q
		}
		return nil
	}
	return api.Quantities{
		CPU:     get(corev1.ResourceCPU),
		Memory:  get(corev1.ResourceMemory),
		GPU:     get(rbv1.ResourceGPU),
		Storage: get(corev1.ResourceEphemeralStorage),
	}
}

// toList converts the broker's amounts (nil: none) to a ResourceList.
func toList(q *api.Quantities) corev1.ResourceList {
	if q == nil {
		return nil
	}
	out := corev1.ResourceList{}
	for name, v := range map[corev1.ResourceName]*resource.Quantity{
		corev1.ResourceCPU: q.CPU, corev1.ResourceMemory: q.Memory,
		rbv1.ResourceGPU: q.GPU, corev1.ResourceEphemeralStorage: q.Storage,
	} {
		if v != nil {
			out[name] = *v
		}
	}
	return out
}

// metrics of the publisher.
type metrics struct {
	duration    *prometheus.HistogramVec
	failures    *prometheus.CounterVec
	published   prometheus.Gauge
	consecutive prometheus.Gauge
	heartbeats  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rb_agent_publish_duration_seconds",
			Help:    "Time to publish the advertisement to the broker, by result (success, failure).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_agent_publish_failures_total",
			Help: "Failed publishes of the advertisement, by reason (BrokerUnreachable, BrokerUnavailable, BrokerBusy, BrokerRejected).",
		}, []string{"reason"}),
		published: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rb_agent_published_timestamp_seconds",
			Help: "Unix time of the last advertisement the broker accepted.",
		}),
		consecutive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rb_agent_publish_consecutive_failures",
			Help: "Failed publishes since the last one the broker accepted.",
		}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rb_agent_heartbeats_total",
			Help: "Heartbeats the broker answered (publishes that named the advertisement it holds instead of sending it), by outcome: accepted, advertisement_needed (followed at once by the full advertisement).",
		}, []string{"outcome"}),
	}
	var err error
	if m.duration, err = register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.failures, err = register(reg, m.failures); err != nil {
		return nil, err
	}
	if m.published, err = register(reg, m.published); err != nil {
		return nil, err
	}
	if m.consecutive, err = register(reg, m.consecutive); err != nil {
		return nil, err
	}
	if m.heartbeats, err = register(reg, m.heartbeats); err != nil {
		return nil, err
	}
	// Export every series from the start, so rates and alerts see zeros.
	for _, r := range []string{"success", "failure"} {
		m.duration.WithLabelValues(r)
	}
	for _, r := range []string{ReasonBrokerUnreachable, ReasonBrokerUnavailable, ReasonBrokerBusy, ReasonBrokerRejected} {
		m.failures.WithLabelValues(r)
	}
	for _, o := range []string{HeartbeatAccepted, HeartbeatAdvertisementNeeded} {
		m.heartbeats.WithLabelValues(o)
	}
	return m, nil
}

// register registers c, or returns the collector already registered under its name.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("publisher: registering metrics: %w", err)
	}
	return c, nil
}
