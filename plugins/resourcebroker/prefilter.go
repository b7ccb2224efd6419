package resourcebroker

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// stateData is what PreFilter found for a pod with a reservation. It is
// never changed after PreFilter, so Clone shares it.
type stateData struct {
	rsv      *brokerv1alpha1.Reservation
	usable   bool
	requests v1.ResourceList
}

func (s *stateData) Clone() fwk.StateData { return s }

func readState(state fwk.CycleState) *stateData {
	d, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*stateData)
	return s
}

// PreFilter looks the pod's reservation up in the informer cache (no API
// call) and decides which nodes the pod may go to:
//
//   - an eligible pod that no local node has room for (by requests, see
//     hasRoom), when preemption cannot make room either (mightPreempt), is
//     narrowed to no node at all: the attempt ends at once ("node(s) didn't
//     satisfy plugin ResourceBroker"), PostFilter opens its reservation or
//     says what it waits for, and this plugin is the pod's only rejector, so
//     that only its queueing hints requeue the pod: when its reservation can
//     be placed or ends, or local room appears (see EventsToRegister), not on
//     every change of every node, which in a burst of pods going to other
//     clusters would retry every waiting pod on every resize of a virtual
//     node;
//   - a pod whose reservation is Reserved or Active is narrowed to the
//     virtual node the reservation names in status.virtualNode, once that
//     node is in the snapshot: a bridge names the node once it can take the
//     reservation's pods (the virtual-kubelet bridge: once the node's
//     capacity counts the reservation);
//   - any other pod with a reservation is narrowed to the local nodes, so
//     that a pod that becomes schedulable locally (or can preempt there)
//     lands there;
//   - a pod without one is left to the other plugins, and when no node is
//     tainted or virtual the plugin's Filter is skipped altogether.
func (pl *ResourceBroker) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if !pl.eligible(pod) {
		return pl.preFilterPlain(nodes)
	}
	requests := PodRequests(pod)
	rsv := pl.rsvs.forPod(pod)
	if rsv != nil {
		state.Write(stateKey, &stateData{rsv: rsv, usable: usable(rsv), requests: requests})
		if vn := rsv.Status.VirtualNode; usable(rsv) && vn != "" {
			if _, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(vn); err == nil {
				return &fwk.PreFilterResult{NodeNames: sets.New(vn)}, nil
			}
			klog.FromContext(ctx).V(4).Info("Reservation usable but its virtual node is not there yet", "pod", klog.KObj(pod),
				"reservation", klog.KObj(rsv), "provider", rsv.Status.Provider, "virtualNode", vn)
		}
	}
	if !pl.anyRoom(ctx, pod, requests, nodes) && !mightPreempt(pod, nodes) {
		return &fwk.PreFilterResult{NodeNames: sets.New[string]()}, nil
	}
	if rsv == nil {
		return pl.preFilterPlain(nodes)
	}
	local := sets.New[string]()
	for _, ni := range nodes {
		if _, virtual := virtualNodeProvider(ni.Node()); !virtual {
			local.Insert(ni.Node().Name)
		}
	}
	return &fwk.PreFilterResult{NodeNames: local}, nil
}

// preFilterPlain is PreFilter for a pod without a reservation: its Filter
// (TaintToleration's rule, and no virtual node) is skipped when no node is
// tainted or virtual. The tracker is fed by its own listener on the node
// informer and may lag behind the snapshot this cycle reads (a virtual node
// just added): skip only when the snapshot agrees, or a pod without a
// reservation could land on a virtual node whose taint nobody checked.
func (pl *ResourceBroker) preFilterPlain(nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if pl.nodes.plain() && plainNodes(nodes) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return nil, nil
}

// mightPreempt: DefaultPreemption could make room for the pod on a local
// node: it may preempt, and some local node runs a pod of lower priority.
func mightPreempt(pod *v1.Pod, nodes []fwk.NodeInfo) bool {
	if p := pod.Spec.PreemptionPolicy; p != nil && *p == v1.PreemptNever {
		return false
	}
	prio := corev1helpers.PodPriority(pod)
	for _, ni := range nodes {
		if _, virtual := virtualNodeProvider(ni.Node()); virtual {
			continue
		}
		for _, pi := range ni.GetPods() {
			if corev1helpers.PodPriority(pi.GetPod()) < prio {
				return true
			}
		}
	}
	return false
}

// anyRoom: some local node has room for the pod (see hasRoom).
func (pl *ResourceBroker) anyRoom(ctx context.Context, pod *v1.Pod, requests v1.ResourceList, nodes []fwk.NodeInfo) bool {
	logger := klog.FromContext(ctx)
	for _, ni := range nodes {
		if _, virtual := virtualNodeProvider(ni.Node()); !virtual && pl.hasRoom(logger, pod, requests, ni) {
			return true
		}
	}
	return false
}

// hasRoom: node ni may take the pod as far as resources (what
// NodeResourcesFit counts: the requests of the pods on it, assumed ones
// included, and the pod count), schedulability and taints go; the other
// filters still run when it does.
func (pl *ResourceBroker) hasRoom(logger klog.Logger, pod *v1.Pod, requests v1.ResourceList, ni fwk.NodeInfo) bool {
	n := ni.Node()
	if n.Spec.Unschedulable {
		return false
	}
	if _, untolerated := untoleratedTaint(logger, n, pod, pl.comparisonOperators); untolerated {
		return false
	}
	alloc, used := ni.GetAllocatable(), ni.GetRequested()
	if len(ni.GetPods())+1 > alloc.GetAllowedPodNumber() {
		return false
	}
	for name, q := range requests {
		var want, free int64
		switch name {
		case v1.ResourceCPU:
			want, free = q.MilliValue(), alloc.GetMilliCPU()-used.GetMilliCPU()
		case v1.ResourceMemory:
			want, free = q.Value(), alloc.GetMemory()-used.GetMemory()
		case v1.ResourceEphemeralStorage:
			want, free = q.Value(), alloc.GetEphemeralStorage()-used.GetEphemeralStorage()
		default:
			want, free = q.Value(), alloc.GetScalarResources()[name]-used.GetScalarResources()[name]
		}
		if want > 0 && want > free {
			return false
		}
	}
	return true
}

// plainNodes: none of nodes is one of our virtual nodes or carries a taint
// the Filter enforces.
func plainNodes(nodes []fwk.NodeInfo) bool {
	for _, ni := range nodes {
		n := ni.Node()
		if n == nil {
			continue
		}
		for i := range n.Spec.Taints {
			if hardTaint(&n.Spec.Taints[i]) || n.Spec.Taints[i].Key == brokerv1alpha1.VirtualNodeTaint {
				return false
			}
		}
		if _, ok := n.Labels[brokerv1alpha1.ProviderLabel]; ok {
			return false
		}
	}
	return true
}

// PreFilterExtensions returns none: the filter does not depend on other
// pods' placement except through the reservation's own accounting.
func (pl *ResourceBroker) PreFilterExtensions() fwk.PreFilterExtensions { return nil }
