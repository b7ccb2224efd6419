package provider

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	agentmetrics "github.com/fluidos-project/resource-broker/agent/metrics"
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

// Defaults of the eviction hold (TenantReconciler.MassExpiryHold).
const (
	// DefaultMassExpiryHold is how long a mass expiry's evictions wait.
	DefaultMassExpiryHold = 10 * time.Minute
	// massExpiryWindow: leases that lapsed within it of each other lapsed "at once".
	massExpiryWindow = time.Minute
	// heardRecheck is how often a held eviction looks at the requester's heartbeat again.
	heardRecheck = 10 * time.Second
)

// holdEviction tells how long the pods of pi, ended for reason at endedAt,
// must still wait: a provider evicts only when the requester is gone by every
// signal it has, and not while a mass expiry says the fault is more likely the
// broker's or the network's, as Kubernetes stops evicting when a whole zone
// goes dark.
//   - Released: never held (the requester asked for it).
//   - the requester still renews its heartbeat Lease here: held, and looked at
//     again shortly (its leases lapsed at the broker only).
//   - a mass expiry, that is at least 3 leases lapsed within a minute of
//     this one and either from several requesters or most of this
//     requester's: held until MassExpiryHold after the end, then evicted.
//
// Each hold is a Warning Event on the instruction and counted in
// rb_agent_evictions_held_total.
func (r *TenantReconciler) holdEviction(ctx context.Context, pi *rbv1.ProviderInstruction, reason string, endedAt time.Time) (time.Duration, error) {
	if reason == EndedReleased {
		return 0, nil
	}
	if r.Requesters != nil && r.Requesters.Heard(ctx, pi.Spec.Requester) {
		r.reportHold(pi, "requester_heard", fmt.Sprintf("reservation %s ended (%s) at the broker, but %s still renews its heartbeat here: its pods keep running",
			pi.Spec.ReservationID, reason, pi.Spec.Requester))
		return heardRecheck, nil
	}
	hold := r.MassExpiryHold
	if hold == 0 {
		hold = DefaultMassExpiryHold
	}
	wait := time.Until(endedAt.Add(hold))
	if hold < 0 || wait <= 0 {
		return 0, nil
	}
	var all rbv1.ProviderInstructionList
	if err := r.Client.List(ctx, &all, client.InNamespace(r.Namespace)); err != nil {
		return 0, err
	}
	lapsed, requesters, mine, minePeers := 0, map[string]bool{}, 0, 0
	for i := range all.Items {
		o := &all.Items[i]
		if o.Spec.Requester == pi.Spec.Requester {
			minePeers++
		}
		c := meta.FindStatusCondition(o.Status.Conditions, rbv1.ConditionEnded)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason == EndedReleased || o.Status.EndedAt == nil ||
			o.Status.EndedAt.Time.Sub(endedAt).Abs() > massExpiryWindow {
			continue
		}
		lapsed++
		requesters[o.Spec.Requester] = true
		if o.Spec.Requester == pi.Spec.Requester {
			mine++
		}
	}
	if lapsed < 3 || (len(requesters) < 2 && 2*mine <= minePeers) {
		return 0, nil
	}
	r.reportHold(pi, "mass_expiry", fmt.Sprintf("%d leases of %d requester(s) lapsed within %s (%d of %s's %d): a fault of the broker or the network is likelier than every requester gone; evictions wait until %s",
		lapsed, len(requesters), massExpiryWindow, mine, pi.Spec.Requester, minePeers, endedAt.Add(hold).Format(time.RFC3339)))
	return wait, nil
}

// Reasons of the EvictionHeld condition, and the label of
// rb_agent_evictions_held_total for each.
var evictionHeldReasons = map[string]string{"requester_heard": "RequesterHeard", "mass_expiry": "MassExpiry"}

// reportHold records a held eviction in pi's condition EvictionHeld (which
// finish writes), with an Event and a count when the reason is new: one per
// hold, not one per look, across restarts too.
func (r *TenantReconciler) reportHold(pi *rbv1.ProviderInstruction, why, msg string) {
	reason := evictionHeldReasons[why]
	c := meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionEvictionHeld)
	first := c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason
	meta.SetStatusCondition(&pi.Status.Conditions, metav1.Condition{Type: rbv1.ConditionEvictionHeld, Status: metav1.ConditionTrue,
		Reason: reason, Message: msg, ObservedGeneration: pi.Generation})
	if !first {
		return
	}
	agentmetrics.EvictionsHeld.WithLabelValues(why).Inc()
	if r.Recorder != nil {
		r.Recorder.Eventf(pi, nil, corev1.EventTypeWarning, "EvictionHeld", "Evict", "%s", msg)
	}
}

// evictionReconciler ends what an ended instruction held (key: the
// instruction): see finish.
type evictionReconciler struct{ *TenantReconciler }

func (r *evictionReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("tenant-eviction").
		For(&rbv1.ProviderInstruction{}).
		Watches(&corev1.Pod{}, r.byReservationPod()).
		Complete(r)
}

// Reconcile finishes an ended instruction, and looks again while its pods
// have their grace or their eviction is held.
func (r *evictionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pi rbv1.ProviderInstruction
	if err := r.Client.Get(ctx, req.NamespacedName, &pi); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pi.DeletionTimestamp.IsZero() || !IsEnded(&pi) {
		return ctrl.Result{}, nil
	}
	live, _, err := r.instructionsOf(ctx, pi.Spec.Requester)
	if err != nil {
		return ctrl.Result{}, err
	}
	covered := slices.ContainsFunc(live, func(o *rbv1.ProviderInstruction) bool { return o.Spec.ReservationID == pi.Spec.ReservationID })
	wait, err := r.finish(ctx, TenantNamespace(pi.Spec.Requester), &pi, covered)
	return ctrl.Result{RequeueAfter: wait}, err
}

// finish handles an ended instruction: its placeholder goes at once (the
// capacity is the broker's again), its tenant pods still running are
// evicted once the grace is over, then the instruction is deleted (at once
// when no pod of it runs any more). It returns when to look
// again (zero: done). covered: a live instruction of the requester has the
// same reservation id, and its pods are never evicted (pi is then an
// instruction of an older agent, named otherwise).
func (r *evictionReconciler) finish(ctx context.Context, ns string, pi *rbv1.ProviderInstruction, covered bool) (time.Duration, error) {
	id := pi.Spec.ReservationID
	if covered {
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
	before := meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionEvictionHeld).DeepCopy()
	if hold, err := r.holdEviction(ctx, pi, reason, endedAt); err != nil || hold > 0 {
		if err == nil && !equality.Semantic.DeepEqual(before, meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionEvictionHeld)) {
			err = client.IgnoreNotFound(r.Client.Status().Update(ctx, pi))
			if apierrors.IsConflict(err) {
				return time.Millisecond, nil // read again: another writer came between
			}
		}
		return hold, err
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
