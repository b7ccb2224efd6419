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
	"fmt"
	"strconv"
	"strings"
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
	finalizer := r.addFinalizer(ctx, &rsv)
	switch rsv.Status.Phase {
	case rbv1.ReservationReleased, rbv1.ReservationExpired:
		return ctrl.Result{}, finalizer() // over; deleting the object is the owner's business
	case rbv1.ReservationFailed:
		if rsv.Status.Reason != api.ReasonNoCapacity {
			return ctrl.Result{}, finalizer() // refused for good
		}
		// Failed for lack of capacity: written by an agent before issue
		// 15, for which Failed was not final. Waiting, as now.
		return r.reserve(ctx, &rsv, finalizer)
	case rbv1.ReservationReserved, rbv1.ReservationActive:
		if err := finalizer(); err != nil {
			return ctrl.Result{}, err
		}
		return r.refresh(ctx, &rsv)
	default: // new, or Pending (waiting for capacity, or for the broker)
		return r.reserve(ctx, &rsv, finalizer)
	}
}

// addFinalizer starts the patch that adds the release finalizer, if rsv
// lacks it, and returns the function that waits for it and takes the
// patched object's metadata into rsv (nil when done or not needed). The
// patch is made while the broker is asked (reserve): one round trip
// instead of two before the decision is written.
//
// Finalizers are patched, never written with Update: an Update would send
// the spec back re-encoded (a duration of 30m as 30m0s), which the CRD's
// immutability rule rightly refuses.
func (r *Reconciler) addFinalizer(ctx context.Context, rsv *rbv1.Reservation) func() error {
	if controllerutil.ContainsFinalizer(rsv, rbv1.ReleaseFinalizer) {
		return func() error { return nil }
	}
	before := rsv.DeepCopy()
	patched := rsv.DeepCopy()
	controllerutil.AddFinalizer(patched, rbv1.ReleaseFinalizer)
	done := make(chan error, 1)
	go func() { done <- r.Client.Patch(ctx, patched, client.MergeFrom(before)) }()
	var err error
	waited := false
	return func() error {
		if !waited {
			waited, err = true, <-done
			if err == nil {
				rsv.ObjectMeta = patched.ObjectMeta
				r.wrote(rsv)
			}
		}
		return err
	}
}

// reserve asks the broker; the UID makes a retried request lock capacity
// once. finalizer waits for the release finalizer (see addFinalizer): no
// status is written before it is in place, and if it could not be put in
// place whatever the broker holds for this object is released (withdrawn
// from the waiting list), as the object may be gone with nothing left to
// release it; the next attempt asks again.
func (r *Reconciler) reserve(ctx context.Context, rsv *rbv1.Reservation, finalizer func() error) (ctrl.Result, error) {
	req, err := r.requestFor(rsv)
	if err != nil {
		if err := finalizer(); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		return r.fail(ctx, rsv, "Invalid", err.Error())
	}
	if rsv.Spec.Group != nil {
		return r.reserveGroup(ctx, rsv, req, finalizer)
	}
	rsv.Status.Attempts++
	decision, err := r.Broker.Reserve(ctx, req)
	metrics.BrokerCalls.WithLabelValues("reserve", outcome(err)).Inc()
	return r.settle(ctx, rsv, decision, err, finalizer)
}

// settle writes the broker's answer to a reservation request (a decision or
// err) into status, once finalizer has put the release finalizer in place.
func (r *Reconciler) settle(ctx context.Context, rsv *rbv1.Reservation, decision api.Reservation, err error, finalizer func() error) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	if ferr := finalizer(); ferr != nil {
		if _, rerr := r.Broker.Release(ctx, string(rsv.UID)); rerr != nil && !brokerclient.IsNotFound(rerr) {
			logger.Info("could not release after failing to add the finalizer; the broker expires it", "error", rerr.Error())
		}
		return ctrl.Result{}, client.IgnoreNotFound(ferr)
	}
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

// transitionEvent records the change of phase from before, if any.
func (r *Reconciler) transitionEvent(rsv *rbv1.Reservation, before rbv1.ReservationPhase) {
	switch now := rsv.Status.Phase; {
	case now == before || now == rbv1.ReservationReserved: // Reserved has its own event, with the decision
	case now == rbv1.ReservationActive:
		r.Recorder.Eventf(rsv, nil, corev1.EventTypeNormal, "Active", "Sync", "granted by %s: the reservation is Ready", rsv.Status.Provider)
	case now == rbv1.ReservationExpired:
		r.Recorder.Eventf(rsv, nil, corev1.EventTypeWarning, "Expired", "Sync", "the broker ended the reservation: its time ran out")
	default:
		r.Recorder.Eventf(rsv, nil, corev1.EventTypeNormal, string(now), "Sync", "reservation is %s at the broker", now)
	}
}

// lifetime says how long a decision lives, for its event.
func lifetime(at api.Reservation) string {
	left := (time.Duration(at.RemainingMs) * time.Millisecond).Round(time.Second)
	if at.Lease != "" {
		return fmt.Sprintf("a lease of %s renewed while its pod runs; %s to bind the pod", at.Lease, left)
	}
	return fmt.Sprintf("for %s", left)
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

// wait keeps a reservation the broker refused for lack of capacity Pending,
// with Reserved=False and the broker's reason, and asks again: within
// WaitingRetry, to keep its place on the broker's waiting list, and at once
// on a CapacityAvailable event.
func (r *Reconciler) wait(ctx context.Context, rsv *rbv1.Reservation, err error) (ctrl.Result, error) {
	reason, msg := api.ReasonNoCapacity, err.Error()
	var apiErr *brokerclient.APIError
	if errors.As(err, &apiErr) && apiErr.Message != "" {
		msg = apiErr.Message
	}
	if err := r.refused(ctx, rsv, rbv1.ReservationPending, reason, msg, "waiting for capacity: "+msg); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: min(r.backoff(rsv.Status.Attempts), r.WaitingRetry)}, nil
}

func isOverLimit(err error) bool {
	_, ok := brokerclient.OverLimit(err)
	return ok
}

// overLimit keeps a reservation Pending while its cluster is at one of the
// limits the broker's operator set (429 LimitExceeded or RateLimited): the
// broker answered, so Synced stays True, and the status and a Warning Event
// name the limit (not BrokerUnavailable). It tries again after the broker's
// Retry-After, no sooner than the back-off.
func (r *Reconciler) overLimit(ctx context.Context, rsv *rbv1.Reservation, err error) (ctrl.Result, error) {
	ae, _ := brokerclient.OverLimit(err)
	if rerr := r.refused(ctx, rsv, rbv1.ReservationPending, ae.Reason, ae.Message, "over this cluster's share at the broker: "+ae.Message); rerr != nil {
		return ctrl.Result{}, rerr
	}
	return ctrl.Result{RequeueAfter: max(ae.RetryAfter, r.backoff(rsv.Status.Attempts))}, nil
}

// fail marks a reservation refused for good: Failed is final.
func (r *Reconciler) fail(ctx context.Context, rsv *rbv1.Reservation, reason, msg string) (ctrl.Result, error) {
	return ctrl.Result{}, r.refused(ctx, rsv, rbv1.ReservationFailed, reason, msg, msg)
}

// refused writes a refusal into status (phase, reason, Reserved=False,
// Synced=True, Ready) and, when the phase or reason changed, a Warning Event
// saying event.
func (r *Reconciler) refused(ctx context.Context, rsv *rbv1.Reservation, phase rbv1.ReservationPhase, reason, msg, event string) error {
	changed := rsv.Status.Phase != phase || rsv.Status.Reason != reason
	rsv.Status.Phase = phase
	rsv.Status.Reason, rsv.Status.Message = reason, msg
	rsv.Status.ObservedGeneration = rsv.Generation
	meta.SetStatusCondition(&rsv.Status.Conditions, metav1.Condition{Type: rbv1.ConditionReserved, Status: metav1.ConditionFalse,
		Reason: reason, Message: msg, ObservedGeneration: rsv.Generation})
	meta.SetStatusCondition(&rsv.Status.Conditions, metav1.Condition{Type: rbv1.ConditionSynced, Status: metav1.ConditionTrue,
		Reason: "BrokerReachable", ObservedGeneration: rsv.Generation})
	setReady(rsv)
	if err := r.updateStatus(ctx, rsv); err != nil {
		return err
	}
	if changed {
		r.Recorder.Eventf(rsv, nil, corev1.EventTypeWarning, reason, "Reserve", "%s", event)
	}
	return nil
}

// expiresAtSlack: a status.expiresAt that differs from a new reading by at
// most this much is kept (each reading is local now + the broker's
// remaining time, so two readings of an unchanged reservation differ by
// the time between them and the second the API server rounds to): looking
// again at an unchanged reservation writes nothing.
const expiresAtSlack = 2 * time.Second

// mirror copies the broker's reservation into status. Times that the
// agent acts on come from the broker's remaining time, on this cluster's
// clock: status.expiresAt is now + RemainingMs (never the broker's
// ExpiresAt, whose clock need not agree with ours).
func (r *Reconciler) mirror(rsv *rbv1.Reservation, at api.Reservation) {
	rsv.Status.Phase = rbv1.ReservationPhase(at.Phase)
	rsv.Status.ReservationID = at.ID
	rsv.Status.Provider = at.Provider
	rsv.Status.Score = strconv.FormatFloat(at.Score, 'f', 2, 64)
	rsv.Status.Reason, rsv.Status.Message = "", fmt.Sprintf("reserved on %s", at.Provider)
	// At the precision the API server keeps (seconds), so that a status
	// read back compares equal to the broker's view of it. (For display
	// only: nothing compares it with this cluster's clock.)
	rsv.Status.ReservedAt = ptr.To(metav1.NewTime(at.CreatedAt).Rfc3339Copy())
	if isLive(rsv.Status.Phase) && at.RemainingMs > 0 {
		exp := metav1.NewTime(r.Now().Add(time.Duration(at.RemainingMs) * time.Millisecond)).Rfc3339Copy()
		if old := rsv.Status.ExpiresAt; old == nil || old.Sub(exp.Time).Abs() > expiresAtSlack {
			rsv.Status.ExpiresAt = &exp
		}
	}
	rsv.Status.Lease = nil
	if at.Lease != "" {
		if d, err := time.ParseDuration(at.Lease); err == nil {
			rsv.Status.Lease = &metav1.Duration{Duration: d}
		}
	}
	// The provider's grant says how it holds the capacity (the bridge
	// pins the pod's copy accordingly); an answer without the grant (the
	// decision, before any grant) keeps what was mirrored.
	if at.Grant != nil && at.Grant.Placement != nil {
		rsv.Status.Placement = &rbv1.ReservationPlacement{Node: at.Grant.Placement.Node, PriorityClassName: at.Grant.Placement.PriorityClassName}
	}
	rsv.Status.ObservedGeneration = rsv.Generation
	if isLive(rsv.Status.Phase) {
		meta.SetStatusCondition(&rsv.Status.Conditions, metav1.Condition{Type: rbv1.ConditionReserved, Status: metav1.ConditionTrue,
			Reason: at.Phase, Message: "capacity held on " + at.Provider, ObservedGeneration: rsv.Generation})
	}
	setReady(rsv)
}

// setReady sets the Ready condition from the phase: True exactly while
// Active (reserved and granted by the provider), so that
// kubectl wait --for=condition=Ready works.
func setReady(rsv *rbv1.Reservation) {
	c := metav1.Condition{Type: rbv1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: rsv.Generation}
	switch rsv.Status.Phase {
	case rbv1.ReservationActive:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, "Granted", "granted by "+rsv.Status.Provider
	case rbv1.ReservationReserved:
		c.Reason, c.Message = "WaitingForGrant", "reserved on "+rsv.Status.Provider+"; waiting for its grant"
	case rbv1.ReservationPending, "":
		c.Reason, c.Message = "Pending", "waiting for the broker's decision"
		if rsv.Status.Reason != "" {
			c.Reason, c.Message = rsv.Status.Reason, rsv.Status.Message
		}
	default:
		c.Reason, c.Message = string(rsv.Status.Phase), "the reservation is "+strings.ToLower(string(rsv.Status.Phase))
	}
	meta.SetStatusCondition(&rsv.Status.Conditions, c)
}

func (r *Reconciler) unsynced(rsv *rbv1.Reservation, err error) {
	meta.SetStatusCondition(&rsv.Status.Conditions, metav1.Condition{Type: rbv1.ConditionSynced, Status: metav1.ConditionFalse,
		Reason: "BrokerUnavailable", Message: err.Error(), ObservedGeneration: rsv.Generation})
}

// untilExpiry looks again at a fixed-duration reservation shortly after the
// broker should have expired it (from the remaining time the broker
// measured, never from its ExpiresAt), in case the event stream missed it.
// A lease gets no timer: its end comes with the broker's events, and with
// the renewals' answers while its pod runs.
func (r *Reconciler) untilExpiry(at api.Reservation) ctrl.Result {
	if at.Lease != "" || at.RemainingMs <= 0 {
		return ctrl.Result{}
	}
	return ctrl.Result{RequeueAfter: time.Duration(at.RemainingMs)*time.Millisecond + 2*time.Second}
}

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
