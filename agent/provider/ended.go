package provider

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Reasons of the Ended condition.
const (
	// EndedLeaseLapsed: the broker expired the reservation (a lease not
	// renewed, or a fixed duration over).
	EndedLeaseLapsed = "LeaseLapsed"
	// EndedReleased: the requester released it.
	EndedReleased = "Released"
	// EndedNotListed: the broker no longer lists it (it ended while this
	// agent did not follow the events), or refused a grant as ended.
	EndedNotListed = "NotListed"
)

// IsEnded tells whether pi's reservation has ended.
func IsEnded(pi *rbv1.ProviderInstruction) bool {
	return meta.IsStatusConditionTrue(pi.Status.Conditions, rbv1.ConditionEnded)
}

// MarkEnded records that pi's reservation ended (reason EndedLeaseLapsed,
// EndedReleased or EndedNotListed), at this agent's own time; its tenant
// pods are evicted a grace period later (TenantReconciler.EvictionGrace). A
// lapsed lease is a Warning Event: the requester stopped renewing while its
// pod may still run here. Idempotent.
func MarkEnded(ctx context.Context, c client.Client, rec events.EventRecorder, pi *rbv1.ProviderInstruction, reason, message string) error {
	if IsEnded(pi) {
		return nil
	}
	now := metav1.NowMicro()
	pi.Status.EndedAt = &now
	meta.SetStatusCondition(&pi.Status.Conditions, metav1.Condition{Type: rbv1.ConditionEnded, Status: metav1.ConditionTrue,
		Reason: reason, Message: message, ObservedGeneration: pi.Generation, LastTransitionTime: metav1.NewTime(now.Time)})
	if err := c.Status().Update(ctx, pi); err != nil {
		return client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("provided reservation ended", "reservation", pi.Spec.ReservationID, "requester", pi.Spec.Requester, "reason", reason)
	if rec != nil {
		typ := corev1.EventTypeNormal
		if reason == EndedLeaseLapsed {
			typ = corev1.EventTypeWarning
		}
		rec.Eventf(pi, nil, typ, reason, "End", "%s; its tenant pods are evicted after the grace period", message)
	}
	return nil
}

// finish handles an ended instruction: its placeholder goes at once (the
// capacity is the broker's again), its tenant pods still running are
// evicted once the grace is over, then the instruction is deleted (at once
// when no pod of it runs any more). It returns when to look
// again (zero: done). coveredIDs are the ids of the requester's live
// instructions: pods of one of them are never evicted (an instruction of an
// older agent, named otherwise, for the same reservation).
func (r *TenantReconciler) finish(ctx context.Context, ns string, pi *rbv1.ProviderInstruction, coveredIDs map[string]bool) (time.Duration, error) {
	id := pi.Spec.ReservationID
	if coveredIDs[id] {
		return 0, client.IgnoreNotFound(r.Client.Delete(ctx, pi))
	}
	placeholder, tenants, err := r.reservationPods(ctx, ns, id)
	if err != nil {
		return 0, err
	}
	if placeholder != nil && placeholder.DeletionTimestamp.IsZero() {
		if err := r.Client.Delete(ctx, placeholder); client.IgnoreNotFound(err) != nil {
			return 0, err
		}
	}
	r.forgetHoldStart(pi)
	r.tokensMu.Lock()
	delete(r.placedHere, pi.UID)
	r.tokensMu.Unlock()
	var running []*corev1.Pod
	for _, p := range tenants {
		if p.DeletionTimestamp.IsZero() && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			running = append(running, p)
		}
	}
	if len(running) == 0 {
		// Nothing left to evict (the requester's bridge deleted its copies,
		// or none came): the instruction goes now, not after the grace. A
		// copy's deletion brings this reconciler back (pod events).
		log.FromContext(ctx).V(1).Info("ended reservation has no running pod left", "reservation", id, "requester", pi.Spec.Requester)
		return 0, client.IgnoreNotFound(r.Client.Delete(ctx, pi))
	}
	endedAt := pi.CreationTimestamp.Time
	if pi.Status.EndedAt != nil {
		endedAt = pi.Status.EndedAt.Time
	}
	if wait := time.Until(endedAt.Add(r.EvictionGrace)); wait > 0 {
		return wait, nil
	}
	reason := "Ended"
	if c := meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionEnded); c != nil {
		reason = c.Reason
	}
	evicted := 0
	for _, p := range running {
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}
		err := r.Client.SubResource("eviction").Create(ctx, p, ev)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case apierrors.IsTooManyRequests(err):
			// A disruption budget holds it for now: try again shortly.
			r.Recorder.Eventf(pi, p, corev1.EventTypeWarning, "EvictionDelayed", "Evict", "pod %s/%s: %v", p.Namespace, p.Name, err)
			return 5 * time.Second, nil
		case err != nil:
			return 0, fmt.Errorf("evict %s/%s: %w", p.Namespace, p.Name, err)
		}
		msg := fmt.Sprintf("reservation %s of %s ended (%s) and the grace of %s is over: pod %s/%s evicted",
			id, pi.Spec.Requester, reason, r.EvictionGrace, p.Namespace, p.Name)
		r.Recorder.Eventf(pi, p, corev1.EventTypeWarning, "Evicted", "Evict", "%s", msg)
		r.Recorder.Eventf(p, pi, corev1.EventTypeWarning, "ReservationEnded", "Evict", "%s", msg)
		evicted++
	}
	log.FromContext(ctx).Info("ended reservation cleaned up", "reservation", id, "requester", pi.Spec.Requester, "reason", reason, "evicted", evicted)
	return 0, client.IgnoreNotFound(r.Client.Delete(ctx, pi))
}
