package resourcebroker

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// Reserve records which reservation the pod is placed with: on a virtual
// node, the pod now consumes it (a second pod cannot); on a local node, the
// reservation is to be released once the pod is bound.
func (pl *ResourceBroker) Reserve(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := readState(state)
	if s == nil || s.rsv == nil {
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
