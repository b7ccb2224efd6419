package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// The provider-side hold (agent/README.md): a placeholder pod per live
// reservation, in the tenant namespace, requests = the reservation, at
// PriorityClass rb-placeholder (above ordinary workloads, preemptionPolicy
// Never). Once the scheduler binds it, the grant carries its node and
// rb-tenant; the requester's bridge pins the copy there at rb-tenant, and
// the scheduler preempts the placeholder for it.

// placeholderMadeAnnotation is when the hold made a placeholder: the first
// grant waits HoldTimeout from then (holdDeadline), which its
// creationTimestamp, in whole seconds, cannot tell.
const placeholderMadeAnnotation = "broker.fluidos.eu/placeholder-made"

// Defaults of the hold.
const (
	DefaultPlaceholderImage = "registry.k8s.io/pause:3.10"
	DefaultHoldTimeout      = 10 * time.Second
	DefaultEvictionGrace    = 30 * time.Second
)

// InstructionName is the name of the ProviderInstruction of reservation id
// of requester: "<requester>.<id>". Ids are scoped per requester, and a
// requester (a DNS label) has no dots, so two requesters' identical ids
// never collide; only a name longer than an object name allows (253) is
// shortened with a hash of the pair.
func InstructionName(requester, id string) string {
	return scopedName(requester+"."+id, requester+"/"+id)
}

// PlaceholderName is the name of the placeholder pod of reservation id in
// its requester's tenant namespace.
func PlaceholderName(id string) string {
	return scopedName("rb-hold-"+id, id)
}

// scopedName is full if it is a valid object name, else a prefix of it and
// a hash of key.
func scopedName(full, key string) string {
	if len(validation.IsDNS1123Subdomain(full)) == 0 {
		return full
	}
	sum := sha256.Sum256([]byte(key))
	suffix := hex.EncodeToString(sum[:])[:16]
	prefix := strings.TrimRight(full[:min(len(full), validation.DNS1123SubdomainMaxLength-len(suffix)-1)], "-.")
	return prefix + "-" + suffix
}

// reservationLabels are the labels that name a reservation on a pod; the
// label only when the id is a valid label value (the annotation always).
func reservationSelector(id string) (client.MatchingLabels, bool) {
	if len(validation.IsValidLabelValue(id)) > 0 {
		return nil, false
	}
	return client.MatchingLabels{rbv1.ReservationLabel: id}, true
}

// NewPlaceholder is the placeholder pod of pi in namespace ns.
func NewPlaceholder(pi *rbv1.ProviderInstruction, ns, image string) *corev1.Pod {
	id := pi.Spec.ReservationID
	labels := map[string]string{rbv1.RoleLabel: rbv1.RolePlaceholder, rbv1.RequesterLabel: pi.Spec.Requester,
		rbv1.ManagedByLabel: rbv1.ManagedByValue}
	if _, ok := reservationSelector(id); ok {
		labels[rbv1.ReservationLabel] = id
	}
	requests := pi.Spec.Resources.DeepCopy()
	limits := corev1.ResourceList{}
	for name, q := range requests {
		// Extended resources (nvidia.com/gpu) cannot be overcommitted: limits = requests.
		if strings.Contains(string(name), "/") && !strings.HasPrefix(string(name), corev1.ResourceDefaultNamespacePrefix) {
			limits[name] = q
		}
	}
	if len(limits) == 0 {
		limits = nil
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: PlaceholderName(id), Namespace: ns, Labels: labels,
			Annotations: map[string]string{rbv1.ReservationIDAnnotation: id}},
		Spec: corev1.PodSpec{
			PriorityClassName:             rbv1.PlaceholderPriorityClass,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{
				Name:      "hold",
				Image:     image,
				Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					RunAsNonRoot:             ptr.To(true),
					RunAsUser:                ptr.To(int64(65535)),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
		},
	}
	if pi.Spec.Node != "" {
		// Preferred, not required: the broker's debit is a hint; any node
		// with room holds the capacity as well.
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
				Weight: 100,
				Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{pi.Spec.Node}}}},
			}},
		}}
	}
	return pod
}

// holdReconciler keeps one placeholder per live instruction, while the
// instruction's requester pins its pods (key: the instruction), and
// records in the instruction's status where it stands: Held on HeldNode,
// or Superseded once its tenant pod came. The grant reconciler reads
// the placement there.
type holdReconciler struct{ *TenantReconciler }

func (r *holdReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("tenant-hold").
		For(&rbv1.ProviderInstruction{}).
		Watches(&corev1.Pod{}, r.byReservationPod()).
		Watches(&corev1.Namespace{}, r.byRequester()).
		Watches(&corev1.ServiceAccount{}, r.byRequester()).
		Watches(&rbacv1.RoleBinding{}, r.byRequester()).
		Complete(r)
}

// Reconcile keeps the placeholder of a live instruction; the eviction
// reconciler removes an ended one's.
func (r *holdReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if !r.Hold {
		return ctrl.Result{}, nil
	}
	var pi rbv1.ProviderInstruction
	if live, wait, err := r.readLive(ctx, req.NamespacedName, &pi); !live {
		return ctrl.Result{RequeueAfter: wait}, err
	}
	if _, ready, err := r.tenantReady(ctx, pi.Spec.Requester); err != nil || !ready {
		return ctrl.Result{}, err // the tenant's objects bring us back
	}
	if !r.requesterPins(ctx, pi.Spec.Requester) {
		return ctrl.Result{RequeueAfter: requesterPinsTTL}, nil // its bridge may change
	}
	st, err := r.hold(ctx, TenantNamespace(pi.Spec.Requester), &pi)
	if err != nil {
		return ctrl.Result{}, err
	}
	if st.changed {
		// Written on the version read: another writer meanwhile (a grant,
		// an end) and this look is made again on the newer one.
		if err := r.Client.Status().Update(ctx, &pi); apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: time.Millisecond}, nil
		} else if err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	return ctrl.Result{RequeueAfter: st.recheck}, nil
}

// readLive reads the instruction at key into pi and tells whether the
// hold and grant reconcilers act on it: live, and the tenant policy loaded
// (else look again in wait).
func (r *TenantReconciler) readLive(ctx context.Context, key types.NamespacedName, pi *rbv1.ProviderInstruction) (bool, time.Duration, error) {
	if err := r.Client.Get(ctx, key, pi); err != nil {
		return false, 0, client.IgnoreNotFound(err)
	}
	if !pi.DeletionTimestamp.IsZero() || IsEnded(pi) {
		return false, 0, nil
	}
	if r.PolicyReady != nil && !r.PolicyReady() {
		return false, time.Second, nil
	}
	return true, 0, nil
}

// reservationPods lists the pods of reservation id in ns: its placeholder
// (nil if none) and its tenant pods.
func (r *TenantReconciler) reservationPods(ctx context.Context, ns, id string) (*corev1.Pod, []*corev1.Pod, error) {
	var list corev1.PodList
	opts := []client.ListOption{client.InNamespace(ns)}
	if sel, ok := reservationSelector(id); ok {
		opts = append(opts, sel)
	}
	if err := r.Client.List(ctx, &list, opts...); err != nil {
		return nil, nil, err
	}
	var placeholder *corev1.Pod
	var tenants []*corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if p.Labels[rbv1.ReservationLabel] != id && p.Annotations[rbv1.ReservationIDAnnotation] != id {
			continue
		}
		if p.Labels[rbv1.RoleLabel] == rbv1.RolePlaceholder && p.Labels[rbv1.ManagedByLabel] == rbv1.ManagedByValue {
			if p.Name == PlaceholderName(id) {
				placeholder = p
			}
			continue
		}
		tenants = append(tenants, p)
	}
	return placeholder, tenants, nil
}

// holdState is what the hold of one live instruction found.
type holdState struct {
	// changed: pi's status changed (to be written).
	changed bool
	// recheck: look again this soon (a pending copy may be stuck; zero: no need).
	recheck time.Duration
}

// StuckCopyAfter is how long a tenant pod may stay unschedulable on a node
// that has room for it before requeueStuckCopies makes it anew.
const StuckCopyAfter = 5 * time.Second

// requeueStuckCopies works around kube-scheduler's async preemption losing a
// preemptor (kubernetes/kubernetes#141694, open in 1.35): when two tenant
// pods pinned to one node arrive together, both preempt the node's
// placeholders, the second finds its victims already deleted, and it waits
// in the unschedulable pool for the 5-minute flush although the node has
// room. A tenant pod unschedulable for StuckCopyAfter, its placeholder gone,
// on a node whose free capacity holds it, is deleted (Warning Event
// CopyRequeued): the requester's bridge makes the copy again at once, and
// a new pod is scheduled at once. Returns when to look again.
func (r *holdReconciler) requeueStuckCopies(ctx context.Context, pi *rbv1.ProviderInstruction, tenants []*corev1.Pod) (time.Duration, error) {
	if r.APIReader == nil || pi.Status.PlacementNode == "" {
		return 0, nil
	}
	var recheck time.Duration
	for _, p := range tenants {
		if p.Spec.NodeName != "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		var since time.Time
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				since = c.LastTransitionTime.Time
			}
		}
		if since.IsZero() {
			continue
		}
		if wait := time.Until(since.Add(StuckCopyAfter)); wait > 0 {
			recheck = max(recheck, wait)
			continue
		}
		fits, err := r.nodeHolds(ctx, pi.Status.PlacementNode, p)
		if err != nil || !fits {
			recheck = StuckCopyAfter // the node is full for now: the scheduler's own events will tell
			if err != nil {
				return recheck, err
			}
			continue
		}
		// The cache may lag the scheduler: a copy bound meanwhile, maybe
		// running, must not be killed. Read it afresh and delete that very
		// version (bound since, its resourceVersion changed: Conflict).
		var cur corev1.Pod
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(p), &cur); err != nil {
			return 0, client.IgnoreNotFound(err)
		}
		if cur.UID != p.UID || cur.Spec.NodeName != "" || !cur.DeletionTimestamp.IsZero() {
			continue
		}
		err = r.Client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID, ResourceVersion: &cur.ResourceVersion})
		if apierrors.IsConflict(err) {
			continue
		}
		if client.IgnoreNotFound(err) != nil {
			return 0, err
		}
		r.Recorder.Eventf(pi, nil, corev1.EventTypeWarning, "CopyRequeued", "Requeue",
			"tenant pod %s/%s unschedulable for %s although node %s has room (kube-scheduler lost it after a preemption, kubernetes/kubernetes#141694): deleted so that the requester makes it anew",
			p.Namespace, p.Name, time.Since(since).Round(time.Second), pi.Status.PlacementNode)
	}
	return recheck, nil
}

// nodeHolds tells whether node's allocatable, less the requests of the
// pods bound to it, holds pod's requests (read from the API server: the
// manager's cache holds only the pods of reservations).
func (r *holdReconciler) nodeHolds(ctx context.Context, node string, pod *corev1.Pod) (bool, error) {
	var n corev1.Node
	if err := r.APIReader.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return false, err
	}
	free := n.Status.Allocatable.DeepCopy()
	for i := range pods.Items {
		q := &pods.Items[i]
		if q.Status.Phase == corev1.PodSucceeded || q.Status.Phase == corev1.PodFailed {
			continue
		}
		for name, v := range resourcehelper.PodRequests(q, resourcehelper.PodResourcesOptions{}) {
			left := free[name]
			left.Sub(v)
			free[name] = left
		}
	}
	for name, want := range resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}) {
		if left, ok := free[name]; !ok || left.Cmp(want) < 0 {
			return false, nil
		}
	}
	return true, nil
}

// hold keeps pi's placeholder and records in pi's status where it stands.
func (r *holdReconciler) hold(ctx context.Context, ns string, pi *rbv1.ProviderInstruction) (holdState, error) {
	var st holdState
	logger := log.FromContext(ctx).WithValues("reservation", pi.Spec.ReservationID, "requester", pi.Spec.Requester)
	placeholder, tenants, err := r.reservationPods(ctx, ns, pi.Spec.ReservationID)
	if err != nil {
		return st, err
	}
	setHeld := func(held bool, node, reason, msg string) {
		if pi.Status.Held != held || (held && pi.Status.HeldNode != node) {
			st.changed = true
			pi.Status.Held = held
			if node != "" {
				pi.Status.HeldNode = node
			}
		}
		status := metav1.ConditionFalse
		if held {
			status = metav1.ConditionTrue
		}
		if meta.SetStatusCondition(&pi.Status.Conditions, metav1.Condition{Type: rbv1.ConditionHeld, Status: status,
			Reason: reason, Message: msg, ObservedGeneration: pi.Generation}) {
			st.changed = true
		}
	}
	if len(tenants) > 0 && !pi.Status.Superseded {
		// Its tenant pod has come: the placeholder gives way (the scheduler
		// preempts it for a pinned copy) and is never made again.
		pi.Status.Superseded = true
		st.changed = true
		r.Recorder.Eventf(pi, nil, corev1.EventTypeNormal, "Superseded", "Hold", "tenant pod %s/%s of the reservation appeared; the placeholder gives way to it",
			ns, tenants[0].Name)
	}
	if pi.Status.Superseded {
		bound := ""
		for _, p := range tenants {
			if p.Spec.NodeName != "" {
				bound = p.Spec.NodeName
			}
		}
		// A placeholder the scheduler has not preempted (the tenant pod runs
		// elsewhere, unpinned) would hold the capacity twice: remove it.
		if placeholder != nil && bound != "" && placeholder.DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, placeholder); client.IgnoreNotFound(err) != nil {
				return st, err
			}
			logger.V(1).Info("placeholder removed: its tenant pod is bound", "node", bound)
		}
		if bound != "" {
			setHeld(false, "", "TenantPodBound", "tenant pod bound to "+bound+"; the placeholder gave way")
		}
		if placeholder == nil {
			recheck, err := r.requeueStuckCopies(ctx, pi, tenants)
			if err != nil {
				return st, err
			}
			st.recheck = recheck
		}
		return st, nil
	}
	if placeholder == nil || !placeholder.DeletionTimestamp.IsZero() {
		if placeholder == nil {
			want := NewPlaceholder(pi, ns, r.PlaceholderImage)
			want.Annotations[placeholderMadeAnnotation] = time.Now().Format(time.RFC3339Nano)
			if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
				setHeld(false, "", "PlaceholderFailed", err.Error())
				r.Recorder.Eventf(pi, nil, corev1.EventTypeWarning, "PlaceholderFailed", "Hold", "placeholder pod %s/%s: %v", ns, want.Name, err)
				return st, err
			}
			logger.V(1).Info("placeholder created", "pod", ns+"/"+want.Name, "preferredNode", pi.Spec.Node)
		}
		if pi.Status.Held {
			setHeld(false, "", "PlaceholderGone", "the placeholder pod was removed; a new one waits for a node")
		}
		return st, nil
	}
	if placeholder.Spec.NodeName == "" {
		if !pi.Status.Held && meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionHeld) == nil {
			setHeld(false, "", "Pending", "the placeholder pod waits for a node")
		}
		return st, nil
	}
	node := placeholder.Spec.NodeName
	if !pi.Status.Held || pi.Status.HeldNode != node {
		r.Recorder.Eventf(pi, nil, corev1.EventTypeNormal, "Held", "Hold", "placeholder pod %s/%s holds the capacity on node %s", ns, placeholder.Name, node)
	}
	setHeld(true, node, "PlaceholderBound", "placeholder pod "+placeholder.Name+" bound to node "+node)
	return st, nil
}
