// Package provider is the provider side of the agent: for every requester
// that holds reservations on this cluster it keeps a tenant namespace
// (rb-<requester>) with a ResourceQuota equal to the sum of those
// reservations, a ServiceAccount with a namespaced Role, a placeholder pod
// per reservation that holds its capacity (hold.go), and hands the requester
// a short-lived token, with the placeholder's node, through the broker
// (grant.go). A reservation that ends is marked so; its tenant pods are
// evicted after a grace (ended.go). When the requester's last reservation is
// gone, all of it is removed.
//
// Each concern is its own level-based reconciler: it reads the objects,
// acts, and returns. What one reconciler tells another, or its next run,
// is in the ProviderInstruction's status or in the objects themselves, so
// a restarted agent carries on where the last one stopped.
package provider

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
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

// TenantReconciler keeps the tenant of one requester: namespace, quota,
// LimitRange and object quota, ServiceAccount and RoleBinding, or their
// removal after the requester's last reservation; its requests are keyed
// by the requester's cluster id (Name). Its fields are the configuration of
// the whole provider side: SetupWithManager registers, beside it, the hold,
// grant and eviction reconcilers, keyed by instruction, which share them.
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
	// GrantWorkers is how many grants are sent at once (default 8): a
	// burst of reservations is granted in parallel, not one round trip
	// after the other.
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

	// Caches of what is costly to fetch; losing them costs a fetch, never
	// a decision.
	pins   pinsCache  // requesters' advertised bridges (requesterPins)
	tokens tokenCache // the requesters' last tokens (tokenFor)
}

// SetupWithManager registers the tenant, hold, grant and eviction
// reconcilers and the index they share.
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
	byTenant := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if pi, ok := o.(*rbv1.ProviderInstruction); ok {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: pi.Spec.Requester}}}
		}
		if requester := o.GetLabels()[rbv1.TenantLabel]; requester != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: requester}}}
		}
		return nil
	})
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("tenant").
		Watches(&rbv1.ProviderInstruction{}, byTenant).
		Watches(&corev1.Namespace{}, byTenant).
		Watches(&corev1.ResourceQuota{}, byTenant).
		Complete(r); err != nil {
		return err
	}
	if err := (&holdReconciler{r}).setup(mgr); err != nil {
		return err
	}
	if err := (&grantReconciler{TenantReconciler: r, fresh: mgr.GetAPIReader()}).setup(mgr); err != nil {
		return err
	}
	return (&evictionReconciler{r}).setup(mgr)
}

// TenantNamespace is the namespace set aside for a requester.
func TenantNamespace(requester string) string { return rbv1.TenantNamespacePrefix + requester }

// Reconcile makes the tenant of requester match its live reservations here.
func (r *TenantReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	requester := req.Name
	logger := log.FromContext(ctx).WithValues("requester", requester)
	live, ended, err := r.instructionsOf(ctx, requester)
	if err != nil {
		return ctrl.Result{}, err
	}
	ns := TenantNamespace(requester)
	if len(live) == 0 && len(ended) == 0 {
		r.tokens.forget(requester)
		return ctrl.Result{}, r.removeTenant(ctx, ns)
	}
	if len(live) == 0 {
		// Only ended reservations, whose pods have their grace (the
		// eviction reconciler deletes each instruction when it is done):
		// keep the namespace, at a quota of nothing more.
		return ctrl.Result{}, r.shrinkQuota(ctx, ns)
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
	if err := r.setQuota(ctx, ns, requester, quotaOf(live)); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.ensureDefaults(ctx, ns, requester); err != nil {
		return ctrl.Result{}, err
	}
	// The ServiceAccount and RoleBinding last: the hold and the grant
	// take their presence for a tenant in place (tenantReady).
	if err := r.ensureAccess(ctx, ns, requester); err != nil {
		return ctrl.Result{}, err
	}
	// Its objects are not watched: one changed by hand (a RoleBinding
	// deleted to revoke access) stays so until the next grant is due,
	// when they are made again for it.
	return ctrl.Result{RequeueAfter: r.nextRenewal(live)}, nil
}

// nextRenewal is how soon the first of live's grants is due again.
func (r *TenantReconciler) nextRenewal(live []*rbv1.ProviderInstruction) time.Duration {
	next := r.TokenTTL
	for _, pi := range live {
		if pi.Status.GrantedAt != nil {
			next = min(next, time.Until(pi.Status.GrantedAt.Add(r.TokenTTL*2/3)))
		}
	}
	return max(next, time.Second)
}

// instructionsOf lists the instructions of requester here, live and ended
// (those being deleted in neither). The provider acts on what the broker
// said ended (events, lists), never on a clock: a live instruction stays
// until then.
func (r *TenantReconciler) instructionsOf(ctx context.Context, requester string) (live, ended []*rbv1.ProviderInstruction, err error) {
	var list rbv1.ProviderInstructionList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace), client.MatchingFields{RequesterIndex: requester}); err != nil {
		return nil, nil, err
	}
	for i := range list.Items {
		pi := &list.Items[i]
		switch {
		case !pi.DeletionTimestamp.IsZero():
		case IsEnded(pi):
			ended = append(ended, pi)
		default:
			live = append(live, pi)
		}
	}
	return live, ended, nil
}

// tenantReady tells whether requester's tenant is in place for its
// reservations to be held and granted: the policy, a namespace of ours not
// terminating, and the ServiceAccount and RoleBinding that the tenant
// reconciler makes last; it returns the ServiceAccount.
func (r *TenantReconciler) tenantReady(ctx context.Context, requester string) (*corev1.ServiceAccount, bool, error) {
	if r.PolicyReady != nil && !r.PolicyReady() {
		return nil, false, nil
	}
	name := TenantNamespace(requester)
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, &ns); err != nil {
		return nil, false, client.IgnoreNotFound(err)
	}
	if ns.Labels[rbv1.ManagedByLabel] != rbv1.ManagedByValue || !ns.DeletionTimestamp.IsZero() {
		return nil, false, nil
	}
	var sa corev1.ServiceAccount
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: name, Name: TenantServiceAccount}, &sa); err != nil {
		return nil, false, client.IgnoreNotFound(err)
	}
	var binding rbacv1.RoleBinding
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: name, Name: TenantRoleBinding}, &binding); err != nil {
		return nil, false, client.IgnoreNotFound(err)
	}
	return &sa, true, nil
}

// byRequester maps the tenant objects of a requester (labelled
// rbv1.TenantLabel) to the requests of its instructions, for the
// reconcilers keyed by instruction.
func (r *TenantReconciler) byRequester() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		requester := o.GetLabels()[rbv1.TenantLabel]
		if requester == "" {
			return nil
		}
		return r.requestsOf(ctx, requester, func(*rbv1.ProviderInstruction) bool { return true })
	})
}

// byReservationPod maps a pod of a reservation in a tenant namespace (the
// manager caches those only, agent.CacheOptions) to its instructions:
// placeholders bound, tenant pods come and go.
func (r *TenantReconciler) byReservationPod() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		requester, ok := strings.CutPrefix(o.GetNamespace(), rbv1.TenantNamespacePrefix)
		if !ok || requester == "" {
			return nil
		}
		id := o.GetLabels()[rbv1.ReservationLabel]
		if id == "" {
			id = o.GetAnnotations()[rbv1.ReservationIDAnnotation]
		}
		return r.requestsOf(ctx, requester, func(pi *rbv1.ProviderInstruction) bool { return pi.Spec.ReservationID == id })
	})
}

func (r *TenantReconciler) requestsOf(ctx context.Context, requester string, keep func(*rbv1.ProviderInstruction) bool) []reconcile.Request {
	var list rbv1.ProviderInstructionList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace), client.MatchingFields{RequesterIndex: requester}); err != nil {
		log.FromContext(ctx).Error(err, "listing a requester's instructions", "requester", requester)
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if keep(&list.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
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

// quotaOf is the tenant quota of live reservations: their sum.
func quotaOf(live []*rbv1.ProviderInstruction) corev1.ResourceList {
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
	return hard
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
		if !equality.Semantic.DeepEqual(quota.Spec.Hard, hard) {
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
		if !equality.Semantic.DeepEqual(q.Spec.Hard, wantQ.Spec.Hard) {
			q.Spec.Hard = wantQ.Spec.Hard
		}
		return nil
	}); err != nil {
		return fmt.Errorf("ResourceQuota %s/%s: %w", ns, q.Name, err)
	}
	return nil
}

// ensureAccess keeps the tenant's ServiceAccount and RoleBinding.
func (r *TenantReconciler) ensureAccess(ctx context.Context, ns, requester string) error {
	labels := map[string]string{rbv1.TenantLabel: requester, rbv1.ManagedByLabel: rbv1.ManagedByValue}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: TenantServiceAccount, Namespace: ns}}
	if _, err := controllerutil.CreateOrPatch(ctx, r.Client, sa, func() error {
		sa.Labels = labels
		sa.AutomountServiceAccountToken = ptr.To(false)
		return nil
	}); err != nil {
		return err
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: TenantRoleBinding, Namespace: ns}}
	_, err := controllerutil.CreateOrPatch(ctx, r.Client, binding, func() error {
		binding.Labels = labels
		binding.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: TenantClusterRole}
		binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: TenantServiceAccount, Namespace: ns}}
		return nil
	})
	return err
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
	add(rbv1.ResourceGPU, res.GPU)
	add(corev1.ResourceEphemeralStorage, res.Storage)
	pi := &rbv1.ProviderInstruction{
		ObjectMeta: metav1.ObjectMeta{Name: InstructionName(requester, id), Namespace: namespace, Labels: map[string]string{
			rbv1.RequesterLabel: requester, rbv1.ManagedByLabel: rbv1.ManagedByValue}},
		Spec: rbv1.ProviderInstructionSpec{ReservationID: id, Requester: requester, Resources: list, Node: node},
	}
	return pi
}

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
	known, ok := r.pins.get(requester)
	if ok && time.Since(known.read) < requesterPinsTTL {
		return known.pins
	}
	c, err := r.Clusters.Cluster(ctx, requester)
	if err != nil {
		log.FromContext(ctx).V(1).Info("requester's advertisement unreadable; keeping what was known", "requester", requester, "error", err.Error())
		return !ok || known.pins
	}
	pins := c.Labels[rbv1.BridgeLabel] != bridgeLiqo
	r.pins.set(requester, requesterBridge{pins: pins, read: time.Now()})
	if !pins && (!ok || known.pins) {
		log.FromContext(ctx).Info("requester offloads with Liqo: its reservations are not held by placeholders", "requester", requester)
	}
	return pins
}

// requesterPinsTTL is how long a requester's advertised bridge is trusted
// before it is read again.
const requesterPinsTTL = time.Minute

// bridgeLiqo is rbv1.BridgeLabel's value for a requester offloading with Liqo.
const bridgeLiqo = "liqo"

// requesterBridge is what a provider knows of a requester's bridge.
type requesterBridge struct {
	pins bool
	read time.Time
}

// pinsCache keeps the requesters' bridges as last read from the broker.
type pinsCache struct {
	mu sync.Mutex
	m  map[string]requesterBridge
}

func (c *pinsCache) get(requester string) (requesterBridge, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[requester]
	return b, ok
}

func (c *pinsCache) set(requester string, b requesterBridge) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]requesterBridge{}
	}
	c.m[requester] = b
}
