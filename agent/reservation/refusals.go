package reservation

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

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
