// Package resourcebroker is the ResourceBroker scheduler plugin: a pod of
// the rb-scheduler profile that fits no local node gets a broker
// Reservation (owned by the pod) and is bound to the provider's virtual node
// once the broker has reserved capacity there. A pod that fits locally is
// scheduled exactly as by the default profile. See README.md beside this
// file.
package resourcebroker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Name is the name of the plugin used in the plugin registry and in configurations.
const Name = "ResourceBroker"

// Unschedulable reasons; they are aggregated per node in the pod's
// PodScheduled condition, so they do not name the node.
const (
	ErrReasonVirtualNode       = "node(s) were broker virtual nodes not reserved for the pod"
	ErrReasonUntoleratedTaint  = "node(s) had untolerated taint(s)"
	errReasonReservationFormat = "node(s) had too little %s left in the pod's broker reservation"
)

// activateOnChanges: the plugin's own informers move a pod to the active
// queue when its reservation or its virtual node changes in a way that
// matters (tests turn it off to check that the queueing hints alone requeue
// the pod).
var activateOnChanges atomic.Bool

func init() { activateOnChanges.Store(true) }

// createRetryDelay: how long after giving up on a create the pod is retried.
const createRetryDelay = 30 * time.Second

// cacheSyncTimeout bounds the wait for the first list of Reservations at start-up.
var cacheSyncTimeout = time.Minute

const stateKey fwk.StateKey = Name

var (
	_ fwk.PreFilterPlugin   = &ResourceBroker{}
	_ fwk.FilterPlugin      = &ResourceBroker{}
	_ fwk.PostFilterPlugin  = &ResourceBroker{}
	_ fwk.ReservePlugin     = &ResourceBroker{}
	_ fwk.PostBindPlugin    = &ResourceBroker{}
	_ fwk.EnqueueExtensions = &ResourceBroker{}
	_ fwk.SignPlugin        = &ResourceBroker{}
)

// ResourceBroker is the plugin.
type ResourceBroker struct {
	handle   fwk.Handle
	args     *ResourceBrokerArgs
	selector labels.Selector
	excluded sets.Set[string]

	comparisonOperators bool // TaintTolerationComparisonOperators

	rsvs      *reservationCache
	conv      conversions // of the scheduler's Reservation events, for the hint
	nodes     *nodeTracker
	worker    *worker
	podLister corelisters.PodLister

	mu      sync.Mutex
	claims  map[types.UID]claim            // pod -> reservation it was reserved against (Reserve..Unreserve/deletion)
	blocked map[string]sets.Set[types.UID] // namespace -> pods held back by the per-namespace limit
}

// claim records, from Reserve on, which reservation a pod is placed with.
type claim struct {
	rsvUID    types.UID
	namespace string
	name      string
	requests  v1.ResourceList
	local     bool // placed on a local node: the reservation is released once the pod is bound
}

// New builds the plugin: decodes and checks the args (invalid args stop the
// scheduler), starts its Reservation informer and its API worker, and hooks
// into the scheduler's Node and Pod informers.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	logger := klog.FromContext(ctx).WithValues("plugin", Name)
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	selector := labels.Everything()
	if args.Selector != nil {
		if selector, err = metav1.LabelSelectorAsSelector(args.Selector); err != nil {
			return nil, err
		}
	}
	if h.KubeConfig() == nil {
		return nil, fmt.Errorf("%s: the scheduler handle has no kubeconfig", Name)
	}
	client, err := dynamic.NewForConfig(h.KubeConfig())
	if err != nil {
		return nil, err
	}
	rsvs, err := newReservationCache(client)
	if err != nil {
		return nil, err
	}
	pl := &ResourceBroker{
		handle:              h,
		args:                args,
		selector:            selector,
		excluded:            sets.New(args.ExcludedNamespaces...),
		comparisonOperators: utilfeature.DefaultFeatureGate.Enabled(features.TaintTolerationComparisonOperators),
		rsvs:                rsvs,
		nodes:               newNodeTracker(),
		worker:              newWorker(client),
		podLister:           h.SharedInformerFactory().Core().V1().Pods().Lister(),
		claims:              map[types.UID]claim{},
		blocked:             map[string]sets.Set[types.UID]{},
	}
	pl.worker.build = pl.buildReservation
	pl.worker.done = pl.created

	if _, err := rsvs.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { pl.onReservation(ctx, nil, toReservation(obj)) },
		UpdateFunc: func(old, obj any) { pl.onReservation(ctx, toReservation(old), toReservation(obj)) },
		DeleteFunc: func(obj any) { pl.onReservationDelete(ctx, toReservation(obj)) },
	}); err != nil {
		return nil, err
	}
	if _, err := h.SharedInformerFactory().Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { pl.onNode(ctx, nil, obj) },
		UpdateFunc: func(old, obj any) { pl.onNode(ctx, old, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*v1.Node); ok {
				pl.nodes.remove(n.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	if _, err := h.SharedInformerFactory().Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, obj any) {
			// A pod bound: its reservation, if it has one, no longer counts
			// against its namespace's limit.
			old, ok1 := oldObj.(*v1.Pod)
			p, ok2 := obj.(*v1.Pod)
			if ok1 && ok2 && old.Spec.NodeName == "" && p.Spec.NodeName != "" && activateOnChanges.Load() && pl.hasBlocked(p.Namespace) {
				pl.activateBlocked(p.Namespace)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*v1.Pod); ok {
				pl.forgetPod(p)
			}
		},
	}); err != nil {
		return nil, err
	}

	if err := rsvs.start(ctx, cacheSyncTimeout); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	pl.worker.run(klog.NewContext(ctx, logger))
	logger.V(2).Info("Plugin started", "selector", selector.String(), "reservationDuration", args.ReservationDuration.Duration,
		"maxOutstandingReservationsPerNamespace", *args.MaxOutstandingReservationsPerNamespace, "excludedNamespaces", args.ExcludedNamespaces)
	return pl, nil
}

// Name returns the name of the plugin.
func (pl *ResourceBroker) Name() string { return Name }

// eligible: the pod opted in (selector) and its namespace is not excluded.
func (pl *ResourceBroker) eligible(pod *v1.Pod) bool {
	return !pl.excluded.Has(pod.Namespace) && pl.selector.Matches(labels.Set(pod.Labels))
}

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
		if s == nil || !s.usable || s.rsv.Status.Provider == "" || s.rsv.Status.Provider != provider ||
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

// PostFilter runs when no node fits. For an eligible pod without a
// reservation it queues the creation of one (the API call is made by a
// worker, never here) and reports "waiting for broker reservation <name>";
// for a pod with one it reports where that reservation stands (a Failed
// one's reason and message included).
func (pl *ResourceBroker) PostFilter(ctx context.Context, _ fwk.CycleState, pod *v1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	if !pl.eligible(pod) {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	if rsv := pl.rsvs.forPod(pod); rsv != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, pl.describe(ctx, pod, rsv))
	}
	if o, ok := pl.worker.creating(pod.UID); ok {
		return nil, fwk.NewStatus(fwk.Unschedulable, "waiting for broker reservation "+o.name)
	}
	limit := int(*pl.args.MaxOutstandingReservationsPerNamespace)
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
		return "waiting for broker reservation " + rsv.Name
	}
}

// Reserve records which reservation the pod is placed with: on a virtual
// node, the pod now consumes it (a second pod cannot); on a local node, the
// reservation is to be released once the pod is bound.
func (pl *ResourceBroker) Reserve(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := readState(state)
	if s == nil {
		return nil
	}
	local := true
	if ni, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(nodeName); err == nil {
		_, virtual := virtualNodeProvider(ni.Node())
		local = !virtual
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.claims[pod.UID] = claim{rsvUID: s.rsv.UID, namespace: s.rsv.Namespace, name: s.rsv.Name, requests: s.requests, local: local}
	return nil
}

// Unreserve undoes Reserve (binding failed or a later plugin rejected the pod).
func (pl *ResourceBroker) Unreserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, _ string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	delete(pl.claims, pod.UID)
}

// PostBind releases the reservation of a pod that was bound to a local node
// before using it: the Reservation is deleted (by the worker), and the
// agent's finalizer releases it at the broker.
func (pl *ResourceBroker) PostBind(ctx context.Context, _ fwk.CycleState, pod *v1.Pod, nodeName string) {
	pl.mu.Lock()
	c, ok := pl.claims[pod.UID]
	if ok && c.local {
		delete(pl.claims, pod.UID)
	}
	pl.mu.Unlock()
	if !ok || !c.local {
		return
	}
	klog.FromContext(ctx).V(2).Info("Pod bound locally before using its reservation; releasing it", "pod", klog.KObj(pod), "node", nodeName, "reservation", klog.KRef(c.namespace, c.name))
	pl.worker.delete(c.namespace, c.name, c.rsvUID)
	pl.handle.EventRecorder().Eventf(pod, nil, v1.EventTypeNormal, "BrokerReservationReleased", "Release",
		"Pod fits local node %s; releasing broker reservation %s", nodeName, c.name)
}

// SignPod lets the scheduler batch pods without a reservation (their Filter
// result depends on their tolerations only); a pod with one is not batched.
func (pl *ResourceBroker) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if pl.eligible(pod) && pl.rsvs.forPod(pod) != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pod has a broker reservation")
	}
	return []fwk.SignFragment{
		{Key: fwk.TolerationsSignerName, Value: fwk.TolerationsSigner(pod)},
		{Key: "broker.fluidos.eu/Reservation", Value: ""},
	}, nil
}

// buildReservation is the worker's view of a create: the current pod (from
// the scheduler's informer), or nil when it is gone, replaced or bound.
func (pl *ResourceBroker) buildReservation(namespace, name string, uid types.UID) *unstructured.Unstructured {
	pod, err := pl.podLister.Pods(namespace).Get(name)
	if err != nil || pod.UID != uid || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil {
		return nil
	}
	u, err := toUnstructured(newReservation(pod, pl.args))
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
	if pod != nil && activateOnChanges.Load() && reservationChangeMatters(old, r) {
		klog.FromContext(ctx).V(4).Info("Reservation added or changed; retrying its pod", "reservation", klog.KObj(r), "phase", r.Status.Phase, "pod", klog.KObj(pod))
		pl.activate(pod)
	}
	if old != nil && !ended(old) && ended(r) && activateOnChanges.Load() {
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
	if activateOnChanges.Load() {
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
// released or is being deleted). Reserved or Active without a virtual node
// is no news for the scheduler: an attempt then could only fail again, and
// in a burst each such attempt costs a status update and an event of the
// pod; the bridge names the node once it can take the pod.
func reservationChangeMatters(old, r *brokerv1alpha1.Reservation) bool {
	switch {
	case old == nil:
		return placeable(r) || ended(r)
	case ended(r):
		return !ended(old) || old.Status.Phase != r.Status.Phase
	case placeable(r):
		return !placeable(old) || old.Status.VirtualNode != r.Status.VirtualNode || old.Status.Provider != r.Status.Provider
	}
	return false
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
	if !virtual || provider == "" || !activateOnChanges.Load() {
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
		!equalResources(old.Status.Allocatable, n.Status.Allocatable) ||
		len(old.Spec.Taints) != len(n.Spec.Taints) ||
		old.Spec.Unschedulable != n.Spec.Unschedulable
}

func equalResources(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, q := range a {
		if q2, ok := b[k]; !ok || q.Cmp(q2) != 0 {
			return false
		}
	}
	return true
}
