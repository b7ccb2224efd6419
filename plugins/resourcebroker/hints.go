package resourcebroker

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// EventsToRegister returns the cluster events that may make a pod rejected
// by this plugin schedulable, each with a queueing hint:
//   - any change of a Reservation (the scheduler watches the CRD through its
//     dynamic informer, by the resource string ReservationEventResource):
//     the pod's own reservation naming its virtual node while Reserved or
//     Active (see reservationChangeMatters), failing, ending or being
//     deleted, or, for a pod held back by the per-namespace limit, another
//     reservation of its namespace ending;
//   - a Node added or changed (taints, labels, allocatable): the virtual
//     node the pod's reservation names (added, or grown), a node whose taints
//     the pod now tolerates (this plugin does TaintToleration's filtering in
//     the rb-scheduler profile, so it also carries that plugin's hint), or a
//     local node that grew and may now have room for the pod;
//   - a pod deleted or scaled down on a local node: room may have appeared
//     (a pod waiting for its reservation is kept off the local nodes by this
//     plugin's PreFilter while none has room, so NodeResourcesFit's hint
//     does not apply to it); a pod bound with its reservation, for a pod
//     held back by the per-namespace limit.
//
// A virtual node growing for other pods' reservations does not requeue a
// pod whose own reservation it does not name yet: in a burst, every
// reservation made Active resizes the node, and requeueing every waiting pod
// on each of them would make the scheduler retry each pod once per resize.
func (pl *ResourceBroker) EventsToRegister(_ context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: ReservationEventResource, ActionType: fwk.Add | fwk.Update | fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterReservationChange},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeTaint | fwk.UpdateNodeLabel | fwk.UpdateNodeAllocatable}, QueueingHintFn: pl.isSchedulableAfterNodeChange},
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Add | fwk.Delete | fwk.UpdatePodScaleDown}, QueueingHintFn: pl.isSchedulableAfterPodChange},
	}, nil
}

// isSchedulableAfterReservationChange is the hint for Reservation events.
// It reads only the event's objects. The scheduler calls it for every
// waiting pod of the profile with the same objects, so their conversion from
// unstructured is made once per event (see conversions).
func (pl *ResourceBroker) isSchedulableAfterReservationChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	if ns, ok := eventNamespace(newObj, oldObj); ok && ns != pod.Namespace {
		return fwk.QueueSkip, nil
	}
	var old, r *brokerv1alpha1.Reservation
	if oldObj != nil {
		if old = pl.conv.reservation(oldObj); old == nil {
			return fwk.Queue, fmt.Errorf("unexpected object %T in a Reservation event", oldObj)
		}
	}
	if newObj != nil {
		if r = pl.conv.reservation(newObj); r == nil {
			return fwk.Queue, fmt.Errorf("unexpected object %T in a Reservation event", newObj)
		}
	}
	deleted := r == nil
	if deleted {
		r = old
	}
	if r == nil || r.Namespace != pod.Namespace {
		return fwk.QueueSkip, nil
	}
	if reservationIsFor(r, pod) {
		if deleted || reservationChangeMatters(old, r) {
			// The scheduler's informer may be ahead of the plugin's: make the
			// attempt this hint triggers read this version.
			pl.rsvs.observe(r, deleted)
			logger.V(5).Info("The pod's reservation changed", "pod", klog.KObj(pod), "reservation", klog.KObj(r), "phase", r.Status.Phase, "deleted", deleted)
			return fwk.Queue, nil
		}
		return fwk.QueueSkip, nil
	}
	if pl.isBlocked(pod) && (deleted || (old != nil && !ended(old) && ended(r))) {
		pl.rsvs.observe(r, deleted)
		logger.V(5).Info("A reservation of the namespace ended; the pod may ask for one", "pod", klog.KObj(pod), "reservation", klog.KObj(r))
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// reservationIsFor: the pod controls r, or r was made by hand for its name.
func reservationIsFor(r *brokerv1alpha1.Reservation, pod *v1.Pod) bool {
	if uid := ownerPodUID(r); uid != "" {
		return uid == pod.UID
	}
	return r.Spec.PodName == pod.Name
}

// isSchedulableAfterNodeChange is the hint for Node events.
func (pl *ResourceBroker) isSchedulableAfterNodeChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	oldNode, node, err := schedutil.As[*v1.Node](oldObj, newObj)
	if err != nil {
		return fwk.Queue, err
	}
	if provider, virtual := virtualNodeProvider(node); virtual {
		if rsv := pl.rsvs.forPod(pod); virtualNodeServes(rsv, provider, node.Name) {
			logger.V(5).Info("The virtual node of the pod's reservation was added or changed", "pod", klog.KObj(pod), "node", klog.KObj(node))
			return fwk.Queue, nil
		}
		return fwk.QueueSkip, nil
	}
	if aff := requiredAffinity(pod); aff != nil {
		if ok, _ := aff.Match(node); !ok {
			return fwk.QueueSkip, nil // a node the pod may not go to (NodeAffinity has its own hint)
		}
	}
	wasUntolerated := true
	if oldNode != nil {
		_, wasUntolerated = untoleratedTaint(logger, oldNode, pod, pl.comparisonOperators)
	}
	_, isUntolerated := untoleratedTaint(logger, node, pod, pl.comparisonOperators)
	if wasUntolerated && !isUntolerated {
		return fwk.Queue, nil
	}
	if oldNode != nil && !isUntolerated && grown(oldNode.Status.Allocatable, node.Status.Allocatable) &&
		fitsAllocatable(PodRequests(pod), node.Status.Allocatable) {
		logger.V(5).Info("A local node grew and may have room for the pod", "pod", klog.KObj(pod), "node", klog.KObj(node))
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// virtualNodeServes: a change of node (a virtual node of provider) may let
// the pod with reservation rsv be placed there: rsv is usable on that
// provider and names the node in status.virtualNode (the bridges name it
// once the node can take the reservation's pods).
func virtualNodeServes(rsv *brokerv1alpha1.Reservation, provider, node string) bool {
	return usable(rsv) && provider != "" && rsv.Status.Provider == provider && rsv.Status.VirtualNode == node
}

// isSchedulableAfterPodChange is the hint for pods deleted or scaled down
// (room may have appeared on a local node), and for pods bound (Add of an
// assigned pod: for a pod held back by the per-namespace limit, a bound pod
// of its namespace with a reservation no longer counts against it).
func (pl *ResourceBroker) isSchedulableAfterPodChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	gone, added, err := schedutil.As[*v1.Pod](oldObj, newObj)
	if err != nil {
		return fwk.Queue, err
	}
	if gone == nil && added != nil {
		if added.Namespace == pod.Namespace && added.Spec.NodeName != "" && pl.isBlocked(pod) && pl.rsvs.forPod(added) != nil {
			logger.V(5).Info("A pod of the namespace was bound with its reservation; the pod may ask for one", "pod", klog.KObj(pod), "bound", klog.KObj(added))
			return fwk.Queue, nil
		}
		return fwk.QueueSkip, nil
	}
	if gone == nil || gone.Spec.NodeName == "" || gone.UID == pod.UID || pl.nodes.isVirtual(gone.Spec.NodeName) {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("A pod on a local node went away or shrank", "pod", klog.KObj(pod), "other", klog.KObj(gone), "node", gone.Spec.NodeName)
	return fwk.Queue, nil
}

// grown: some quantity of b is larger than in a.
func grown(a, b v1.ResourceList) bool {
	for name, q := range b {
		if old, ok := a[name]; !ok || q.Cmp(old) > 0 {
			return true
		}
	}
	return false
}

// fitsAllocatable: requests fit in an empty node of that allocatable.
func fitsAllocatable(requests, alloc v1.ResourceList) bool {
	for name, q := range requests {
		if q.Sign() <= 0 {
			continue
		}
		a, ok := alloc[name]
		if !ok || q.Cmp(a) > 0 {
			return false
		}
	}
	return true
}

// eventNamespace is the namespace of a Reservation event's object, read
// without converting it.
func eventNamespace(objs ...any) (string, bool) {
	for _, o := range objs {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		switch m := o.(type) {
		case *unstructured.Unstructured:
			return m.GetNamespace(), true
		case *brokerv1alpha1.Reservation:
			return m.Namespace, true
		}
	}
	return "", false
}

// conversions remembers the typed form of the last few unstructured
// Reservations the scheduler's informer handed to the hint: one event is
// hinted for every waiting pod, and converting it each time (reflection over
// the whole object) would cost, in a burst of a hundred waiting pods, a
// hundred conversions per event.
type conversions struct {
	mu      sync.Mutex
	entries [4]struct {
		u *unstructured.Unstructured
		r *brokerv1alpha1.Reservation
	}
	next int
}

func (c *conversions) reservation(obj any) *brokerv1alpha1.Reservation {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return toReservation(obj)
	}
	c.mu.Lock()
	for _, e := range c.entries {
		if e.u == u {
			c.mu.Unlock()
			return e.r
		}
	}
	c.mu.Unlock()
	r := toReservation(u)
	if r == nil {
		return nil
	}
	c.mu.Lock()
	c.entries[c.next].u, c.entries[c.next].r = u, r
	c.next = (c.next + 1) % len(c.entries)
	c.mu.Unlock()
	return r
}
