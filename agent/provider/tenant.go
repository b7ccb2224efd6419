// Package provider is the provider side of the agent: for every requester
// that holds reservations on this cluster it keeps a tenant namespace
// (rb-<requester>) with a ResourceQuota equal to the sum of those
// reservations, a ServiceAccount with a namespaced Role, a placeholder pod
// per reservation that holds its capacity (hold.go), and hands the requester
// a short-lived token, with the placeholder's node, through the broker. A
// reservation that ends is marked so; its tenant pods are evicted after a
// grace (ended.go). When the requester's last reservation is gone, all of it
// is removed.
package provider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// RequesterIndex indexes ProviderInstructions by spec.requester.
const RequesterIndex = "spec.requester"

// Names of the per-tenant objects inside the tenant namespace, and of the
// ClusterRole (shipped in manifests/agent) that their RoleBinding grants.
const (
	TenantServiceAccount = "rb-tenant"
	TenantRoleBinding    = "rb-tenant"
	TenantQuota          = "rb-reservations"
	TenantClusterRole    = "rb-tenant"
)

// Granter hands a requester its access through the broker (ids are scoped
// per requester).
type Granter interface {
	GrantTo(ctx context.Context, requester, id string, g api.Grant) (api.Reservation, error)
}

// ClusterReader reads a cluster's advertisement at the broker.
type ClusterReader interface {
	Cluster(ctx context.Context, id string) (api.Cluster, error)
}

// TenantReconciler reconciles the tenant of one requester; its requests are
// keyed by the requester's cluster id (Name), whatever object changed.
type TenantReconciler struct {
	Client client.Client
	// APIReader reads what the manager's cache does not hold (every pod of
	// a node, for requeueStuckCopies); nil turns that work-around off.
	APIReader client.Reader
	// Clusters reads requesters' advertisements: a requester that
	// advertises rbv1.BridgeLabel=liqo cannot pin its pods to a held node,
	// so its reservations are not held (nil: every requester pins).
	Clusters ClusterReader
	Broker   Granter
	Recorder events.EventRecorder
	// Namespace holds this agent's ProviderInstructions.
	Namespace string
	// Endpoint and CABundle are this cluster's API server as requesters reach it.
	Endpoint string
	CABundle []byte
	// TokenTTL is the lifetime of a granted token (default 1h, at least 10m);
	// grants are renewed after two thirds of it.
	TokenTTL time.Duration
	// GrantWorkers is how many grants of one requester are sent at once
	// (default 8): a burst of reservations is granted in parallel, not one
	// round trip after the other.
	GrantWorkers int
	// Hold turns the provider-side hold on: a placeholder pod per live
	// reservation, and grants that carry its placement.
	Hold bool
	// PlaceholderImage is the placeholder's image (default DefaultPlaceholderImage).
	PlaceholderImage string
	// HoldTimeout is how long a first grant waits for the placeholder to be
	// bound (default DefaultHoldTimeout); then it goes without placement.
	HoldTimeout time.Duration
	// EvictionGrace is how long the tenant pods of an ended reservation may
	// still run (default DefaultEvictionGrace).
	EvictionGrace time.Duration
	// Requesters tells whether a requester is still heard here (its
	// heartbeat Lease); nil: by the broker's word only.
	Requesters *Requesters
	// MassExpiryHold is how long the evictions of a mass expiry wait
	// (holdEviction); default DefaultMassExpiryHold, negative: never held.
	MassExpiryHold time.Duration
	// PolicyReady tells whether the tenant policy is in place
	// (ClusterObjects.Ready); until it is, no tenant namespace is made and
	// no access granted. nil: always.
	PolicyReady func() bool

	// pins: per requester, whether its bridge pins pods to held nodes, and
	// when that was read (requesterPins).
	pinsMu sync.Mutex
	pins   map[string]requesterBridge

	// tokens: the last token requested per requester, handed to the
	// reservations granted while it is young (see tokenFor).
	tokensMu sync.Mutex
	tokens   map[string]tenantToken
	// granted: per requester, the reservations granted by this process and
	// when, for the reconciles that come before the cache shows the
	// instruction's new status (the quota's and the instruction's own
	// events): without it they would grant again.
	granted map[string]map[types.UID]time.Time
	// holdStart: per instruction UID, when this process first saw its
	// placeholder waiting for a node (HoldTimeout counts from there).
	holdStart map[string]time.Time
	// placedHere: per instruction UID, the placement node this process
	// last granted (the cache may not show status.placementNode yet).
	placedHere map[types.UID]string
	// held: per instruction UID, why its eviction was last reported held,
	// so that each hold is one Event, not one per look.
	heldMu sync.Mutex
	held   map[types.UID]string
}

// tenantToken is a token of a tenant's ServiceAccount.
type tenantToken struct {
	saUID   types.UID // the ServiceAccount it was issued for: a new one (tenant re-created) voids it
	token   string
	issued  time.Time
	expires time.Time
}

// SetupWithManager registers the reconciler and its index.
func (r *TenantReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.TokenTTL == 0 {
		r.TokenTTL = time.Hour
	}
	if r.GrantWorkers == 0 {
		r.GrantWorkers = 8
	}
	if r.PlaceholderImage == "" {
		r.PlaceholderImage = DefaultPlaceholderImage
	}
	if r.HoldTimeout == 0 {
		r.HoldTimeout = DefaultHoldTimeout
	}
	if r.EvictionGrace == 0 {
		r.EvictionGrace = DefaultEvictionGrace
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &rbv1.ProviderInstruction{}, RequesterIndex,
		func(o client.Object) []string { return []string{o.(*rbv1.ProviderInstruction).Spec.Requester} }); err != nil {
		return err
	}
	byRequester := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if pi, ok := o.(*rbv1.ProviderInstruction); ok {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: pi.Spec.Requester}}}
		}
		if requester := o.GetLabels()[rbv1.TenantLabel]; requester != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: requester}}}
		}
		// Pods of reservations (the manager caches those only, agent.CacheOptions)
		// in a tenant namespace: placeholders bound, tenant pods come.
		if _, ok := o.(*corev1.Pod); ok {
			if requester, ok := strings.CutPrefix(o.GetNamespace(), rbv1.TenantNamespacePrefix); ok && requester != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: requester}}}
			}
		}
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("tenant").
		Watches(&rbv1.ProviderInstruction{}, byRequester).
		Watches(&corev1.Namespace{}, byRequester).
		Watches(&corev1.ResourceQuota{}, byRequester).
		Watches(&corev1.Pod{}, byRequester).
		Complete(r)
}

// TenantNamespace is the namespace set aside for a requester.
func TenantNamespace(requester string) string { return rbv1.TenantNamespacePrefix + requester }

// Reconcile makes the tenant of requester match its live reservations here.
func (r *TenantReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	requester := req.Name
	logger := log.FromContext(ctx).WithValues("requester", requester)
	var list rbv1.ProviderInstructionList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace), client.MatchingFields{RequesterIndex: requester}); err != nil {
		return ctrl.Result{}, err
	}
	now := time.Now()
	next := now.Add(r.TokenTTL)
	soonest := func(t time.Time) {
		if t.Before(next) {
			next = t
		}
	}
	// The provider acts on what the broker said ended (events, lists), never
	// on a clock: a live instruction stays until then.
	var live, ended []*rbv1.ProviderInstruction
	covered := map[string]bool{}
	for i := range list.Items {
		pi := &list.Items[i]
		switch {
		case !pi.DeletionTimestamp.IsZero():
		case IsEnded(pi):
			ended = append(ended, pi)
		default:
			live = append(live, pi)
			covered[pi.Spec.ReservationID] = true
		}
	}
	ns := TenantNamespace(requester)
	inGrace := 0
	for _, pi := range ended {
		wait, err := r.finish(ctx, ns, pi, covered)
		if err != nil {
			return ctrl.Result{}, err
		}
		if wait > 0 {
			inGrace++
			soonest(now.Add(wait))
		}
	}
	if len(live) == 0 && inGrace == 0 {
		r.forgetToken(requester)
		return ctrl.Result{}, r.removeTenant(ctx, ns)
	}
	if len(live) == 0 {
		// Only reservations in their grace: keep the namespace (their pods
		// run on), at a quota of nothing more.
		if err := r.shrinkQuota(ctx, ns); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: max(time.Until(next), time.Second)}, nil
	}
	if r.PolicyReady != nil && !r.PolicyReady() {
		logger.Info("tenant policy not in place yet: no access granted")
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err := r.ensureNamespace(ctx, ns, requester); err != nil {
		if errors.Is(err, errTerminating) {
			logger.Info("tenant namespace still terminating, waiting")
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, err
	}
	if err := r.ensureQuota(ctx, ns, requester, live); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.ensureDefaults(ctx, ns, requester); err != nil {
		return ctrl.Result{}, err
	}
	sa, err := r.ensureAccess(ctx, ns, requester)
	if err != nil {
		return ctrl.Result{}, err
	}
	type dueGrant struct {
		pi        *rbv1.ProviderInstruction
		placement *api.Placement
	}
	var due []dueGrant
	granted := r.grantedOf(requester, live)
	hold := r.Hold && r.requesterPins(ctx, requester)
	for _, pi := range live {
		var hs holdState
		if hold {
			if hs, err = r.hold(ctx, ns, pi); err != nil {
				return ctrl.Result{}, err
			}
			if hs.changed {
				if err := r.Client.Status().Update(ctx, pi); err != nil {
					return ctrl.Result{}, client.IgnoreNotFound(err)
				}
			}
			if hs.recheck > 0 {
				soonest(time.Now().Add(hs.recheck))
			}
		}
		first := !pi.Status.Enforced && granted[pi.UID].IsZero()
		if first && hs.waiting {
			if time.Now().Before(hs.deadline) {
				soonest(hs.deadline) // the placeholder's binding wakes us earlier
				continue
			}
			r.Recorder.Eventf(pi, nil, corev1.EventTypeWarning, "HoldUnplaced", "Grant",
				"placeholder pod not bound within %s: granting without placement (a later grant carries it once the placeholder lands)", r.HoldTimeout)
		}
		// A placement the requester has not been told of yet is due now.
		newPlacement := hs.placement != nil && hs.placement.Node != r.placedNode(pi) && !pi.Status.Superseded
		if at, ok := r.renewAt(pi, granted[pi.UID]); ok && !newPlacement {
			soonest(at)
			continue
		}
		if hs.waiting {
			soonest(time.Now().Add(r.HoldTimeout)) // look at the placeholder again
		}
		due = append(due, dueGrant{pi, hs.placement})
	}
	if len(due) > 0 {
		tok, err := r.tokenFor(ctx, requester, sa)
		if err != nil {
			return ctrl.Result{}, err
		}
		// Independent grants (one broker call and one status write each), in parallel.
		var mu sync.Mutex
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(max(1, r.GrantWorkers))
		for _, d := range due {
			g.Go(func() error {
				renewAt, err := r.grant(gctx, ns, d.pi, tok, d.placement)
				if err == nil {
					mu.Lock()
					soonest(renewAt)
					mu.Unlock()
					r.recordGrant(requester, d.pi.UID, d.placement)
				}
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: max(time.Until(next), time.Second)}, nil
}

var errTerminating = errors.New("namespace terminating")

func (r *TenantReconciler) ensureNamespace(ctx context.Context, name, requester string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := controllerutil.CreateOrPatch(ctx, r.Client, ns, func() error {
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels[rbv1.TenantLabel] = requester
		ns.Labels[rbv1.ManagedByLabel] = rbv1.ManagedByValue
		// Mirrored pods are ordinary workloads: hold them to the restricted-ish baseline.
		ns.Labels["pod-security.kubernetes.io/enforce"] = "baseline"
		return nil
	}); err != nil {
		return err
	}
	if !ns.DeletionTimestamp.IsZero() {
		return errTerminating
	}
	return nil
}

// QuotaScope is the tenant quota's scope: every pod but the placeholders
// (whose requests stand for the very capacity the quota grants: counted,
// they would leave the tenant nothing). The priority class of a pod with
// none is "", which NotIn matches.
var QuotaScope = &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
	ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpNotIn,
	Values: []string{rbv1.PlaceholderPriorityClass},
}}}

// PodsPerReservation is how many pods (placeholders aside) the tenant quota
// counts per live reservation: its pod, and a replacement made while the
// first one terminates.
const PodsPerReservation = 2

// ensureQuota caps the tenant at the sum of its live reservations.
func (r *TenantReconciler) ensureQuota(ctx context.Context, ns, requester string, live []*rbv1.ProviderInstruction) error {
	// cpu and memory always: a quota without a resource does not limit it.
	hard := corev1.ResourceList{"requests.cpu": resource.Quantity{}, "requests.memory": resource.Quantity{},
		corev1.ResourcePods: *resource.NewQuantity(int64(PodsPerReservation*len(live)), resource.DecimalSI)}
	for _, pi := range live {
		for name, q := range pi.Spec.Resources {
			key := corev1.ResourceName("requests." + string(name))
			sum := hard[key]
			sum.Add(q)
			hard[key] = sum
		}
	}
	return r.setQuota(ctx, ns, requester, hard)
}

// shrinkQuota lets a tenant whose reservations have all ended create
// nothing more while their pods' grace runs.
func (r *TenantReconciler) shrinkQuota(ctx context.Context, ns string) error {
	requester := strings.TrimPrefix(ns, rbv1.TenantNamespacePrefix)
	var have corev1.ResourceQuota
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: TenantQuota}, &have); err != nil {
		return client.IgnoreNotFound(err) // no namespace: nothing to shrink
	}
	hard := corev1.ResourceList{}
	for name := range have.Spec.Hard {
		hard[name] = resource.Quantity{}
	}
	return r.setQuota(ctx, ns, requester, hard)
}

func (r *TenantReconciler) setQuota(ctx context.Context, ns, requester string, hard corev1.ResourceList) error {
	// The scope is immutable: a quota of an older agent, without it, is replaced.
	var have corev1.ResourceQuota
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: TenantQuota}, &have)
	if err == nil && !equality.Semantic.DeepEqual(have.Spec.ScopeSelector, QuotaScope) {
		if err := r.Client.Delete(ctx, &have); client.IgnoreNotFound(err) != nil {
			return err
		}
	} else if client.IgnoreNotFound(err) != nil {
		return err
	}
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: TenantQuota, Namespace: ns}}
	_, err = controllerutil.CreateOrPatch(ctx, r.Client, quota, func() error {
		if quota.CreationTimestamp.IsZero() {
			quota.Spec.ScopeSelector = QuotaScope.DeepCopy()
		}
		quota.Labels = map[string]string{rbv1.TenantLabel: requester, rbv1.ManagedByLabel: rbv1.ManagedByValue}
		if !equalResources(quota.Spec.Hard, hard) {
			quota.Spec.Hard = hard
		}
		return nil
	})
	return err
}

// ensureDefaults keeps the tenant namespace's LimitRange and object-count
// quota (manifests/agent/tenant-namespace.yaml).
func (r *TenantReconciler) ensureDefaults(ctx context.Context, ns, requester string) error {
	labels := map[string]string{rbv1.TenantLabel: requester, rbv1.ManagedByLabel: rbv1.ManagedByValue}
	wantLR := NewTenantLimitRange(ns)
	lr := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: wantLR.Name, Namespace: ns}}
	if _, err := controllerutil.CreateOrPatch(ctx, r.Client, lr, func() error {
		lr.Labels, lr.Spec = labels, wantLR.Spec
		return nil
	}); err != nil {
		return fmt.Errorf("LimitRange %s/%s: %w", ns, lr.Name, err)
	}
	wantQ := NewTenantObjectQuota(ns)
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: wantQ.Name, Namespace: ns}}
	if _, err := controllerutil.CreateOrPatch(ctx, r.Client, q, func() error {
		q.Labels = labels
		if !equalResources(q.Spec.Hard, wantQ.Spec.Hard) {
			q.Spec.Hard = wantQ.Spec.Hard
		}
		return nil
	}); err != nil {
		return fmt.Errorf("ResourceQuota %s/%s: %w", ns, q.Name, err)
	}
	return nil
}

// equalResources compares by value, so "1000m" equals "1".
func equalResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

// ensureAccess keeps the tenant's ServiceAccount and RoleBinding, and
// returns the ServiceAccount.
func (r *TenantReconciler) ensureAccess(ctx context.Context, ns, requester string) (*corev1.ServiceAccount, error) {
	labels := map[string]string{rbv1.TenantLabel: requester, rbv1.ManagedByLabel: rbv1.ManagedByValue}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: TenantServiceAccount, Namespace: ns}}
	if _, err := controllerutil.CreateOrPatch(ctx, r.Client, sa, func() error {
		sa.Labels = labels
		sa.AutomountServiceAccountToken = ptr.To(false)
		return nil
	}); err != nil {
		return nil, err
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: TenantRoleBinding, Namespace: ns}}
	_, err := controllerutil.CreateOrPatch(ctx, r.Client, binding, func() error {
		binding.Labels = labels
		binding.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: TenantClusterRole}
		binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: TenantServiceAccount, Namespace: ns}}
		return nil
	})
	return sa, err
}

// renewAt tells when pi's grant is due again, if it is granted (as its
// status says, or at grantedHere by this process) and not due yet.
func (r *TenantReconciler) renewAt(pi *rbv1.ProviderInstruction, grantedHere time.Time) (time.Time, bool) {
	last := grantedHere
	if pi.Status.GrantedAt != nil && pi.Status.Enforced && pi.Status.GrantedAt.After(last) {
		last = pi.Status.GrantedAt.Time
	}
	if last.IsZero() {
		return time.Time{}, false
	}
	at := last.Add(r.TokenTTL * 2 / 3)
	return at, time.Now().Before(at)
}

// grantedOf returns when this process granted the live instructions of a
// requester, and forgets the others.
func (r *TenantReconciler) grantedOf(requester string, live []*rbv1.ProviderInstruction) map[types.UID]time.Time {
	r.tokensMu.Lock()
	defer r.tokensMu.Unlock()
	out := map[types.UID]time.Time{}
	m := r.granted[requester]
	for _, pi := range live {
		if at, ok := m[pi.UID]; ok {
			out[pi.UID] = at
		}
	}
	if len(out) < len(m) {
		r.granted[requester] = maps.Clone(out)
	}
	return out
}

// placedNode is the placement node last granted for pi, by this process or
// as its status says.
func (r *TenantReconciler) placedNode(pi *rbv1.ProviderInstruction) string {
	r.tokensMu.Lock()
	defer r.tokensMu.Unlock()
	if node, ok := r.placedHere[pi.UID]; ok {
		return node
	}
	return pi.Status.PlacementNode
}

func (r *TenantReconciler) recordGrant(requester string, uid types.UID, placement *api.Placement) {
	r.tokensMu.Lock()
	defer r.tokensMu.Unlock()
	if placement != nil {
		if r.placedHere == nil {
			r.placedHere = map[types.UID]string{}
		}
		r.placedHere[uid] = placement.Node
	}
	if r.granted == nil {
		r.granted = map[string]map[types.UID]time.Time{}
	}
	if r.granted[requester] == nil {
		r.granted[requester] = map[types.UID]time.Time{}
	}
	r.granted[requester][uid] = time.Now()
}

// tokenFor returns a token of the tenant's ServiceAccount for the grants
// due now: the last one requested for this requester while it is younger
// than a sixth of its lifetime and was issued for this ServiceAccount,
// else a new one (TokenRequest). A grant made with it is renewed two thirds
// of a lifetime later (renewAt), so with at least a sixth of the token's
// lifetime left. One TokenRequest thus serves every reservation of a
// requester made within TokenTTL/6 (10 minutes by default), instead of one
// each: the same credentials, to the same ServiceAccount, for the same
// namespace.
func (r *TenantReconciler) tokenFor(ctx context.Context, requester string, sa *corev1.ServiceAccount) (tenantToken, error) {
	r.tokensMu.Lock()
	defer r.tokensMu.Unlock()
	if t, ok := r.tokens[requester]; ok && t.saUID == sa.UID && sa.UID != "" && time.Since(t.issued) < r.TokenTTL/6 {
		return t, nil
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(r.TokenTTL.Seconds()))}}
	issued := time.Now()
	if err := r.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return tenantToken{}, fmt.Errorf("token for %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	t := tenantToken{saUID: sa.UID, token: tr.Status.Token, issued: issued, expires: tr.Status.ExpirationTimestamp.Time}
	if r.tokens == nil {
		r.tokens = map[string]tenantToken{}
	}
	r.tokens[requester] = t
	return t, nil
}

// forgetToken drops the cached token of a requester (its tenant is gone).
func (r *TenantReconciler) forgetToken(requester string) {
	r.tokensMu.Lock()
	defer r.tokensMu.Unlock()
	delete(r.tokens, requester)
	for uid := range r.granted[requester] {
		delete(r.placedHere, uid)
	}
	delete(r.granted, requester)
}

// grant sends tok for pi's reservation (which is due: see renewAt); it
// returns when the grant should be renewed.
func (r *TenantReconciler) grant(ctx context.Context, ns string, pi *rbv1.ProviderInstruction, tok tenantToken, placement *api.Placement) (time.Time, error) {
	renew := func(at time.Time) time.Time { return at.Add(r.TokenTTL * 2 / 3) }
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
	pi.Status.Enforced = true
	pi.Status.TenantNamespace = ns
	pi.Status.GrantedAt = &now
	msg := "namespace " + ns + ", quota and credentials in place"
	if placement != nil {
		newPlacement := pi.Status.PlacementNode != placement.Node
		pi.Status.PlacementNode = placement.Node
		msg += "; the tenant pod is pinned to node " + placement.Node + " at " + placement.PriorityClassName
		if newPlacement {
			r.Recorder.Eventf(pi, nil, corev1.EventTypeNormal, "PlacementGranted", "Grant", "requester %s told to pin the pod to node %s at PriorityClass %s",
				pi.Spec.Requester, placement.Node, placement.PriorityClassName)
		}
	}
	meta.SetStatusCondition(&pi.Status.Conditions, metav1.Condition{Type: rbv1.ConditionEnforced, Status: metav1.ConditionTrue,
		Reason: "Granted", Message: msg, ObservedGeneration: pi.Generation})
	if err := r.Client.Status().Update(ctx, pi); err != nil {
		return time.Time{}, err
	}
	if first {
		r.Recorder.Eventf(pi, nil, corev1.EventTypeNormal, "Enforced", "Enforce", "capacity set aside in %s for %s", ns, pi.Spec.Requester)
	}
	return renew(now.Time), nil
}

// removeTenant deletes the namespace; everything of the tenant is inside it.
func (r *TenantReconciler) removeTenant(ctx context.Context, name string) error {
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, &ns); err != nil {
		return client.IgnoreNotFound(err)
	}
	if ns.Labels[rbv1.ManagedByLabel] != rbv1.ManagedByValue || !ns.DeletionTimestamp.IsZero() {
		return nil // not ours, or already going
	}
	log.FromContext(ctx).Info("last reservation ended, removing tenant", "namespace", name)
	err := r.Client.Delete(ctx, &ns, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// InstructionFor builds the ProviderInstruction that records a reservation
// this cluster provides; node is the node the broker debited ("" none).
func InstructionFor(namespace string, id, requester string, res api.Quantities, node string) *rbv1.ProviderInstruction {
	list := corev1.ResourceList{}
	add := func(name corev1.ResourceName, q *resource.Quantity) {
		if q != nil && !q.IsZero() {
			list[name] = *q
		}
	}
	add(corev1.ResourceCPU, res.CPU)
	add(corev1.ResourceMemory, res.Memory)
	add("nvidia.com/gpu", res.GPU)
	add(corev1.ResourceEphemeralStorage, res.Storage)
	pi := &rbv1.ProviderInstruction{
		ObjectMeta: metav1.ObjectMeta{Name: InstructionName(requester, id), Namespace: namespace, Labels: map[string]string{
			rbv1.RequesterLabel: requester, rbv1.ManagedByLabel: rbv1.ManagedByValue}},
		Spec: rbv1.ProviderInstructionSpec{ReservationID: id, Requester: requester, Resources: list, Node: node},
	}
	return pi
}

// requesterBridge is what a provider knows of a requester's bridge.
type requesterBridge struct {
	pins bool
	read time.Time
}

// requesterPinsTTL is how long a requester's advertised bridge is trusted
// before it is read again.
const requesterPinsTTL = time.Minute

// requesterPins tells whether requester's bridge pins its pods to the node
// a placeholder holds (our virtual-kubelet bridge does; Liqo's offloading
// does not, and says so with rbv1.BridgeLabel in its advertisement). Held
// for a requester that does not pin, the capacity would be taken twice: by
// the placeholder, which nothing preempts, and by the offloaded pod. When
// the broker cannot say, the last answer stands (pinning if none).
func (r *TenantReconciler) requesterPins(ctx context.Context, requester string) bool {
	if r.Clusters == nil {
		return true
	}
	r.pinsMu.Lock()
	known, ok := r.pins[requester]
	r.pinsMu.Unlock()
	if ok && time.Since(known.read) < requesterPinsTTL {
		return known.pins
	}
	c, err := r.Clusters.Cluster(ctx, requester)
	if err != nil {
		log.FromContext(ctx).V(1).Info("requester's advertisement unreadable; keeping what was known", "requester", requester, "error", err.Error())
		return !ok || known.pins
	}
	pins := c.Labels[rbv1.BridgeLabel] != bridgeLiqo
	r.pinsMu.Lock()
	if r.pins == nil {
		r.pins = map[string]requesterBridge{}
	}
	r.pins[requester] = requesterBridge{pins: pins, read: time.Now()}
	r.pinsMu.Unlock()
	if !pins && (!ok || known.pins) {
		log.FromContext(ctx).Info("requester offloads with Liqo: its reservations are not held by placeholders", "requester", requester)
	}
	return pins
}

// bridgeLiqo is rbv1.BridgeLabel's value for a requester offloading with Liqo.
const bridgeLiqo = "liqo"
