package virtualkubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// NotifyNodeStatus records how to tell the node controller of changes.
func (n *providerNode) NotifyNodeStatus(_ context.Context, cb func(*corev1.Node)) {
	n.mu.Lock()
	n.notify = cb
	n.mu.Unlock()
	n.push()
}

// push asks for the node's status to be written (coalesced).
func (n *providerNode) push() {
	select {
	case n.pushNow <- struct{}{}:
	default:
	}
}

func (n *providerNode) pushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.pushNow:
		}
		n.mu.Lock()
		cb := n.notify
		n.mu.Unlock()
		if cb == nil {
			continue
		}
		sent := make(chan struct{})
		go func() {
			cb(n.nodeObject())
			close(sent)
		}()
		select {
		case <-ctx.Done():
			return
		case <-sent:
		}
	}
}

// nodeObject is the Node as it should be now.
//
// It carries no capacity or allocatable: those the bridge writes itself
// (writeCapacity). virtual-kubelet's node controller writes the status as a
// three-way patch that makes the API server's copy equal to this object for
// every field the object has, so a capacity here, captured when the object
// was handed over and written later, could undo a newer one.
func (n *providerNode) nodeObject() *corev1.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	ready := n.ready.status
	now := metav1.Now()
	condition := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string, since metav1.Time) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: since}
	}
	created := n.ready.since
	nodeObj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.name,
			Labels: map[string]string{
				rbv1.ProviderLabel:   n.provider,
				TypeLabel:            TypeValue,
				"kubernetes.io/role": "agent",
				corev1.LabelHostname: n.name,
				corev1.LabelOSStable: "linux",
				rbv1.ManagedByLabel:  rbv1.ManagedByValue,
				rbv1.RequesterLabel:  n.b.cfg.ClusterID,
				"node.kubernetes.io/exclude-from-external-load-balancers": "true",
			},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{
				condition(corev1.NodeReady, ready, n.ready.reason, n.ready.message, n.ready.since),
				condition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "ProviderHasSufficientMemory", "capacity is reserved at the broker", created),
				condition(corev1.NodeDiskPressure, corev1.ConditionFalse, "ProviderHasNoDiskPressure", "capacity is reserved at the broker", created),
				condition(corev1.NodePIDPressure, corev1.ConditionFalse, "ProviderHasSufficientPID", "capacity is reserved at the broker", created),
				condition(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "ProviderNetwork", "pods use the provider's network", created),
			},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: "linux",
				KubeletVersion:  kubeletVersion(),
				OSImage:         "provider " + n.provider + " (resource broker)",
			},
		},
	}
	for k, v := range n.providerLabels {
		nodeObj.Labels[k] = v
	}
	// The API server (logs, exec, attach, port-forward, node proxy) and
	// metrics-server reach the node's kubelet endpoint at the agent's IP,
	// which its serving certificate names, and the node's own port; no host
	// name address, which the API server would try first and could not
	// resolve.
	if e := n.endpoint; e != nil && n.b.cfg.NodeIP != "" {
		nodeObj.Status.DaemonEndpoints.KubeletEndpoint.Port = e.port
		nodeObj.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.b.cfg.NodeIP}}
	}
	return nodeObj
}

// capacityLocked is the node's capacity (and allocatable): the sum of the
// active reservations and PodsPerReservation pods for each.
func (n *providerNode) capacityLocked() corev1.ResourceList {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("0"),
		corev1.ResourceMemory: resource.MustParse("0"),
		corev1.ResourcePods:   *resource.NewQuantity(n.b.cfg.PodsPerReservation*int64(len(n.active)), resource.DecimalSI),
	}
	maps.Copy(capacity, n.capacity)
	refused, count := n.pods.refusedResources()
	addResources(capacity, refused)
	addResources(capacity, corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(count, resource.DecimalSI)})
	return capacity
}

// writeCapacity makes the node's status.capacity and status.allocatable, as
// the API server holds them (cur, from the cache), what they should be now:
// one merge patch of the status, nothing when they already are. The bridge
// writes them itself, not virtual-kubelet's node controller (see
// nodeObject), whose writes are a read and a patch queued behind its other
// updates: when this returns, the capacity counts every active reservation,
// and the bridge can name the node in their status at once.
func (n *providerNode) writeCapacity(ctx context.Context, cur *corev1.Node) (bool, error) {
	n.mu.Lock()
	want := n.capacityLocked()
	written, writtenRV := n.written, n.writtenRV
	n.mu.Unlock()
	if equality.Semantic.DeepEqual(cur.Status.Capacity, want) && equality.Semantic.DeepEqual(cur.Status.Allocatable, want) {
		return false, nil
	}
	if older, err := resourceversion.CompareResourceVersion(cur.ResourceVersion, writtenRV); err == nil && older < 0 && equality.Semantic.DeepEqual(written, want) {
		return false, nil // the cache has not seen the last write yet, which was this capacity
	}
	values := func(have corev1.ResourceList) map[string]any {
		m := map[string]any{}
		for k := range have {
			m[string(k)] = nil // gone unless wanted
		}
		for k, q := range want {
			m[string(k)] = q.String()
		}
		return m
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity": values(cur.Status.Capacity), "allocatable": values(cur.Status.Allocatable)}})
	if err != nil {
		return false, err
	}
	node, err := n.b.local.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}, "status")
	if err != nil {
		return false, err
	}
	n.mu.Lock()
	n.written, n.writtenRV = want, node.ResourceVersion
	n.mu.Unlock()
	return true, nil
}

// setReservations is what the bridge's controller tells the node: the active
// reservations (ids, newest first) and their sum.
func (n *providerNode) setReservations(ids []string, capacity corev1.ResourceList) {
	n.mu.Lock()
	newIDs := !slices.Equal(n.active, ids)
	changed := newIDs || !equality.Semantic.DeepEqual(n.capacity, capacity)
	n.active, n.capacity = ids, capacity
	noRemote := n.remote == nil
	lost := n.grantOf != "" && !slices.Contains(ids, n.grantOf)
	n.mu.Unlock()
	if changed {
		n.log.V(1).Info("capacity", "reservations", len(ids), "resources", fmt.Sprint(capacity))
	}
	// Read the grants again when there is no connection yet, or the
	// reservation whose grant it uses has ended. Not on every new
	// reservation: the connection's token is renewed halfway to its expiry
	// anyway, and in a burst of reservations each refresh would read up to
	// five grants from the broker.
	if newIDs && len(ids) > 0 && (noRemote || lost) {
		n.refreshNow()
	}
}

func (n *providerNode) activeIDs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.active)
}
