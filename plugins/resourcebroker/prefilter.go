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

// stateData is what PreFilter found out about a pod it may offload. It is
// never changed after PreFilter, so Clone shares it.
type stateData struct {
	// rsv is the pod's reservation (nil: none, or the pod may not be offloaded).
	rsv      *brokerv1alpha1.Reservation
	usable   bool
	requests v1.ResourceList
	// verdict, when PreFilter made it, is whether the pod may be offloaded
	// (rules 1 to 3 of eligibility.go) and to which providers.
	verdict *verdict
	// short: no local node has room, and one would take the pod but for
	// resources (rule 4): PreFilter ended the attempt, PostFilter asks the broker.
	short bool
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

// verdictFor is whether pod may be offloaded: PreFilter's verdict when it
// made one, else made now.
func (pl *ResourceBroker) verdictFor(s *stateData, pod *v1.Pod) verdict {
	if s != nil && s.verdict != nil {
		return *s.verdict
	}
	return pl.offloadVerdict(pod)
}

// PreFilter looks the pod's reservation up in the informer cache (no API
// call) and decides which nodes the pod may go to:
//
//   - a pod it may offload (see eligibility.go) that no local node has room
//     for (see localRoom), when some local node would take it but for
//     resources and preemption cannot make room either (mightPreempt), is
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
//   - any other pod is left to the other plugins (the filters then say why
//     no node takes it, which PostFilter reads), and when no node is tainted
//     or virtual the plugin's Filter is skipped altogether.
//
// A pod the bridge cannot carry does not use a reservation either (one made
// by hand for it, say): it is treated as a pod without one.
func (pl *ResourceBroker) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if !pl.eligible(pod) {
		return pl.preFilterPlain(nodes)
	}
	s := &stateData{requests: PodRequests(pod)}
	decide := func() verdict {
		if s.verdict == nil {
			v := pl.offloadVerdict(pod)
			s.verdict = &v
		}
		return *s.verdict
	}
	if rsv := pl.rsvs.forPod(pod); rsv != nil && decide().reason == "" {
		s.rsv, s.usable = rsv, usable(rsv)
		state.Write(stateKey, s)
		if vn := rsv.Status.VirtualNode; s.usable && vn != "" {
			if _, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(vn); err == nil {
				return &fwk.PreFilterResult{NodeNames: sets.New(vn)}, nil
			}
			klog.FromContext(ctx).V(4).Info("Reservation usable but its virtual node is not there yet", "pod", klog.KObj(pod),
				"reservation", klog.KObj(rsv), "provider", rsv.Status.Provider, "virtualNode", vn)
		}
	}
	if room, short := pl.localRoom(klog.FromContext(ctx), pod, s.requests, nodes); !room && !mightPreempt(pod, nodes) {
		if s.rsv != nil {
			return &fwk.PreFilterResult{NodeNames: sets.New[string]()}, nil
		}
		if short && decide().reason == "" {
			s.short = true
			state.Write(stateKey, s)
			return &fwk.PreFilterResult{NodeNames: sets.New[string]()}, nil
		}
	}
	if s.rsv == nil {
		if s.verdict != nil {
			state.Write(stateKey, s) // for PostFilter
		}
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

// localRoom tells whether some local node has room for the pod: admits it
// (schedulability, taints, node affinity) and has the resources for it (the
// other filters still run when one does); and whether some local node
// admits it, room or not.
func (pl *ResourceBroker) localRoom(logger klog.Logger, pod *v1.Pod, requests v1.ResourceList, nodes []fwk.NodeInfo) (room, admitted bool) {
	aff := requiredAffinity(pod)
	for _, ni := range nodes {
		n := ni.Node()
		if _, virtual := virtualNodeProvider(n); virtual || !pl.admits(logger, pod, aff, n) {
			continue
		}
		if fitsResources(requests, ni) {
			return true, true
		}
		admitted = true
	}
	return false, admitted
}

// fitsResources: what NodeResourcesFit counts (the requests of the pods on
// the node, assumed ones included, and the pod count) leaves room for requests.
func fitsResources(requests v1.ResourceList, ni fwk.NodeInfo) bool {
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
