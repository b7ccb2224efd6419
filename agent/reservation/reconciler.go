// Package reservation is the requester side of the agent: it turns each
// Reservation object into a reservation at the broker (idempotent by the
// object's UID), mirrors the broker's decision into status, queues refused
// reservations with back-off until capacity appears, and releases at the
// broker before the object goes away (finalizer).
//
// A Reservation opened for a pod (spec.podName) is a lease: it is asked for
// with LeaseLength and a hold time, the Renewer renews it while its pod is
// bound and running, and it is deleted (so released) as soon as its pod is
// deleted, Succeeded or Failed (see pods.go).
//
// Several Reservations are reconciled at once (MaxConcurrentReconciles); the
// controller's work queue never hands the same object to two workers at the
// same time, and the reconciler keeps no state of its own between calls: all
// it knows of a Reservation is in the object and at the broker, where the
// UID makes every request idempotent.
package reservation

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

// UIDIndex indexes Reservations by UID, the id they carry at the broker.
const UIDIndex = "metadata.uid"

// PodIndex indexes Reservations by the pod they were opened for,
// <namespace>/<spec.podName>.
const PodIndex = "spec.podName"

// Defaults of the lease of a Reservation opened for a pod.
const (
	// DefaultLeaseLength: how long a lease lives after each renewal. Long
	// enough to outlast a broker failover and a few missed renewals.
	DefaultLeaseLength = 2 * time.Minute
	// DefaultHoldTime: how long a granted lease waits for its pod to be
	// bound before the broker ends it.
	DefaultHoldTime = 2 * time.Minute
)

// Broker is what the reconciler needs of the broker client.
type Broker interface {
	Reserve(ctx context.Context, r api.ReservationRequest) (api.Reservation, error)
	Reservation(ctx context.Context, id string) (api.Reservation, error)
	Release(ctx context.Context, id string) (api.Reservation, error)
}

// Reconciler reconciles Reservation objects.
type Reconciler struct {
	Client   client.Client
	Broker   Broker
	Recorder events.EventRecorder
	// MinBackoff and MaxBackoff bound the wait between attempts of a
	// reservation the broker refused or could not be reached for (doubling,
	// with jitter: internal/backoff).
	MinBackoff, MaxBackoff time.Duration
	// WaitingRetry bounds the wait between attempts of a reservation the
	// broker refused for lack of capacity (default DefaultWaitingRetry): the
	// request then waits on the broker's priority list, and each attempt
	// renews its place there, which the broker forgets after its --wait-ttl
	// (5s) without one. It must stay below that TTL. CapacityAvailable
	// events bring an attempt at once.
	WaitingRetry time.Duration
	// Notify receives a Reservation to look at again (from the broker's event stream).
	Notify chan event.GenericEvent
	// MaxConcurrentReconciles is how many Reservations are reconciled at
	// once (default 1). Everything the reconciler shares between objects is
	// safe for concurrent use: the clients, the recorder, the metrics.
	MaxConcurrentReconciles int
	// LeaseLength and HoldTime are asked of the broker for a Reservation
	// opened for a pod (spec.podName), a lease (defaults DefaultLeaseLength
	// and DefaultHoldTime; spec.duration, when set, is the hold time).
	LeaseLength, HoldTime time.Duration
	// Pods tells the state of the pods Reservations were opened for; nil:
	// a Reservation is not deleted when its pod ends (the garbage collector
	// deletes it with its pod).
	Pods PodLookup
	// APIReader confirms, with a read from the API server, that a pod the
	// cache does not show is gone before its Reservation is deleted.
	APIReader client.Reader
	// Now is the agent's clock (default time.Now): status.expiresAt is
	// Now + the broker's remaining time when read.
	Now func() time.Time

	// written: the resourceVersion of this reconciler's last write of each
	// Reservation. A reconcile that finds an older one in the cache (the
	// broker's event for a decision comes before the cache shows the
	// decision's status write) looks again shortly instead of acting on it:
	// acting would ask the broker again and write a status that conflicts.
	// It is the stale-cache guard kube-controller-manager's controllers use
	// (the last write's resourceVersion, compared with apimachinery's
	// resourceversion): forgotten on a restart, it costs one such conflict.
	written sync.Map // types.NamespacedName -> string
}

// DefaultWaitingRetry is Reconciler.WaitingRetry's default: well below the
// broker's default --wait-ttl (5s), so that one late attempt does not lose
// the request's place on the waiting list.
const DefaultWaitingRetry = 2 * time.Second

// staleRequeue is how soon a reconcile that found the cache behind this
// reconciler's own write looks again.
const staleRequeue = 50 * time.Millisecond

// wrote records the resourceVersion of a write of rsv that succeeded.
func (r *Reconciler) wrote(rsv *rbv1.Reservation) {
	r.written.Store(client.ObjectKeyFromObject(rsv), rsv.ResourceVersion)
}

// stale tells whether the cache's rsv is older than this reconciler's last
// write of it.
func (r *Reconciler) stale(rsv *rbv1.Reservation) bool {
	w, ok := r.written.Load(client.ObjectKeyFromObject(rsv))
	if !ok {
		return false
	}
	cmp, err := resourceversion.CompareResourceVersion(rsv.ResourceVersion, w.(string))
	return err == nil && cmp < 0
}

// updateStatus writes rsv's status and records the write.
func (r *Reconciler) updateStatus(ctx context.Context, rsv *rbv1.Reservation) error {
	if err := r.Client.Status().Update(ctx, rsv); err != nil {
		return err
	}
	r.wrote(rsv)
	return nil
}

// defaults fills the unset knobs.
func (r *Reconciler) defaults() {
	if r.MinBackoff == 0 {
		r.MinBackoff = time.Second
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = 30 * time.Second
	}
	if r.WaitingRetry == 0 {
		r.WaitingRetry = DefaultWaitingRetry
	}
	if r.LeaseLength == 0 {
		r.LeaseLength = DefaultLeaseLength
	}
	if r.HoldTime == 0 {
		r.HoldTime = DefaultHoldTime
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Notify == nil {
		r.Notify = make(chan event.GenericEvent, 1024)
	}
}

func indexPod(o client.Object) []string {
	if name := o.(*rbv1.Reservation).Spec.PodName; name != "" {
		return []string{o.GetNamespace() + "/" + name}
	}
	return nil
}

// SetupWithManager registers the reconciler and its indexes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.defaults()
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &rbv1.Reservation{}, UIDIndex,
		func(o client.Object) []string { return []string{string(o.GetUID())} }); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &rbv1.Reservation{}, PodIndex, indexPod); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &rbv1.Reservation{}, GroupIndex, indexGroup); err != nil {
		return err
	}
	if err := metrics.RegisterReservationCollector(mgr.GetCache()); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("reservation").
		For(&rbv1.Reservation{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.Notify, brokerNews)).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(1, r.MaxConcurrentReconciles)}).
		Complete(r)
}

// brokerNews enqueues a Reservation the broker changed (from Notify) ahead
// of the ones waiting for their first decision: in a burst, a reservation
// granted by its provider becomes Active (and its pod can go) without
// waiting behind the decisions of every Reservation created after it. The
// controller's queue is controller-runtime's priority queue (its default);
// with another queue the request is added as usual.
var brokerNews = handler.Funcs{
	GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.Object)}
		if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(brokerNewsPriority)}, req)
			return
		}
		q.Add(req)
	},
}

// brokerNewsPriority is above the default (0) of the object's own events.
const brokerNewsPriority = 10

// Reconcile brings one Reservation in line with the broker.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rsv rbv1.Reservation
	if err := r.Client.Get(ctx, req.NamespacedName, &rsv); err != nil {
		if apierrors.IsNotFound(err) {
			r.written.Delete(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.stale(&rsv) {
		return ctrl.Result{RequeueAfter: staleRequeue}, nil
	}
	if !rsv.DeletionTimestamp.IsZero() {
		return r.release(ctx, &rsv)
	}
	if gone, why, err := r.podGone(ctx, &rsv); err != nil {
		return ctrl.Result{}, err
	} else if gone {
		return ctrl.Result{}, r.deleteForPod(ctx, &rsv, why)
	}
	r.defaults()
	// The release finalizer is in place before the broker is asked: whatever
	// the broker then holds for this object is released when it goes.
	if err := r.addFinalizer(ctx, &rsv); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	switch rsv.Status.Phase {
	case rbv1.ReservationReleased, rbv1.ReservationExpired:
		return ctrl.Result{}, nil // over; deleting the object is the owner's business
	case rbv1.ReservationFailed:
		if rsv.Status.Reason != api.ReasonNoCapacity {
			return ctrl.Result{}, nil // refused for good
		}
		// Failed for lack of capacity: written by an agent older than
		// leases, for which Failed was not final. Waiting, as now.
		return r.reserve(ctx, &rsv)
	case rbv1.ReservationReserved, rbv1.ReservationActive:
		return r.refresh(ctx, &rsv)
	default: // new, or Pending (waiting for capacity, or for the broker)
		return r.reserve(ctx, &rsv)
	}
}

// addFinalizer adds the release finalizer to rsv if it lacks it.
//
// Finalizers are patched, never written with Update: an Update would send
// the spec back re-encoded (a duration of 30m as 30m0s), which the CRD's
// immutability rule rightly refuses.
func (r *Reconciler) addFinalizer(ctx context.Context, rsv *rbv1.Reservation) error {
	if controllerutil.ContainsFinalizer(rsv, rbv1.ReleaseFinalizer) {
		return nil
	}
	before := rsv.DeepCopy()
	controllerutil.AddFinalizer(rsv, rbv1.ReleaseFinalizer)
	if err := r.Client.Patch(ctx, rsv, client.MergeFrom(before)); err != nil {
		return err
	}
	r.wrote(rsv)
	return nil
}

// reserve asks the broker; the UID makes a retried request lock capacity
// once.
func (r *Reconciler) reserve(ctx context.Context, rsv *rbv1.Reservation) (ctrl.Result, error) {
	req, err := r.requestFor(rsv)
	if err != nil {
		return r.fail(ctx, rsv, "Invalid", err.Error())
	}
	if rsv.Spec.Group != nil {
		return r.reserveGroup(ctx, rsv, req)
	}
	rsv.Status.Attempts++
	decision, err := r.Broker.Reserve(ctx, req)
	metrics.BrokerCalls.WithLabelValues("reserve", outcome(err)).Inc()
	return r.settle(ctx, rsv, decision, err)
}

// settle writes the broker's answer to a reservation request (a decision or
// err) into status.
func (r *Reconciler) settle(ctx context.Context, rsv *rbv1.Reservation, decision api.Reservation, err error) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	switch {
	case err == nil:
		before := rsv.Status.Phase
		r.mirror(rsv, decision)
		meta.SetStatusCondition(&rsv.Status.Conditions, metav1.Condition{Type: rbv1.ConditionSynced, Status: metav1.ConditionTrue,
			Reason: "BrokerReachable", ObservedGeneration: rsv.Generation})
		if err := r.updateStatus(ctx, rsv); err != nil {
			return ctrl.Result{}, err
		}
		logger.Info("reserved", "provider", decision.Provider, "score", decision.Score, "attempts", rsv.Status.Attempts,
			"phase", decision.Phase, "lease", decision.Lease, "remainingMs", decision.RemainingMs, "group", decision.Group)
		if isLive(rsv.Status.Phase) {
			if decision.Group != "" {
				r.Recorder.Eventf(rsv, nil, corev1.EventTypeNormal, "Reserved", "Reserve", "reserved on %s with group %s, %s",
					decision.Provider, decision.Group, lifetime(decision))
			} else {
				r.Recorder.Eventf(rsv, nil, corev1.EventTypeNormal, "Reserved", "Reserve", "reserved on %s (score %.2f), %s",
					decision.Provider, decision.Score, lifetime(decision))
			}
		}
		r.transitionEvent(rsv, before)
		return r.untilExpiry(decision), nil
	case brokerclient.IsNoCapacity(err):
		return r.wait(ctx, rsv, err)
	case isOverLimit(err):
		return r.overLimit(ctx, rsv, err)
	case brokerclient.IsRetryable(err):
		rsv.Status.Phase = rbv1.ReservationPending
		setReady(rsv)
		r.unsynced(rsv, err)
		if uerr := r.updateStatus(ctx, rsv); uerr != nil {
			return ctrl.Result{}, uerr
		}
		return ctrl.Result{RequeueAfter: r.backoff(rsv.Status.Attempts)}, nil
	default: // refused for good (400, 403, conflict)
		return r.fail(ctx, rsv, reasonOf(err), err.Error())
	}
}

// refresh reads the broker's view of a live reservation (after an event, or
// when it should have expired).
func (r *Reconciler) refresh(ctx context.Context, rsv *rbv1.Reservation) (ctrl.Result, error) {
	at, err := r.Broker.Reservation(ctx, rsv.Status.ReservationID)
	metrics.BrokerCalls.WithLabelValues("get", outcome(err)).Inc()
	switch {
	case err == nil:
	case brokerclient.IsNotFound(err):
		at = api.Reservation{Phase: string(rbv1.ReservationExpired)} // forgotten after its retention
	default:
		r.unsynced(rsv, err)
		if uerr := r.updateStatus(ctx, rsv); uerr != nil {
			return ctrl.Result{}, uerr
		}
		return ctrl.Result{RequeueAfter: r.backoff(2)}, nil
	}
	before := rsv.Status.Phase
	old := rsv.Status.DeepCopy()
	if at.ID != "" {
		r.mirror(rsv, at)
	} else {
		rsv.Status.Phase = rbv1.ReservationExpired
		setReady(rsv)
	}
	if !isLive(rsv.Status.Phase) {
		meta.SetStatusCondition(&rsv.Status.Conditions, metav1.Condition{Type: rbv1.ConditionReserved, Status: metav1.ConditionFalse,
			Reason: string(rsv.Status.Phase), Message: "the broker no longer holds this capacity", ObservedGeneration: rsv.Generation})
	}
	meta.SetStatusCondition(&rsv.Status.Conditions, metav1.Condition{Type: rbv1.ConditionSynced, Status: metav1.ConditionTrue,
		Reason: "BrokerReachable", ObservedGeneration: rsv.Generation})
	// The broker sends an event for every change of a reservation (and the
	// follower enqueues on each, and after every reconnection): most find
	// the status already right, and write nothing.
	if !equality.Semantic.DeepEqual(old, &rsv.Status) {
		if err := r.updateStatus(ctx, rsv); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.transitionEvent(rsv, before)
	if isLive(rsv.Status.Phase) {
		return r.untilExpiry(at), nil
	}
	return ctrl.Result{}, nil
}

// release gives the capacity back before the object may go.
func (r *Reconciler) release(ctx context.Context, rsv *rbv1.Reservation) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(rsv, rbv1.ReleaseFinalizer) {
		return ctrl.Result{}, nil
	}
	// Always ask the broker, by UID (the reservation's id there): status may
	// lack the id of a decision whose status update was lost, and a request
	// still on the broker's waiting list must be withdrawn from it.
	res, err := r.Broker.Release(ctx, string(rsv.UID))
	metrics.BrokerCalls.WithLabelValues("release", outcome(err)).Inc()
	if err != nil && !brokerclient.IsNotFound(err) {
		r.unsynced(rsv, err)
		if uerr := r.updateStatus(ctx, rsv); uerr != nil && !apierrors.IsNotFound(uerr) {
			return ctrl.Result{}, uerr
		}
		return ctrl.Result{RequeueAfter: r.backoff(2)}, nil
	}
	if err == nil && res.Phase == string(rbv1.ReservationReleased) {
		r.Recorder.Eventf(rsv, nil, corev1.EventTypeNormal, "Released", "Release", "released at the broker")
	}
	before := rsv.DeepCopy()
	controllerutil.RemoveFinalizer(rsv, rbv1.ReleaseFinalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, rsv, client.MergeFrom(before)))
}

// expiresAtSlack: a status.expiresAt that differs from a new reading by at
// most this much is kept (each reading is local now + the broker's
// remaining time, so two readings of an unchanged reservation differ by
// the time between them and the second the API server rounds to): looking
// again at an unchanged reservation writes nothing.
const expiresAtSlack = 2 * time.Second

// backoff is the wait after the attempts-th attempt that failed (the count
// is kept in the status, across restarts).
func (r *Reconciler) backoff(attempts int32) time.Duration {
	return backoff.Nth(backoff.Exponential(r.MinBackoff, r.MaxBackoff), int(attempts))
}

func outcome(err error) string {
	return metrics.Outcome(err, brokerclient.IsNoCapacity, brokerclient.IsRetryable)
}

func isLive(p rbv1.ReservationPhase) bool {
	return p == rbv1.ReservationReserved || p == rbv1.ReservationActive
}

func reasonOf(err error) string {
	var apiErr *brokerclient.APIError
	if errors.As(err, &apiErr) && apiErr.Reason != "" {
		return apiErr.Reason
	}
	return "BrokerError"
}

// requestFor builds the broker request of a Reservation: a lease of
// LeaseLength held HoldTime (or spec.duration) for its pod when opened for
// one (spec.podName), else the fixed spec.duration.
func (r *Reconciler) requestFor(rsv *rbv1.Reservation) (api.ReservationRequest, error) {
	q := func(name corev1.ResourceName) *resource.Quantity {
		v, ok := rsv.Spec.Resources[name]
		if !ok {
			return nil
		}
		return &v
	}
	req := api.ReservationRequest{
		ID:        string(rsv.UID),
		Resources: api.Quantities{CPU: q(corev1.ResourceCPU), Memory: q(corev1.ResourceMemory), GPU: q(rbv1.ResourceGPU), Storage: q(corev1.ResourceEphemeralStorage)},
		Owner:     rsv.Namespace + "/" + rsv.Name,
		Priority:  rsv.Spec.Priority,
	}
	if req.Resources.CPU == nil || req.Resources.Memory == nil {
		return req, errors.New("spec.resources needs cpu and memory")
	}
	if rsv.Spec.Duration != nil {
		req.Duration = rsv.Spec.Duration.Duration.String()
	}
	if rsv.Spec.PodName != "" {
		req.Lease = r.LeaseLength.String()
		if rsv.Spec.Duration == nil {
			req.Duration = r.HoldTime.String()
		}
	}
	if len(rsv.Spec.ProviderSelector) > 0 {
		req.Selector = &api.LabelSelector{MatchLabels: rsv.Spec.ProviderSelector}
	}
	for _, p := range rsv.Spec.ProviderPreferences {
		req.Preferences = append(req.Preferences, api.Preference{Weight: p.Weight, MatchLabels: p.MatchLabels, Clusters: p.Clusters})
	}
	req.Preempt = rsv.Spec.PreemptionPolicy != nil && *rsv.Spec.PreemptionPolicy == corev1.PreemptLowerPriority
	if sp := rsv.Spec.Spread; sp != nil {
		req.Spread = &api.Spread{Group: sp.Group, TopologyKey: sp.TopologyKey, MaxSkew: sp.MaxSkew, WhenUnsatisfiable: sp.WhenUnsatisfiable}
	}
	return req, nil
}

// Lookup finds the Reservation that carries a broker id, for event routing.
func Lookup(ctx context.Context, c client.Client, id string) (*rbv1.Reservation, error) {
	var list rbv1.ReservationList
	if err := c.List(ctx, &list, client.MatchingFields{UIDIndex: id}); err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	return &list.Items[0], nil
}

// EnqueueAll asks the reconciler to look at Reservations again, ahead of
// the others (a pod ended: its reservation is to be released).
func (r *Reconciler) EnqueueAll(keys []types.NamespacedName) {
	for _, k := range keys {
		r.Enqueue(k)
	}
}

// Enqueue asks the reconciler to look at a Reservation again.
func (r *Reconciler) Enqueue(key types.NamespacedName) {
	r.Notify <- event.GenericEvent{Object: &rbv1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}
}
