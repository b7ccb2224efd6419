package provider

import (
	"context"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	"github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// grantReconciler hands the requester of a live instruction its access
// through the broker: the tenant namespace, a token of its ServiceAccount
// and, with the hold, the node its placeholder holds (key: the
// instruction). A grant is due when the instruction was never granted,
// when its placeholder is on a node the requester was not told of, and two
// thirds of a token's lifetime after the last grant; the instruction's
// status says which. GrantWorkers grants go at once.
type grantReconciler struct {
	*TenantReconciler
	// fresh reads the instruction from the API server once a grant looks
	// due: the cache may not show the last grant's status yet, and a grant
	// is a broker call not to be made twice.
	fresh client.Reader
}

func (r *grantReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("tenant-grant").
		For(&rbv1.ProviderInstruction{}).
		Watches(&corev1.Namespace{}, r.byRequester()).
		Watches(&corev1.ResourceQuota{}, r.byRequester()).
		Watches(&corev1.ServiceAccount{}, r.byRequester()).
		Watches(&rbacv1.RoleBinding{}, r.byRequester()).
		Watches(&corev1.Pod{}, r.byReservationPod()).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(1, r.GrantWorkers)}).
		Complete(r)
}

// Reconcile grants pi's reservation if a grant is due.
func (r *grantReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pi rbv1.ProviderInstruction
	if live, wait, err := r.readLive(ctx, req.NamespacedName, &pi); !live {
		return ctrl.Result{RequeueAfter: wait}, err
	}
	requester := pi.Spec.Requester
	// No access before the tenant is in place, quota included; its objects'
	// events bring this reconciler back.
	sa, ready, err := r.tenantReady(ctx, requester)
	if err != nil || !ready {
		return ctrl.Result{}, err
	}
	if ok, err := r.quotaCounts(ctx, requester); err != nil || !ok {
		return ctrl.Result{}, err
	}
	now := time.Now()
	d, err := r.decide(ctx, &pi, now)
	if err != nil || !d.due {
		return ctrl.Result{RequeueAfter: d.after}, err
	}
	if err := r.fresh.Get(ctx, req.NamespacedName, &pi); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pi.DeletionTimestamp.IsZero() || IsEnded(&pi) {
		return ctrl.Result{}, nil
	}
	if d, err = r.decide(ctx, &pi, now); err != nil || !d.due {
		return ctrl.Result{RequeueAfter: d.after}, err
	}
	if d.unplaced {
		r.Recorder.Eventf(&pi, nil, corev1.EventTypeWarning, "HoldUnplaced", "Grant",
			"placeholder pod not bound within %s: granting without placement (a later grant carries it once the placeholder lands)", r.HoldTimeout)
	}
	tok, err := r.tokenFor(ctx, requester, sa)
	if err != nil {
		return ctrl.Result{}, err
	}
	renewAt, err := r.grant(ctx, TenantNamespace(requester), &pi, tok, d.placement)
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: max(time.Until(renewAt), time.Second)}, nil
}

// quotaCounts tells whether the tenant quota is the sum of requester's live
// reservations, as the tenant reconciler makes it: a requester told to go
// ahead finds room for its pod.
func (r *grantReconciler) quotaCounts(ctx context.Context, requester string) (bool, error) {
	live, _, err := r.instructionsOf(ctx, requester)
	if err != nil {
		return false, err
	}
	var quota corev1.ResourceQuota
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: TenantNamespace(requester), Name: TenantQuota}, &quota); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return equality.Semantic.DeepEqual(quota.Spec.Hard, quotaOf(live)), nil
}

// grantDecision is whether a grant of one instruction is due, with what
// placement, and if not, when to look again.
type grantDecision struct {
	due       bool
	placement *api.Placement // nil: none (yet)
	// unplaced: a first grant that waited HoldTimeout for the placeholder
	// in vain, and goes without placement.
	unplaced bool
	after    time.Duration
}

func (r *grantReconciler) decide(ctx context.Context, pi *rbv1.ProviderInstruction, now time.Time) (grantDecision, error) {
	var d grantDecision
	waiting := false
	if r.Hold && r.requesterPins(ctx, pi.Spec.Requester) {
		switch {
		case pi.Status.Superseded:
			// The placeholder gave way to the tenant pod: the placement
			// already granted stands.
			if pi.Status.PlacementNode != "" {
				d.placement = &api.Placement{Node: pi.Status.PlacementNode, PriorityClassName: rbv1.TenantPriorityClass}
			}
		case pi.Status.Held && pi.Status.HeldNode != "":
			d.placement = &api.Placement{Node: pi.Status.HeldNode, PriorityClassName: rbv1.TenantPriorityClass}
		default:
			waiting = true
		}
	}
	if waiting && !pi.Status.Enforced {
		deadline, ok, err := r.holdDeadline(ctx, pi)
		switch {
		case err != nil:
			return d, err
		case !ok || meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionHeld) == nil:
			// No placeholder yet, or the hold has not said where it
			// stands: its status write brings us back, or this look.
			d.after = r.HoldTimeout
			return d, nil
		case now.Before(deadline):
			d.after = deadline.Sub(now) // the placeholder's binding wakes us earlier
			return d, nil
		}
		d.unplaced = true
	}
	// A placement the requester has not been told of yet is due now.
	newPlacement := d.placement != nil && d.placement.Node != pi.Status.PlacementNode && !pi.Status.Superseded
	if at, ok := r.renewAt(pi, now); ok && !newPlacement {
		d.after = at.Sub(now)
		return d, nil
	}
	d.due = true
	return d, nil
}

// holdDeadline is when the first grant of pi stops waiting for its
// placeholder: HoldTimeout after the placeholder was made (false: none yet).
func (r *grantReconciler) holdDeadline(ctx context.Context, pi *rbv1.ProviderInstruction) (time.Time, bool, error) {
	var ph corev1.Pod
	key := types.NamespacedName{Namespace: TenantNamespace(pi.Spec.Requester), Name: PlaceholderName(pi.Spec.ReservationID)}
	if err := r.Client.Get(ctx, key, &ph); err != nil {
		return time.Time{}, false, client.IgnoreNotFound(err)
	}
	made := ph.CreationTimestamp.Time
	if at, err := time.Parse(time.RFC3339Nano, ph.Annotations[placeholderMadeAnnotation]); err == nil {
		made = at
	}
	return made.Add(r.HoldTimeout), true, nil
}

// renewAt tells when pi's grant is due again, if it is granted and not
// due yet at now.
func (r *grantReconciler) renewAt(pi *rbv1.ProviderInstruction, now time.Time) (time.Time, bool) {
	if pi.Status.GrantedAt == nil || !pi.Status.Enforced {
		return time.Time{}, false
	}
	at := pi.Status.GrantedAt.Add(r.TokenTTL * 2 / 3)
	return at, now.Before(at)
}

// grant sends tok for pi's reservation (which is due: see decide) and
// records it in pi's status; it returns when the grant should be renewed.
func (r *grantReconciler) grant(ctx context.Context, ns string, pi *rbv1.ProviderInstruction, tok tenantToken, placement *api.Placement) (time.Time, error) {
	_, err := r.Broker.GrantTo(ctx, pi.Spec.Requester, pi.Spec.ReservationID, api.Grant{
		Endpoint: r.Endpoint, CABundle: r.CABundle, Token: tok.token, Namespace: ns, ExpiresAt: tok.expires,
		Placement: placement,
	})
	metrics.BrokerCalls.WithLabelValues("grant", metrics.Outcome(err, brokerclient.IsNoCapacity, brokerclient.IsRetryable)).Inc()
	if brokerclient.IsNotFound(err) || brokerclient.IsConflict(err) {
		// The reservation has ended at the broker: end this instruction
		// (its pods get their grace, as after an event).
		return time.Now().Add(r.TokenTTL), MarkEnded(ctx, r.Client, r.Recorder, pi, EndedNotListed,
			"the broker refused the grant: the reservation has ended ("+err.Error()+")")
	}
	if err != nil {
		meta.SetStatusCondition(&pi.Status.Conditions, metav1.Condition{Type: rbv1.ConditionEnforced, Status: metav1.ConditionFalse,
			Reason: "GrantFailed", Message: err.Error(), ObservedGeneration: pi.Generation})
		_ = r.Client.Status().Update(ctx, pi)
		return time.Time{}, fmt.Errorf("grant %s: %w", pi.Spec.ReservationID, err)
	}
	now := metav1.Now()
	first := !pi.Status.Enforced
	newPlacement := placement != nil && pi.Status.PlacementNode != placement.Node
	msg := "namespace " + ns + ", quota and credentials in place"
	if placement != nil {
		msg += "; the tenant pod is pinned to node " + placement.Node + " at " + placement.PriorityClassName
	}
	// The grant is made: record it, on the newest version of pi if another
	// writer (the hold, an end) came between.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pi.Status.Enforced = true
		pi.Status.TenantNamespace = ns
		pi.Status.GrantedAt = &now
		if placement != nil {
			pi.Status.PlacementNode = placement.Node
		}
		meta.SetStatusCondition(&pi.Status.Conditions, metav1.Condition{Type: rbv1.ConditionEnforced, Status: metav1.ConditionTrue,
			Reason: "Granted", Message: msg, ObservedGeneration: pi.Generation})
		err := r.Client.Status().Update(ctx, pi)
		if apierrors.IsConflict(err) {
			if getErr := r.fresh.Get(ctx, client.ObjectKeyFromObject(pi), pi); getErr != nil {
				return getErr
			}
		}
		return err
	})
	if err != nil {
		return time.Time{}, client.IgnoreNotFound(err)
	}
	if newPlacement {
		r.Recorder.Eventf(pi, nil, corev1.EventTypeNormal, "PlacementGranted", "Grant", "requester %s told to pin the pod to node %s at PriorityClass %s",
			pi.Spec.Requester, placement.Node, placement.PriorityClassName)
	}
	if first {
		r.Recorder.Eventf(pi, nil, corev1.EventTypeNormal, "Enforced", "Enforce", "capacity set aside in %s for %s", ns, pi.Spec.Requester)
	}
	return now.Add(r.TokenTTL * 2 / 3), nil
}

// tenantToken is a token of a tenant's ServiceAccount.
type tenantToken struct {
	saUID   types.UID // the ServiceAccount it was issued for: a new one (tenant re-created) voids it
	token   string
	issued  time.Time
	expires time.Time
}

// tokenCache keeps the last token requested per requester.
type tokenCache struct {
	mu sync.Mutex
	m  map[string]tenantToken
}

// forget drops the token of a requester (its tenant is gone).
func (c *tokenCache) forget(requester string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, requester)
}

// tokenFor returns a token of the tenant's ServiceAccount for a grant due
// now: the last one requested for this requester while it is younger than
// a sixth of its lifetime and was issued for this ServiceAccount, else a
// new one (TokenRequest). A grant made with it is renewed two thirds of a
// lifetime later (renewAt), so with at least a sixth of the token's
// lifetime left. One TokenRequest thus serves every reservation of a
// requester granted within TokenTTL/6 (10 minutes by default), instead of
// one each: the same credentials, to the same ServiceAccount, for the same
// namespace. The lock is held across the request, so that a burst of
// grants makes one.
func (r *TenantReconciler) tokenFor(ctx context.Context, requester string, sa *corev1.ServiceAccount) (tenantToken, error) {
	c := &r.tokens
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.m[requester]; ok && t.saUID == sa.UID && sa.UID != "" && time.Since(t.issued) < r.TokenTTL/6 {
		return t, nil
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(r.TokenTTL.Seconds()))}}
	issued := time.Now()
	if err := r.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return tenantToken{}, fmt.Errorf("token for %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	t := tenantToken{saUID: sa.UID, token: tr.Status.Token, issued: issued, expires: tr.Status.ExpirationTimestamp.Time}
	if c.m == nil {
		c.m = map[string]tenantToken{}
	}
	c.m[requester] = t
	return t, nil
}
