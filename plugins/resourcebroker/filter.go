package resourcebroker

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Filter admits a pod to one of our virtual nodes only when its reservation
// is usable, targets that node's provider, names that node and has enough
// left for it; on
// every node it applies TaintToleration's rule to all taints but
// VirtualNodeTaint (the rb-scheduler profile disables TaintToleration's
// filter, see README.md).
func (pl *ResourceBroker) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	node := nodeInfo.Node()
	if provider, ok := virtualNodeProvider(node); ok {
		s := readState(state)
		if s == nil || s.rsv == nil || !s.usable || s.rsv.Status.Provider == "" || s.rsv.Status.Provider != provider ||
			s.rsv.Status.VirtualNode != node.Name {
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, ErrReasonVirtualNode)
		}
		if ok, name := fitsReservation(s.requests, s.rsv.Spec.Resources, pl.usedOf(s.rsv, pod, nodeInfo)); !ok {
			return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf(errReasonReservationFormat, name))
		}
	}
	if taint, ok := untoleratedTaint(klog.FromContext(ctx), node, pod, pl.comparisonOperators); ok {
		klog.FromContext(ctx).V(4).Info("node had untolerated taints", "node", klog.KObj(node), "pod", klog.KObj(pod), "untoleratedTaint", taint)
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, ErrReasonUntoleratedTaint)
	}
	return nil
}

// usedOf sums the requests of the other pods placed with rsv: those reserved
// in this scheduler (claims) and those already on the node (after a
// restart, claims are empty but the pods are there).
func (pl *ResourceBroker) usedOf(rsv *brokerv1alpha1.Reservation, pod *v1.Pod, nodeInfo fwk.NodeInfo) v1.ResourceList {
	used := v1.ResourceList{}
	add := func(l v1.ResourceList) {
		for k, q := range l {
			sum := used[k]
			sum.Add(q)
			used[k] = sum
		}
	}
	counted := sets.New(pod.UID)
	pl.mu.Lock()
	for uid, c := range pl.claims {
		if c.rsvUID == rsv.UID && !c.local && !counted.Has(uid) {
			counted.Insert(uid)
			add(c.requests)
		}
	}
	pl.mu.Unlock()
	for _, pi := range nodeInfo.GetPods() {
		p := pi.GetPod()
		if counted.Has(p.UID) {
			continue
		}
		if r := pl.rsvs.forPod(p); r != nil && r.UID == rsv.UID {
			counted.Insert(p.UID)
			add(PodRequests(p))
		}
	}
	return used
}

// SignPod lets the scheduler batch pods without a reservation (their Filter
// result depends on their tolerations only); a pod with one is not batched.
func (pl *ResourceBroker) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if pl.eligible(pod) && pl.rsvs.forPod(pod) != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pod has a broker reservation")
	}
	return []fwk.SignFragment{
		{Key: fwk.TolerationsSignerName, Value: fwk.TolerationsSigner(pod)},
		{Key: "broker.fluidos.eu/Reservation", Value: pod.Annotations[OffloadAnnotation]},
	}, nil
}
