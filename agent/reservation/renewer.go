package reservation

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

// DefaultRenewInterval is how often the renewer renews the leases of the
// bound pods by default: a quarter of DefaultLeaseLength, so that a lease
// survives three missed rounds (a broker failover, say).
const DefaultRenewInterval = 30 * time.Second

// Renewal metrics.
var (
	renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rb_agent_lease_renewals_total",
		Help: "Lease renewals, by outcome: renewed, refused (Ended, NotFound, NotALease) or error (the broker could not be reached; retried within the interval).",
	}, []string{"outcome"})
	renewalRoundIDs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rb_agent_lease_renewal_round_ids",
		Help:    "Leases a renewal round renews (every bound, running pod's), by round.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 9), // 1 .. 65536
	})
	renewalRoundSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rb_agent_lease_renewal_round_duration_seconds",
		Help:    "How long a renewal round takes, broker calls and their retries included.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 9), // 1ms .. 65s
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(renewals, renewalRoundIDs, renewalRoundSeconds)
}

// Renewing is what the renewer needs of the broker client.
type Renewing interface {
	Renew(ctx context.Context, ids []string) (api.RenewResponse, error)
}

// Renewer renews, every Interval, the leases of the Reservations whose pod
// exists, is bound and runs (see renewable), in batches of at most
// MaxBatch ids: a few calls a minute for thousands of pods. It reads the
// Reservations from the manager's cache and the pods from the PodTracker:
// no API call per round. A lease the broker refuses to renew (it ended, or
// is unknown) is handed to the reconciler, which mirrors its end. A pod
// just bound has its lease renewed within Soon rather than at the next
// round, which may come after its hold time. It runs on the leader only.
type Renewer struct {
	Client client.Reader
	Broker Renewing
	Pods   PodLookup
	// Enqueue asks the reconciler to look at a Reservation again.
	Enqueue func(types.NamespacedName)
	// Interval between rounds (default DefaultRenewInterval).
	Interval time.Duration
	// MaxBatch is the most ids per renewal call (default api.MaxRenewBatch).
	MaxBatch int
	// Soon is how long the renewer gathers the pods just bound before it
	// renews their leases (default 1s).
	Soon time.Duration
	// MinBackoff is the first wait before a failed call is tried again
	// (doubling, within the interval; default 1s).
	MinBackoff time.Duration
	Log        logr.Logger

	once  sync.Once
	mu    sync.Mutex
	bound map[types.NamespacedName]struct{}
	kick  chan struct{}
}

// NeedLeaderElection: only the leader renews.
func (w *Renewer) NeedLeaderElection() bool { return true }

func (w *Renewer) defaults() { w.once.Do(w.setDefaults) }

func (w *Renewer) setDefaults() {
	if w.Interval <= 0 {
		w.Interval = DefaultRenewInterval
	}
	if w.MaxBatch <= 0 || w.MaxBatch > api.MaxRenewBatch {
		w.MaxBatch = api.MaxRenewBatch
	}
	if w.Soon <= 0 {
		w.Soon = time.Second
	}
	if w.MinBackoff <= 0 {
		w.MinBackoff = time.Second
	}
	w.kick = make(chan struct{}, 1)
}

// Bound tells the renewer that the pods of these Reservations were just
// bound: their leases are renewed within Soon.
func (w *Renewer) Bound(keys []types.NamespacedName) {
	w.defaults()
	w.mu.Lock()
	if w.bound == nil {
		w.bound = map[types.NamespacedName]struct{}{}
	}
	for _, k := range keys {
		w.bound[k] = struct{}{}
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Start runs rounds until ctx ends: one at once (a new leader renews
// without waiting), then every Interval, and the pods just bound between.
func (w *Renewer) Start(ctx context.Context) error {
	w.defaults()
	w.Log.Info("renewing leases", "interval", w.Interval, "maxBatch", w.MaxBatch)
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
			next = next.Add(w.Interval)
			if now := time.Now(); next.Before(now) {
				next = now.Add(w.Interval)
			}
			w.Round(ctx, nil, next)
			timer.Reset(time.Until(next))
		case <-w.kick:
			select { // gather the burst: a Deployment's pods are bound together
			case <-ctx.Done():
				return nil
			case <-time.After(w.Soon):
			}
			w.mu.Lock()
			keys := w.bound
			w.bound = nil
			w.mu.Unlock()
			if len(keys) > 0 {
				w.Round(ctx, keys, time.Now().Add(w.Interval/2))
			}
		}
	}
}

// Round renews the renewable leases (of only, when not nil), retrying
// calls the broker could not answer until deadline. It returns how many
// leases were renewed.
func (w *Renewer) Round(ctx context.Context, only map[types.NamespacedName]struct{}, deadline time.Time) int {
	w.defaults()
	began := time.Now()
	var list rbv1.ReservationList
	if err := w.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		w.Log.Error(err, "listing Reservations from the cache")
		return 0
	}
	keys := map[string]types.NamespacedName{}
	ids := make([]string, 0, len(list.Items))
	for i := range list.Items {
		rsv := &list.Items[i]
		key := client.ObjectKeyFromObject(rsv)
		if only != nil {
			if _, ok := only[key]; !ok {
				continue
			}
		}
		if renewable(w.Pods, rsv) {
			keys[rsv.Status.ReservationID] = key
			ids = append(ids, rsv.Status.ReservationID)
		}
	}
	if len(ids) == 0 {
		return 0
	}
	renewed := 0
	for start := 0; start < len(ids); start += w.MaxBatch {
		batch := ids[start:min(start+w.MaxBatch, len(ids))]
		renewed += w.renew(ctx, batch, keys, deadline)
	}
	took := time.Since(began)
	renewalRoundIDs.Observe(float64(len(ids)))
	renewalRoundSeconds.Observe(took.Seconds())
	w.Log.V(1).Info("renewal round", "leases", len(ids), "renewed", renewed, "calls", (len(ids)+w.MaxBatch-1)/w.MaxBatch,
		"took", took.Round(time.Millisecond), "newlyBound", only != nil)
	return renewed
}

// renew makes one call, retried with back-off until deadline while the
// broker cannot answer.
func (w *Renewer) renew(ctx context.Context, ids []string, keys map[string]types.NamespacedName, deadline time.Time) int {
	retry := backoff.Exponential(w.MinBackoff, time.Until(deadline))
	for {
		res, err := w.Broker.Renew(ctx, ids)
		metrics.BrokerCalls.WithLabelValues("renew", outcome(err)).Inc()
		if err == nil {
			renewals.WithLabelValues("renewed").Add(float64(len(res.Renewed)))
			for _, ref := range res.Refused {
				renewals.WithLabelValues(ref.Reason).Inc()
				key, ok := keys[ref.ID]
				if !ok {
					continue
				}
				// Ended or unknown at the broker: the reconciler reads
				// and mirrors its end. (NotALease: it reads that too,
				// and status.lease goes, so it is not asked again.)
				w.Log.Info("lease renewal refused", "reservation", key.String(), "id", ref.ID, "reason", ref.Reason, "error", ref.Error)
				if w.Enqueue != nil {
					w.Enqueue(key)
				}
			}
			return len(res.Renewed)
		}
		renewals.WithLabelValues("error").Add(float64(len(ids)))
		wait := retry.Step()
		again := brokerclient.IsRetryable(err) && time.Now().Add(wait).Before(deadline)
		w.Log.Error(err, "renewing leases", "leases", len(ids), "retryIn", wait, "retrying", again)
		if !again {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(wait):
		}
	}
}
