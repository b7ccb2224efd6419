package resourcebroker

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// EventsToRegister returns the cluster events that may make a pod rejected
// by this plugin schedulable, each with a queueing hint:
//   - any change of a Reservation (the scheduler watches the CRD through its
//     dynamic informer, by the resource string ReservationEventResource):
//     the pod's own reservation turning Reserved, Active, Failed, ended or
//     deleted, or, for a pod held back by the per-namespace limit, another
//     reservation of its namespace ending;
//   - a Node added or changed (taints, labels, allocatable): a virtual node
//     of the provider the pod's reservation targets, or a node whose taints
//     the pod now tolerates (this plugin does TaintToleration's filtering
//     in the rb-scheduler profile, so it also carries that plugin's hint).
func (pl *ResourceBroker) EventsToRegister(_ context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: ReservationEventResource, ActionType: fwk.Add | fwk.Update | fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterReservationChange},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeTaint | fwk.UpdateNodeLabel | fwk.UpdateNodeAllocatable}, QueueingHintFn: pl.isSchedulableAfterNodeChange},
	}, nil
}

// isSchedulableAfterReservationChange is the hint for Reservation events.
// It reads only the event's objects.
func (pl *ResourceBroker) isSchedulableAfterReservationChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	var old, r *brokerv1alpha1.Reservation
	if oldObj != nil {
		if old = toReservation(oldObj); old == nil {
			return fwk.Queue, fmt.Errorf("unexpected object %T in a Reservation event", oldObj)
		}
	}
	if newObj != nil {
		if r = toReservation(newObj); r == nil {
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
		if rsv := pl.rsvs.forPod(pod); usable(rsv) && rsv.Status.Provider == provider && provider != "" &&
			(rsv.Status.VirtualNode == "" || rsv.Status.VirtualNode == node.Name) {
			logger.V(5).Info("The virtual node of the pod's provider was added or changed", "pod", klog.KObj(pod), "node", klog.KObj(node))
			return fwk.Queue, nil
		}
		return fwk.QueueSkip, nil
	}
	wasUntolerated := true
	if oldNode != nil {
		_, wasUntolerated = untoleratedTaint(logger, oldNode, pod, pl.comparisonOperators)
	}
	if _, isUntolerated := untoleratedTaint(logger, node, pod, pl.comparisonOperators); wasUntolerated && !isUntolerated {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}
