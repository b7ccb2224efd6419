package reservation

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

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

// mirror copies the broker's reservation into status. Times that the
// agent acts on come from the broker's remaining time, on this cluster's
// clock: status.expiresAt is now + RemainingMs (never the broker's
// ExpiresAt, whose clock need not agree with ours).
func (r *Reconciler) mirror(rsv *rbv1.Reservation, at api.Reservation) {
	rsv.Status.Phase = rbv1.ReservationPhase(at.Phase)
	rsv.Status.ReservationID = at.ID
	rsv.Status.Provider = at.Provider
	rsv.Status.Score = strconv.FormatFloat(at.Score, 'f', 2, 64)
	rsv.Status.PricePerHour = PricePerHour(at.Price)
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

// PricePerHour writes a price in micro-units as a decimal string ("0.031").
func PricePerHour(micros int64) string {
	return strconv.FormatFloat(float64(micros)/1e6, 'f', -1, 64)
}

// PriceMicros reads a status.pricePerHour back in micro-units (false: none
// or not a decimal).
func PriceMicros(price string) (int64, bool) {
	q, err := resource.ParseQuantity(price)
	if err != nil || price == "" {
		return 0, false
	}
	return q.ScaledValue(resource.Micro), true
}
