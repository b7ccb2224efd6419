package resourcebroker

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// PostFilter runs when no node fits (and DefaultPreemption did not help).
// A pod that may not be offloaded (see eligibility.go) is told why, in its
// condition and in an Event. For one that may, with a reservation, it
// reports where that reservation stands (a Failed one's reason and message
// included); without one, when some local node rejected it for lack of
// resources only, it queues the creation of one (the API call is made by a
// worker, never here) and reports "waiting for broker reservation <name>".
func (pl *ResourceBroker) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s := readState(state)
	v := pl.verdictFor(s, pod)
	if v.reason != "" {
		return nil, pl.notOffloaded(pod, v.reason)
	}
	if rsv := pl.rsvs.forPod(pod); rsv != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, pl.describe(ctx, pod, rsv))
	}
	if o, ok := pl.worker.creating(pod.UID); ok {
		return nil, fwk.NewStatus(fwk.Unschedulable, "waiting for broker reservation "+o.name)
	}
	if (s == nil || !s.short) && !pl.shortOfResources(klog.FromContext(ctx), pod, statuses) {
		return nil, pl.notOffloaded(pod, reasonNoShortage)
	}
	limit := int(pl.args.MaxOutstandingReservationsPerNamespace)
	if n := pl.outstanding(pod.Namespace) + pl.worker.inflightIn(pod.Namespace); n >= limit {
		pl.block(pod)
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf(
			"namespace %s has %d broker reservations outstanding, the most allowed (maxOutstandingReservationsPerNamespace)", pod.Namespace, n))
	}
	name := ReservationName(pod)
	if pl.worker.create(pod, name) {
		klog.FromContext(ctx).V(2).Info("No node fits; asking the broker", "pod", klog.KObj(pod), "reservation", name)
	}
	return nil, fwk.NewStatus(fwk.Unschedulable, "waiting for broker reservation "+name)
}

// outstanding counts the reservations of namespace ns that are still
// waiting: not ended, and their pod not bound yet (nor gone). A reservation
// whose pod runs on its virtual node is capacity in use, not a request in
// flight: the limit bounds how many pods of a namespace wait for the broker
// at once, not how many a namespace runs elsewhere, so a Deployment of any
// size gets all its pods placed, the limit's worth at a time.
func (pl *ResourceBroker) outstanding(ns string) int {
	n := 0
	for _, r := range pl.rsvs.byIndex(cache.NamespaceIndex, ns) {
		if !ended(r) && pl.podOf(r) != nil {
			n++
		}
	}
	return n
}

// describe says where the pod's reservation stands, for its PodScheduled
// condition; an ended reservation of its own is deleted so that the next
// attempt asks for a new one.
func (pl *ResourceBroker) describe(ctx context.Context, pod *v1.Pod, rsv *brokerv1alpha1.Reservation) string {
	switch {
	case rsv.DeletionTimestamp != nil:
		return fmt.Sprintf("waiting for broker reservation %s to be deleted", rsv.Name)
	case rsv.Status.Phase == brokerv1alpha1.ReservationFailed:
		// Final: the agent will not ask again (invalid, forbidden, conflict).
		msg := fmt.Sprintf("broker reservation %s failed", rsv.Name)
		if rsv.Status.Reason != "" {
			msg += " (" + rsv.Status.Reason + ")"
		}
		if rsv.Status.Message != "" {
			msg += ": " + rsv.Status.Message
		}
		return msg
	case rsv.Status.Phase == brokerv1alpha1.ReservationReleased || rsv.Status.Phase == brokerv1alpha1.ReservationExpired:
		if ownerPodUID(rsv) == pod.UID {
			klog.FromContext(ctx).V(2).Info("Reservation ended before use; replacing it", "pod", klog.KObj(pod), "reservation", klog.KObj(rsv), "phase", rsv.Status.Phase)
			pl.worker.delete(rsv.Namespace, rsv.Name, rsv.UID)
		}
		return fmt.Sprintf("broker reservation %s is %s; waiting for a new one", rsv.Name, strings.ToLower(string(rsv.Status.Phase)))
	case usable(rsv):
		vn := rsv.Status.VirtualNode
		if vn == "" {
			vn = "of provider " + rsv.Status.Provider
		}
		return fmt.Sprintf("waiting for broker reservation %s: %s on provider %s, virtual node %s does not admit the pod yet",
			rsv.Name, rsv.Status.Phase, rsv.Status.Provider, vn)
	default:
		if c := waitingCondition(rsv); c != nil {
			// Pending with Reserved=False: the broker refused it for now
			// (NoCapacity) and the agent keeps asking; say why.
			msg := fmt.Sprintf("waiting for broker reservation %s (%s)", rsv.Name, c.Reason)
			if c.Message != "" {
				msg += ": " + c.Message
			}
			return msg
		}
		return "waiting for broker reservation " + rsv.Name
	}
}
