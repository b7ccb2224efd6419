package resourcebroker

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// buildReservation is the worker's view of a create: the current pod (from
// the scheduler's informer), or nil when it is gone, replaced or bound.
func (pl *ResourceBroker) buildReservation(namespace, name string, uid types.UID) *unstructured.Unstructured {
	pod, err := pl.podLister.Pods(namespace).Get(name)
	if err != nil || pod.UID != uid || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil {
		return nil
	}
	v := pl.offloadVerdict(pod)
	if v.reason != "" {
		return nil // changed since PostFilter (e.g. annotated not to be offloaded)
	}
	rsv := newReservation(pod, pl.args, v.selector)
	if len(rsv.Spec.ProviderPreferences) == 0 {
		prefs, err := pl.namespacePreferences(pod.Namespace)
		if err != nil {
			pl.handle.EventRecorder().Eventf(pod, nil, v1.EventTypeWarning, "ProviderPreferencesIgnored", "Create",
				"The namespace's provider preferences are ignored: %v", err)
		}
		rsv.Spec.ProviderPreferences = prefs
	}
	if rsv.Spec.Group, err = pl.podGroup(pod); err != nil {
		// The pod is tried again when its PodGroup appears (Coscheduling's queueing hint).
		pl.handle.EventRecorder().Eventf(pod, nil, v1.EventTypeWarning, "BrokerReservationFailed", "Create",
			"Could not create broker reservation %s: %v", rsv.Name, err)
		return nil
	}
	rsv.Spec.Spread = spreadOf(pod)
	u, err := toUnstructured(rsv)
	if err != nil {
		return nil
	}
	return u
}

// created follows up a create: when the cache already has the reservation
// the in-flight mark goes (otherwise the informer's Add does it); a create
// given up on is reported on the pod, which is retried after createRetryDelay.
func (pl *ResourceBroker) created(o op, err error) {
	pod, perr := pl.podLister.Pods(o.namespace).Get(o.podName)
	if perr != nil || pod.UID != o.uid {
		pl.worker.forget(o.uid)
		return
	}
	if err != nil {
		pl.handle.EventRecorder().Eventf(pod, nil, v1.EventTypeWarning, "BrokerReservationFailed", "Create",
			"Could not create broker reservation %s: %v", o.name, err)
		// Try again later rather than at once: an error that outlived the
		// worker's retries is unlikely to clear in the next millisecond.
		time.AfterFunc(createRetryDelay, func() { pl.activate(pod) })
		return
	}
	if pl.rsvs.forPod(pod) != nil {
		pl.worker.forget(o.uid)
	}
}

func (pl *ResourceBroker) block(pod *v1.Pod) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.blocked[pod.Namespace] == nil {
		pl.blocked[pod.Namespace] = sets.New[types.UID]()
	}
	pl.blocked[pod.Namespace].Insert(pod.UID)
}

func (pl *ResourceBroker) hasBlocked(ns string) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.blocked[ns].Len() > 0
}

func (pl *ResourceBroker) isBlocked(pod *v1.Pod) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.blocked[pod.Namespace].Has(pod.UID)
}

func (pl *ResourceBroker) forgetPod(pod *v1.Pod) {
	pl.worker.forget(pod.UID)
	pl.mu.Lock()
	defer pl.mu.Unlock()
	delete(pl.claims, pod.UID)
	delete(pl.told, pod.UID)
	if s := pl.blocked[pod.Namespace]; s != nil {
		s.Delete(pod.UID)
		if s.Len() == 0 {
			delete(pl.blocked, pod.Namespace)
		}
	}
}

// activate moves pods to the active queue at once (no back-off). It is
// called from this plugin's own informers, after their caches hold the
// change, so the attempt it triggers reads fresh data; the queueing hints
// (EventsToRegister) react to the same changes through the scheduler's
// informers, which may run a little ahead of this plugin's cache.
func (pl *ResourceBroker) activate(pods ...*v1.Pod) {
	m := make(map[string]*v1.Pod, len(pods))
	for _, p := range pods {
		if p != nil && p.Spec.NodeName == "" {
			m[p.Namespace+"/"+p.Name] = p
		}
	}
	if len(m) > 0 {
		pl.handle.Activate(klog.Background(), m)
	}
}

// podOf is the unbound pod a reservation is for, if it is in the cache.
func (pl *ResourceBroker) podOf(r *brokerv1alpha1.Reservation) *v1.Pod {
	if r == nil {
		return nil
	}
	var name string
	uid := ownerPodUID(r)
	switch {
	case uid != "":
		name = metav1.GetControllerOfNoCopy(r).Name
	case r.Spec.PodName != "" && metav1.GetControllerOfNoCopy(r) == nil:
		name = r.Spec.PodName
	default:
		return nil
	}
	pod, err := pl.podLister.Pods(r.Namespace).Get(name)
	if err != nil || (uid != "" && pod.UID != uid) || pod.Spec.NodeName != "" {
		return nil
	}
	return pod
}

// onReservation reacts to a Reservation added or changed in the cache: a
// change that matters (see reservationChangeMatters) retries its pod from
// this cache, so the attempt reads what the hint saw even when the
// scheduler's own informer ran ahead of this one. The attempt that opened
// the reservation already made this plugin the pod's rejector (PreFilter
// narrowed it to no node), so the queueing hints apply too.
func (pl *ResourceBroker) onReservation(ctx context.Context, old, r *brokerv1alpha1.Reservation) {
	if r == nil {
		return
	}
	pl.rsvs.caughtUp(r, false)
	if uid := ownerPodUID(r); uid != "" {
		pl.worker.forget(uid)
	}
	pod := pl.podOf(r)
	if pod != nil && pl.retryOnChanges() && reservationChangeMatters(old, r) {
		klog.FromContext(ctx).V(4).Info("Reservation added or changed; retrying its pod", "reservation", klog.KObj(r), "phase", r.Status.Phase, "pod", klog.KObj(pod))
		pl.activate(pod)
	}
	if old != nil && !ended(old) && ended(r) && pl.retryOnChanges() {
		pl.activateBlocked(r.Namespace)
	}
}

func (pl *ResourceBroker) onReservationDelete(_ context.Context, r *brokerv1alpha1.Reservation) {
	if r == nil {
		return
	}
	pl.rsvs.caughtUp(r, true)
	if uid := ownerPodUID(r); uid != "" {
		pl.worker.forget(uid)
	}
	if pl.retryOnChanges() {
		pl.activate(pl.podOf(r))
		pl.activateBlocked(r.Namespace)
	}
}

func (pl *ResourceBroker) activateBlocked(ns string) {
	pl.mu.Lock()
	uids := pl.blocked[ns]
	delete(pl.blocked, ns)
	pl.mu.Unlock()
	if uids.Len() == 0 {
		return
	}
	pods, err := pl.podLister.Pods(ns).List(labels.Everything())
	if err != nil {
		return
	}
	var todo []*v1.Pod
	for _, p := range pods {
		if uids.Has(p.UID) {
			todo = append(todo, p)
		}
	}
	pl.activate(todo...)
}

// reservationChangeMatters: a change after which the pod must be tried
// again: its reservation can now be placed (it is usable and names its
// virtual node, see placeable), or will never be (it failed, expired, was
// released or is being deleted), or it waits for a new reason (Pending with
// Reserved=False, see waitingReasonChanged: the pod's condition then says
// why). Reserved or Active without a virtual node
// is no news for the scheduler: an attempt then could only fail again, and
// in a burst each such attempt costs a status update and an event of the
// pod; the bridge names the node once it can take the pod.
func reservationChangeMatters(old, r *brokerv1alpha1.Reservation) bool {
	switch {
	case old == nil:
		return placeable(r) || ended(r) || waitingCondition(r) != nil
	case ended(r):
		return !ended(old) || old.Status.Phase != r.Status.Phase
	case placeable(r):
		return !placeable(old) || old.Status.VirtualNode != r.Status.VirtualNode || old.Status.Provider != r.Status.Provider
	}
	return waitingReasonChanged(old, r)
}

// waitingReasonChanged: r is Pending with Reserved=False and its reason is
// new (the broker refused it for now, or for another reason): one more
// attempt reports it in the pod's condition. The agent rewrites status on
// every retry (every 2s while the broker lacks capacity): an unchanged
// reason, or only a new message, requeues nothing.
func waitingReasonChanged(old, r *brokerv1alpha1.Reservation) bool {
	c := waitingCondition(r)
	if c == nil {
		return false
	}
	before := waitingCondition(old)
	return before == nil || before.Reason != c.Reason
}

// placeable: r is usable and names the virtual node its pods go to.
func placeable(r *brokerv1alpha1.Reservation) bool {
	return usable(r) && r.Status.VirtualNode != ""
}

// onNode keeps the node tracker current and, when a virtual node appears or
// changes, retries the pods whose usable reservation names it (see
// virtualNodeServes). Pods of other reservations of the provider are left
// alone: the node grows once per reservation made Active, and retrying them
// all on every resize would cost one scheduling attempt per pod and resize.
func (pl *ResourceBroker) onNode(ctx context.Context, oldObj, obj any) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	pl.nodes.set(node)
	provider, virtual := virtualNodeProvider(node)
	if !virtual || provider == "" || !pl.retryOnChanges() {
		return
	}
	old, _ := oldObj.(*v1.Node)
	if old != nil && !virtualNodeChanged(old, node) {
		return
	}
	var pods []*v1.Pod
	for _, r := range pl.rsvs.byIndex(indexProvider, provider) {
		if !virtualNodeServes(r, provider, node.Name) {
			continue
		}
		if p := pl.podOf(r); p != nil {
			pods = append(pods, p)
		}
	}
	if len(pods) > 0 {
		klog.FromContext(ctx).V(4).Info("Virtual node changed; retrying the pods it serves", "node", klog.KObj(node), "provider", provider, "pods", len(pods))
		pl.activate(pods...)
	}
}

func virtualNodeChanged(old, n *v1.Node) bool {
	return old.Labels[brokerv1alpha1.ProviderLabel] != n.Labels[brokerv1alpha1.ProviderLabel] ||
		!equality.Semantic.DeepEqual(old.Status.Allocatable, n.Status.Allocatable) ||
		len(old.Spec.Taints) != len(n.Spec.Taints) ||
		old.Spec.Unschedulable != n.Spec.Unschedulable
}
